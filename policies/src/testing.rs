//! Test doubles for policies: a device that never has memory, one whose driver fails,
//! and one with a simple, exact capacity and virtual memory; checks shared by the
//! policies' unit tests and the conformance suite. Enough to unit-test a policy without
//! `sim`. And [`every_policy`], the one list of what a test of "every policy" runs,
//! derived from the registry.

use std::collections::BTreeMap;

use crate::device::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment, SegmentId,
    VirtualMemory,
};
use crate::page_table::PageTable;
use crate::policy::{Allocation, Policy};
use crate::registry::POLICIES;
use crate::spec::{parse_policy, PolicySpec};

/// Settings that take a registered policy down a code path of its own, so that every
/// test of every policy runs them as one more policy: `(policy, settings)`. The caching
/// policy's expandable segments are the only user of virtual memory.
const VARIANTS: &[(&str, &str)] = &[("caching", "expandable_segments=True")];

/// What a test of "every policy" runs, in [`POLICIES`] order: each registered policy
/// with its defaults (labelled by its name), each followed by its variants of
/// [`VARIANTS`] (`caching:expandable_segments=True`). A policy added to the registry is
/// in it, so every such test covers it; a test that needs one policy names it instead.
pub fn every_policy() -> Vec<PolicySpec> {
    let mut out = Vec::new();
    for entry in POLICIES {
        out.push(PolicySpec {
            label: entry.name.to_string(),
            config: entry.default_config(),
        });
        for (_, settings) in VARIANTS.iter().filter(|(name, _)| *name == entry.name) {
            let text = format!("{}:{settings}", entry.name);
            let spec = parse_policy(&text, &Default::default())
                .unwrap_or_else(|e| panic!("testing::VARIANTS: {text}: {e}"));
            out.push(spec);
        }
    }
    out
}

