//! A pool's free blocks in the order of PyTorch's `BlockPool::blocks` set: by stream,
//! then size, then address. PyTorch's rules fix which block is chosen (the first of
//! that order at or after `(stream, size, 0)`); this structure only finds it faster
//! than an ordered map of triples.
//!
//! Per stream (a short vector, sorted by stream), blocks are segregated by size class:
//! one class per 512-byte unit up to 64 KiB, then 64 classes per power of two (the
//! classes of a two-level segregated fit allocator). Classes are monotone in size, so
//! every block of a lower class is smaller than every block of a higher one; a bitmap
//! (one bit per class, and a summary bit per word) finds the next non-empty class in a
//! few instructions; each class holds its blocks in a vector sorted by (size,
//! address), usually of a few entries (an ordered map when it holds many: thousands of
//! equal blocks freed between live ones). Positions ([`Cursor`]) walk the order
//! forwards and backwards, as PyTorch's set iterators do.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Classes below this are one 512-byte unit each (up to 64 KiB).
const EXACT_UNITS: u64 = 128;
/// Classes per power of two above the exact ones (2^SUB_BITS).
const SUB_BITS: u32 = 6;
/// Number of classes: enough for any size below 2^64.
const CLASSES: usize = class_of(u64::MAX) + 1;
/// Words of the class bitmap.
const WORDS: usize = CLASSES.div_ceil(64);

const _: () = assert!(WORDS <= 64, "one summary word covers the bitmap");

/// The size class of `size`: non-decreasing in `size`.
const fn class_of(size: u64) -> usize {
    let units = size >> 9;
    if units < EXACT_UNITS {
        return units as usize;
    }
    let lg = 63 - units.leading_zeros();
    let sub = (units >> (lg - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    EXACT_UNITS as usize + (lg as usize - 7) * (1 << SUB_BITS) + sub as usize
}

/// One free block: its size, address and block id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) size: u64,
    pub(super) addr: u64,
    pub(super) id: u32,
}

impl Entry {
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// A bin holding more blocks than this becomes an ordered map (a vector's insertions
/// and removals move every later entry); it goes back to a vector below
/// [`SHRINK_BELOW`].
const GROW_ABOVE: usize = 64;
/// See [`GROW_ABOVE`].
const SHRINK_BELOW: usize = 16;

/// The blocks of one size class, by (size, address).
#[derive(Debug)]
enum Bin {
    /// A sorted vector: the usual case, a few blocks.
    Few(Vec<Entry>),
    /// Many blocks of one class (thousands of equal tensors freed between live ones).
    Many(BTreeMap<(u64, u64), u32>),
}

impl Default for Bin {
    fn default() -> Self {
        Bin::Few(Vec::new())
    }
}

impl Bin {
    fn len(&self) -> usize {
        match self {
            Bin::Few(v) => v.len(),
            Bin::Many(m) => m.len(),
        }
    }

    fn insert(&mut self, entry: Entry) -> bool {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() < entry.key());
                if v.get(i).is_some_and(|e| e.key() == entry.key()) {
                    return false;
                }
                v.insert(i, entry);
                if v.len() > GROW_ABOVE {
                    *self = Bin::Many(v.iter().map(|e| (e.key(), e.id)).collect());
                }
                true
            }
            Bin::Many(m) => match m.entry(entry.key()) {
                std::collections::btree_map::Entry::Occupied(_) => false,
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(entry.id);
                    true
                }
            },
        }
    }

    fn remove(&mut self, key: (u64, u64)) -> Option<Entry> {
        let entry = match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() < key);
                if v.get(i).is_some_and(|e| e.key() == key) {
                    return Some(v.remove(i));
                }
                return None;
            }
            Bin::Many(m) => {
                let id = m.remove(&key)?;
                Entry {
                    size: key.0,
                    addr: key.1,
                    id,
                }
            }
        };
        if let Bin::Many(m) = self {
            if m.len() < SHRINK_BELOW {
                let v = m
                    .iter()
                    .map(|(&(size, addr), &id)| Entry { size, addr, id })
                    .collect();
                *self = Bin::Few(v);
            }
        }
        Some(entry)
    }

    fn get(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() < key);
                v.get(i).copied().filter(|e| e.key() == key)
            }
            Bin::Many(m) => m.get(&key).map(|&id| Entry {
                size: key.0,
                addr: key.1,
                id,
            }),
        }
    }

    /// The first entry at or after `key`.
    fn first_from(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() < key);
                v.get(i).copied()
            }
            Bin::Many(m) => {
                m.range(key..)
                    .next()
                    .map(|(&(size, addr), &id)| Entry { size, addr, id })
            }
        }
    }

    /// The first entry after `key`.
    fn first_after(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() <= key);
                v.get(i).copied()
            }
            Bin::Many(m) => m
                .range((Bound::Excluded(key), Bound::Unbounded))
                .next()
                .map(|(&(size, addr), &id)| Entry { size, addr, id }),
        }
    }

    /// The last entry before `key`.
    fn last_before(&self, key: (u64, u64)) -> Option<Entry> {
        match self {
            Bin::Few(v) => {
                let i = v.partition_point(|e| e.key() < key);
                i.checked_sub(1).map(|i| v[i])
            }
            Bin::Many(m) => m
                .range(..key)
                .next_back()
                .map(|(&(size, addr), &id)| Entry { size, addr, id }),
        }
    }

    fn first(&self) -> Option<Entry> {
        match self {
            Bin::Few(v) => v.first().copied(),
            Bin::Many(m) => m
                .iter()
                .next()
                .map(|(&(size, addr), &id)| Entry { size, addr, id }),
        }
    }

    fn last(&self) -> Option<Entry> {
        match self {
            Bin::Few(v) => v.last().copied(),
            Bin::Many(m) => {
                m.iter()
                    .next_back()
                    .map(|(&(size, addr), &id)| Entry { size, addr, id })
            }
        }
    }

    fn for_each(&self, mut f: impl FnMut(Entry)) {
        match self {
            Bin::Few(v) => v.iter().for_each(|&e| f(e)),
            Bin::Many(m) => m
                .iter()
                .for_each(|(&(size, addr), &id)| f(Entry { size, addr, id })),
        }
    }
}

