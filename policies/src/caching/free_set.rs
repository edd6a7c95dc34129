//! A pool's free blocks in the order of PyTorch's `BlockPool::blocks` set: by stream,
//! then size, then address. PyTorch's rules fix which block is chosen (the first of
//! that order at or after `(stream, size, 0)`); this structure only finds it faster
//! than an ordered map of triples.
//!
//! Per stream (lists made for the streams that have blocks here, found through an index
//! by the stream's slot, which the caller gives: the caching policy numbers its streams
//! in the order they came, and a block's record keeps its stream's slot and its class,
//! so a removal finds both without a search), blocks are segregated by size class:
//! one class per 512-byte unit up to 64 KiB, then 64 classes per power of two (the
//! classes of a two-level segregated fit allocator). Classes are monotone in size, so
//! every block of a lower class is smaller than every block of a higher one; a bitmap
//! (one bit per class, and a summary bit per word) finds the next non-empty class in a
//! few instructions. Each class is a doubly linked list of its blocks sorted by (size,
//! address), usually of one or two blocks, whose links ([`Link`]) live in the blocks'
//! own records, beside the size and address that are their keys ([`NodeTable`]: the
//! caching policy's block table, shared by every set of a policy; a block is in at
//! most one set): a block is removed by its id without a search, a set reads a
//! block's key and links from one record, and a set's own memory is a head and a
//! length per class. A class holding many blocks (thousands of equal
//! tensors freed between live ones) also keeps an ordered map of them, which finds
//! where a block goes without walking the list. Positions ([`Cursor`]) walk the order
//! forwards and backwards, as PyTorch's set iterators do.

use std::collections::BTreeMap;

use super::pick;
use crate::policy::StreamId;

/// Classes below this are one 512-byte unit each (up to 64 KiB).
const EXACT_UNITS: u64 = 128;
/// Classes per power of two above the exact ones (2^SUB_BITS).
const SUB_BITS: u32 = 6;
/// Number of classes: enough for any size below 2^64.
const CLASSES: usize = class_of(u64::MAX) + 1;

const _: () = assert!(CLASSES < NO_CLASS as usize, "a class fits a node's u16");
/// Words of the class bitmap.
const WORDS: usize = CLASSES.div_ceil(64);

const _: () = assert!(WORDS <= 64, "one summary word covers the bitmap");

/// No block (end of a list).
const NIL: u32 = u32::MAX;

/// The size class of `size`: non-decreasing in `size`. One 512-byte unit each below
/// [`EXACT_UNITS`] units, then 2^[`SUB_BITS`] classes per power of two: for `units` in
/// `[2^lg, 2^(lg+1))` with `lg >= SUB_BITS`, the class is `64 * (lg - 6) + (units >> (lg -
/// 6))`, which is `units` itself up to 127 units, so one formula serves both ranges (with
/// the shift `lg - 6` taken as 0 below 64 units): no choice between a small and a large
/// form, which a trace's random sizes would make for every lookup.
#[inline]
const fn class_of(size: u64) -> usize {
    let units = size >> 9;
    // `| 1`: 0 units is class 0, and the logarithm is of a non-zero value.
    let lg = 63 - (units | 1).leading_zeros();
    let shift = lg.saturating_sub(SUB_BITS);
    (((shift as u64) << SUB_BITS) + (units >> shift)) as usize
}

const _: () = assert!(
    EXACT_UNITS == 2 << SUB_BITS,
    "one formula covers the exact classes"
);

/// One free block: its size, address and block id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) size: u64,
    pub(super) addr: u64,
    pub(super) id: u32,
}

/// A class list with more blocks than this also keeps an ordered map of them (a
/// walk along the list to find a block's place would pass every smaller one); the
/// map goes again below [`SHRINK_BELOW`].
const GROW_ABOVE: u32 = 64;
/// See [`GROW_ABOVE`].
const SHRINK_BELOW: u32 = 16;

/// One block's neighbours in its class list: kept in the block's own record (the
/// caching policy's `Block`), beside the size, address and stream slot that are its key
/// and its class ([`NodeTable::place`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    /// Not in a set.
    pub(super) const UNLINKED: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// The class a block not in a set has ([`NodeTable::place`]): no class.
pub(super) const NO_CLASS: u16 = u16::MAX;

/// Where the blocks of a policy's free sets keep their keys and their [`Link`]s, by
/// block id (a block is in one set at most): the caching policy's block table, whose
/// records hold both, so a set reads a block's key and links from one place.
pub(super) trait NodeTable {
    /// Block `id`'s size and address (its key within its stream).
    fn key(&self, id: u32) -> (u64, u64);
    /// Block `id`'s stream slot (its index in [`FreeSet::streams`]).
    fn slot(&self, id: u32) -> u32;
    /// Block `id`'s links.
    fn link(&self, id: u32) -> &Link;
    /// Block `id`'s links, mutably.
    fn link_mut(&mut self, id: u32) -> &mut Link;
    /// Block `id`'s links and its size class while it is in a set ([`NO_CLASS`] while
    /// it is in none: the class is kept so a removal need not recompute it).
    fn place(&self, id: u32) -> (Link, u16);
    /// [`NodeTable::place`], mutably.
    fn place_mut(&mut self, id: u32) -> (&mut Link, &mut u16);
    /// Called by [`FreeSet::insert`] before block `id` goes in with this key: a table
    /// whose records hold the key already only checks it (in debug builds).
    fn set_key(&mut self, id: u32, slot: u32, size: u64, addr: u64);
}

