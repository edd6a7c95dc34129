//! [`PageTable`]: the bookkeeping behind [`VirtualMemory`], written once for every
//! device (simulated, test, CUDA).
//!
//! It knows which address ranges and physical chunks are live, where each chunk is
//! mapped, and checks every call against that before the device acts: a chunk or range
//! the device did not hand out, a span that leaves its range or overlaps a mapping,
//! unmapping what is not mapped there, releasing a mapped chunk or a range with
//! mappings. Those are bugs in the caller and panic with the device's name and the
//! broken rule. The table makes no driver call and charges nothing; each device adds
//! its own cost model (the simulated one its page charge, the CUDA one real calls).
//!
//! A device with fallible calls (CUDA) validates first with a `check_*` method, makes
//! its driver calls, then records the outcome with the matching method; a device whose
//! calls cannot fail after validation calls the recording method alone (it validates
//! too).
//!
//! [`VirtualMemory`]: crate::VirtualMemory

use std::collections::BTreeMap;

use crate::device::{AddressRange, ChunkId, DeviceAddr, PhysicalChunk, SegmentId};

/// Where one chunk is (or is to be) mapped, with the device's handle for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement<H> {
    /// First byte of the mapping.
    pub addr: DeviceAddr,
    /// Length of the mapping (the chunk's size).
    pub size_bytes: u64,
    /// The device's handle of the chunk.
    pub handle: H,
}

/// Everything a table held, handed over by [`PageTable::take_all`] for cleanup.
#[derive(Debug)]
pub struct Teardown<H> {
    /// Every mapping as (address, bytes), in address order.
    pub mappings: Vec<(DeviceAddr, u64)>,
    /// Every live chunk as (handle, bytes), in order of creation.
    pub chunks: Vec<(H, u64)>,
    /// Every live range as (address, bytes asked for), in address order.
    pub ranges: Vec<(DeviceAddr, u64)>,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    chunk: u64,
    bytes: u64,
}

#[derive(Debug)]
struct RangeEntry {
    id: SegmentId,
    size: u64,
    /// Mappings by offset from the range's first byte.
    mappings: BTreeMap<u64, Mapping>,
}

#[derive(Debug)]
struct ChunkEntry<H> {
    size: u64,
    handle: H,
    /// Places where the chunk is mapped now.
    mappings: u32,
}

/// The live address ranges and physical chunks of one device, and every mapping of a
/// chunk into a range. `H` is the device's handle of a chunk (`()` when it has none).
#[derive(Debug)]
pub struct PageTable<H> {
    owner: &'static str,
    /// Ranges by first address.
    ranges: BTreeMap<u64, RangeEntry>,
    chunks: BTreeMap<u64, ChunkEntry<H>>,
    next_chunk: u64,
    physical_bytes: u64,
}

impl<H: Copy> PageTable<H> {
    /// An empty table; `owner` names the device in panic messages.
    pub fn new(owner: &'static str) -> PageTable<H> {
        PageTable {
            owner,
            ranges: BTreeMap::new(),
            chunks: BTreeMap::new(),
            next_chunk: 1,
            physical_bytes: 0,
        }
    }

    /// Bytes of live physical chunks.
    pub fn physical_bytes(&self) -> u64 {
        self.physical_bytes
    }

    /// Live address ranges.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Live physical chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Whether `addr..addr + size_bytes` touches a live range.
    pub fn overlaps_range(&self, addr: u64, size_bytes: u64) -> bool {
        let end = addr.saturating_add(size_bytes);
        self.ranges
            .range(..end)
            .next_back()
            .is_some_and(|(&a, r)| a + r.size > addr)
    }

    /// Every mapping as (address, bytes), in address order.
    pub fn mapped_regions(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().flat_map(|(&base, r)| {
            r.mappings
                .iter()
                .map(move |(&off, m)| (base + off, m.bytes))
        })
    }

