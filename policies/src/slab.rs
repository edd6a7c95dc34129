//! A table of values under stable `u32` keys that reuses freed keys: the handles behind
//! [`crate::Allocation`] and the caching policy's blocks and segments. One definition
//! for every policy, with its own bookkeeping check.
//!
//! [`DenseSlab`] is the table, for values that mark their own slot vacant
//! ([`Vacancy`]: the caching policy's blocks, whose state says so), so a slot is the
//! value alone, and a key the caller knows to be live is read without testing a tag
//! ([`DenseSlab::live`]). [`Slab`] is the same table holding `Option`s (`None` the
//! vacant slot), for values that cannot mark themselves.

/// See the module docs: a [`DenseSlab`] of `Option`s.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    dense: DenseSlab<Option<T>>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            dense: DenseSlab::default(),
        }
    }
}

impl<T> Vacancy for Option<T> {
    #[inline(always)]
    fn is_vacant(&self) -> bool {
        self.is_none()
    }
    #[inline(always)]
    fn vacate(&mut self) {
        *self = None;
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its key (a freed key if there is one).
    ///
    /// The keys are those [`DenseSlab::insert`] would give (the last freed, else the
    /// next never used), but a full table grows by many vacant slots at once, kept in
    /// the free list under the freed keys, lowest on top: whether a key was free
    /// followed the program's allocations and frees (about one insertion in ten
    /// mispredicted it, under `immediate`), while running out of vacant slots is rare.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        if self.dense.free.is_empty() {
            self.grow();
        }
        let key = self.dense.free.pop().expect("a vacant slot");
        self.dense.items[key as usize] = Some(value);
        key
    }

    /// Adds vacant slots (as many as the table holds, at least 16) to the free list,
    /// the lowest on top, so that they are taken in the order new keys were.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let len = self.dense.items.len();
        // Every key below 2^32, as `DenseSlab::insert` keeps them.
        let room = usize::try_from((1u64 << 32).saturating_sub(len as u64)).unwrap_or(usize::MAX);
        let more = len.max(16).min(room);
        assert!(more > 0, "more than 4 billion live entries");
        self.dense.items.resize_with(len + more, || None);
        self.dense
            .free
            .extend((len..len + more).rev().map(|k| k as u32));
    }

    /// Takes the value out; its key becomes free. `None` if the key holds nothing.
    #[inline]
    pub(crate) fn remove(&mut self, key: u32) -> Option<T> {
        self.take_if(key, |_| true)
    }

    /// Takes the value out if it satisfies `keep_out` (e.g. "is this tenant").
    #[inline]
    pub(crate) fn take_if(&mut self, key: u32, keep_out: impl FnOnce(&T) -> bool) -> Option<T> {
        let value = self
            .dense
            .items
            .get_mut(key as usize)?
            .take_if(|v| keep_out(v))?;
        self.dense.free.push(key);
        Some(value)
    }

    /// The value under `key`, if any.
    #[inline]
    pub(crate) fn get(&self, key: u32) -> Option<&T> {
        self.dense.items.get(key as usize)?.as_ref()
    }

    /// The value under `key`, if any, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut T> {
        self.dense.items.get_mut(key as usize)?.as_mut()
    }

    /// Live entries with their keys, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.dense
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    }

    /// Live values, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, v)| v)
    }

    /// Panics if the free list and the table disagree (`what` names the owner).
    pub(crate) fn check(&self, what: &str) {
        self.dense.check(what);
    }
}

/// A value that can stand for an empty slot of a [`DenseSlab`].
pub(crate) trait Vacancy {
    /// Whether this value's slot is empty (see [`Vacancy::vacate`]).
    fn is_vacant(&self) -> bool;
    /// Marks this value's slot empty (as cheaply as the type can: the caching policy's
    /// block sets its state), so that [`Vacancy::is_vacant`] holds.
    fn vacate(&mut self);
}