/// A table of keys and links of its own, for sets without a block table (the tests).
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Nodes {
    nodes: Vec<((u32, u64, u64), Link, u16)>,
}

#[cfg(test)]
impl NodeTable for Nodes {
    fn key(&self, id: u32) -> (u64, u64) {
        let (_, size, addr) = self.nodes[id as usize].0;
        (size, addr)
    }

    fn slot(&self, id: u32) -> u32 {
        self.nodes[id as usize].0 .0
    }

    fn link(&self, id: u32) -> &Link {
        &self.nodes[id as usize].1
    }

    fn link_mut(&mut self, id: u32) -> &mut Link {
        &mut self.nodes[id as usize].1
    }

    fn place(&self, id: u32) -> (Link, u16) {
        let n = &self.nodes[id as usize];
        (n.1, n.2)
    }

    fn place_mut(&mut self, id: u32) -> (&mut Link, &mut u16) {
        let n = &mut self.nodes[id as usize];
        (&mut n.1, &mut n.2)
    }

    fn set_key(&mut self, id: u32, slot: u32, size: u64, addr: u64) {
        let at = id as usize;
        if self.nodes.len() <= at {
            self.nodes
                .resize(at + 1, ((0, 0, 0), Link::UNLINKED, NO_CLASS));
        }
        self.nodes[at].0 = (slot, size, addr);
    }
}

/// The head of one class list.
#[derive(Clone, Copy, Debug)]
struct Class {
    head: u32,
    /// Blocks in the list; [`CROWDED`] set while the class keeps an ordered map.
    len: u32,
}

/// See [`Class::len`].
const CROWDED: u32 = 1 << 31;

impl Class {
    const EMPTY: Class = Class { head: NIL, len: 0 };

    fn count(&self) -> u32 {
        self.len & !CROWDED
    }

    fn crowded(&self) -> bool {
        self.len & CROWDED != 0
    }
}

/// The free blocks of one stream ([`FreeSet::stream_mut`]: one stream's lists, for a
/// caller that removes and inserts several blocks of that stream).
#[derive(Debug)]
pub(super) struct StreamBlocks {
    /// Bit `w` set when `words[w]` is not zero.
    summary: u64,
    /// Bit `c` set when class `c` holds a block.
    words: [u64; WORDS],
    /// Class lists; as long as the highest class used so far.
    classes: Vec<Class>,
    /// The ordered maps of crowded classes, by class.
    crowded: BTreeMap<usize, BTreeMap<(u64, u64), u32>>,
}

impl StreamBlocks {
    fn new() -> StreamBlocks {
        StreamBlocks {
            summary: 0,
            words: [0; WORDS],
            classes: Vec::new(),
            crowded: BTreeMap::new(),
        }
    }

    /// The first non-empty class at or above `class`.
    fn next_class(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let (w, b) = (class / 64, class % 64);
        let here = self.words[w] & (!0u64 << b);
        // The first word above `w` with a bit set is read whether it is needed or not,
        // and one of the two words picked by a mask: whether the class's own word
        // holds the answer follows the trace's sizes, which a branch predicts badly.
        let above = self.summary & (!1u64 << w);
        let wa = (above.trailing_zeros() as usize).min(WORDS - 1);
        let word_above = pick(above != 0, self.words[wa], 0);
        let word = pick(here != 0, here, word_above);
        if word == 0 {
            return None;
        }
        let w = pick(here != 0, w as u64, wa as u64) as usize;
        Some(w * 64 + word.trailing_zeros() as usize)
    }