    /// Records a range the device has reserved.
    ///
    /// # Panics
    /// If it overlaps a live range (a bug in the device).
    pub fn add_range(&mut self, id: SegmentId, addr: DeviceAddr, size_bytes: u64) -> AddressRange {
        assert!(
            !self.overlaps_range(addr.0, size_bytes.max(1)),
            "{}: range at {addr} overlaps a live range",
            self.owner
        );
        self.ranges.insert(
            addr.0,
            RangeEntry {
                id,
                size: size_bytes,
                mappings: BTreeMap::new(),
            },
        );
        AddressRange {
            id,
            addr,
            size_bytes,
        }
    }

    /// Records a chunk the device has created, with its handle.
    pub fn add_chunk(&mut self, size_bytes: u64, handle: H) -> PhysicalChunk {
        let id = self.next_chunk;
        self.next_chunk += 1;
        self.chunks.insert(
            id,
            ChunkEntry {
                size: size_bytes,
                handle,
                mappings: 0,
            },
        );
        self.physical_bytes += size_bytes;
        PhysicalChunk {
            id: ChunkId(id),
            size_bytes,
        }
    }

    fn range_entry(&self, range: &AddressRange) -> &RangeEntry {
        let r = self.ranges.get(&range.addr.0).unwrap_or_else(|| {
            panic!(
                "{}: address range at {} was not reserved by this device (or is released)",
                self.owner, range.addr
            )
        });
        assert!(
            r.id == range.id && r.size == range.size_bytes,
            "{}: address range {:?} does not match what this device reserved",
            self.owner,
            range.id
        );
        r
    }

    fn chunk_entry(&self, chunk: &PhysicalChunk) -> &ChunkEntry<H> {
        let c = self.chunks.get(&chunk.id.0).unwrap_or_else(|| {
            panic!(
                "{}: physical chunk {:?} was not created by this device (or is released)",
                self.owner, chunk.id
            )
        });
        assert_eq!(
            c.size, chunk.size_bytes,
            "{}: physical chunk {:?} does not match what this device created",
            self.owner, chunk.id
        );
        c
    }

