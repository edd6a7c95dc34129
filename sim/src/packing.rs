//! The simulated driver's packing of small allocations into shared pages (see
//! [`crate::SimDevice`]'s charge model): best fit over the free holes of every partly
//! used page, ties to the oldest page, then the lowest offset; a new page when no hole
//! holds the request; a page returned with its last allocation.
//!
//! The rule fixes which hole is chosen; this module only finds it fast. Pages live in
//! a slot table, each with its holes in a short vector sorted by offset (a page of
//! 2 MiB at 512-byte alignment has at most 2 048 holes). Every hole is also in one
//! index ordered by (length, page age, offset): holes are binned by length (for the
//! H100's 2 MiB pages and 512-byte alignment one bin per possible length), a bitmap
//! of non-empty bins finds the next bin that holds a long enough hole in a few
//! instructions, and each bin keeps its holes sorted, in a vector while they are few
//! and in an ordered map when many (thousands of equal holes in as many pages).

use std::collections::BTreeMap;

use crate::address::Placed;

/// About this many bins at most (the bin width grows for pages of more than this many
/// alignment units).
const MAX_BINS: u64 = 4096;
/// A bin holding more holes than this becomes an ordered map (a vector's insertions
/// and removals move every later entry); it goes back to a vector below
/// [`SHRINK_BELOW`].
const GROW_ABOVE: usize = 64;
/// See [`GROW_ABOVE`].
const SHRINK_BELOW: usize = 16;

/// A hole's place in the best-fit order: (length, page age, offset in the page).
type Key = (u64, u64, u64);

/// The holes of one bin in best-fit order, each with its page's slot.
#[derive(Debug)]
enum Bin {
    /// The usual case: a few holes, sorted.
    Few(Vec<(Key, u32)>),
    /// Many holes of about one length.
    Many(BTreeMap<Key, u32>),
}

impl Bin {
    #[inline]
    fn is_empty(&self) -> bool {
        match self {
            Bin::Few(v) => v.is_empty(),
            Bin::Many(m) => m.is_empty(),
        }
    }

    /// (The short form inline; growing and the ordered map out of line.)
    #[inline(always)]
    fn insert(&mut self, key: Key, slot: u32) {
        match self {
            Bin::Few(v) if v.len() < GROW_ABOVE => {
                let i = v.partition_point(|&(k, _)| k < key);
                debug_assert!(
                    v.get(i).is_none_or(|&(k, _)| k != key),
                    "hole indexed twice"
                );
                v.insert(i, (key, slot));
            }
            _ => self.insert_slow(key, slot),
        }
    }

    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, key: Key, slot: u32) {
        match self {
            Bin::Few(v) => {
                let mut m: BTreeMap<Key, u32> = v.iter().copied().collect();
                let old = m.insert(key, slot);
                debug_assert!(old.is_none(), "hole indexed twice");
                *self = Bin::Many(m);
            }
            Bin::Many(m) => {
                let old = m.insert(key, slot);
                debug_assert!(old.is_none(), "hole indexed twice");
            }
        }
    }

    #[inline(always)]
    fn remove(&mut self, key: Key) {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|&(k, _)| k < key);
                if v.get(i).is_none_or(|&(k, _)| k != key) {
                    missing_hole();
                }
                v.remove(i);
            }
            Bin::Many(_) => self.remove_slow(key),
        }
    }

    #[cold]
    #[inline(never)]
    fn remove_slow(&mut self, key: Key) {
        if let Bin::Many(m) = self {
            if m.remove(&key).is_none() {
                missing_hole();
            }
            if m.len() < SHRINK_BELOW {
                *self = Bin::Few(m.iter().map(|(&k, &s)| (k, s)).collect());
            }
        }
    }

    /// The first hole at or after `from` in best-fit order.
    #[cfg(test)]
    fn first_from(&self, from: Key) -> Option<(Key, u32)> {
        match self {
            Bin::Few(v) => v.get(v.partition_point(|&(k, _)| k < from)).copied(),
            Bin::Many(m) => m.range(from..).next().map(|(&k, &s)| (k, s)),
        }
    }

    /// Removes and returns the first hole at or after `from` in best-fit order.
    #[inline(always)]
    fn take_from(&mut self, from: Key) -> Option<(Key, u32)> {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|&(k, _)| k < from);
                (i < v.len()).then(|| v.remove(i))
            }
            Bin::Many(_) => self.take_from_slow(from),
        }
    }

    #[cold]
    #[inline(never)]
    fn take_from_slow(&mut self, from: Key) -> Option<(Key, u32)> {
        let Bin::Many(m) = self else { return None };
        let (&k, _) = m.range(from..).next()?;
        let slot = m.remove(&k).expect("the hole just found");
        if m.len() < SHRINK_BELOW {
            *self = Bin::Few(m.iter().map(|(&k, &s)| (k, s)).collect());
        }
        Some((k, slot))
    }
}

