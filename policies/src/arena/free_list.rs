//! The free ranges of one arena chunk or superblock: address-ordered first fit with
//! coalescing.
//!
//! The ranges sit in one vector sorted by address, followed by padding ([`PAD`]: a
//! start above every address and no length) up to a multiple of [`GROUP`] slots, at
//! least one. First fit scans the ranges from the front (as an ordered map's
//! iteration would), a whole group of eight at a time: a bit per slot that holds the
//! request, the lowest taken, with no branch inside the group and none on where the
//! ranges end (the padding holds nothing). It carves from the front of the range it
//! finds, which keeps the order, so the range is changed in place. A free finds its
//! place by binary search over the whole groups (as many steps for every list of the
//! same group count) and merges with its neighbours there; the range after its place
//! always exists (a range or the padding), so looking at it needs no test. A
//! superblock holds at most `superblock / 512` ranges and a chunk's ranges are
//! separated by blocks or superblocks, so the vectors stay short; shifting one on an
//! insertion or removal costs less than an ordered map's node walk for the lengths
//! met in practice. A bound, at least the longest range, answers "nothing here fits"
//! without a search (the arena keeps a copy of each list's bound, `regions.rs`, to pass
//! over the superblocks that cannot hold a request).

/// Slots looked at together by first fit; the vector is a whole number of groups.
const GROUP: usize = 8;

/// Groups a list always has and a free always searches: most lists hold fewer than 16
/// ranges, so the binary search takes the same four steps for nearly every list (a list
/// of one group and one of two would end their searches after different numbers of
/// steps, which the predictor cannot tell apart).
const MIN_GROUPS: usize = 2;

/// A slot past the last range: above every address (so a search stops before it and
/// no freed range ends there), holding no bytes (so no request fits it).
const PAD: (u64, u64) = (u64::MAX, 0);

/// Free ranges of one chunk or superblock: (address, length), by address, coalesced.
#[derive(Debug)]
pub(super) struct FreeList {
    /// The `count` ranges, then [`PAD`] slots: a multiple of [`GROUP`] slots, more than
    /// `count`.
    slots: Vec<(u64, u64)>,
    /// Ranges held.
    count: usize,
    /// At least the longest range's length: a request longer than it fits nowhere in
    /// the list, which first fit then answers without a scan. Raised by a free that
    /// makes a longer range, brought down to the longest range by a first fit that
    /// scanned and found nothing; a carve leaves it (so the usual allocation pays
    /// nothing for it).
    bound: u64,
}

impl FreeList {
    /// A list with one free range.
    pub(super) fn whole(addr: u64, len: u64) -> FreeList {
        let mut slots = vec![PAD; MIN_GROUPS * GROUP];
        slots[0] = (addr, len);
        FreeList {
            slots,
            count: 1,
            bound: len,
        }
    }

    /// The free ranges, (address, length), by address.
    #[inline]
    pub(super) fn ranges(&self) -> &[(u64, u64)] {
        &self.slots[..self.count]
    }

    /// Whether the list is the single range `addr..addr + len`.
    #[inline]
    pub(super) fn is_whole(&self, addr: u64, len: u64) -> bool {
        self.count == 1 && self.slots[0] == (addr, len)
    }

    /// Whether some free range holds `bytes` (RMM's `superblock::fits`).
    #[cfg(test)]
    pub(super) fn fits(&self, bytes: u64) -> bool {
        self.first_fitting(bytes).is_some()
    }

    /// [`FreeList::peek`], bringing the bound down to the longest range when nothing
    /// fits (as a failed [`FreeList::carve_first`] does).
    pub(super) fn peek_lowering(&mut self, bytes: u64) -> Option<u64> {
        let found = self.peek(bytes);
        if found.is_none() {
            self.bound = self.bound.min(self.scan_widest());
        }
        found
    }

    /// At least the longest free range's length: nothing longer fits.
    #[inline]
    pub(super) fn bound(&self) -> u64 {
        self.bound
    }