/// The table, for values that mark their own slot vacant: no `Option` tag per slot. The
/// table never shrinks, so every key [`DenseSlab::insert`] returned stays in range.
#[derive(Debug)]
pub(crate) struct DenseSlab<T> {
    items: Vec<T>,
    free: Vec<u32>,
}

impl<T> Default for DenseSlab<T> {
    fn default() -> Self {
        DenseSlab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T: Vacancy> DenseSlab<T> {
    /// Stores `value` (not vacant) and returns its key (a freed key if there is one).
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        debug_assert!(!value.is_vacant(), "a vacant value stored");
        match self.free.pop() {
            Some(key) => {
                self.items[key as usize] = value;
                key
            }
            None => {
                self.items.push(value);
                u32::try_from(self.items.len() - 1).expect("more than 4 billion live entries")
            }
        }
    }

    /// Stores a copy of the live value under `key` and returns the copy's key (a freed
    /// key if there is one): the value is copied whole, slot to slot, for the caller
    /// to change a few fields of through [`DenseSlab::live_mut`].
    #[inline]
    pub(crate) fn insert_copy(&mut self, key: u32) -> u32
    where
        T: Copy,
    {
        debug_assert!(!self.items[key as usize].is_vacant(), "key {key} is vacant");
        match self.free.pop() {
            // Read where it is written: the value goes slot to slot, not through a
            // copy kept across the vector's growth.
            Some(slot) => {
                self.items[slot as usize] = self.items[key as usize];
                slot
            }
            None => self.push_copy(key),
        }
    }

    /// [`DenseSlab::insert_copy`] when no key is free: the table grows.
    #[inline(never)]
    fn push_copy(&mut self, key: u32) -> u32
    where
        T: Copy,
    {
        let value = self.items[key as usize];
        self.items.push(value);
        u32::try_from(self.items.len() - 1).expect("more than 4 billion live entries")
    }

    /// Empties `key`'s slot without moving its value out ([`Vacancy::vacate`]); its
    /// key becomes free. Whether the key held a value.
    #[inline]
    pub(crate) fn vacate(&mut self, key: u32) -> bool {
        let Some(slot) = self.items.get_mut(key as usize) else {
            return false;
        };
        if slot.is_vacant() {
            return false;
        }
        slot.vacate();
        self.free.push(key);
        true
    }

    /// [`DenseSlab::vacate`] of a key the caller knows to be live (a key its own links
    /// hold): checked against the table's length always, against vacancy only in
    /// debug builds.
    #[inline]
    pub(crate) fn vacate_live(&mut self, key: u32) {
        let slot = &mut self.items[key as usize];
        debug_assert!(!slot.is_vacant(), "key {key} is vacant");
        slot.vacate();
        self.free.push(key);
    }

    /// The value under `key`, if any.
    #[inline]
    pub(crate) fn get(&self, key: u32) -> Option<&T> {
        self.items.get(key as usize).filter(|v| !v.is_vacant())
    }

    /// The value under `key`, which the caller knows to be live (a key its own links
    /// hold): checked against the table's length always, against vacancy only in
    /// debug builds (a vacant slot reads as the value it held last).
    #[inline(always)]
    pub(crate) fn live(&self, key: u32) -> &T {
        let value = &self.items[key as usize];
        debug_assert!(!value.is_vacant(), "key {key} is vacant");
        value
    }

    /// [`DenseSlab::live`], mutably.
    #[inline(always)]
    pub(crate) fn live_mut(&mut self, key: u32) -> &mut T {
        let value = &mut self.items[key as usize];
        debug_assert!(!value.is_vacant(), "key {key} is vacant");
        value
    }

    /// Live entries with their keys, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_vacant())
            .map(|(k, v)| (k as u32, v))
    }