/// The panic of a hole missing from the index (a bookkeeping bug), out of line.
#[cold]
#[inline(never)]
fn missing_hole() -> ! {
    panic!("SimDevice: a page's hole is missing from the best-fit index")
}

/// Every hole of every page, in best-fit order (see the module docs).
#[derive(Debug)]
struct HoleIndex {
    /// log2 of the bin width in bytes.
    shift: u32,
    bins: Vec<Bin>,
    /// One bit per non-empty bin.
    bits: Vec<u64>,
    /// One bit per non-zero word of `bits`.
    summary: Vec<u64>,
}

impl HoleIndex {
    /// An index for holes shorter than `page_bytes`, binned by `align`-byte units
    /// (widened so that there are at most [`MAX_BINS`] bins).
    fn new(page_bytes: u64, align: u64) -> HoleIndex {
        let mut shift = align.max(1).ilog2();
        while page_bytes >> shift > MAX_BINS {
            shift += 1;
        }
        let count = (page_bytes >> shift) as usize + 1;
        let words = count.div_ceil(64);
        HoleIndex {
            shift,
            bins: (0..count).map(|_| Bin::Few(Vec::new())).collect(),
            bits: vec![0; words],
            summary: vec![0; words.div_ceil(64)],
        }
    }

    /// An index with no bins, for a device that has packed nothing yet.
    fn unbuilt() -> HoleIndex {
        HoleIndex {
            shift: 0,
            bins: Vec::new(),
            bits: Vec::new(),
            summary: Vec::new(),
        }
    }

    /// The bin of a hole of `len` bytes: non-decreasing in `len`.
    #[inline(always)]
    fn bin_of(&self, len: u64) -> usize {
        ((len >> self.shift) as usize).min(self.bins.len() - 1)
    }

    #[inline(always)]
    fn insert(&mut self, key: Key, slot: u32) {
        let b = self.bin_of(key.0);
        if self.bins[b].is_empty() {
            self.bits[b / 64] |= 1 << (b % 64);
            self.summary[b / 4096] |= 1 << (b / 64 % 64);
        }
        self.bins[b].insert(key, slot);
    }

    #[inline(always)]
    fn remove(&mut self, key: Key) {
        let b = self.bin_of(key.0);
        self.bins[b].remove(key);
        self.note_if_empty(b);
    }

    /// Clears the bits of bin `b` if it is empty.
    #[inline(always)]
    fn note_if_empty(&mut self, b: usize) {
        if self.bins[b].is_empty() {
            self.bits[b / 64] &= !(1 << (b % 64));
            if self.bits[b / 64] == 0 {
                self.summary[b / 4096] &= !(1 << (b / 64 % 64));
            }
        }
    }

    /// The first non-empty bin after `bin`.
    fn next_bin_after(&self, bin: usize) -> Option<usize> {
        let from = bin + 1;
        let w = from / 64;
        if w >= self.bits.len() {
            return None;
        }
        let m = self.bits[w] & (!0u64 << (from % 64));
        if m != 0 {
            return Some(w * 64 + m.trailing_zeros() as usize);
        }
        let next_word = w + 1;
        let mut s = next_word / 64;
        let mut mask = if next_word % 64 == 0 {
            !0u64
        } else {
            !0u64 << (next_word % 64)
        };
        while s < self.summary.len() {
            let m = self.summary[s] & mask;
            if m != 0 {
                let word = s * 64 + m.trailing_zeros() as usize;
                return Some(word * 64 + self.bits[word].trailing_zeros() as usize);
            }
            s += 1;
            mask = !0;
        }
        None
    }

    /// The best fit for `len` bytes: the first hole in (length, page age, offset) order
    /// at least `len` long.
    #[cfg(test)]
    fn best_fit(&self, len: u64) -> Option<(Key, u32)> {
        let b = self.bin_of(len);
        if let Some(hit) = self.bins[b].first_from((len, 0, 0)) {
            return Some(hit);
        }
        let next = self.next_bin_after(b)?;
        self.bins[next].first_from((0, 0, 0))
    }