    /// Where [`PageTable::map`] would put `chunks`, after checking that it may.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::map`].
    pub fn check_map(
        &self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Vec<Placement<H>> {
        let r = self.range_entry(range);
        let mut placements = Vec::with_capacity(chunks.len());
        let mut offset = offset_bytes;
        for chunk in chunks {
            let c = self.chunk_entry(chunk);
            assert!(c.size > 0, "{}: mapping an empty chunk", self.owner);
            let end = offset
                .checked_add(c.size)
                .filter(|&end| end <= r.size)
                .unwrap_or_else(|| panic!("{}: mapping past the end of the range", self.owner));
            if let Some((&at, m)) = r.mappings.range(..end).next_back() {
                assert!(
                    at + m.bytes <= offset,
                    "{}: mapping over a mapped page (offset {offset:#x} overlaps the mapping at {at:#x})",
                    self.owner
                );
            }
            placements.push(Placement {
                addr: DeviceAddr(range.addr.0 + offset),
                size_bytes: c.size,
                handle: c.handle,
            });
            offset = end;
        }
        placements
    }

    /// Records `chunks` mapped back to back at `range.addr + offset_bytes`; returns the
    /// bytes mapped.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::map`].
    pub fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> u64 {
        self.check_map(range, offset_bytes, chunks);
        let r = self
            .ranges
            .get_mut(&range.addr.0)
            .expect("range checked above");
        let mut offset = offset_bytes;
        for chunk in chunks {
            r.mappings.insert(
                offset,
                Mapping {
                    chunk: chunk.id.0,
                    bytes: chunk.size_bytes,
                },
            );
            self.chunks
                .get_mut(&chunk.id.0)
                .expect("chunk checked above")
                .mappings += 1;
            offset += chunk.size_bytes;
        }
        offset - offset_bytes
    }

    /// Where the mappings [`PageTable::unmap`] would remove are, after checking that
    /// `chunks` are mapped back to back at `range.addr + offset_bytes`.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::unmap`].
    pub fn check_unmap(
        &self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Vec<Placement<H>> {
        let r = self.range_entry(range);
        let mut placements = Vec::with_capacity(chunks.len());
        let mut offset = offset_bytes;
        for chunk in chunks {
            let c = self.chunk_entry(chunk);
            let m = r.mappings.get(&offset);
            assert!(
                m.is_some_and(|m| m.chunk == chunk.id.0),
                "{}: unmapping a page that is not mapped (chunk {:?} is not mapped at offset {offset:#x})",
                self.owner,
                chunk.id
            );
            placements.push(Placement {
                addr: DeviceAddr(range.addr.0 + offset),
                size_bytes: c.size,
                handle: c.handle,
            });
            offset += c.size;
        }
        placements
    }

    /// Records `chunks` unmapped from `range.addr + offset_bytes`; returns the bytes
    /// unmapped.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::unmap`].
    pub fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> u64 {
        self.check_unmap(range, offset_bytes, chunks);
        let r = self
            .ranges
            .get_mut(&range.addr.0)
            .expect("range checked above");
        let mut offset = offset_bytes;
        for chunk in chunks {
            r.mappings.remove(&offset);
            self.chunks
                .get_mut(&chunk.id.0)
                .expect("chunk checked above")
                .mappings -= 1;
            offset += chunk.size_bytes;
        }
        offset - offset_bytes
    }

    /// The handle of a chunk that may be released.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::release_physical`].
    pub fn check_release_chunk(&self, chunk: &PhysicalChunk) -> H {
        let c = self.chunk_entry(chunk);
        assert_eq!(
            c.mappings, 0,
            "{}: releasing physical chunk {:?} while it is mapped at {} place(s)",
            self.owner, chunk.id, c.mappings
        );
        c.handle
    }

    /// Forgets a released chunk; returns its handle.
    ///
    /// # Panics
    /// As [`crate::VirtualMemory::release_physical`].
    pub fn remove_chunk(&mut self, chunk: PhysicalChunk) -> H {
        let handle = self.check_release_chunk(&chunk);
        self.chunks.remove(&chunk.id.0);
        self.physical_bytes -= chunk.size_bytes;
        handle
    }

    /// How many mappings the range still has.
    ///
    /// # Panics
    /// If the range is not live on this device.
    pub fn mappings_in(&self, range: &AddressRange) -> usize {
        self.range_entry(range).mappings.len()
    }

    /// Forgets a released range.
    ///
    /// # Panics
    /// If it is not live here or still has mappings.
    pub fn remove_range(&mut self, range: AddressRange) {
        let mapped = self.mappings_in(&range);
        assert_eq!(
            mapped, 0,
            "{}: releasing the address range at {} with {mapped} mapping(s) in it",
            self.owner, range.addr
        );
        self.ranges.remove(&range.addr.0);
    }

    /// Empties the table and hands over everything it held, for a device's cleanup:
    /// unmap every mapping, release every chunk, free every range, in that order.
    pub fn take_all(&mut self) -> Teardown<H> {
        let ranges = std::mem::take(&mut self.ranges);
        let chunks = std::mem::take(&mut self.chunks);
        self.physical_bytes = 0;
        Teardown {
            mappings: ranges
                .iter()
                .flat_map(|(&base, r)| {
                    r.mappings
                        .iter()
                        .map(move |(&off, m)| (DeviceAddr(base + off), m.bytes))
                })
                .collect(),
            chunks: chunks.into_values().map(|c| (c.handle, c.size)).collect(),
            ranges: ranges
                .into_iter()
                .map(|(addr, r)| (DeviceAddr(addr), r.size))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn table_with_range() -> (PageTable<u32>, AddressRange) {
        let mut t = PageTable::new("T");
        let r = t.add_range(SegmentId(1), DeviceAddr(1 << 40), 10 * MIB);
        (t, r)
    }

    /// Mapping places chunks back to back and counts physical bytes once however often
    /// a chunk is mapped; unmap and release undo it.
    #[test]
    fn map_unmap_release() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(2 * MIB, 7);
        let b = t.add_chunk(4 * MIB, 8);
        assert_eq!(t.physical_bytes(), 6 * MIB);
        let chunks = [a, b];
        let placed = t.check_map(&r, 2 * MIB, &chunks);
        assert_eq!(
            placed
                .iter()
                .map(|p| (p.addr.0 - r.addr.0, p.size_bytes, p.handle))
                .collect::<Vec<_>>(),
            vec![(2 * MIB, 2 * MIB, 7), (4 * MIB, 4 * MIB, 8)]
        );
        assert_eq!(t.map(&r, 2 * MIB, &chunks), 6 * MIB);
        // The first chunk once more, at the range's start: stitching.
        t.map(&r, 0, &chunks[..1]);
        assert_eq!(
            t.mapped_regions().collect::<Vec<_>>(),
            vec![
                (r.addr.0, 2 * MIB),
                (r.addr.0 + 2 * MIB, 2 * MIB),
                (r.addr.0 + 4 * MIB, 4 * MIB)
            ]
        );
        assert_eq!(t.physical_bytes(), 6 * MIB);
        assert_eq!(t.unmap(&r, 2 * MIB, &chunks), 6 * MIB);
        assert_eq!(t.mappings_in(&r), 1);
        let [a, b] = chunks;
        assert_eq!(t.remove_chunk(b), 8);
        t.unmap(&r, 0, std::slice::from_ref(&a));
        t.remove_chunk(a);
        t.remove_range(r);
        assert_eq!(
            (t.physical_bytes(), t.chunk_count(), t.range_count()),
            (0, 0, 0)
        );
    }

    /// A span that overlaps a mapping is refused.
    #[test]
    #[should_panic(expected = "T: mapping over a mapped page")]
    fn overlapping_map_panics() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(4 * MIB, 0);
        let b = t.add_chunk(2 * MIB, 0);
        t.map(&r, 2 * MIB, std::slice::from_ref(&a));
        t.map(&r, 4 * MIB, std::slice::from_ref(&b));
    }

    /// A span that leaves the range is refused.
    #[test]
    #[should_panic(expected = "T: mapping past the end of the range")]
    fn map_past_the_end_panics() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(4 * MIB, 0);
        t.map(&r, 8 * MIB, std::slice::from_ref(&a));
    }

    /// Unmapping a chunk where another one is mapped is refused.
    #[test]
    #[should_panic(expected = "T: unmapping a page that is not mapped")]
    fn unmapping_the_wrong_chunk_panics() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(2 * MIB, 0);
        let b = t.add_chunk(2 * MIB, 0);
        t.map(&r, 0, std::slice::from_ref(&a));
        t.unmap(&r, 0, std::slice::from_ref(&b));
    }