    /// Panics if the free list and the table disagree (`what` names the owner).
    pub(crate) fn check(&self, what: &str) {
        let live = self.items.iter().filter(|v| !v.is_vacant()).count();
        assert_eq!(
            live + self.free.len(),
            self.items.len(),
            "{what}: slot bookkeeping"
        );
        assert!(
            self.free
                .iter()
                .all(|&k| self.items[k as usize].is_vacant()),
            "{what}: a free slot holds a value"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Vacancy for &'static str {
        fn is_vacant(&self) -> bool {
            self.is_empty()
        }
        fn vacate(&mut self) {
            *self = "";
        }
    }

    /// A dense slab keeps keys stable, reuses freed ones, tells vacant slots from live
    /// ones and keeps its counts consistent, as the slab of options does.
    #[test]
    fn dense_keys_are_stable_and_reused() {
        let mut s: DenseSlab<&'static str> = DenseSlab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert!(s.vacate(a));
        assert!(!s.vacate(a), "a vacant slot holds nothing");
        assert_eq!(s.get(a), None);
        assert!(!s.vacate(7), "a key past the table holds nothing");
        let c = s.insert("c");
        assert_eq!(c, a, "freed key reused");
        assert_eq!((s.get(b), s.live(c)), (Some(&"b"), &"c"));
        *s.live_mut(b) = "d";
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(a, &"c"), (b, &"d")]);
        s.check("test");
        let copy = s.insert_copy(b);
        assert_eq!((copy, s.live(copy), s.live(b)), (2, &"d", &"d"));
        s.vacate_live(copy);
        assert_eq!(s.get(copy), None);
        s.check("test");
        let again = s.insert_copy(a);
        assert_eq!(
            (again, s.live(again)),
            (copy, &"c"),
            "a copy into a freed key"
        );
        s.vacate_live(again);
        s.check("test");
        assert!(s.vacate(b));
        assert_eq!(s.get(b), None);
        assert_eq!(s.insert("e"), b, "a vacated key is reused");
        s.check("test");
    }

    /// A slab that grows by many vacant slots at once gives the keys a table growing
    /// one slot at a time gives (the last freed, else the next never used), through
    /// several growths and any mix of insertions and removals.
    #[test]
    fn keys_are_those_of_a_table_growing_one_slot_at_a_time() {
        let mut s = Slab::default();
        let (mut freed, mut next) = (Vec::<u32>::new(), 0u32);
        let mut live: Vec<u32> = Vec::new();
        let mut x = 12345u64;
        for step in 0..5000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Insertions more often in the first half, removals in the second.
            let insert_bias = if step < 2500 { 6 } else { 3 };
            if live.is_empty() || (x >> 60) < insert_bias {
                let expected = freed.pop().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                assert_eq!(s.insert(step), expected, "key of insertion {step}");
                live.push(expected);
            } else {
                let key = live.swap_remove((x >> 20) as usize % live.len());
                assert!(s.remove(key).is_some());
                freed.push(key);
            }
        }
        s.check("test");
        assert_eq!(s.values().count(), live.len());
    }

    /// Keys are stable, freed keys are reused, and the counts stay consistent.
    #[test]
    fn keys_are_stable_and_reused() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None);
        let c = s.insert("c");
        assert_eq!(c, a, "freed key reused");
        assert_eq!(
            (s.get(b), s.get(c), s.values().count()),
            (Some(&"b"), Some(&"c"), 2)
        );
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(a, &"c"), (b, &"b")]);
        s.check("test");
        assert_eq!(s.take_if(b, |v| *v == "x"), None, "refused: stays");
        assert_eq!(s.take_if(b, |v| *v == "b"), Some("b"));
        assert_eq!(s.get(b), None);
        assert_eq!(s.take_if(b, |_| true), None, "nothing to take twice");
        *s.get_mut(c).unwrap() = "d";
        assert_eq!(s.values().collect::<Vec<_>>(), vec![&"d"]);
        assert_eq!(s.insert("e"), b, "a key taken out is reused");
        s.check("test");
    }
}