/// The free blocks of one stream.
#[derive(Debug)]
struct StreamBlocks {
    stream: u64,
    /// Bit `w` set when `words[w]` is not zero.
    summary: u64,
    /// Bit `c` set when class `c` holds a block.
    words: [u64; WORDS],
    /// Blocks by class; as long as the highest class used so far.
    classes: Vec<Bin>,
}

impl StreamBlocks {
    fn new(stream: u64) -> StreamBlocks {
        StreamBlocks {
            stream,
            summary: 0,
            words: [0; WORDS],
            classes: Vec::new(),
        }
    }

    /// The first non-empty class at or above `class`.
    fn next_class(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let (w, b) = (class / 64, class % 64);
        let here = self.words[w] & (!0u64 << b);
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= 64 {
            0
        } else {
            self.summary & (!0u64 << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
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
        if self.words[w] == 0 {
            self.summary &= !(1 << w);
        }
    }

    fn insert(&mut self, entry: Entry) -> bool {
        let class = class_of(entry.size);
        if self.classes.len() <= class {
            self.classes.resize_with(class + 1, Bin::default);
        }
        let bin = &mut self.classes[class];
        if !bin.insert(entry) {
            return false;
        }
        if bin.len() == 1 {
            self.set_bit(class);
        }
        true
    }

    fn remove(&mut self, size: u64, addr: u64) -> Option<Entry> {
        let class = class_of(size);
        let bin = self.classes.get_mut(class)?;
        let entry = bin.remove((size, addr))?;
        if bin.len() == 0 {
            self.clear_bit(class);
        }
        Some(entry)
    }

    fn get(&self, size: u64, addr: u64) -> Option<Entry> {
        self.classes.get(class_of(size))?.get((size, addr))
    }

    /// The first block at or after `key`.
    fn first_from(&self, key: (u64, u64)) -> Option<Entry> {
        let class = class_of(key.0);
        if let Some(e) = self.classes.get(class).and_then(|b| b.first_from(key)) {
            return Some(e);
        }
        self.classes[self.next_class(class + 1)?].first()
    }

    /// The first block after `key`.
    fn first_after(&self, key: (u64, u64)) -> Option<Entry> {
        let class = class_of(key.0);
        if let Some(e) = self.classes.get(class).and_then(|b| b.first_after(key)) {
            return Some(e);
        }
        self.classes[self.next_class(class + 1)?].first()
    }

    /// The last block before `key`.
    fn last_before(&self, key: (u64, u64)) -> Option<Entry> {
        let class = class_of(key.0);
        if let Some(e) = self.classes.get(class).and_then(|b| b.last_before(key)) {
            return Some(e);
        }
        self.classes[self.prev_class(class)?].last()
    }
}

/// A block found in the set, with its stream's place: valid until the set changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cursor {
    stream: u32,
    /// The block.
    pub(super) entry: Entry,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct FreeSet {
    /// Sorted by stream; a stream's entry stays once made.
    streams: Vec<StreamBlocks>,
    len: usize,
}

impl FreeSet {
    fn stream_index(&self, stream: u64) -> Result<usize, usize> {
        // Few streams: a linear scan beats a binary search.
        for (i, s) in self.streams.iter().enumerate() {
            if s.stream >= stream {
                return if s.stream == stream { Ok(i) } else { Err(i) };
            }
        }
        Err(self.streams.len())
    }

    fn at(&self, stream: usize, entry: Option<Entry>) -> Option<Cursor> {
        entry.map(|entry| Cursor {
            stream: stream as u32,
            entry,
        })
    }

    /// Number of free blocks.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds a block; `false` (and nothing changes) if a block with the same stream,
    /// size and address is there already.
    pub(super) fn insert(&mut self, stream: u64, size: u64, addr: u64, id: u32) -> bool {
        let i = match self.stream_index(stream) {
            Ok(i) => i,
            Err(i) => {
                self.streams.insert(i, StreamBlocks::new(stream));
                i
            }
        };
        let added = self.streams[i].insert(Entry { size, addr, id });
        self.len += usize::from(added);
        added
    }

    /// Removes the block with this key; its id, if it was there.
    pub(super) fn remove(&mut self, stream: u64, size: u64, addr: u64) -> Option<u32> {
        let s = self.stream_index(stream).ok()?;
        let entry = self.streams[s].remove(size, addr)?;
        self.len -= 1;
        Some(entry.id)
    }

    /// The id of the block with this key, if it is there.
    pub(super) fn get(&self, stream: u64, size: u64, addr: u64) -> Option<u32> {
        let s = &self.streams[self.stream_index(stream).ok()?];
        s.get(size, addr).map(|e| e.id)
    }

    /// The first block of `stream` at or after `(size, 0)`: the smallest block of at
    /// least `size` bytes, lowest address first.
    pub(super) fn first_at_least(&self, stream: u64, size: u64) -> Option<Cursor> {
        let si = self.stream_index(stream).ok()?;
        self.at(si, self.streams[si].first_from((size, 0)))
    }

    /// The last block of `stream` before `(size, 0)`: the largest block smaller than
    /// `size` bytes, highest address first.
    pub(super) fn last_below(&self, stream: u64, size: u64) -> Option<Cursor> {
        let si = self.stream_index(stream).ok()?;
        self.at(si, self.streams[si].last_before((size, 0)))
    }

    /// The block after `at` in the same stream.
    pub(super) fn next(&self, at: Cursor) -> Option<Cursor> {
        let s = at.stream as usize;
        self.at(s, self.streams[s].first_after(at.entry.key()))
    }

    /// The block before `at` in the same stream.
    pub(super) fn prev(&self, at: Cursor) -> Option<Cursor> {
        let s = at.stream as usize;
        self.at(s, self.streams[s].last_before(at.entry.key()))
    }

    /// Removes the block at `at` (every cursor becomes stale).
    pub(super) fn remove_at(&mut self, at: Cursor) -> Entry {
        let entry = self.streams[at.stream as usize]
            .remove(at.entry.size, at.entry.addr)
            .expect("a cursor of this set");
        self.len -= 1;
        entry
    }

    /// Every block in order, with its stream.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        let mut all = Vec::with_capacity(self.len);
        for s in &self.streams {
            let mut class = s.next_class(0);
            while let Some(c) = class {
                s.classes[c].for_each(|e| all.push((s.stream, e)));
                class = s.next_class(c + 1);
            }
        }
        all.into_iter()
    }

    /// The ids of every block, in order.
    pub(super) fn ids(&self) -> Vec<u32> {
        self.iter().map(|(_, e)| e.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

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
        Insert(u64, u64, u64),
        Remove(usize),
        FirstAtLeast(u64, u64),
        LastBelow(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let size = prop_oneof![
            (1u64..300).prop_map(|u| u * 512),
            (1u64..(1 << 30)).prop_map(|b| b.div_ceil(512) * 512),
            (1u64..4).prop_map(|k| k << 40),
        ];
        // Many blocks of two sizes: bins that grow into ordered maps and shrink back.
        let crowded = (0u64..2, 0u64..400).prop_map(|(z, a)| Op::Insert(0, 512 << z, a * 4096));
        prop_oneof![
            4 => (0u64..3, size.clone(), 0u64..64).prop_map(|(s, z, a)| Op::Insert(s, z, a * 512)),
            4 => crowded,
            3 => any::<usize>().prop_map(Op::Remove),
            2 => (0u64..4, size.clone()).prop_map(|(s, z)| Op::FirstAtLeast(s, z)),
            2 => (0u64..4, size).prop_map(|(s, z)| Op::LastBelow(s, z)),
        ]
    }

    proptest! {
        /// The free set agrees with an ordered map of (stream, size, address) on every
        /// insert, removal, lookup and walk in either direction.
        #[test]
        fn agrees_with_an_ordered_map(ops in proptest::collection::vec(op(), 1..600)) {
            let mut set = FreeSet::default();
            let mut model: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(s, z, a) => {
                        let added = set.insert(s, z, a, n as u32);
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
                        prop_assert_eq!(set.remove(key.0, key.1, key.2), model.remove(&key));
                        prop_assert_eq!(set.remove(key.0, key.1, key.2), None);
                    }
                    Op::FirstAtLeast(s, z) => {
                        let mut got = Vec::new();
                        let mut c = set.first_at_least(s, z);
                        while let Some(at) = c {
                            let e = at.entry;
                            got.push(((s, e.size, e.addr), e.id));
                            c = set.next(at);
                        }
                        let want: Vec<_> = model
                            .range((s, z, 0)..(s + 1, 0, 0))
                            .map(|(k, v)| (*k, *v))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                    Op::LastBelow(s, z) => {
                        let mut got = Vec::new();
                        let mut c = set.last_below(s, z);
                        while let Some(at) = c {
                            let e = at.entry;
                            got.push(((s, e.size, e.addr), e.id));
                            c = set.prev(at);
                        }
                        let want: Vec<_> = model
                            .range((s, 0, 0)..(s, z, 0))
                            .rev()
                            .map(|(k, v)| (*k, *v))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(set.len(), model.len());
                let all: Vec<_> = set.iter().map(|(s, e)| ((s, e.size, e.addr), e.id)).collect();
                let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
            }
        }
    }

    /// Removing at a cursor keeps the bitmap right: the class empties and the walk
    /// skips it.
    #[test]
    fn remove_at_clears_empty_classes() {
        let mut set = FreeSet::default();
        set.insert(0, 512, 0, 1);
        set.insert(0, 1 << 30, 0, 2);
        let at = set.first_at_least(0, 512).unwrap();
        assert_eq!(set.remove_at(at).id, 1);
        let at = set.first_at_least(0, 512).unwrap();
        assert_eq!(at.entry.id, 2);
        assert_eq!(set.prev(at), None);
        assert_eq!(set.last_below(0, 1 << 30), None);
    }

    /// A bin of many equal blocks (an ordered map past GROW_ABOVE, a vector again below
    /// SHRINK_BELOW) keeps the order of an ordered map through growth and shrinking.
    #[test]
    fn crowded_bins_keep_the_order() {
        let mut set = FreeSet::default();
        let mut model: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let check = |set: &FreeSet, model: &BTreeMap<(u64, u64), u32>| {
            let all: Vec<_> = set.iter().map(|(_, e)| ((e.size, e.addr), e.id)).collect();
            let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(all, want);
            let first = set.first_at_least(0, 1 << 20).map(|at| at.entry.addr);
            assert_eq!(first, model.range((1 << 20, 0)..).next().map(|(k, _)| k.1));
        };
        for i in 0..300u64 {
            // Addresses in a scrambled order, two sizes in one class.
            let addr = (i * 7919) % 300 * 8192;
            let size = (1 << 20) + (i % 2) * 512;
            assert_eq!(class_of(size), class_of(1 << 20));
            assert!(set.insert(0, size, addr, i as u32));
            model.insert((size, addr), i as u32);
        }
        check(&set, &model);
        assert!(!set.insert(0, 1 << 20, 0, 9), "a key is there once");
        let keys: Vec<_> = model.keys().copied().collect();
        for (n, key) in keys.iter().enumerate() {
            if n % 3 != 0 {
                assert_eq!(set.remove(0, key.0, key.1), model.remove(key));
            }
        }
        check(&set, &model);
        while model.len() > 3 {
            let at = set.first_at_least(0, 1 << 20).unwrap();
            let e = set.remove_at(at);
            assert_eq!(model.remove(&(e.size, e.addr)), Some(e.id));
            check(&set, &model);
        }
    }
}
