//! The simulated driver's packing of small allocations into shared pages (see
//! [`crate::SimDevice`]'s charge model): best fit over the free holes of every partly
//! used page, ties to the oldest page, then the lowest offset; a new page when no hole
//! holds the request; a page returned with its last allocation.
//!
//! The rule fixes which hole is chosen; this module only finds it fast. Each page is
//! tiled by blocks (its live allocations and its free holes, never two holes side by
//! side), kept in one table of [`Block`]s indexed by a `u32` handle and linked in
//! address order within their page, so a freed allocation finds the holes it merges
//! with through its own links, without a search. Every hole is also in one index
//! ordered by (length, page age, offset): holes are binned by length (for the H100's
//! 2 MiB pages and 512-byte alignment one bin per possible length), a bitmap of
//! non-empty bins finds the next bin that holds a long enough hole in a few
//! instructions, and each bin is a doubly linked list of its holes in that order whose
//! links live in the blocks themselves: a hole leaves the index by its handle, without
//! a search, and a bin's own memory is a head and a length. A bin holding many holes
//! (thousands of equal holes in as many pages) also keeps an ordered map of them,
//! which finds where a hole goes without walking the list.

use std::collections::BTreeMap;

use crate::address::Placed;

/// About this many bins at most (the bin width grows for pages of more than this many
/// alignment units).
const MAX_BINS: u64 = 4096;
/// A bin holding more holes than this also keeps an ordered map of them (finding a
/// hole's place would walk every hole before it); the map goes again below
/// [`SHRINK_BELOW`].
const GROW_ABOVE: u32 = 64;
/// See [`GROW_ABOVE`].
const SHRINK_BELOW: u32 = 16;

/// No block (the end of a list): handle 0, the table's sentinel, which is never a
/// page's block. A link that may be NIL is written through without a test (the write
/// lands in the sentinel, which nothing reads), and the sentinel is never a hole, so
/// "is the block before a hole" needs no test for NIL: those tests followed the
/// trace's random sizes and lifetimes, and mispredicted about a third of the time.
const NIL: u32 = 0;

/// The block behind [`NIL`] (see there): never free.
const SENTINEL: Block = Block {
    offset: u64::MAX,
    len: u64::MAX,
    seq: u64::MAX,
    page: u32::MAX,
    prev: NIL,
    next: NIL,
    bin_prev: NIL,
    bin_next: NIL,
    free: false,
};

/// A hole's place in the best-fit order: (length, page age, offset in the page).
type Key = (u64, u64, u64);

/// One piece of a packed page: a live allocation or a free hole.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// Offset in its page.
    offset: u64,
    /// Bytes it covers (an allocation's footprint, or a hole's length).
    len: u64,
    /// Its page's creation order (a hole's key needs it without a page lookup).
    seq: u64,
    /// Its page's slot.
    page: u32,
    /// The blocks before and after it in its page, by address ([`NIL`] at the ends).
    prev: u32,
    next: u32,
    /// While a hole: its neighbours in its bin's list ([`NIL`] at the ends).
    bin_prev: u32,
    bin_next: u32,
    /// A hole (in the index), not a live allocation.
    free: bool,
}

impl Block {
    #[inline(always)]
    fn key(&self) -> Key {
        (self.len, self.seq, self.offset)
    }
}

/// The blocks of every page, by handle (handle 0 the [`SENTINEL`]); freed handles are
/// reused.
#[derive(Debug)]
struct Blocks {
    items: Vec<Block>,
    free: Vec<u32>,
}

impl Default for Blocks {
    fn default() -> Self {
        Blocks {
            items: vec![SENTINEL],
            free: Vec::new(),
        }
    }
}

impl Blocks {
    #[inline(always)]
    fn add(&mut self, block: Block) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = block;
                id
            }
            None => {
                self.items.push(block);
                // Below `u32::MAX`, which the device keeps for "not packed".
                u32::try_from(self.items.len() - 1)
                    .ok()
                    .filter(|&id| id != u32::MAX)
                    .expect("fewer than 2^32 - 1 packed blocks")
            }
        }
    }
}