    /// The last non-empty class below `class`.
    fn prev_class(&self, class: usize) -> Option<usize> {
        let class = class.min(CLASSES);
        let (w, b) = (class / 64, class % 64);
        if w < WORDS {
            let here = self.words[w] & ((1u64 << b) - 1);
            if here != 0 {
                return Some(w * 64 + 63 - here.leading_zeros() as usize);
            }
        }
        let below = self.summary & ((1u64 << w.min(63)) - 1);
        if below == 0 {
            return None;
        }
        let w = 63 - below.leading_zeros() as usize;
        Some(w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }

    fn set_bit(&mut self, class: usize) {
        self.words[class / 64] |= 1 << (class % 64);
        self.summary |= 1 << (class / 64);
    }

    fn clear_bit(&mut self, class: usize) {
        let w = class / 64;
        self.words[w] &= !(1 << (class % 64));
        // The summary bit goes with the word's last bit, without a branch (whether the
        // word empties follows the trace's sizes).
        let empty = u64::from(self.words[w] == 0);
        self.summary &= !(empty << w);
    }

    /// The class list of `class` (empty past the classes used).
    #[inline]
    fn class(&self, class: usize) -> Class {
        self.classes.get(class).copied().unwrap_or(Class::EMPTY)
    }

    /// Links `id` (its node's key set, `size` its size) into its class list, in order;
    /// `false` if a block with its key is there already.
    #[inline(always)]
    pub(super) fn insert(&mut self, nodes: &mut impl NodeTable, id: u32, size: u64) -> bool {
        debug_assert!(
            nodes.place(id).1 == NO_CLASS && nodes.key(id).0 == size,
            "block {id} is in a free set already, or under another key"
        );
        let class = class_of(size);
        match self.classes.get_mut(class) {
            Some(list) if list.len == 0 => {
                // The usual case: the class is empty (96 % of the inserts of a random
                // trace).
                *list = Class { head: id, len: 1 };
                Self::link(nodes, id, NIL, NIL, class);
                self.set_bit(class);
                true
            }
            _ => self.insert_among(nodes, id, class),
        }
    }

    /// Writes into block `id`, being linked between `prev` and `next` of class list
    /// `class`, its links and its class (its stream's slot is written already), so that
    /// a removal finds its list without a search.
    #[inline(always)]
    fn link(nodes: &mut impl NodeTable, id: u32, prev: u32, next: u32, class: usize) {
        let (node, node_class) = nodes.place_mut(id);
        *node = Link { prev, next };
        *node_class = class as u16;
    }

    /// [`StreamBlocks::insert`] into a class that holds blocks already, or past the
    /// classes used so far.
    #[inline(never)]
    fn insert_among(&mut self, nodes: &mut impl NodeTable, id: u32, class: usize) -> bool {
        let key = nodes.key(id);
        if self.classes.len() <= class {
            self.classes.resize(class + 1, Class::EMPTY);
        }
        let list = self.classes[class];
        // The blocks the new one goes between.
        let (prev, next) = if list.crowded() {
            let map = self
                .crowded
                .get_mut(&class)
                .expect("a crowded class has a map");
            match map.entry(key) {
                std::collections::btree_map::Entry::Occupied(_) => return false,
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(id);
                }
            }
            let prev = map.range(..key).next_back().map_or(NIL, |(_, &p)| p);
            let next = if prev == NIL {
                list.head
            } else {
                nodes.link(prev).next
            };
            (prev, next)
        } else {
            let (mut prev, mut cur) = (NIL, list.head);
            while cur != NIL {
                let k = nodes.key(cur);
                if k >= key {
                    if k == key {
                        return false;
                    }
                    break;
                }
                prev = cur;
                cur = nodes.link(cur).next;
            }
            (prev, cur)
        };
        Self::link(nodes, id, prev, next, class);
        if prev == NIL {
            self.classes[class].head = id;
        } else {
            nodes.link_mut(prev).next = id;
        }
        if next != NIL {
            nodes.link_mut(next).prev = id;
        }
        let list = &mut self.classes[class];
        list.len += 1;
        if list.count() == 1 {
            self.set_bit(class);
        } else if list.count() > GROW_ABOVE && !list.crowded() {
            list.len |= CROWDED;
            let mut map = BTreeMap::new();
            let mut cur = list.head;
            while cur != NIL {
                map.insert(nodes.key(cur), cur);
                cur = nodes.link(cur).next;
            }
            self.crowded.insert(class, map);
        }
        true
    }

    /// Unlinks `id`, which is in this stream's lists.
    #[inline(always)]
    fn remove(&mut self, nodes: &mut impl NodeTable, id: u32) {
        self.unlink(nodes, id);
        *nodes.place_mut(id).1 = NO_CLASS;
    }

    /// Removes block `id`, which is in these lists and whose record is about to be
    /// vacated (a block absorbed by a merge): its class is left as it was, since a
    /// vacant record is never read.
    #[inline(always)]
    pub(super) fn remove_vacated(&mut self, nodes: &mut impl NodeTable, id: u32) {
        debug_assert!(nodes.place(id).1 != NO_CLASS, "block {id} is in no set");
        self.unlink(nodes, id);
    }

    /// Unlinks `id` from its class list (its own links and class are left).
    #[inline(always)]
    fn unlink(&mut self, nodes: &mut impl NodeTable, id: u32) {
        let (node, class) = nodes.place(id);
        let class = usize::from(class);
        debug_assert_eq!(class, class_of(nodes.key(id).0));
        // The class list is looked up once (its neighbours' links are in `nodes`).
        let list = &mut self.classes[class];
        if node.prev == NIL {
            list.head = node.next;
        } else {
            nodes.link_mut(node.prev).next = node.next;
        }
        if node.next != NIL {
            nodes.link_mut(node.next).prev = node.prev;
        }
        list.len -= 1;
        let (crowded, empty) = (list.crowded(), list.count() == 0);
        if crowded {
            self.forget_crowded(class, nodes.key(id));
        }
        if empty {
            self.clear_bit(class);
        }
    }

