//! The free ranges of one arena chunk or superblock: address-ordered first fit with
//! coalescing.
//!
//! The ranges sit in one vector sorted by address. First fit scans it from the front
//! (as an ordered map's iteration would) and carves from the front of the range it
//! finds, which keeps the order, so the range is changed in place; a free finds its
//! place by binary search and merges with its neighbours there. A superblock holds at
//! most `superblock / 512` ranges and a chunk's ranges are separated by blocks or
//! superblocks, so the vectors stay short; shifting one on an insertion or removal
//! costs less than an ordered map's node walk for the lengths met in practice.

/// Free ranges of one chunk or superblock: (address, length), by address, coalesced.
#[derive(Debug, Default)]
pub(super) struct FreeList {
    pub(super) ranges: Vec<(u64, u64)>,
    /// Sum of the range lengths (lets a search skip lists that cannot fit).
    pub(super) free_bytes: u64,
}

impl FreeList {
    /// A list with one free range.
    pub(super) fn whole(addr: u64, len: u64) -> FreeList {
        FreeList {
            ranges: vec![(addr, len)],
            free_bytes: len,
        }
    }

    /// Whether the list is the single range `addr..addr + len`.
    #[inline]
    pub(super) fn is_whole(&self, addr: u64, len: u64) -> bool {
        self.ranges.len() == 1 && self.ranges[0] == (addr, len)
    }

    /// Whether some free range holds `bytes` (RMM's `superblock::fits`).
    pub(super) fn fits(&self, bytes: u64) -> bool {
        self.first_fitting(bytes).is_some()
    }

    /// The index of the first range (by address) that holds `bytes`.
    #[inline]
    fn first_fitting(&self, bytes: u64) -> Option<usize> {
        if self.free_bytes < bytes {
            return None;
        }
        // Eight ranges at a time, a bit per range that holds `bytes`, then the lowest:
        // the inner loop runs to the group's end (a length the predictor follows)
        // instead of stopping at a data-dependent range, and a long list is not read
        // past the group that fits.
        for (g, group) in self.ranges.chunks(8).enumerate() {
            let fits = group.iter().enumerate().fold(0u32, |fits, (i, &(_, len))| {
                fits | (u32::from(len >= bytes) << i)
            });
            if fits != 0 {
                return Some(g * 8 + fits.trailing_zeros() as usize);
            }
        }
        None
    }

    /// The address of the first range that holds `bytes`, without carving it.
    pub(super) fn peek(&self, bytes: u64) -> Option<u64> {
        self.first_fitting(bytes).map(|i| self.ranges[i].0)
    }

    /// Address-ordered first fit: carves `bytes` from the front of the first range that
    /// holds them.
    #[inline(always)]
    pub(super) fn first_fit(&mut self, bytes: u64) -> Option<u64> {
        let i = self.first_fitting(bytes)?;
        let (addr, len) = self.ranges[i];
        if len > bytes {
            // The rest starts above `addr` and below the next range: same place.
            self.ranges[i] = (addr + bytes, len - bytes);
        } else {
            self.ranges.remove(i);
        }
        self.free_bytes -= bytes;
        Some(addr)
    }

    /// Returns a range, merging it with free neighbours.
    #[inline(always)]
    pub(super) fn insert(&mut self, addr: u64, len: u64) {
        let end = addr + len;
        // Ranges before `i` start below `addr`; `i` and after at or above it.
        let i = self.ranges.partition_point(|&(a, _)| a < addr);
        let merge_prev = match i.checked_sub(1).map(|p| self.ranges[p]) {
            Some((p, plen)) => {
                assert!(
                    p + plen <= addr,
                    "arena: freed range {addr:#x} overlaps a free range"
                );
                p + plen == addr
            }
            None => false,
        };
        let merge_next = match self.ranges.get(i) {
            Some(&(n, _)) => {
                assert!(
                    n >= end,
                    "arena: freed range {addr:#x} overlaps a free range"
                );
                n == end
            }
            None => false,
        };
        if merge_prev != merge_next {
            // One neighbour: it grows in place, by `len`, starting at `addr` when it is
            // the next one (no branch on which).
            let j = i - usize::from(merge_prev);
            let (start, grown) = self.ranges[j];
            let start = if merge_prev { start } else { addr };
            self.ranges[j] = (start, grown + len);
        } else if merge_prev {
            // Both: the previous range swallows the block and the next range.
            // Removing the last range needs no shift (and no call to make one).
            let (_, nlen) = if i + 1 == self.ranges.len() {
                self.ranges.pop().expect("the next range exists")
            } else {
                self.ranges.remove(i)
            };
            self.ranges[i - 1].1 += len + nlen;
        } else {
            self.ranges.insert(i, (addr, len));
        }
        self.free_bytes += len;
    }