    /// The longest range's length (0 for none), by a scan.
    fn scan_widest(&self) -> u64 {
        self.ranges().iter().map(|&(_, len)| len).max().unwrap_or(0)
    }

    /// The slots of the groups that hold ranges: the ranges and at least one padding
    /// slot, and never fewer than [`MIN_GROUPS`] groups.
    #[inline(always)]
    fn groups(&self) -> &[(u64, u64)] {
        &self.slots[..(self.count / GROUP + 1).max(MIN_GROUPS) * GROUP]
    }

    /// The index of the first range (by address) that holds `bytes`.
    #[inline(always)]
    fn first_fitting(&self, bytes: u64) -> Option<usize> {
        if self.bound < bytes {
            return None;
        }
        self.scan_first(bytes)
    }

    /// [`FreeList::first_fitting`] by the search alone.
    #[inline(always)]
    fn scan_first(&self, bytes: u64) -> Option<usize> {
        // A bit per slot of a group that holds `bytes`, then the lowest: the group is
        // read whole (a fixed length, unrolled), and a long list is not read past the
        // group that fits.
        for (g, group) in self.groups().chunks_exact(GROUP).enumerate() {
            let fits = group.iter().enumerate().fold(0u32, |fits, (i, &(_, len))| {
                fits | (u32::from(len >= bytes) << i)
            });
            if fits != 0 {
                return Some(g * GROUP + fits.trailing_zeros() as usize);
            }
        }
        None
    }

    /// The address of the first range that holds `bytes`, without carving it.
    pub(super) fn peek(&self, bytes: u64) -> Option<u64> {
        self.first_fitting(bytes).map(|i| self.slots[i].0)
    }

    /// Address-ordered first fit: carves `bytes` from the front of the first range that
    /// holds them.
    #[inline(always)]
    #[cfg(test)]
    pub(super) fn first_fit(&mut self, bytes: u64) -> Option<u64> {
        if self.bound < bytes {
            return None;
        }
        self.carve_first(bytes)
    }

    /// [`FreeList::first_fit`] without the bound's test, for a caller that made it (on
    /// its own copy of the bound): searches the ranges, and brings the bound down to the
    /// longest range when none holds `bytes`.
    #[inline(always)]
    pub(super) fn carve_first(&mut self, bytes: u64) -> Option<u64> {
        let Some(i) = self.scan_first(bytes) else {
            self.bound = self.bound.min(self.scan_widest());
            return None;
        };
        let (addr, len) = self.slots[i];
        if len > bytes {
            // The rest starts above `addr` and below the next range: same place.
            self.slots[i] = (addr + bytes, len - bytes);
        } else {
            self.remove(i);
        }
        Some(addr)
    }

    /// Removes the range at `i`: the ranges above it move down, with the first padding
    /// slot (so the move is never empty, and the slot the last range leaves is
    /// padding).
    #[inline(always)]
    fn remove(&mut self, i: usize) {
        let count = self.count;
        self.slots.copy_within(i + 1..count + 1, i);
        self.count = count - 1;
    }