/// The labels of [`every_policy`], comma-separated: a `--policies` value.
pub fn every_policy_list() -> String {
    every_policy()
        .iter()
        .map(|s| s.label.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// A device with no memory at all: every allocation is out of memory.
#[derive(Debug, Default)]
pub struct NullDevice;

impl Device for NullDevice {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        Err(DeviceError::OutOfMemory {
            requested_bytes: size_bytes,
        })
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        panic!("NullDevice never handed out segment {:?}", segment.id)
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            total_bytes: 80 << 30,
            ..DeviceStats::default()
        }
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for NullDevice {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        Ok(AddressRange {
            id: SegmentId(0),
            addr: DeviceAddr(1 << 40),
            size_bytes,
        })
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        Err(DeviceError::OutOfMemory {
            requested_bytes: size_bytes,
        })
    }

    fn map(&mut self, _: &AddressRange, _: u64, _: &[PhysicalChunk]) -> Result<(), DeviceError> {
        panic!("NullDevice never created a physical chunk")
    }

    fn unmap(&mut self, _: &AddressRange, _: u64, _: &[PhysicalChunk]) -> Result<(), DeviceError> {
        panic!("NullDevice never mapped a page")
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        panic!("NullDevice never created physical chunk {:?}", chunk.id)
    }

    fn release_range(&mut self, _: AddressRange) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// The error a [`BrokenDevice`] fails with: `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub fn broken_driver_error() -> DeviceError {
    DeviceError::Driver {
        code: 700,
        message: "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered (in BrokenDevice)".into(),
    }
}

/// A device whose driver has failed: every segment, address range and physical chunk
/// request fails with [`broken_driver_error`] (not out of memory), so a policy must stop
/// and pass the error on.
#[derive(Debug, Default)]
pub struct BrokenDevice;

impl Device for BrokenDevice {
    fn allocate_segment(&mut self, _: u64) -> Result<Segment, DeviceError> {
        Err(broken_driver_error())
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        panic!("BrokenDevice never handed out segment {:?}", segment.id)
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            total_bytes: 80 << 30,
            capacity_bytes: 80 << 30,
            ..DeviceStats::default()
        }
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for BrokenDevice {
    fn reserve_range(&mut self, _: u64) -> Result<AddressRange, DeviceError> {
        Err(broken_driver_error())
    }

    fn create_physical(&mut self, _: u64) -> Result<PhysicalChunk, DeviceError> {
        Err(broken_driver_error())
    }

    fn map(&mut self, _: &AddressRange, _: u64, _: &[PhysicalChunk]) -> Result<(), DeviceError> {
        panic!("BrokenDevice never created a physical chunk")
    }

    fn unmap(&mut self, _: &AddressRange, _: u64, _: &[PhysicalChunk]) -> Result<(), DeviceError> {
        panic!("BrokenDevice never mapped a page")
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        panic!("BrokenDevice never created physical chunk {:?}", chunk.id)
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        panic!("BrokenDevice never reserved range {:?}", range.id)
    }
}

/// A second handle on an allocation, which the type system otherwise rules out: for
/// tests that a policy catches a stale or doubly freed handle.
pub fn duplicate(allocation: &Allocation) -> Allocation {
    Allocation {
        addr: allocation.addr,
        requested_bytes: allocation.requested_bytes,
        block_bytes: allocation.block_bytes,
        stream: allocation.stream,
        block: allocation.block,
        serial: allocation.serial,
    }
}

/// Checks a policy against the [`TestDevice`] it draws from: its own invariants, its
/// reserved bytes and segment count against the device's, and its snapshot (each
/// segment tiled by its blocks, the segments adding up to the reserved bytes).
///
/// # Panics
/// On the first disagreement.
pub fn check_against_device(policy: &dyn Policy, device: &TestDevice) {
    policy.check_invariants();
    let stats = policy.stats();
    assert_eq!(
        stats.reserved_bytes,
        device.stats().reserved_bytes,
        "reserved disagrees with the device"
    );
    assert_eq!(
        stats.segment_count,
        device.stats().segment_count,
        "segment count disagrees with the device"
    );
    let snapshot = policy.snapshot();
    for s in &snapshot {
        let mut cursor = s.addr.0;
        for b in &s.blocks {
            assert_eq!(
                b.addr.0, cursor,
                "snapshot blocks do not tile their segment"
            );
            cursor += b.size_bytes;
        }
        assert_eq!(cursor, s.addr.0 + s.size_bytes, "snapshot segment size");
    }
    assert_eq!(
        snapshot.iter().map(|s| s.size_bytes).sum::<u64>(),
        stats.reserved_bytes,
        "snapshot does not add up to the reserved bytes"
    );
}

/// A device with a byte capacity (`u64::MAX`: unbounded), ascending 2 MiB-aligned
/// addresses that are never reused, and virtual memory. It charges exactly what it is
/// asked for (segments and physical chunks), so policy figures can be checked against
/// it byte for byte.
#[derive(Debug)]
pub struct TestDevice {
    capacity_bytes: u64,
    total_bytes: u64,
    next_addr: u64,
    next_id: u64,
    used_bytes: u64,
    segments: BTreeMap<u64, (u64, u64)>,
    vm: PageTable<()>,
    allocate_count: u64,
    free_count: u64,
}

impl TestDevice {
    /// A device that can hand out `capacity_bytes` in all.
    pub fn with_capacity(capacity_bytes: u64) -> TestDevice {
        TestDevice {
            capacity_bytes,
            total_bytes: if capacity_bytes == u64::MAX {
                80 << 30
            } else {
                capacity_bytes
            },
            next_addr: 1 << 40,
            next_id: 1,
            used_bytes: 0,
            segments: BTreeMap::new(),
            vm: PageTable::new("TestDevice"),
            allocate_count: 0,
            free_count: 0,
        }
    }

    /// A device that never runs out.
    pub fn unbounded() -> TestDevice {
        TestDevice::with_capacity(u64::MAX)
    }

    /// Sets the total memory reported to policies (memory fractions use it).
    pub fn set_total_bytes(&mut self, total_bytes: u64) {
        self.total_bytes = total_bytes;
    }

    /// Live segments as (address, size), in address order.
    pub fn live_segments(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|(&a, &(s, _))| (a, s)).collect()
    }

    /// Mapped chunks as (address, size), in address order.
    pub fn mapped_regions(&self) -> Vec<(u64, u64)> {
        self.vm.mapped_regions().collect()
    }

    fn free_capacity(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.used_bytes)
    }

    fn take_addr(&mut self, size_bytes: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size_bytes.div_ceil(2 << 20).max(1) * (2 << 20);
        addr
    }
}

impl Device for TestDevice {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        if size_bytes > self.free_capacity() {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: size_bytes,
            });
        }
        self.used_bytes += size_bytes;
        let addr = self.take_addr(size_bytes);
        let id = self.next_id;
        self.next_id += 1;
        self.segments.insert(addr, (size_bytes, id));
        self.allocate_count += 1;
        Ok(Segment {
            id: SegmentId(id),
            addr: DeviceAddr(addr),
            size_bytes,
        })
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        let (size, id) = self
            .segments
            .remove(&segment.addr.0)
            .expect("TestDevice: freeing a segment it did not hand out");
        assert_eq!(
            (size, id),
            (segment.size_bytes, segment.id.0),
            "TestDevice: segment mismatch"
        );
        self.used_bytes -= size;
        self.free_count += 1;
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            capacity_bytes: self.capacity_bytes,
            total_bytes: self.total_bytes,
            reserved_bytes: self.used_bytes,
            charged_bytes: self.used_bytes,
            segment_count: (self.segments.len() + self.vm.range_count()) as u64,
            allocate_count: self.allocate_count,
            free_count: self.free_count,
        }
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for TestDevice {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        let addr = self.take_addr(size_bytes);
        let id = self.next_id;
        self.next_id += 1;
        Ok(self
            .vm
            .add_range(SegmentId(id), DeviceAddr(addr), size_bytes))
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        if size_bytes > self.free_capacity() {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: size_bytes,
            });
        }
        self.used_bytes += size_bytes;
        Ok(self.vm.add_chunk(size_bytes, ()))
    }

    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm.map(range, offset_bytes, chunks);
        self.allocate_count += 1;
        Ok(())
    }

    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm.unmap(range, offset_bytes, chunks);
        self.free_count += 1;
        Ok(())
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        let size = chunk.size_bytes;
        self.vm.remove_chunk(chunk);
        self.used_bytes -= size;
        Ok(())
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        self.vm.remove_range(range);
        Ok(())
    }
}