    /// Removes and returns the best fit for `len` bytes ([`HoleIndex::best_fit`]).
    #[inline(always)]
    fn take_best_fit(&mut self, len: u64) -> Option<(Key, u32)> {
        if self.bins.is_empty() {
            return None;
        }
        let b = self.bin_of(len);
        let (bin, hit) = match self.bins[b].take_from((len, 0, 0)) {
            Some(hit) => (b, hit),
            None => {
                let next = self.next_bin_after(b)?;
                (next, self.bins[next].take_from((0, 0, 0))?)
            }
        };
        self.note_if_empty(bin);
        Some(hit)
    }
}

/// One shared page.
#[derive(Debug)]
struct Page {
    base: u64,
    /// Creation order: ties between equal holes go to the oldest page.
    seq: u64,
    /// Live allocations in it.
    live: u64,
    /// Free holes as (offset, length), sorted by offset, never adjacent.
    holes: Vec<(u64, u64)>,
    /// The page's placement in the driver's address space, if the device keeps one.
    va: Option<Placed>,
}

/// The packed pages of one device (see the module docs).
#[derive(Debug)]
pub(crate) struct PackedPages {
    page_bytes: u64,
    align: u64,
    /// Pages by slot; `None` for a free slot.
    pages: Vec<Option<Page>>,
    free_slots: Vec<u32>,
    /// Hole vectors of returned pages, kept for new pages (no allocation per page).
    spare_holes: Vec<Vec<(u64, u64)>>,
    next_seq: u64,
    index: HoleIndex,
}

impl PackedPages {
    /// No pages yet; pages of `page_bytes`, allocations aligned to `align` bytes.
    pub(crate) fn new(page_bytes: u64, align: u64) -> PackedPages {
        let align = align.max(1);
        PackedPages {
            page_bytes,
            align,
            pages: Vec::new(),
            free_slots: Vec::new(),
            spare_holes: Vec::new(),
            next_seq: 0,
            index: HoleIndex::unbuilt(),
        }
    }

    /// The base address of every live page.
    pub(crate) fn bases(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.iter().flatten().map(|p| p.base)
    }

    /// Bytes `size` takes in a page: rounded up to the alignment.
    pub(crate) fn footprint(&self, size: u64) -> u64 {
        if self.align.is_power_of_two() {
            // `size` is below a page, far from overflowing; a mask, not a division.
            (size + (self.align - 1)) & !(self.align - 1)
        } else {
            size.div_ceil(self.align) * self.align
        }
    }

    fn page_mut(&mut self, slot: u32) -> &mut Page {
        self.pages[slot as usize]
            .as_mut()
            .expect("SimDevice: packed page of a live allocation")
    }

    /// Places `size` bytes in the best-fitting hole of a live page: its page's slot
    /// and its address, or `None` when no hole holds it.
    #[inline]
    pub(crate) fn take(&mut self, size: u64) -> Option<(u32, u64)> {
        let len = self.footprint(size);
        let ((hole_len, seq, offset), slot) = self.index.take_best_fit(len)?;
        let page = self.page_mut(slot);
        let i = page.holes.partition_point(|&(o, _)| o < offset);
        debug_assert_eq!(page.holes[i], (offset, hole_len));
        if hole_len > len {
            // The rest of the hole stays where the hole was in the page's order.
            page.holes[i] = (offset + len, hole_len - len);
        } else {
            page.holes.remove(i);
        }
        page.live += 1;
        let addr = page.base + offset;
        if hole_len > len {
            self.index.insert((hole_len - len, seq, offset + len), slot);
        }
        Some((slot, addr))
    }