    /// Takes `key` out of crowded class `class`'s map (its list has lost the block
    /// already), and the map away when the class holds fewer than [`SHRINK_BELOW`]
    /// blocks now.
    #[inline(never)]
    fn forget_crowded(&mut self, class: usize, key: (u64, u64)) {
        let list = &mut self.classes[class];
        let map = self
            .crowded
            .get_mut(&class)
            .expect("a crowded class has a map");
        map.remove(&key);
        if list.count() < SHRINK_BELOW {
            list.len &= !CROWDED;
            self.crowded.remove(&class);
        }
    }

    /// The block with this key in class list `class`.
    fn find(&self, nodes: &impl NodeTable, size: u64, addr: u64) -> Option<u32> {
        let class = class_of(size);
        let list = self.class(class);
        if list.crowded() {
            return self.crowded[&class].get(&(size, addr)).copied();
        }
        let mut cur = list.head;
        while cur != NIL {
            if nodes.key(cur) == (size, addr) {
                return Some(cur);
            }
            cur = nodes.link(cur).next;
        }
        None
    }

    /// The first block of class `class` at or after `key`.
    #[inline(always)]
    fn first_in_class_from(
        &self,
        nodes: &impl NodeTable,
        class: usize,
        key: (u64, u64),
    ) -> Option<u32> {
        let list = self.class(class);
        if list.crowded() {
            return self.crowded_first_from(class, key);
        }
        let mut cur = list.head;
        while cur != NIL {
            if nodes.key(cur) >= key {
                return Some(cur);
            }
            cur = nodes.link(cur).next;
        }
        None
    }

    /// [`StreamBlocks::first_in_class_from`] in a crowded class.
    #[inline(never)]
    fn crowded_first_from(&self, class: usize, key: (u64, u64)) -> Option<u32> {
        self.crowded[&class].range(key..).next().map(|(_, &id)| id)
    }

    /// The last block of class `class` before `key`.
    fn last_in_class_before(
        &self,
        nodes: &impl NodeTable,
        class: usize,
        key: (u64, u64),
    ) -> Option<u32> {
        let list = self.class(class);
        if list.crowded() {
            return self.crowded[&class]
                .range(..key)
                .next_back()
                .map(|(_, &id)| id);
        }
        let (mut last, mut cur) = (None, list.head);
        while cur != NIL {
            if nodes.key(cur) >= key {
                break;
            }
            last = Some(cur);
            cur = nodes.link(cur).next;
        }
        last
    }

    /// The last block of class `class`, which holds one.
    fn last_of(&self, nodes: &impl NodeTable, class: usize) -> Option<u32> {
        let list = self.class(class);
        if list.crowded() {
            return self.crowded[&class].values().next_back().copied();
        }
        let mut cur = list.head;
        while cur != NIL {
            let next = nodes.link(cur).next;
            if next == NIL {
                return Some(cur);
            }
            cur = next;
        }
        None
    }

    /// The first block at or after `key`. The bitmap is asked first: the class of
    /// `key` is usually empty (a best fit is usually found in a higher class, whose
    /// first block is the one), and its list is walked only when it holds blocks.
    #[inline(always)]
    fn first_from(&self, nodes: &impl NodeTable, key: (u64, u64)) -> Option<u32> {
        let class = class_of(key.0);
        let found = self.next_class(class)?;
        if found == class {
            if let Some(id) = self.first_in_class_from(nodes, class, key) {
                return Some(id);
            }
            return Some(self.classes[self.next_class(class + 1)?].head);
        }
        Some(self.classes[found].head)
    }

    /// The last block before `key`.
    fn last_before(&self, nodes: &impl NodeTable, key: (u64, u64)) -> Option<u32> {
        let class = class_of(key.0);
        if let Some(id) = self.last_in_class_before(nodes, class, key) {
            return Some(id);
        }
        self.last_of(nodes, self.prev_class(class)?)
    }

    /// The block after `id` (in this stream's lists).
    fn after(&self, nodes: &impl NodeTable, id: u32) -> Option<u32> {
        let (node, class) = nodes.place(id);
        if node.next != NIL {
            return Some(node.next);
        }
        Some(self.classes[self.next_class(usize::from(class) + 1)?].head)
    }

    /// The block before `id` (in this stream's lists).
    fn before(&self, nodes: &impl NodeTable, id: u32) -> Option<u32> {
        let (node, class) = nodes.place(id);
        if node.prev != NIL {
            return Some(node.prev);
        }
        self.last_of(nodes, self.prev_class(usize::from(class))?)
    }
}

/// [`FreeSet::local`] of a stream slot without lists in the set.
const NO_LISTS: u32 = u32::MAX;