impl std::ops::Index<u32> for Blocks {
    type Output = Block;
    #[inline(always)]
    fn index(&self, id: u32) -> &Block {
        &self.items[id as usize]
    }
}

impl std::ops::IndexMut<u32> for Blocks {
    #[inline(always)]
    fn index_mut(&mut self, id: u32) -> &mut Block {
        &mut self.items[id as usize]
    }
}

/// One length bin of the [`HoleIndex`]: its list of holes.
#[derive(Clone, Copy, Debug)]
struct Bin {
    /// First hole of the list ([`NIL`] when empty).
    head: u32,
    /// Holes in it.
    count: u32,
}

/// A bin with no holes.
const EMPTY_BIN: Bin = Bin {
    head: NIL,
    count: 0,
};

/// Every hole of every page, in best-fit order (see the module docs).
#[derive(Debug)]
struct HoleIndex {
    /// log2 of the bin width in bytes.
    shift: u32,
    /// Each bin's head and count, one record (one bounds check and one cache line per
    /// bin touched).
    bins: Vec<Bin>,
    /// Whether each bin keeps an ordered map in `crowded`. Such a bin holds at least
    /// [`SHRINK_BELOW`] holes (the map goes below that), so this is read only for a bin
    /// holding that many.
    has_map: Vec<bool>,
    /// The ordered maps of bins that grew past [`GROW_ABOVE`] holes, by bin.
    crowded: BTreeMap<usize, BTreeMap<Key, u32>>,
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
            bins: vec![EMPTY_BIN; count],
            has_map: vec![false; count],
            crowded: BTreeMap::new(),
            bits: vec![0; words],
            summary: vec![0; words.div_ceil(64)],
        }
    }

    /// An index with no bins, for a device that has packed nothing yet.
    fn unbuilt() -> HoleIndex {
        HoleIndex {
            shift: 0,
            bins: Vec::new(),
            has_map: Vec::new(),
            crowded: BTreeMap::new(),
            bits: Vec::new(),
            summary: Vec::new(),
        }
    }

    /// The bin of a hole of `len` bytes: non-decreasing in `len`.
    #[inline(always)]
    fn bin_of(&self, len: u64) -> usize {
        ((len >> self.shift) as usize).min(self.bins.len() - 1)
    }

    /// Marks bin `b` non-empty in the bitmaps.
    #[inline(always)]
    fn mark(&mut self, b: usize) {
        self.bits[b / 64] |= 1 << (b % 64);
        self.summary[b / 4096] |= 1 << (b / 64 % 64);
    }

    /// Marks bin `b` empty in the bitmaps.
    #[inline(always)]
    fn unmark(&mut self, b: usize) {
        let word = &mut self.bits[b / 64];
        *word &= !(1 << (b % 64));
        // Without a branch: whether the word emptied depends on the other holes of
        // its 64 bins, about as often one way as the other.
        let emptied = u64::from(*word == 0);
        self.summary[b / 4096] &= !(emptied << (b / 64 % 64));
    }

    /// Puts hole `id` (its key read from `blocks`) in its place in the index.
    #[inline(always)]
    fn insert(&mut self, blocks: &mut [Block], id: u32) {
        let key = blocks[id as usize].key();
        let b = self.bin_of(key.0);
        let bin = &mut self.bins[b];
        let count = bin.count;
        bin.count = count + 1;
        if count == 0 {
            bin.head = id;
            let h = &mut blocks[id as usize];
            h.bin_prev = NIL;
            h.bin_next = NIL;
            self.mark(b);
            return;
        }
        let head = bin.head;
        debug_assert!(count >= SHRINK_BELOW || !self.has_map[b]);
        let prev = if count < SHRINK_BELOW || (count < GROW_ABOVE && !self.has_map[b]) {
            // A short list: walk it to the first hole after `key`.
            let mut prev = NIL;
            let mut cur = head;
            while cur != NIL && blocks[cur as usize].key() < key {
                prev = cur;
                cur = blocks[cur as usize].bin_next;
            }
            prev
        } else {
            self.crowded_prev(blocks, b, key, id)
        };
        let next = if prev == NIL {
            std::mem::replace(&mut self.bins[b].head, id)
        } else {
            std::mem::replace(&mut blocks[prev as usize].bin_next, id)
        };
        blocks[next as usize].bin_prev = id;
        let h = &mut blocks[id as usize];
        h.bin_prev = prev;
        h.bin_next = next;
    }

    /// The hole before `key` in crowded bin `b`, through (and into) its ordered map,
    /// built from the list when the bin first grows past [`GROW_ABOVE`].
    #[cold]
    #[inline(never)]
    fn crowded_prev(&mut self, blocks: &[Block], b: usize, key: Key, id: u32) -> u32 {
        self.has_map[b] = true;
        let head = self.bins[b].head;
        let map = self.crowded.entry(b).or_insert_with(|| {
            let mut map = BTreeMap::new();
            let mut cur = head;
            while cur != NIL {
                map.insert(blocks[cur as usize].key(), cur);
                cur = blocks[cur as usize].bin_next;
            }
            map
        });
        let prev = map.range(..key).next_back().map_or(NIL, |(_, &p)| p);
        let old = map.insert(key, id);
        debug_assert!(old.is_none(), "hole indexed twice");
        prev
    }

    /// Takes hole `id` out of the index; returns the hole as it was read.
    #[inline(always)]
    fn remove(&mut self, blocks: &mut [Block], id: u32) -> Block {
        let h = blocks[id as usize];
        debug_assert!(
            h.free,
            "SimDevice: a live block taken out of the hole index"
        );
        let b = self.bin_of(h.len);
        let bin = &mut self.bins[b];
        if h.bin_prev == NIL {
            if bin.head != id {
                missing_hole();
            }
            bin.head = h.bin_next;
        } else {
            blocks[h.bin_prev as usize].bin_next = h.bin_next;
        }
        blocks[h.bin_next as usize].bin_prev = h.bin_prev;
        let count = bin.count - 1;
        bin.count = count;
        if count == 0 {
            self.unmark(b);
        } else if count >= SHRINK_BELOW - 1 && self.has_map[b] {
            self.forget_crowded(b, h.key(), count);
        }
        h
    }

    /// Takes `key` out of bin `b`'s ordered map, if it keeps one, and drops the map
    /// when the bin holds fewer than [`SHRINK_BELOW`] holes.
    #[cold]
    #[inline(never)]
    fn forget_crowded(&mut self, b: usize, key: Key, count: u32) {
        let map = self.crowded.get_mut(&b).expect("a crowded bin's map");
        if map.remove(&key).is_none() {
            missing_hole();
        }
        if count < SHRINK_BELOW {
            self.crowded.remove(&b);
            self.has_map[b] = false;
        }
    }

    /// The first non-empty bin after `bin`.
    ///
    /// One path: whether `bin`'s own word holds a later bin (about as often so as not
    /// on a random trace) decides only where the summary's search starts (that word,
    /// or the next) and which bits of the word found are read, not which code runs.
    #[inline]
    fn next_bin_after(&self, bin: usize) -> Option<usize> {
        let from = bin + 1;
        let w = from / 64;
        if w >= self.bits.len() {
            return None;
        }
        let from_bit = !0u64 << (from % 64);
        let here = self.bits[w] & from_bit;
        // The first word to search: `w` if it has a bin at or after `from`, else the next.
        let first = w + usize::from(here == 0);
        let mut s = first / 64;
        let mut mask = !0u64 << (first % 64);
        while s < self.summary.len() {
            let m = self.summary[s] & mask;
            if m != 0 {
                let word = s * 64 + m.trailing_zeros() as usize;
                // In word `w`, only the bins at or after `from`.
                let keep = from_bit | u64::from(word != w).wrapping_neg();
                return Some(word * 64 + (self.bits[word] & keep).trailing_zeros() as usize);
            }
            s += 1;
            mask = !0;
        }
        None
    }

    /// The first hole of bin `b` at least `len` long (every hole of a bin of one
    /// length is: its head).
    #[inline(always)]
    fn first_at_least(&self, blocks: &[Block], b: usize, len: u64) -> Option<u32> {
        let head = self.bins[b].head;
        if head == NIL || blocks[head as usize].len >= len {
            return (head != NIL).then_some(head);
        }
        self.first_at_least_slow(blocks, b, len)
    }

    /// [`HoleIndex::first_at_least`] past a head shorter than `len` (a bin wider than
    /// one length): through the ordered map of a crowded bin, else along the list.
    #[cold]
    #[inline(never)]
    fn first_at_least_slow(&self, blocks: &[Block], b: usize, len: u64) -> Option<u32> {
        if let Some(map) = self.crowded.get(&b) {
            return map.range((len, 0, 0)..).next().map(|(_, &id)| id);
        }
        let mut cur = self.bins[b].head;
        while cur != NIL && blocks[cur as usize].len < len {
            cur = blocks[cur as usize].bin_next;
        }
        (cur != NIL).then_some(cur)
    }

    /// The best fit for `len` bytes: the first hole in (length, page age, offset) order
    /// at least `len` long.
    #[inline(always)]
    fn best_fit(&self, blocks: &[Block], len: u64) -> Option<u32> {
        if self.bins.is_empty() {
            return None;
        }
        let b = self.bin_of(len);
        match self.first_at_least(blocks, b, len) {
            Some(id) => Some(id),
            None => Some(self.bins[self.next_bin_after(b)?].head),
        }
    }
}