    /// Opens a new page at `base` (placed as `va`) with one allocation of `size` bytes
    /// at its start; returns the page's slot.
    pub(crate) fn open(&mut self, base: u64, size: u64, va: Option<Placed>) -> u32 {
        if self.index.bins.is_empty() {
            // Built with the first page: devices that never pack keep no bins.
            self.index = HoleIndex::new(self.page_bytes, self.align);
        }
        let len = self.footprint(size);
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut page = Page {
            base,
            seq,
            live: 1,
            holes: self.spare_holes.pop().unwrap_or_default(),
            va,
        };
        if self.page_bytes > len {
            page.holes.push((len, self.page_bytes - len));
        }
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.pages[s as usize] = Some(page);
                s
            }
            None => {
                self.pages.push(Some(page));
                u32::try_from(self.pages.len() - 1).expect("fewer than 2^32 live pages")
            }
        };
        if self.page_bytes > len {
            self.index.insert((self.page_bytes - len, seq, len), slot);
        }
        slot
    }

    /// Returns `size` bytes at `addr` to their page, merging holes; the page's base and
    /// placement when that was its last allocation (the page is then gone).
    #[inline]
    pub(crate) fn give_back(
        &mut self,
        slot: u32,
        addr: u64,
        size: u64,
    ) -> Option<(u64, Option<Placed>)> {
        let len = self.footprint(size);
        let page = self.page_mut(slot);
        page.live -= 1;
        if page.live == 0 {
            let mut page = self.pages[slot as usize].take().expect("live page");
            for &(offset, hole_len) in &page.holes {
                self.index.remove((hole_len, page.seq, offset));
            }
            self.free_slots.push(slot);
            page.holes.clear();
            self.spare_holes.push(page.holes);
            return Some((page.base, page.va));
        }
        let seq = page.seq;
        let offset = addr - page.base;
        let i = page.holes.partition_point(|&(o, _)| o < offset);
        let before = i
            .checked_sub(1)
            .map(|j| page.holes[j])
            .filter(|&(o, l)| o + l == offset);
        let after = page
            .holes
            .get(i)
            .copied()
            .filter(|&(o, _)| o == offset + len);
        let merged = match (before, after) {
            (Some((o, l)), Some((_, al))) => {
                page.holes[i - 1] = (o, l + len + al);
                page.holes.remove(i);
                (o, l + len + al)
            }
            (Some((o, l)), None) => {
                page.holes[i - 1] = (o, l + len);
                (o, l + len)
            }
            (None, Some((_, al))) => {
                page.holes[i] = (offset, len + al);
                (offset, len + al)
            }
            (None, None) => {
                page.holes.insert(i, (offset, len));
                (offset, len)
            }
        };
        if let Some((o, l)) = before {
            self.index.remove((l, seq, o));
        }
        if let Some((o, l)) = after {
            self.index.remove((l, seq, o));
        }
        self.index.insert((merged.1, seq, merged.0), slot);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const MIB: u64 = 1 << 20;

    /// The packing as it was first written (ordered maps of holes), the reference the
    /// fast version must agree with placement for placement.
    struct Reference {
        page_bytes: u64,
        align: u64,
        /// page id → (base, holes offset → length, live)
        pages: BTreeMap<u64, (u64, BTreeMap<u64, u64>, u64)>,
        holes: BTreeSet<(u64, u64, u64)>,
        next: u64,
    }

    impl Reference {
        fn take(&mut self, size: u64) -> Option<u64> {
            let len = size.div_ceil(self.align) * self.align;
            let hole = self.holes.range((len, 0, 0)..).next().copied()?;
            let (hole_len, p, offset) = hole;
            self.holes.remove(&hole);
            let pg = self.pages.get_mut(&p).unwrap();
            pg.1.remove(&offset);
            if hole_len > len {
                pg.1.insert(offset + len, hole_len - len);
                self.holes.insert((hole_len - len, p, offset + len));
            }
            pg.2 += 1;
            Some(pg.0 + offset)
        }

        fn open(&mut self, base: u64, size: u64) {
            let len = size.div_ceil(self.align) * self.align;
            let p = self.next;
            self.next += 1;
            let mut holes = BTreeMap::new();
            if self.page_bytes > len {
                holes.insert(len, self.page_bytes - len);
                self.holes.insert((self.page_bytes - len, p, len));
            }
            self.pages.insert(p, (base, holes, 1));
        }

        fn give_back(&mut self, addr: u64, size: u64) -> Option<u64> {
            let (&p, _) = self
                .pages
                .iter()
                .find(|(_, pg)| pg.0 <= addr && addr < pg.0 + self.page_bytes)
                .unwrap();
            let pg = self.pages.get_mut(&p).unwrap();
            pg.2 -= 1;
            if pg.2 == 0 {
                for (&o, &l) in &pg.1 {
                    self.holes.remove(&(l, p, o));
                }
                let base = pg.0;
                self.pages.remove(&p);
                return Some(base);
            }
            let mut offset = addr - pg.0;
            let mut len = size.div_ceil(self.align) * self.align;
            if let Some((&b, &bl)) = pg.1.range(..offset).next_back() {
                if b + bl == offset {
                    pg.1.remove(&b);
                    self.holes.remove(&(bl, p, b));
                    offset = b;
                    len += bl;
                }
            }
            if let Some(al) = pg.1.remove(&(offset + len)) {
                self.holes.remove(&(al, p, offset + len));
                len += al;
            }
            pg.1.insert(offset, len);
            self.holes.insert((len, p, offset));
            None
        }
    }

    /// A small deterministic generator (xorshift64*), so the test needs no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Runs one random sequence of allocations and frees through both and checks that
    /// every placement, every opened and every returned page agree.
    fn agree(seed: u64, page_bytes: u64, align: u64, max_size: u64, steps: usize) {
        let mut fast = PackedPages::new(page_bytes, align);
        let mut reference = Reference {
            page_bytes,
            align,
            pages: BTreeMap::new(),
            holes: BTreeSet::new(),
            next: 0,
        };
        let mut rng = Rng(seed | 1);
        let mut live: Vec<(u32, u64, u64)> = Vec::new();
        let mut next_base = 1u64 << 40;
        for step in 0..steps {
            // Bias towards allocation while few are live, so pages fill up.
            if live.is_empty() || rng.below(100) < 55 {
                // Sizes log-uniform-ish, some equal, some tiny.
                let size = match rng.below(4) {
                    0 => 1 + rng.below(max_size),
                    1 => 1 + rng.below(max_size / 64 + 1),
                    2 => align * (1 + rng.below(8)),
                    _ => 1 + (rng.below(max_size) >> rng.below(12)),
                };
                let size = size.min(max_size).max(1);
                let got = fast.take(size);
                let want = reference.take(size);
                assert_eq!(
                    got.map(|g| g.1),
                    want,
                    "seed {seed} step {step}: take {size}"
                );
                match got {
                    Some((slot, addr)) => live.push((slot, addr, size)),
                    None => {
                        let base = next_base;
                        next_base += page_bytes;
                        let slot = fast.open(base, size, None);
                        reference.open(base, size);
                        live.push((slot, base, size));
                    }
                }
            } else {
                let i = rng.below(live.len() as u64) as usize;
                let (slot, addr, size) = live.swap_remove(i);
                assert_eq!(
                    fast.give_back(slot, addr, size).map(|(b, _)| b),
                    reference.give_back(addr, size),
                    "seed {seed} step {step}: free {size} at {addr:#x}"
                );
            }
        }
        while let Some((slot, addr, size)) = live.pop() {
            assert_eq!(
                fast.give_back(slot, addr, size).map(|(b, _)| b),
                reference.give_back(addr, size)
            );
        }
        assert!(fast.pages.iter().all(Option::is_none));
        assert!(
            fast.index.bits.iter().all(|&w| w == 0),
            "index left non-empty"
        );
    }

    /// Random sequences on the H100's pages (2 MiB, 512-byte alignment) place every
    /// allocation where the ordered-map packing does, from tiny to almost a page.
    #[test]
    fn agrees_with_the_ordered_map_packing() {
        for seed in 1..40 {
            agree(seed, 2 * MIB, 512, 2 * MIB - 1, 3000);
        }
    }

    /// Many equal small allocations (bins that become ordered maps and back), and
    /// other page and alignment sizes (bins wider than one unit), agree too.
    #[test]
    fn agrees_with_many_equal_holes_and_other_geometries() {
        for seed in 1..6 {
            agree(seed, 2 * MIB, 512, 4096, 20_000);
            agree(seed, 64 * MIB, 1, 64 * MIB - 1, 3000);
            agree(seed, 3 * MIB + 7, 1000, 3 * MIB, 3000);
            agree(seed, 4096, 512, 4095, 3000);
        }
    }

    /// The bitmap finds the next non-empty bin across words, and bins wider than one
    /// length hold holes shorter than the request, which are passed over.
    #[test]
    fn next_bin_crosses_words() {
        let mut index = HoleIndex::new(2 * MIB, 512);
        let n = index.bins.len();
        assert_eq!(n, 4097);
        for b in [0, 63, 64, 1000, n - 1] {
            index.insert(((b as u64) << index.shift, 0, 0), 0);
        }
        assert_eq!(index.next_bin_after(0), Some(63));
        assert_eq!(index.next_bin_after(63), Some(64));
        assert_eq!(index.next_bin_after(64), Some(1000));
        assert_eq!(index.next_bin_after(1000), Some(n - 1));
        assert_eq!(index.next_bin_after(n - 1), None);
        let mut wide = HoleIndex::new(64 * MIB, 1);
        assert!(wide.bins.len() == 4097 && wide.shift == 14);
        wide.insert((40_000, 1, 0), 7);
        wide.insert((33_000, 0, 0), 8);
        assert_eq!(wide.best_fit(35_000), Some(((40_000, 1, 0), 7)));
        assert_eq!(wide.best_fit(33_000), Some(((33_000, 0, 0), 8)));
        assert_eq!(wide.best_fit(40_001), None);
    }
}
