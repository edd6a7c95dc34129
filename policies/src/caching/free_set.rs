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
//! address), usually of a few entries. Positions ([`Cursor`]) walk the order forwards
//! and backwards, as PyTorch's set iterators do.

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

/// The free blocks of one stream.
#[derive(Debug)]
struct StreamBlocks {
    stream: u64,
    len: usize,
    /// Bit `w` set when `words[w]` is not zero.
    summary: u64,
    /// Bit `c` set when class `c` holds a block.
    words: [u64; WORDS],
    /// Blocks by class, each sorted by (size, address); as long as the highest class
    /// used so far.
    classes: Vec<Vec<Entry>>,
}

impl StreamBlocks {
    fn new(stream: u64) -> StreamBlocks {
        StreamBlocks {
            stream,
            len: 0,
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
            self.classes.resize_with(class + 1, Vec::new);
        }
        let bin = &mut self.classes[class];
        let i = bin.partition_point(|e| e.key() < entry.key());
        if bin.get(i).is_some_and(|e| e.key() == entry.key()) {
            return false;
        }
        bin.insert(i, entry);
        if bin.len() == 1 {
            self.set_bit(class);
        }
        self.len += 1;
        true
    }

    fn remove_at(&mut self, class: usize, index: usize) -> Entry {
        let bin = &mut self.classes[class];
        let entry = bin.remove(index);
        if bin.is_empty() {
            self.clear_bit(class);
        }
        self.len -= 1;
        entry
    }

    fn find(&self, size: u64, addr: u64) -> Option<(usize, usize)> {
        let class = class_of(size);
        let bin = self.classes.get(class)?;
        let i = bin.partition_point(|e| e.key() < (size, addr));
        bin.get(i)
            .filter(|e| e.key() == (size, addr))
            .map(|_| (class, i))
    }
}

/// A place in the order: valid until the set changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cursor {
    stream: u32,
    class: u32,
    index: u32,
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
        let (class, index) = self.streams[s].find(size, addr)?;
        self.len -= 1;
        Some(self.streams[s].remove_at(class, index).id)
    }

    /// The id of the block with this key, if it is there.
    pub(super) fn get(&self, stream: u64, size: u64, addr: u64) -> Option<u32> {
        let s = &self.streams[self.stream_index(stream).ok()?];
        let (class, index) = s.find(size, addr)?;
        Some(s.classes[class][index].id)
    }

    /// The position of the block with this key, if it is there.
    pub(super) fn find(&self, stream: u64, size: u64, addr: u64) -> Option<Cursor> {
        let si = self.stream_index(stream).ok()?;
        let (class, index) = self.streams[si].find(size, addr)?;
        Some(cursor(si, class, index))
    }

    /// The first block of `stream` at or after `(size, 0)`: the smallest block of at
    /// least `size` bytes, lowest address first.
    pub(super) fn first_at_least(&self, stream: u64, size: u64) -> Option<Cursor> {
        let si = self.stream_index(stream).ok()?;
        let s = &self.streams[si];
        let class = class_of(size);
        if let Some(bin) = s.classes.get(class) {
            let i = bin.partition_point(|e| e.size < size);
            if i < bin.len() {
                return Some(cursor(si, class, i));
            }
        }
        let class = s.next_class(class + 1)?;
        Some(cursor(si, class, 0))
    }

    /// The last block of `stream` before `(size, 0)`: the largest block smaller than
    /// `size` bytes, highest address first.
    pub(super) fn last_below(&self, stream: u64, size: u64) -> Option<Cursor> {
        let si = self.stream_index(stream).ok()?;
        let s = &self.streams[si];
        let class = class_of(size);
        if let Some(bin) = s.classes.get(class) {
            let i = bin.partition_point(|e| e.size < size);
            if i > 0 {
                return Some(cursor(si, class, i - 1));
            }
        }
        let class = s.prev_class(class)?;
        Some(cursor(si, class, s.classes[class].len() - 1))
    }

    /// The block after `at` in the same stream.
    pub(super) fn next(&self, at: Cursor) -> Option<Cursor> {
        let s = &self.streams[at.stream as usize];
        let (class, index) = (at.class as usize, at.index as usize);
        if index + 1 < s.classes[class].len() {
            return Some(cursor(at.stream as usize, class, index + 1));
        }
        let class = s.next_class(class + 1)?;
        Some(cursor(at.stream as usize, class, 0))
    }

    /// The block before `at` in the same stream.
    pub(super) fn prev(&self, at: Cursor) -> Option<Cursor> {
        let s = &self.streams[at.stream as usize];
        let (class, index) = (at.class as usize, at.index as usize);
        if index > 0 {
            return Some(cursor(at.stream as usize, class, index - 1));
        }
        let class = s.prev_class(class)?;
        Some(cursor(at.stream as usize, class, s.classes[class].len() - 1))
    }

    /// The block at `at`.
    pub(super) fn entry(&self, at: Cursor) -> Entry {
        self.streams[at.stream as usize].classes[at.class as usize][at.index as usize]
    }

    /// Removes the block at `at` (every cursor becomes stale).
    pub(super) fn remove_at(&mut self, at: Cursor) -> Entry {
        self.len -= 1;
        self.streams[at.stream as usize].remove_at(at.class as usize, at.index as usize)
    }

    /// Every block in order, with its stream.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Entry)> + '_ {
        self.streams.iter().flat_map(|s| {
            let mut class = s.next_class(0);
            std::iter::from_fn(move || {
                let c = class?;
                class = s.next_class(c + 1);
                Some(c)
            })
            .flat_map(move |c| s.classes[c].iter().map(move |e| (s.stream, *e)))
        })
    }

    /// The ids of every block, in order.
    pub(super) fn ids(&self) -> Vec<u32> {
        self.iter().map(|(_, e)| e.id).collect()
    }
}

fn cursor(stream: usize, class: usize, index: usize) -> Cursor {
    Cursor {
        stream: stream as u32,
        class: class as u32,
        index: index as u32,
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
            assert!(c >= prev, "class of {size} below the class of a smaller size");
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
        prop_oneof![
            4 => (0u64..3, size.clone(), 0u64..64).prop_map(|(s, z, a)| Op::Insert(s, z, a * 512)),
            3 => any::<usize>().prop_map(Op::Remove),
            2 => (0u64..4, size.clone()).prop_map(|(s, z)| Op::FirstAtLeast(s, z)),
            2 => (0u64..4, size).prop_map(|(s, z)| Op::LastBelow(s, z)),
        ]
    }

    proptest! {
        /// The free set agrees with an ordered map of (stream, size, address) on every
        /// insert, removal, lookup and walk in either direction.
        #[test]
        fn agrees_with_an_ordered_map(ops in proptest::collection::vec(op(), 1..200)) {
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
                            let e = set.entry(at);
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
                            let e = set.entry(at);
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
        assert_eq!(set.entry(at).id, 2);
        assert_eq!(set.prev(at), None);
        assert_eq!(set.last_below(0, 1 << 30), None);
    }
}