    /// A mapped chunk cannot be released.
    #[test]
    #[should_panic(expected = "T: releasing physical chunk ChunkId(1) while it is mapped")]
    fn releasing_a_mapped_chunk_panics() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(2 * MIB, 0);
        t.map(&r, 0, std::slice::from_ref(&a));
        t.remove_chunk(a);
    }

    /// A range with mappings cannot be released.
    #[test]
    #[should_panic(expected = "with 1 mapping(s) in it")]
    fn releasing_a_mapped_range_panics() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(2 * MIB, 0);
        t.map(&r, 0, std::slice::from_ref(&a));
        t.remove_range(r);
    }

    /// A forged range (right address, wrong size) is refused.
    #[test]
    #[should_panic(expected = "does not match what this device reserved")]
    fn forged_range_panics() {
        let (t, r) = table_with_range();
        let forged = AddressRange {
            size_bytes: r.size_bytes * 2,
            ..r
        };
        t.mappings_in(&forged);
    }

    /// take_all hands over every mapping, chunk and range and leaves the table empty.
    #[test]
    fn take_all_empties() {
        let (mut t, r) = table_with_range();
        let a = t.add_chunk(2 * MIB, 5);
        let _unmapped = t.add_chunk(2 * MIB, 6);
        t.map(&r, 4 * MIB, std::slice::from_ref(&a));
        let all = t.take_all();
        assert_eq!(
            all.mappings,
            vec![(DeviceAddr(r.addr.0 + 4 * MIB), 2 * MIB)]
        );
        assert_eq!(all.chunks, vec![(5, 2 * MIB), (6, 2 * MIB)]);
        assert_eq!(all.ranges, vec![(r.addr, 10 * MIB)]);
        assert_eq!(
            (t.physical_bytes(), t.chunk_count(), t.range_count()),
            (0, 0, 0)
        );
    }
}