/// The panic of a hole missing from the index (a bookkeeping bug), out of line.
#[cold]
#[inline(never)]
fn missing_hole() -> ! {
    panic!("SimDevice: a page's hole is missing from the best-fit index")
}

/// One shared page.
#[derive(Debug)]
struct Page {
    base: u64,
    /// Live allocations in it.
    live: u64,
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
    /// Every page's blocks.
    blocks: Blocks,
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
            blocks: Blocks::default(),
            next_seq: 0,
            index: HoleIndex::unbuilt(),
        }
    }

    /// The base address of every live page.
    pub(crate) fn bases(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.iter().flatten().map(|p| p.base)
    }

    /// Bytes `size` takes in a page: rounded up to the alignment.
    #[inline(always)]
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

    /// Places `size` bytes in the best-fitting hole of a live page: the allocation's
    /// handle (for [`PackedPages::give_back`]) and its address, or `None` when no hole
    /// holds it.
    #[inline]
    pub(crate) fn take(&mut self, size: u64) -> Option<(u32, u64)> {
        let len = self.footprint(size);
        let id = self.index.best_fit(&self.blocks.items, len)?;
        let hole = self.index.remove(&mut self.blocks.items, id);
        if hole.len > len {
            // The rest of the hole stays a hole, just after the allocation.
            let rest = self.blocks.add(Block {
                offset: hole.offset + len,
                len: hole.len - len,
                seq: hole.seq,
                page: hole.page,
                prev: id,
                next: hole.next,
                bin_prev: NIL,
                bin_next: NIL,
                free: true,
            });
            let blocks = &mut self.blocks.items[..];
            blocks[hole.next as usize].prev = rest;
            let b = &mut blocks[id as usize];
            b.next = rest;
            b.len = len;
            self.index.insert(blocks, rest);
        }
        self.blocks[id].free = false;
        let page = self.page_mut(hole.page);
        page.live += 1;
        Some((id, page.base + hole.offset))
    }

    /// Opens a new page at `base` (placed as `va`) with one allocation of `size` bytes
    /// at its start; returns the allocation's handle.
    pub(crate) fn open(&mut self, base: u64, size: u64, va: Option<Placed>) -> u32 {
        if self.index.bins.is_empty() {
            // Built with the first page: devices that never pack keep no bins.
            self.index = HoleIndex::new(self.page_bytes, self.align);
        }
        let len = self.footprint(size);
        let seq = self.next_seq;
        self.next_seq += 1;
        let page = Page { base, live: 1, va };
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
        let id = self.blocks.add(Block {
            offset: 0,
            len,
            seq,
            page: slot,
            prev: NIL,
            next: NIL,
            bin_prev: NIL,
            bin_next: NIL,
            free: false,
        });
        if self.page_bytes > len {
            let hole = self.blocks.add(Block {
                offset: len,
                len: self.page_bytes - len,
                seq,
                page: slot,
                prev: id,
                next: NIL,
                bin_prev: NIL,
                bin_next: NIL,
                free: true,
            });
            self.blocks[id].next = hole;
            self.index.insert(&mut self.blocks.items, hole);
        }
        id
    }

    /// Returns the allocation `id` (`size` bytes at `addr`) to its page, merging it
    /// with the holes beside it; the page's base and placement when that was its last
    /// allocation (the page is then gone).
    #[inline]
    pub(crate) fn give_back(
        &mut self,
        id: u32,
        addr: u64,
        size: u64,
    ) -> Option<(u64, Option<Placed>)> {
        debug_assert_eq!(self.blocks[id].len, self.footprint(size));
        // One slice of blocks (its start and length in registers) and the free list.
        let Blocks { items, free } = &mut self.blocks;
        let blocks = &mut items[..];
        let block = blocks[id as usize];
        debug_assert!(!block.free, "SimDevice: a packed allocation freed twice");
        let page = self.pages[block.page as usize]
            .as_mut()
            .expect("SimDevice: packed page of a live allocation");
        debug_assert_eq!(page.base + block.offset, addr);
        page.live -= 1;
        if page.live == 0 {
            // Only holes are left beside it (holes are never side by side).
            let page = self.pages[block.page as usize].take().expect("live page");
            for other in [block.prev, block.next] {
                if other != NIL {
                    self.index.remove(blocks, other);
                    free.push(other);
                }
            }
            free.push(id);
            self.free_slots.push(block.page);
            return Some((page.base, page.va));
        }
        let mut merged = id;
        // (The sentinel behind NIL is never a hole.)
        if blocks[block.prev as usize].free {
            // The hole before takes this block in.
            let prev = block.prev;
            self.index.remove(blocks, prev);
            let p = &mut blocks[prev as usize];
            p.len += block.len;
            p.next = block.next;
            blocks[block.next as usize].prev = prev;
            free.push(id);
            merged = prev;
        }
        if blocks[block.next as usize].free {
            // And the hole after.
            let next = self.index.remove(blocks, block.next);
            let m = &mut blocks[merged as usize];
            m.len += next.len;
            m.next = next.next;
            blocks[next.next as usize].prev = merged;
            free.push(block.next);
        }
        blocks[merged as usize].free = true;
        self.index.insert(blocks, merged);
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
    /// every placement, every opened and every returned page agree; returns the most
    /// bins that kept an ordered map at once. A step allocates with `grow` percent
    /// chance in the first half, `110 - grow` in the second (55: the same throughout).
    fn agree(
        seed: u64,
        page_bytes: u64,
        align: u64,
        max_size: u64,
        steps: usize,
        grow: u64,
    ) -> usize {
        let mut most_crowded = 0;
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
            most_crowded = most_crowded.max(fast.index.crowded.len());
            // Bias towards allocation while few are live, so pages fill up.
            let bias = if step < steps / 2 { grow } else { 110 - grow };
            if live.is_empty() || rng.below(100) < bias {
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
        assert!(fast
            .index
            .bins
            .iter()
            .all(|b| b.count == 0 && b.head == NIL));
        assert!(fast.index.crowded.is_empty() && !fast.index.has_map.contains(&true));
        assert_eq!(
            fast.blocks.free.len() + 1,
            fast.blocks.items.len(),
            "every block handle returned (all but the sentinel's)"
        );
        let sentinel = fast.blocks.items[NIL as usize];
        assert!(
            !sentinel.free && sentinel.key() == SENTINEL.key(),
            "the sentinel is never a hole and keeps its key"
        );
        most_crowded
    }

    /// Random sequences on the H100's pages (2 MiB, 512-byte alignment) place every
    /// allocation where the ordered-map packing does, from tiny to almost a page.
    #[test]
    fn agrees_with_the_ordered_map_packing() {
        for seed in 1..40 {
            agree(seed, 2 * MIB, 512, 2 * MIB - 1, 3000, 55);
        }
    }

    /// Many equal small allocations (bins that grow an ordered map and lose it again),
    /// and other page and alignment sizes (bins wider than one unit), agree too.
    #[test]
    fn agrees_with_many_equal_holes_and_other_geometries() {
        for seed in 1..6 {
            assert!(
                agree(seed, 2 * MIB, 512, 4096, 20_000, 80) > 0,
                "no bin grew an ordered map"
            );
            agree(seed, 2 * MIB, 512, 4096, 20_000, 55);
            agree(seed, 64 * MIB, 1, 64 * MIB - 1, 3000, 55);
            assert!(agree(seed, 64 * MIB, 1, 65_536, 20_000, 80) > 0);
            agree(seed, 3 * MIB + 7, 1000, 3 * MIB, 3000, 55);
            agree(seed, 4096, 512, 4095, 3000, 55);
        }
    }

    /// A free hole of `len` bytes in a page of age `seq`, at offset 0, added to `blocks`.
    fn hole(blocks: &mut Blocks, len: u64, seq: u64) -> u32 {
        blocks.add(Block {
            offset: 0,
            len,
            seq,
            page: 0,
            prev: NIL,
            next: NIL,
            bin_prev: NIL,
            bin_next: NIL,
            free: true,
        })
    }

    /// The bitmap finds the next non-empty bin across words, and bins wider than one
    /// length hold holes shorter than the request, which are passed over.
    #[test]
    fn next_bin_crosses_words() {
        let mut blocks = Blocks::default();
        let mut index = HoleIndex::new(2 * MIB, 512);
        let n = index.bins.len();
        assert_eq!(n, 4097);
        for b in [0, 63, 64, 1000, n - 1] {
            let id = hole(&mut blocks, (b as u64) << index.shift, 0);
            index.insert(&mut blocks.items, id);
        }
        assert_eq!(index.next_bin_after(0), Some(63));
        assert_eq!(index.next_bin_after(63), Some(64));
        assert_eq!(index.next_bin_after(64), Some(1000));
        assert_eq!(index.next_bin_after(1000), Some(n - 1));
        assert_eq!(index.next_bin_after(n - 1), None);
        let mut wide = HoleIndex::new(64 * MIB, 1);
        assert!(wide.bins.len() == 4097 && wide.shift == 14);
        let long = hole(&mut blocks, 40_000, 1);
        let short = hole(&mut blocks, 33_000, 0);
        wide.insert(&mut blocks.items, long);
        wide.insert(&mut blocks.items, short);
        assert_eq!(wide.best_fit(&blocks.items, 35_000), Some(long));
        assert_eq!(wide.best_fit(&blocks.items, 33_000), Some(short));
        assert_eq!(wide.best_fit(&blocks.items, 40_001), None);
    }

    /// A crowded wide bin (more holes than a list is walked for) finds the first hole
    /// long enough through its ordered map, in (length, page age, offset) order, and
    /// drops the map when it empties.
    #[test]
    fn crowded_wide_bins_find_the_best_fit() {
        let mut blocks = Blocks::default();
        let mut index = HoleIndex::new(64 * MIB, 1);
        // 100 holes in one 16 KiB-wide bin: lengths 32 768 + 100 * (i % 10), newest pages first.
        let ids: Vec<u32> = (0..100u64)
            .map(|i| {
                let id = hole(&mut blocks, 32_768 + 100 * (i % 10), 1000 - i);
                index.insert(&mut blocks.items, id);
                id
            })
            .collect();
        assert_eq!(index.crowded.len(), 1);
        // Length 32 768 + 500: holes i = 5, 15, ..., 95; the oldest page is i = 95.
        assert_eq!(index.best_fit(&blocks.items, 32_768 + 450), Some(ids[95]));
        assert_eq!(index.best_fit(&blocks.items, 32_768), Some(ids[90]));
        for id in ids {
            index.remove(&mut blocks.items, id);
        }
        assert!(index.crowded.is_empty() && !index.has_map.contains(&true));
        assert_eq!(index.best_fit(&blocks.items, 1), None);
    }
}