/// A block found in the set, with the index of its stream's lists in the set: valid
/// until the set changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cursor {
    stream: u32,
    /// The block.
    pub(super) entry: Entry,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct FreeSet {
    /// The lists of each stream that ever had a block here, in the order they came
    /// ([`FreeSet::local`] finds a stream's): the order of streams themselves is only
    /// needed by
    /// [`FreeSet::iter`], which is given their ids.
    streams: Vec<StreamBlocks>,
    /// By stream slot (the caller's numbering of streams): the index of the slot's
    /// lists in `streams`, [`NO_LISTS`] where the slot has none. Four bytes a slot, so that a
    /// set used on one stream of many (a private pool captured on the thousandth
    /// stream) holds that stream's lists only, where lists for every slot below it
    /// were made before (456 bytes each: 935 MB for 2 000 pools on a trace of 1 024
    /// streams, from a 199 KB file).
    local: Vec<u32>,
    /// By index in `streams`: the slot.
    slots: Vec<u32>,
}

impl FreeSet {
    fn at(&self, nodes: &impl NodeTable, stream: usize, id: Option<u32>) -> Option<Cursor> {
        id.map(|id| {
            let (size, addr) = nodes.key(id);
            Cursor {
                stream: stream as u32,
                entry: Entry { size, addr, id },
            }
        })
    }

    /// Number of free blocks (counted: only the invariant check asks, so inserts and
    /// removals keep no total).
    pub(super) fn len(&self) -> usize {
        self.streams
            .iter()
            .map(|s| s.classes.iter().map(|c| c.count() as usize).sum::<usize>())
            .sum()
    }

    /// Adds block `id` with this key (`slot`: its stream's); `false` (and nothing
    /// changes) if a block with the same stream, size and address is there already.
    /// The block must be in no set of `nodes`.
    #[inline(always)]
    pub(super) fn insert(
        &mut self,
        nodes: &mut impl NodeTable,
        slot: u32,
        size: u64,
        addr: u64,
        id: u32,
    ) -> bool {
        nodes.set_key(id, slot, size, addr);
        debug_assert!(
            nodes.place(id).1 == NO_CLASS,
            "block {id} is in a free set already"
        );
        self.stream_mut(slot).insert(nodes, id, size)
    }

    /// The lists of stream `slot`, made if it has none here yet.
    #[inline(always)]
    pub(super) fn stream_mut(&mut self, slot: u32) -> &mut StreamBlocks {
        match self.index(slot) {
            Some(i) => &mut self.streams[i],
            None => self.add_stream(slot as usize),
        }
    }

    /// The index in `streams` of stream `slot`'s lists, if it has any here.
    #[inline(always)]
    fn index(&self, slot: u32) -> Option<usize> {
        let i = *self.local.get(slot as usize)? as usize;
        // `NO_LISTS` is past every index: one comparison for both answers.
        (i < self.streams.len()).then_some(i)
    }

    /// Makes the lists of stream `slot`, which has none here.
    #[cold]
    #[inline(never)]
    fn add_stream(&mut self, slot: usize) -> &mut StreamBlocks {
        if self.local.len() <= slot {
            self.local.resize(slot + 1, NO_LISTS);
        }
        debug_assert_eq!(
            self.local[slot], NO_LISTS,
            "stream slot {slot} has lists here"
        );
        self.local[slot] = u32::try_from(self.streams.len()).expect("fewer than 2^32 streams");
        self.slots
            .push(u32::try_from(slot).expect("stream slots fit 32 bits"));
        self.streams.push(StreamBlocks::new());
        self.streams.last_mut().expect("just pushed")
    }

    /// Removes block `id` if it is in this set (a block of another set of `nodes`
    /// must not be named); whether it was.
    #[inline(always)]
    pub(super) fn remove(&mut self, nodes: &mut impl NodeTable, id: u32) -> bool {
        if nodes.place(id).1 == NO_CLASS {
            return false;
        }
        let Some(i) = self.index(nodes.slot(id)) else {
            return false;
        };
        self.streams[i].remove(nodes, id);
        true
    }

    /// The id of the block with this key (`slot`: its stream's), if it is there.
    pub(super) fn get(
        &self,
        nodes: &impl NodeTable,
        slot: u32,
        size: u64,
        addr: u64,
    ) -> Option<u32> {
        self.streams[self.index(slot)?].find(nodes, size, addr)
    }

    /// The first block of stream `slot` at or after `(size, 0)`: the smallest block of
    /// at least `size` bytes, lowest address first.
    #[inline(always)]
    pub(super) fn first_at_least(
        &self,
        nodes: &impl NodeTable,
        slot: u32,
        size: u64,
    ) -> Option<Cursor> {
        let si = self.index(slot)?;
        self.at(nodes, si, self.streams[si].first_from(nodes, (size, 0)))
    }

    /// The last block of stream `slot` before `(size, 0)`: the largest block smaller
    /// than `size` bytes, highest address first.
    pub(super) fn last_below(
        &self,
        nodes: &impl NodeTable,
        slot: u32,
        size: u64,
    ) -> Option<Cursor> {
        let si = self.index(slot)?;
        self.at(nodes, si, self.streams[si].last_before(nodes, (size, 0)))
    }

    /// The block after `at` in the same stream.
    #[inline]
    pub(super) fn next(&self, nodes: &impl NodeTable, at: Cursor) -> Option<Cursor> {
        let s = at.stream as usize;
        self.at(nodes, s, self.streams[s].after(nodes, at.entry.id))
    }