    /// Returns a range, merging it with free neighbours.
    #[inline(always)]
    pub(super) fn insert(&mut self, addr: u64, len: u64) {
        let end = addr + len;
        let count = self.count;
        // Ranges before `i` start below `addr`; `i` and after at or above it. `i` is a
        // range or the first padding slot, which no range ends at.
        let i = self.groups().partition_point(|&(a, _)| a < addr);
        let (next, next_len) = self.slots[i];
        // The previous range's end, or 0 where there is none (read without a test).
        let has_prev = i > 0;
        let (prev, prev_len) = self.slots[i - usize::from(has_prev)];
        let prev_end = (prev + prev_len) & 0u64.wrapping_sub(u64::from(has_prev));
        assert!(
            prev_end <= addr && next >= end,
            "arena: freed range {addr:#x} overlaps a free range"
        );
        let merge_prev = has_prev & (prev_end == addr);
        let merge_next = next == end;
        if merge_prev != merge_next {
            // One neighbour: it grows in place, by `len`, starting at `addr` when it is
            // the next one (no branch on which).
            // (Both choices are between values already in registers, which the compiler
            // makes a conditional move rather than a branch; a choice of a value still
            // to be loaded it would make a branch.)
            let j = i - usize::from(merge_prev);
            let start = if merge_prev { prev } else { addr };
            let grown = self.slots[j].1 + len;
            self.slots[j] = (start, grown);
            self.bound = self.bound.max(grown);
        } else {
            // Both (the previous range swallows the block and the next range, and the
            // ranges above move down) or neither (a new range at `i`, and the ones
            // above move up): one path, the move's direction chosen without a branch.
            // The first padding slot moves with them, so the move is never empty; a
            // second padding slot makes room for a move up.
            if count + 2 > self.slots.len() {
                self.slots.resize(self.slots.len() + GROUP, PAD);
            }
            let both = usize::from(merge_next);
            let lo = i - both;
            self.slots.copy_within(i + both..count + 1, lo + 1);
            let start = if merge_prev { prev } else { addr };
            let merged = if merge_prev { prev_len + next_len } else { 0 };
            self.slots[lo] = (start, len + merged);
            self.bound = self.bound.max(len + merged);
            self.count = count + 1 - 2 * both;
        }
    }

    /// Panics unless the ranges lie in `lo..hi`, are non-empty, disjoint and coalesced,
    /// and the padding fills the rest of whole groups.
    pub(super) fn check(&self, lo: u64, hi: u64, what: &str) {
        assert!(
            self.slots.len() % GROUP == 0
                && self.slots.len() >= MIN_GROUPS * GROUP
                && self.count < self.slots.len()
                && self.slots[self.count..].iter().all(|&s| s == PAD),
            "arena: free list of {what} without its padding"
        );
        let mut prev_end = None;
        for &(addr, len) in self.ranges() {
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
        }
        assert!(
            self.bound >= self.scan_widest(),
            "arena: a free range of {what} is longer than the bound kept"
        );
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
                prop_assert_eq!(list.ranges(), &model.ranges.iter().map(|(&a, &l)| (a, l)).collect::<Vec<_>>());
                prop_assert_eq!(list.peek(512), model.ranges.iter().find(|(_, &l)| l >= 512).map(|(&a, _)| a));
                prop_assert!(list.bound() >= model.ranges.values().copied().max().unwrap_or(0));
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
        assert_eq!(list.ranges().len(), 11);
        assert_eq!(list.peek(1024), Some(30 * 512));
        assert_eq!(list.peek(512), Some(0));
        assert!(list.ranges().iter().map(|r| r.1).sum::<u64>() >= 4096);
        assert_eq!(list.first_fit(4096), None);
        assert_eq!(list.first_fit(1024), Some(30 * 512));
        assert_eq!(list.ranges().len(), 10);
    }

    /// A list longer than two groups widens with padding, and ranges freed at the
    /// front, between two free ranges and at the back move the ranges above them up,
    /// down and not at all, the padding with them.
    #[test]
    fn long_lists_keep_their_padding() {
        const BASE: u64 = 1 << 20;
        const END: u64 = BASE + 64 * 512;
        let mut list = FreeList::whole(BASE, 64 * 512);
        let blocks: Vec<u64> = (0..64).map(|_| list.first_fit(512).unwrap()).collect();
        assert!(list.ranges().is_empty());
        list.check(BASE, END, "test range");
        // Every other block, from the top down: each a new range at the front.
        for &addr in blocks.iter().step_by(2).rev() {
            list.insert(addr, 512);
            list.check(BASE, END, "test range");
            assert_eq!(list.ranges()[0], (addr, 512));
        }
        assert_eq!(list.ranges().len(), 32);
        // The others from the bottom up: each merges with the ranges on both sides,
        // the last with the one below.
        for &addr in blocks.iter().skip(1).step_by(2) {
            list.insert(addr, 512);
            list.check(BASE, END, "test range");
        }
        assert!(list.is_whole(BASE, 64 * 512));
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