/// Checks that stitching, in the style of GMLake, is expressible on `device`: one
/// physical chunk mapped at two places at once, and the chunks of a released range
/// mapped again, back to back, in another range. Physical memory is charged once
/// whatever the mappings; everything is given back at the end.
///
/// # Panics
/// If the device lacks virtual memory management or a step fails or is mis-charged.
pub fn check_stitching(device: &mut dyn Device) {
    const MIB: u64 = 1 << 20;
    let before = device.stats();
    let vm = device
        .virtual_memory()
        .expect("the device has virtual memory management");
    let first = vm.reserve_range(8 * MIB).expect("reserve the first range");
    let second = vm.reserve_range(8 * MIB).expect("reserve the second range");
    let a = vm.create_physical(2 * MIB).expect("create chunk a");
    let b = vm.create_physical(2 * MIB).expect("create chunk b");
    let chunks = [a, b];
    vm.map(&first, 0, &chunks)
        .expect("map a and b in the first range");
    // Chunk a at a second place: one physical chunk, two virtual addresses.
    vm.map(&second, 4 * MIB, &chunks[..1])
        .expect("map a in the second range too");
    let s = device.stats();
    assert_eq!(
        s.reserved_bytes - before.reserved_bytes,
        4 * MIB,
        "physical memory counts once however often it is mapped"
    );
    assert_eq!(s.charged_bytes - before.charged_bytes, 4 * MIB);
    assert_eq!(s.segment_count - before.segment_count, 2, "two ranges");

    // Release the first range; its chunk b joins a in the second range, contiguous.
    let vm = device.virtual_memory().expect("virtual memory");
    vm.unmap(&first, 0, &chunks).expect("unmap the first range");
    vm.release_range(first).expect("release the first range");
    vm.map(&second, 6 * MIB, &chunks[1..])
        .expect("map b right after a in the second range");
    let s = device.stats();
    assert_eq!(s.reserved_bytes - before.reserved_bytes, 4 * MIB);
    assert_eq!(s.segment_count - before.segment_count, 1);

    // One unmap for the stitched span, then the chunks and the range go back.
    let vm = device.virtual_memory().expect("virtual memory");
    vm.unmap(&second, 4 * MIB, &chunks)
        .expect("unmap the stitched span");
    for chunk in chunks {
        vm.release_physical(chunk).expect("release a chunk");
    }
    vm.release_range(second).expect("release the second range");
    let after = device.stats();
    assert_eq!(
        (
            after.reserved_bytes,
            after.charged_bytes,
            after.segment_count
        ),
        (
            before.reserved_bytes,
            before.charged_bytes,
            before.segment_count
        ),
        "everything given back"
    );
    assert_eq!(
        after.allocate_count - before.allocate_count,
        3,
        "three maps"
    );
    assert_eq!(after.free_count - before.free_count, 2, "two unmaps");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list of every policy holds each registered policy by its name, in the
    /// registry's order, and each variant after its policy; each label parses back to
    /// its configuration.
    #[test]
    fn every_policy_follows_the_registry() {
        let specs = every_policy();
        let names: Vec<&str> = specs.iter().map(|s| s.config.kind_name()).collect();
        let mut registered: Vec<&str> = POLICIES.iter().map(|e| e.name).collect();
        for (name, _) in VARIANTS {
            let at = registered.iter().position(|n| n == name).unwrap() + 1;
            registered.insert(at, name);
        }
        assert_eq!(names, registered);
        for s in &specs {
            assert_eq!(parse_policy(&s.label, &Default::default()).unwrap(), *s);
        }
        assert!(
            every_policy_list().starts_with("caching,caching:expandable_segments=True,"),
            "{}",
            every_policy_list()
        );
    }

    /// Stitching is expressible on the test device.
    #[test]
    fn stitching_on_the_test_device() {
        check_stitching(&mut TestDevice::unbounded());
    }

    /// The test device refuses a chunk that does not fit and charges chunks exactly.
    #[test]
    fn test_device_charges_chunks() {
        let mut d = TestDevice::with_capacity(5 << 20);
        let a = d.create_physical(3 << 20).unwrap();
        assert_eq!(
            d.create_physical(3 << 20),
            Err(DeviceError::OutOfMemory {
                requested_bytes: 3 << 20
            })
        );
        assert_eq!(d.stats().charged_bytes, 3 << 20);
        d.release_physical(a).unwrap();
        assert_eq!(d.stats().charged_bytes, 0);
    }
}