    /// The block before `at` in the same stream.
    pub(super) fn prev(&self, nodes: &impl NodeTable, at: Cursor) -> Option<Cursor> {
        let s = at.stream as usize;
        self.at(nodes, s, self.streams[s].before(nodes, at.entry.id))
    }

    /// Removes the block at `at` (every cursor becomes stale).
    #[cfg(test)]
    pub(super) fn remove_at(&mut self, nodes: &mut impl NodeTable, at: Cursor) -> Entry {
        self.streams[at.stream as usize].remove(nodes, at.entry.id);
        at.entry
    }

    /// Unlinks the block at `at` from its lists (every cursor becomes stale) and leaves
    /// its record alone: its class still names the list it left, and **the caller writes
    /// [`NO_CLASS`] into it** (or the block goes back into a set, which writes its new
    /// class). For a block about to be copied whole (the front of a split): a two-byte
    /// store into the record just before the copy's 16-byte loads of it could not be
    /// forwarded to them, and would hold the copy until the store reached the cache.
    #[inline(always)]
    pub(super) fn take_at(&mut self, nodes: &mut impl NodeTable, at: Cursor) -> Entry {
        self.streams[at.stream as usize].unlink(nodes, at.entry.id);
        at.entry
    }

    /// Every block in order (streams by their ids, `stream_ids` by slot), with its
    /// stream's id: read as it goes (a release that looks at every free block of a
    /// pool on each out-of-memory retry copies none of them).
    pub(super) fn iter<'a, N: NodeTable>(
        &'a self,
        nodes: &'a N,
        stream_ids: &[StreamId],
    ) -> impl Iterator<Item = (u64, Entry)> + 'a {
        self.iter_from(nodes, stream_ids, 0)
    }

    /// [`FreeSet::iter`] without the blocks smaller than `min_size`: each stream's
    /// blocks from its first of at least `min_size` bytes, found as
    /// [`FreeSet::first_at_least`] finds it.
    pub(super) fn iter_from<'a, N: NodeTable>(
        &'a self,
        nodes: &'a N,
        stream_ids: &[StreamId],
        min_size: u64,
    ) -> impl Iterator<Item = (u64, Entry)> + 'a {
        let mut streams: Vec<(u64, &StreamBlocks)> = self
            .streams
            .iter()
            .zip(&self.slots)
            .map(|(s, &slot)| (stream_ids[slot as usize].0, s))
            .collect();
        streams.sort_unstable_by_key(|&(id, _)| id);
        streams.into_iter().flat_map(move |(stream, s)| {
            std::iter::successors(s.first_from(nodes, (min_size, 0)), move |&id| {
                s.after(nodes, id)
            })
            .map(move |id| {
                let (size, addr) = nodes.key(id);
                (stream, Entry { size, addr, id })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Stream ids by slot for the tests: slot `s` is stream `s`.
    fn ids() -> Vec<StreamId> {
        (0..8).map(StreamId).collect()
    }

    /// The two forms of the size class (exact units, then 64 classes per power of two)
    /// as the classes were first written: the oracle of [`class_of`]'s one formula.
    fn class_of_two_forms(size: u64) -> usize {
        let units = size >> 9;
        if units < EXACT_UNITS {
            return units as usize;
        }
        let lg = 63 - units.leading_zeros();
        let sub = (units >> (lg - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        (EXACT_UNITS + (u64::from(lg) - 7) * (1 << SUB_BITS) + sub) as usize
    }

    /// The one-formula class of every size is the class of the two forms: every size up
    /// to 2^26 bytes by 512-byte unit, and the sizes around every power of two and every
    /// 64th of one up to 2^64.
    #[test]
    fn one_formula_is_the_two_forms() {
        for units in 0..(1u64 << 17) {
            for size in [units << 9, (units << 9) | 511] {
                assert_eq!(class_of(size), class_of_two_forms(size), "size {size}");
            }
        }
        for lg in 9..64u32 {
            for sub in 0..64u64 {
                let at = (1u64 << lg) + (sub << lg.saturating_sub(6));
                for size in [at.wrapping_sub(1), at, at.saturating_add(1)] {
                    assert_eq!(class_of(size), class_of_two_forms(size), "size {size}");
                }
            }
        }
        assert_eq!(class_of(u64::MAX), class_of_two_forms(u64::MAX));
    }

    /// Size classes never decrease with size, and cover every size below 2^64.
    #[test]
    fn classes_are_monotone() {
        let mut prev = 0;
        let mut size = 0u64;
        while size < (1 << 50) {
            let c = class_of(size);
            assert!(
                c >= prev,
                "class of {size} below the class of a smaller size"
            );
            prev = c;
            size = size + 1 + size / 97;
        }
        for shift in 9..64u32 {
            let below = class_of((1u64 << shift) - 1);
            assert!(class_of(1u64 << shift) > below, "2^{shift} starts a class");
        }
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u64, u64),
        Remove(usize),
        FirstAtLeast(u32, u64),
        LastBelow(u32, u64),
        WalkFrom(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let size = prop_oneof![
            (1u64..300).prop_map(|u| u * 512),
            (1u64..(1 << 30)).prop_map(|b| b.div_ceil(512) * 512),
            (1u64..4).prop_map(|k| k << 40),
        ];
        // Many blocks of two sizes: classes that grow ordered maps and lose them again.
        let crowded = (0u64..2, 0u64..400).prop_map(|(z, a)| Op::Insert(0, 512 << z, a * 4096));
        prop_oneof![
            4 => (0u32..3, size.clone(), 0u64..64).prop_map(|(s, z, a)| Op::Insert(s, z, a * 512)),
            4 => crowded,
            3 => any::<usize>().prop_map(Op::Remove),
            2 => (0u32..4, size.clone()).prop_map(|(s, z)| Op::FirstAtLeast(s, z)),
            2 => (0u32..4, size.clone()).prop_map(|(s, z)| Op::LastBelow(s, z)),
            2 => size.prop_map(Op::WalkFrom),
        ]
    }

    proptest! {
        /// The free set agrees with an ordered map of (stream, size, address) on every
        /// insert, removal, lookup, walk in either direction and walk of the blocks of
        /// at least a size.
        #[test]
        fn agrees_with_an_ordered_map(ops in proptest::collection::vec(op(), 1..600)) {
            let mut set = FreeSet::default();
            let mut nodes = Nodes::default();
            let mut model: BTreeMap<(u32, u64, u64), u32> = BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(s, z, a) => {
                        let added = set.insert(&mut nodes, s, z, a, n as u32);
                        let fresh = !model.contains_key(&(s, z, a));
                        prop_assert_eq!(added, fresh);
                        if fresh {
                            model.insert((s, z, a), n as u32);
                        }
                    }
                    Op::Remove(k) => {
                        if model.is_empty() {
                            continue;
                        }
                        let key = *model.keys().nth(k % model.len()).unwrap();
                        let id = model.remove(&key).unwrap();
                        if k % 2 == 0 {
                            prop_assert!(set.remove(&mut nodes, id));
                            prop_assert!(!set.remove(&mut nodes, id));
                        } else {
                            // As a merge takes a neighbour out (its id is not used again).
                            set.stream_mut(key.0).remove_vacated(&mut nodes, id);
                        }
                        prop_assert_eq!(set.get(&nodes, key.0, key.1, key.2), None);
                    }
                    Op::FirstAtLeast(s, z) => {
                        let mut got = Vec::new();
                        let mut c = set.first_at_least(&nodes, s, z);
                        while let Some(at) = c {
                            let e = at.entry;
                            got.push(((s, e.size, e.addr), e.id));
                            c = set.next(&nodes, at);
                        }
                        let want: Vec<_> = model
                            .range((s, z, 0)..(s + 1, 0, 0))
                            .map(|(k, v)| (*k, *v))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::LastBelow(s, z) => {
                        let mut got = Vec::new();
                        let mut c = set.last_below(&nodes, s, z);
                        while let Some(at) = c {
                            let e = at.entry;
                            got.push(((s, e.size, e.addr), e.id));
                            c = set.prev(&nodes, at);
                        }
                        let want: Vec<_> = model
                            .range((s, 0, 0)..(s, z, 0))
                            .rev()
                            .map(|(k, v)| (*k, *v))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::WalkFrom(z) => {
                        let got: Vec<_> = set
                            .iter_from(&nodes, &ids(), z)
                            .map(|(s, e)| ((s as u32, e.size, e.addr), e.id))
                            .collect();
                        let want: Vec<_> = model
                            .iter()
                            .filter(|(k, _)| k.1 >= z)
                            .map(|(k, v)| (*k, *v))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                let all: Vec<_> = set.iter(&nodes, &ids()).map(|(s, e)| ((s as u32, e.size, e.addr), e.id)).collect();
                let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
                for (&(s, z, a), &id) in &model {
                    prop_assert_eq!(set.get(&nodes, s, z, a), Some(id));
                }
            }
        }
    }

    /// A block that leaves its set and goes back under another key (a split's rest, a
    /// merged block) returns to its own stream's lists by the slot it kept, in order,
    /// with another stream's blocks untouched.
    #[test]
    fn a_block_returns_to_its_stream_under_a_new_key() {
        let mut set = FreeSet::default();
        let mut nodes = Nodes::default();
        assert!(set.insert(&mut nodes, 7, 4096, 0, 1));
        assert!(set.insert(&mut nodes, 3, 4096, 0, 2));
        assert!(set.insert(&mut nodes, 7, 1 << 20, 8192, 3));
        assert!(set.remove(&mut nodes, 3));
        assert!(set.insert(&mut nodes, 7, 2048, 8192, 3));
        let all: Vec<_> = set
            .iter(&nodes, &ids())
            .map(|(s, e)| (s, e.size, e.id))
            .collect();
        assert_eq!(all, vec![(3, 4096, 2), (7, 2048, 3), (7, 4096, 1)]);
        assert_eq!(
            set.first_at_least(&nodes, 7, 1).map(|at| at.entry.id),
            Some(3)
        );
        assert!(set.remove(&mut nodes, 3));
        assert!(!set.remove(&mut nodes, 3));
        assert_eq!(set.len(), 2);
    }

    /// Removing at a cursor keeps the bitmap right: the class empties and the walk
    /// skips it.
    #[test]
    fn remove_at_clears_empty_classes() {
        let mut set = FreeSet::default();
        let mut nodes = Nodes::default();
        set.insert(&mut nodes, 0, 512, 0, 1);
        set.insert(&mut nodes, 0, 1 << 30, 0, 2);
        let at = set.first_at_least(&nodes, 0, 512).unwrap();
        assert_eq!(set.remove_at(&mut nodes, at).id, 1);
        let at = set.first_at_least(&nodes, 0, 512).unwrap();
        assert_eq!(at.entry.id, 2);
        assert_eq!(set.prev(&nodes, at), None);
        assert_eq!(set.last_below(&nodes, 0, 1 << 30), None);
    }

    /// A set used on a few streams of many keeps lists for those streams only (it made
    /// lists for every slot below the highest it was used on: 456 bytes each, so a
    /// private pool captured on the thousandth stream took 456 KB), and finds, walks
    /// and removes blocks by stream as before, in stream order.
    #[test]
    fn lists_only_for_the_streams_used() {
        let mut set = FreeSet::default();
        let mut nodes = Nodes::default();
        let stream_ids: Vec<StreamId> = (0..2000).map(StreamId).collect();
        set.insert(&mut nodes, 1000, 4096, 0x1000, 1);
        set.insert(&mut nodes, 7, 4096, 0x9000, 2);
        set.insert(&mut nodes, 1000, 512, 0x5000, 3);
        set.insert(&mut nodes, 1999, 512, 0x7000, 4);
        assert_eq!(
            set.streams.len(),
            3,
            "lists for streams 1000, 7 and 1999 only"
        );
        assert_eq!(set.first_at_least(&nodes, 1000, 1024).unwrap().entry.id, 1);
        assert_eq!(set.first_at_least(&nodes, 7, 1024).unwrap().entry.id, 2);
        assert!(set.first_at_least(&nodes, 8, 1).is_none());
        assert!(set.first_at_least(&nodes, 5000, 1).is_none());
        assert_eq!(set.get(&nodes, 1999, 512, 0x7000), Some(4));
        let walked: Vec<(u64, u32)> = set
            .iter(&nodes, &stream_ids)
            .map(|(stream, e)| (stream, e.id))
            .collect();
        assert_eq!(walked, vec![(7, 2), (1000, 3), (1000, 1), (1999, 4)]);
        assert!(set.remove(&mut nodes, 3));
        assert_eq!(set.len(), 3);
        assert_eq!(set.last_below(&nodes, 1000, 1 << 20).unwrap().entry.id, 1);
    }

    /// A class of many equal blocks (with its ordered map past GROW_ABOVE, without it
    /// again below SHRINK_BELOW) keeps the order of an ordered map through growth and
    /// shrinking.
    #[test]
    fn crowded_bins_keep_the_order() {
        let mut set = FreeSet::default();
        let mut nodes = Nodes::default();
        let mut model: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let check = |set: &FreeSet, nodes: &Nodes, model: &BTreeMap<(u64, u64), u32>| {
            let all: Vec<_> = set
                .iter(nodes, &ids())
                .map(|(_, e)| ((e.size, e.addr), e.id))
                .collect();
            let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(all, want);
            let first = set
                .first_at_least(nodes, 0, 1 << 20)
                .map(|at| at.entry.addr);
            assert_eq!(first, model.range((1 << 20, 0)..).next().map(|(k, _)| k.1));
        };
        for i in 0..300u64 {
            // Addresses in a scrambled order, two sizes in one class.
            let addr = (i * 7919) % 300 * 8192;
            let size = (1 << 20) + (i % 2) * 512;
            assert_eq!(class_of(size), class_of(1 << 20));
            assert!(set.insert(&mut nodes, 0, size, addr, i as u32));
            model.insert((size, addr), i as u32);
        }
        check(&set, &nodes, &model);
        assert!(
            !set.insert(&mut nodes, 0, 1 << 20, 0, 999),
            "a key is there once"
        );
        let keys: Vec<_> = model.keys().copied().collect();
        for (n, key) in keys.iter().enumerate() {
            if n % 3 != 0 {
                let id = model.remove(key).unwrap();
                assert!(set.remove(&mut nodes, id));
            }
        }
        check(&set, &nodes, &model);
        while model.len() > 3 {
            let at = set.first_at_least(&nodes, 0, 1 << 20).unwrap();
            let e = set.remove_at(&mut nodes, at);
            assert_eq!(model.remove(&(e.size, e.addr)), Some(e.id));
            check(&set, &nodes, &model);
        }
    }
}
