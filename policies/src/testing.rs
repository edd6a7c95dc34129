//! Test doubles for policies: a device that never has memory and one with a simple,
//! exact capacity and virtual memory. Enough to unit-test a policy without `sim`.

use std::collections::BTreeMap;

use crate::device::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, Segment, SegmentId, VirtualMemory,
};

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

    fn map_pages(
        &mut self,
        _: &AddressRange,
        _: u64,
        page_bytes: u64,
        page_count: u64,
    ) -> Result<(), DeviceError> {
        Err(DeviceError::OutOfMemory {
            requested_bytes: page_bytes * page_count,
        })
    }

    fn unmap_pages(&mut self, _: &AddressRange, _: u64, _: u64, _: u64) -> Result<(), DeviceError> {
        panic!("NullDevice never mapped a page")
    }

    fn release_range(&mut self, _: AddressRange) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// A device with a byte capacity (`u64::MAX`: unbounded), ascending 2 MiB-aligned
/// addresses that are never reused, and virtual memory. It charges exactly what it is
/// asked for, so policy figures can be checked against it byte for byte.
#[derive(Debug)]
pub struct TestDevice {
    capacity_bytes: u64,
    total_bytes: u64,
    next_addr: u64,
    next_id: u64,
    used_bytes: u64,
    segments: BTreeMap<u64, (u64, u64)>,
    ranges: BTreeMap<u64, (u64, u64)>,
    pages: BTreeMap<(u64, u64), u64>,
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
            ranges: BTreeMap::new(),
            pages: BTreeMap::new(),
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

    fn take_addr(&mut self, size_bytes: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size_bytes.div_ceil(2 << 20).max(1) * (2 << 20);
        addr
    }
}

impl Device for TestDevice {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        if size_bytes > self.capacity_bytes.saturating_sub(self.used_bytes) {
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
            segment_count: (self.segments.len() + self.ranges.len()) as u64,
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
        self.ranges.insert(addr, (size_bytes, id));
        Ok(AddressRange {
            id: SegmentId(id),
            addr: DeviceAddr(addr),
            size_bytes,
        })
    }

    fn map_pages(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        page_bytes: u64,
        page_count: u64,
    ) -> Result<(), DeviceError> {
        assert!(
            offset_bytes + page_bytes * page_count <= range.size_bytes,
            "mapping past the range"
        );
        let bytes = page_bytes * page_count;
        if bytes > self.capacity_bytes.saturating_sub(self.used_bytes) {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: bytes,
            });
        }
        for p in 0..page_count {
            let at = range.addr.0 + offset_bytes + p * page_bytes;
            assert!(
                self.pages.insert((range.addr.0, at), page_bytes).is_none(),
                "page mapped twice"
            );
        }
        self.used_bytes += bytes;
        self.allocate_count += 1;
        Ok(())
    }

    fn unmap_pages(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        page_bytes: u64,
        page_count: u64,
    ) -> Result<(), DeviceError> {
        for p in 0..page_count {
            let at = range.addr.0 + offset_bytes + p * page_bytes;
            assert_eq!(
                self.pages.remove(&(range.addr.0, at)),
                Some(page_bytes),
                "unmapping a page that is not mapped"
            );
        }
        self.used_bytes -= page_bytes * page_count;
        self.free_count += 1;
        Ok(())
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        assert!(
            self.pages
                .range((range.addr.0, 0)..(range.addr.0 + 1, 0))
                .next()
                .is_none(),
            "releasing a range with mapped pages"
        );
        self.ranges
            .remove(&range.addr.0)
            .expect("TestDevice: unknown range");
        Ok(())
    }
}