    /// Panics unless the ranges lie in `lo..hi`, are non-empty, disjoint and coalesced,
    /// and sum to `free_bytes`.
    pub(super) fn check(&self, lo: u64, hi: u64, what: &str) {
        let mut prev_end = None;
        let mut sum = 0;
        for &(addr, len) in &self.ranges {
            assert!(len > 0, "arena: empty free range in {what}");
            assert!(
                addr >= lo && addr + len <= hi,
                "arena: free range {addr:#x} outside its {what}"
            );
            if let Some(end) = prev_end {
                assert!(
                    addr > end,
                    "arena: free ranges in {what} overlap or were not coalesced at {addr:#x}"
                );
            }
            prev_end = Some(addr + len);
            sum += len;
        }
        assert_eq!(sum, self.free_bytes, "arena: free bytes of {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The ordered-map free list this one replaced, kept as the model it must match.
    #[derive(Default)]
    struct Model {
        ranges: BTreeMap<u64, u64>,
    }

    impl Model {
        fn first_fit(&mut self, bytes: u64) -> Option<u64> {
            let (&addr, &len) = self.ranges.iter().find(|(_, &len)| len >= bytes)?;
            self.ranges.remove(&addr);
            if len > bytes {
                self.ranges.insert(addr + bytes, len - bytes);
            }
            Some(addr)
        }

        fn insert(&mut self, addr: u64, len: u64) {
            let (mut start, mut end) = (addr, addr + len);
            if let Some((&p, &plen)) = self.ranges.range(..addr).next_back() {
                if p + plen == addr {
                    self.ranges.remove(&p);
                    start = p;
                }
            }
            if let Some((&n, &nlen)) = self.ranges.range(addr..).next() {
                if n == end {
                    self.ranges.remove(&n);
                    end = n + nlen;
                }
            }
            self.ranges.insert(start, end - start);
        }
    }

    proptest! {
        /// Carving and returning blocks of a 64 KiB range in random order gives the same
        /// addresses and the same ranges as the ordered-map list (merges on both sides,
        /// exact fits, carving from the front).
        #[test]
        fn matches_the_ordered_map(ops in prop::collection::vec((any::<bool>(), 1u64..=32, any::<usize>()), 1..300)) {
            const BASE: u64 = 1 << 20;
            let mut list = FreeList::whole(BASE, 64 << 10);
            let mut model = Model::default();
            model.insert(BASE, 64 << 10);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, units, pick) in ops {
                if alloc || live.is_empty() {
                    let bytes = units * 256;
                    let fits = list.fits(bytes);
                    let got = list.first_fit(bytes);
                    prop_assert_eq!(got, model.first_fit(bytes));
                    prop_assert_eq!(fits, got.is_some());
                    if let Some(addr) = got {
                        live.push((addr, bytes));
                    }
                } else {
                    let (addr, bytes) = live.swap_remove(pick % live.len());
                    list.insert(addr, bytes);
                    model.insert(addr, bytes);
                }
                list.check(BASE, BASE + (64 << 10), "test range");
                prop_assert_eq!(&list.ranges, &model.ranges.iter().map(|(&a, &l)| (a, l)).collect::<Vec<_>>());
                prop_assert_eq!(list.peek(512), model.ranges.iter().find(|(_, &l)| l >= 512).map(|(&a, _)| a));
            }
            for (addr, bytes) in live {
                list.insert(addr, bytes);
            }
            prop_assert!(list.is_whole(BASE, 64 << 10));
        }
    }

    /// First fit finds the first range that holds the request past the first eight
    /// ranges (the search's second group), and nothing when none holds it though the
    /// free bytes would.
    #[test]
    fn first_fit_past_eight_ranges() {
        let mut list = FreeList::whole(0, 40 * 512);
        let blocks: Vec<u64> = (0..40).map(|_| list.first_fit(512).unwrap()).collect();
        // Ten lone 512-byte ranges, then one of 1 KiB.
        for &addr in blocks.iter().take(20).step_by(2) {
            list.insert(addr, 512);
        }
        list.insert(blocks[30], 512);
        list.insert(blocks[31], 512);
        assert_eq!(list.ranges.len(), 11);
        assert_eq!(list.peek(1024), Some(30 * 512));
        assert_eq!(list.peek(512), Some(0));
        assert!(list.free_bytes >= 4096);
        assert_eq!(list.first_fit(4096), None);
        assert_eq!(list.first_fit(1024), Some(30 * 512));
        assert_eq!(list.ranges.len(), 10);
    }

    /// A freed range that overlaps a free one is refused.
    #[test]
    #[should_panic(expected = "overlaps a free range")]
    fn overlap_panics() {
        let mut list = FreeList::whole(0, 1024);
        list.first_fit(512);
        list.insert(256, 512);
    }
}
