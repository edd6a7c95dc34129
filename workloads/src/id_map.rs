//! Values by [`AllocId`], in memory proportional to the ids live at once, not to the
//! trace's length: the table behind the replay engine's live allocations and
//! validation's live ids.
//!
//! Ids are dense integers past the reader (names are interned, numbers mostly count
//! up), so the table is flat: ids are cut into pages of [`PAGE_SLOTS`] consecutive
//! ids, a page exists only while one of its ids holds a value, and a lookup is two
//! array indexings, with no hashing. Ids from [`DENSE_LIMIT`] up (a trace that numbers
//! its allocations by address) go to a hash map instead, which is also proportional
//! to what is live. A trace whose ids count up keeps a sliding window of pages: the
//! pages themselves hold only what is live, give or take a page at each end of a live
//! run, and the page directory (16 bytes a page) covers only the pages from the oldest
//! one in use to the newest: where the directory's front is mostly empty (a run of
//! [`TRIM_GAP`] empty pages or more before its last held pages), it is cut there, and
//! the pages before the cut that still hold values (ids that live long, such as a
//! model's weights allocated first) move to an ordered map of their own, found by a
//! slower lookup. So memory follows the live ids, not the ids ever seen (the directory
//! was a slot per page ever seen: 6 MB for 10⁸ ids).

use std::collections::BTreeMap;

use crate::hash::FastMap;

use crate::trace::AllocId;

/// Ids per page (a power of two).
pub const PAGE_SLOTS: usize = 256;
const PAGE_BITS: u32 = PAGE_SLOTS.trailing_zeros();

/// Ids from this one up are kept in a hash map (the page directory would otherwise
/// grow with the largest id rather than with the ids in use: at most 8 MB of
/// directory below it).
pub const DENSE_LIMIT: u64 = 1 << 28;

/// Emptied pages kept for reuse, so an id run that keeps crossing a page boundary
/// does not allocate a page per event.
const SPARE_PAGES: usize = 4;

/// A run of this many empty pages in the page directory, before the pages it holds
/// last, is where the directory is cut when it grows (the module docs).
pub const TRIM_GAP: usize = 16;

/// The directory length below which no cut is tried.
const TRIM_MIN: usize = 64;

struct Page<T> {
    /// A fixed number of slots: a slot's index needs no bounds check.
    slots: Box<[Option<T>; PAGE_SLOTS]>,
    /// Slots holding a value.
    used: u32,
}

impl<T> Page<T> {
    #[cold]
    #[inline(never)]
    fn new() -> Page<T> {
        let slots: Box<[Option<T>]> = (0..PAGE_SLOTS).map(|_| None).collect();
        Page {
            slots: slots
                .try_into()
                .unwrap_or_else(|_| unreachable!("PAGE_SLOTS slots")),
            used: 0,
        }
    }
}

/// A map from [`AllocId`] to `T` in memory proportional to its entries (see the
/// module docs).
pub struct IdMap<T> {
    /// The page directory: page `first + i` at `pages[i]`.
    pages: Vec<Option<Page<T>>>,
    /// The page index of `pages[0]`.
    first: usize,
    /// Pages held in `pages`.
    held: usize,
    /// The directory length at which the next cut is tried (doubled after each
    /// try, so trying costs a constant per page added).
    trim_at: usize,
    /// Pages before `first` that hold values, by page index.
    behind: BTreeMap<usize, Page<T>>,
    sparse: FastMap<u64, T>,
    spare: Vec<Page<T>>,
    len: usize,
}

impl<T> Default for IdMap<T> {
    fn default() -> IdMap<T> {
        IdMap::new()
    }
}

impl<T> IdMap<T> {
    /// An empty map.
    pub fn new() -> IdMap<T> {
        IdMap {
            pages: Vec::new(),
            first: 0,
            held: 0,
            trim_at: TRIM_MIN,
            behind: BTreeMap::new(),
            sparse: FastMap::default(),
            spare: Vec::new(),
            len: 0,
        }
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn split(id: AllocId) -> (usize, usize) {
        (
            (id.0 >> PAGE_BITS) as usize,
            (id.0 as usize) & (PAGE_SLOTS - 1),
        )
    }

    /// Page `p`, if it exists: in the directory (one indexing), else behind it.
    #[inline(always)]
    fn page(&self, p: usize) -> Option<&Page<T>> {
        match self.pages.get(p.wrapping_sub(self.first)) {
            Some(page) => page.as_ref(),
            None => page_behind(&self.behind, p),
        }
    }

    /// Page `p`, to change it, if it exists.
    #[inline(always)]
    fn page_mut(&mut self, p: usize) -> Option<&mut Page<T>> {
        match self.pages.get_mut(p.wrapping_sub(self.first)) {
            Some(page) => page.as_mut(),
            None => page_behind_mut(&mut self.behind, p),
        }
    }

    /// Sets `id`'s value, returning the one it replaces.
    #[inline]
    pub fn insert(&mut self, id: AllocId, value: T) -> Option<T> {
        if id.0 >= DENSE_LIMIT {
            return self.insert_sparse(id, value);
        }
        let (p, s) = Self::split(id);
        let page = match self.page_mut(p) {
            Some(page) => page,
            None => self.new_page(p),
        };
        let old = page.slots[s].replace(value);
        if old.is_none() {
            page.used += 1;
            self.len += 1;
        }
        old
    }

    /// Sets the value of `id`, which has none: `Err` gives `value` back, untouched,
    /// where `id` has one (the caller decides what a replacement means, with
    /// [`IdMap::insert`]). One lookup, no move of an old value.
    #[inline]
    pub fn insert_vacant(&mut self, id: AllocId, value: T) -> Result<(), T> {
        if id.0 >= DENSE_LIMIT {
            return self.insert_vacant_sparse(id, value);
        }
        let (p, s) = Self::split(id);
        let page = match self.page_mut(p) {
            Some(page) => page,
            None => self.new_page(p),
        };
        let slot = &mut page.slots[s];
        if slot.is_some() {
            return Err(value);
        }
        *slot = Some(value);
        page.used += 1;
        self.len += 1;
        Ok(())
    }

    /// `id`'s place, where `id` is below [`DENSE_LIMIT`] and its page is in the
    /// directory: found once, then read, filled or emptied without a second lookup (a
    /// caller that borrows the value while it calls something else, then empties the
    /// slot). `None` for other ids (a page behind the directory included), whose
    /// values the other methods take.
    #[inline(always)]
    pub fn place(&mut self, id: AllocId) -> Option<Place<'_, T>> {
        if id.0 >= DENSE_LIMIT {
            return None;
        }
        let (p, s) = Self::split(id);
        let page = self.pages.get_mut(p.wrapping_sub(self.first))?.as_mut()?;
        Some(Place {
            slot: &mut page.slots[s],
            used: &mut page.used,
            len: &mut self.len,
        })
    }

    /// Drops `id`'s page if no id in it holds a value, or keeps it as a spare (after
    /// [`Place::discard`] said its page was left empty).
    #[cold]
    #[inline(never)]
    pub fn release_if_empty(&mut self, id: AllocId) {
        if id.0 >= DENSE_LIMIT {
            return;
        }
        let (p, _) = Self::split(id);
        if self.page(p).is_some_and(|page| page.used == 0) {
            self.release_page(p);
        }
    }

    /// Page `p`, which is missing, made (or taken from the spares): in the directory,
    /// grown (and cut, [`IdMap::trim`]) to reach it, or behind it for a page before
    /// the directory's first.
    #[cold]
    #[inline(never)]
    fn new_page(&mut self, p: usize) -> &mut Page<T> {
        let page = self.spare.pop().unwrap_or_else(Page::new);
        if self.held == 0 {
            // Nothing in the directory: it starts again at `p`, or just after the
            // pages behind it (every page behind comes before `first`).
            let floor = self.behind.last_key_value().map_or(0, |(&q, _)| q + 1);
            self.pages.clear();
            self.first = p.max(floor);
        }
        if p < self.first {
            return self.behind.entry(p).or_insert(page);
        }
        if p - self.first >= self.pages.len() {
            if self.pages.len() >= self.trim_at {
                self.trim();
                if self.pages.is_empty() {
                    // Cut whole: every page behind comes before `first`, so before `p`.
                    self.first = p;
                }
            }
            self.pages.resize_with(p - self.first + 1, || None);
        }
        self.held += 1;
        let slot = &mut self.pages[p - self.first];
        debug_assert!(slot.is_none(), "the page was missing");
        slot.insert(page)
    }

    /// Cuts the directory's front where it is mostly empty: after the last run of
    /// [`TRIM_GAP`] empty pages or more that comes before the last pages it holds
    /// (all of it where it ends in such a run). Pages before the cut that hold values
    /// move behind the directory. The next try comes when the directory has doubled.
    #[cold]
    #[inline(never)]
    fn trim(&mut self) {
        let mut cut = 0;
        let mut run = 0;
        for (i, page) in self.pages.iter().enumerate() {
            if page.is_some() {
                if run >= TRIM_GAP {
                    cut = i;
                }
                run = 0;
            } else {
                run += 1;
            }
        }
        if run >= TRIM_GAP {
            cut = self.pages.len();
        }
        if cut > 0 {
            for (i, page) in self.pages.drain(..cut).enumerate() {
                if let Some(page) = page {
                    self.behind.insert(self.first + i, page);
                    self.held -= 1;
                }
            }
            self.first += cut;
        }
        self.trim_at = (2 * self.pages.len()).max(TRIM_MIN);
    }

    /// [`IdMap::insert_vacant`] of a sparse id: one lookup.
    #[cold]
    #[inline(never)]
    fn insert_vacant_sparse(&mut self, id: AllocId, value: T) -> Result<(), T> {
        match self.sparse.entry(id.0) {
            std::collections::hash_map::Entry::Occupied(_) => Err(value),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(value);
                self.len += 1;
                Ok(())
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn insert_sparse(&mut self, id: AllocId, value: T) -> Option<T> {
        let old = self.sparse.insert(id.0, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// `id`'s value.
    #[inline]
    pub fn get(&self, id: AllocId) -> Option<&T> {
        if id.0 >= DENSE_LIMIT {
            return self.sparse.get(&id.0);
        }
        let (p, s) = Self::split(id);
        self.page(p)?.slots[s].as_ref()
    }

    /// `id`'s value, to change it.
    #[inline]
    pub fn get_mut(&mut self, id: AllocId) -> Option<&mut T> {
        if id.0 >= DENSE_LIMIT {
            return self.sparse.get_mut(&id.0);
        }
        let (p, s) = Self::split(id);
        self.page_mut(p)?.slots[s].as_mut()
    }

    /// Takes `id`'s value out; a page left empty is dropped (or kept as a spare).
    #[inline]
    pub fn remove(&mut self, id: AllocId) -> Option<T> {
        if id.0 >= DENSE_LIMIT {
            return self.remove_sparse(id);
        }
        let (p, s) = Self::split(id);
        let page = self.page_mut(p)?;
        let old = page.slots[s].take()?;
        page.used -= 1;
        let emptied = page.used == 0;
        self.len -= 1;
        if emptied {
            self.release_page(p);
        }
        Some(old)
    }

    /// Drops the emptied page `p` (or keeps it as a spare).
    #[cold]
    #[inline(never)]
    fn release_page(&mut self, p: usize) {
        let page = match self.pages.get_mut(p.wrapping_sub(self.first)) {
            Some(page) => {
                self.held -= 1;
                page.take()
            }
            None => self.behind.remove(&p),
        };
        let page = page.expect("the page was just used");
        if self.spare.len() < SPARE_PAGES {
            self.spare.push(page);
        }
    }

    #[cold]
    #[inline(never)]
    fn remove_sparse(&mut self, id: AllocId) -> Option<T> {
        let old = self.sparse.remove(&id.0);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Every entry: dense ids in increasing order, then the others in no fixed order
    /// (sort them where the order matters).
    pub fn iter(&self) -> impl Iterator<Item = (AllocId, &T)> {
        let first = self.first;
        self.behind
            .iter()
            .map(|(&p, page)| (p, page))
            .chain(
                self.pages
                    .iter()
                    .enumerate()
                    .filter_map(move |(i, page)| page.as_ref().map(|page| (first + i, page))),
            )
            .flat_map(|(p, page)| {
                page.slots.iter().enumerate().filter_map(move |(s, v)| {
                    v.as_ref()
                        .map(|v| (AllocId(((p as u64) << PAGE_BITS) | s as u64), v))
                })
            })
            .chain(self.sparse.iter().map(|(&id, v)| (AllocId(id), v)))
    }

    /// Removes every entry, in the order of [`IdMap::iter`].
    pub fn drain(&mut self) -> Vec<(AllocId, T)> {
        let mut out = Vec::with_capacity(self.len);
        let first = self.first;
        let behind = std::mem::take(&mut self.behind);
        let pages = self
            .pages
            .drain(..)
            .enumerate()
            .filter_map(|(i, page)| page.map(|page| (first + i, page)));
        for (p, page) in behind.into_iter().chain(pages) {
            let slots: Box<[Option<T>]> = page.slots;
            for (s, v) in slots.into_vec().into_iter().enumerate() {
                if let Some(v) = v {
                    out.push((AllocId(((p as u64) << PAGE_BITS) | s as u64), v));
                }
            }
        }
        out.extend(self.sparse.drain().map(|(id, v)| (AllocId(id), v)));
        self.held = 0;
        self.len = 0;
        out
    }

    /// Pages held now (for tests of the memory bound).
    pub fn pages_held(&self) -> usize {
        self.pages.iter().flatten().count() + self.behind.len()
    }

    /// Entries of the page directory now (for tests of the memory bound).
    pub fn directory_len(&self) -> usize {
        self.pages.len()
    }
}

/// Page `p` behind the directory, if it exists there (a slower lookup, out of line).
#[cold]
#[inline(never)]
fn page_behind<T>(behind: &BTreeMap<usize, Page<T>>, p: usize) -> Option<&Page<T>> {
    behind.get(&p)
}

/// [`page_behind`], to change the page.
#[cold]
#[inline(never)]
fn page_behind_mut<T>(behind: &mut BTreeMap<usize, Page<T>>, p: usize) -> Option<&mut Page<T>> {
    behind.get_mut(&p)
}

/// A slot of an [`IdMap`] found once ([`IdMap::place`]).
pub struct Place<'a, T> {
    slot: &'a mut Option<T>,
    used: &'a mut u32,
    len: &'a mut usize,
}

impl<T> Place<'_, T> {
    /// The value, if the slot holds one.
    #[inline(always)]
    pub fn get(&self) -> Option<&T> {
        self.slot.as_ref()
    }

    /// The value, to change it, if the slot holds one.
    #[inline(always)]
    pub fn get_mut(&mut self) -> Option<&mut T> {
        self.slot.as_mut()
    }

    /// Sets the value of the slot, which holds none: `Err` gives `value` back,
    /// untouched, where it holds one.
    #[inline(always)]
    pub fn fill(self, value: T) -> Result<(), T> {
        if self.slot.is_some() {
            return Err(value);
        }
        *self.slot = Some(value);
        *self.used += 1;
        *self.len += 1;
        Ok(())
    }

    /// Drops the value where it lies (nothing is moved out); nothing happens where
    /// the slot holds none. `true` where the page is left empty: the caller then
    /// calls [`IdMap::release_if_empty`], as the map keeps no empty page.
    #[inline(always)]
    #[must_use = "an emptied page is released by IdMap::release_if_empty"]
    pub fn discard(self) -> bool {
        if self.slot.is_none() {
            return false;
        }
        *self.slot = None;
        *self.used -= 1;
        *self.len -= 1;
        *self.used == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Insert, get, replace and remove agree with a hash map, for dense and sparse ids.
    #[test]
    fn behaves_as_a_map() {
        let mut m = IdMap::new();
        let mut reference = HashMap::new();
        let ids = [0, 1, 255, 256, 1000, DENSE_LIMIT - 1, DENSE_LIMIT, u64::MAX];
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(m.insert(AllocId(id), i), reference.insert(id, i));
        }
        assert_eq!(m.insert(AllocId(256), 99), reference.insert(256, 99));
        assert_eq!(
            m.insert(AllocId(u64::MAX), 98),
            reference.insert(u64::MAX, 98)
        );
        assert_eq!(m.len(), reference.len());
        for &id in &ids {
            assert_eq!(m.get(AllocId(id)), reference.get(&id));
        }
        assert_eq!(m.get(AllocId(2)), None);
        *m.get_mut(AllocId(1)).unwrap() += 10;
        *reference.get_mut(&1).unwrap() += 10;
        for &id in &ids {
            assert_eq!(m.remove(AllocId(id)), reference.remove(&id));
            assert_eq!(m.remove(AllocId(id)), None);
        }
        assert!(m.is_empty());
        assert_eq!(m.pages_held(), 0);
    }

    /// `insert_vacant` sets an id that has no value and gives the value back, the
    /// old one kept, for an id that has one, dense or sparse.
    #[test]
    fn insert_vacant_keeps_a_taken_id() {
        let mut m = IdMap::new();
        for id in [5, 300, DENSE_LIMIT + 3] {
            assert_eq!(m.insert_vacant(AllocId(id), id), Ok(()));
            assert_eq!(m.insert_vacant(AllocId(id), 7), Err(7));
            assert_eq!(m.get(AllocId(id)), Some(&id));
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.remove(AllocId(300)), Some(300));
        assert_eq!(m.insert_vacant(AllocId(300), 8), Ok(()));
        assert_eq!(m.get(AllocId(300)), Some(&8));
    }

    /// A place found once reads, fills and empties its slot as the map's own
    /// methods do; emptying the last value of a page and releasing it leaves no page;
    /// ids without a page, or sparse ones, have no place.
    #[test]
    fn places_agree_with_the_map() {
        let mut m = IdMap::new();
        assert!(m.place(AllocId(3)).is_none(), "no page yet");
        m.insert(AllocId(3), 30);
        assert!(m.place(AllocId(DENSE_LIMIT)).is_none(), "sparse");
        assert_eq!(m.place(AllocId(3)).unwrap().get(), Some(&30));
        assert_eq!(m.place(AllocId(4)).unwrap().fill(40), Ok(()));
        assert_eq!(m.place(AllocId(4)).unwrap().fill(41), Err(41));
        *m.place(AllocId(4)).unwrap().get_mut().unwrap() += 2;
        assert_eq!((m.get(AllocId(4)), m.len()), (Some(&42), 2));
        assert!(!m.place(AllocId(5)).unwrap().discard(), "nothing there");
        assert!(!m.place(AllocId(3)).unwrap().discard());
        assert_eq!((m.get(AllocId(3)), m.len()), (None, 1));
        m.release_if_empty(AllocId(4));
        assert_eq!(m.pages_held(), 1, "a page holding a value stays");
        assert!(
            m.place(AllocId(4)).unwrap().discard(),
            "the page is left empty"
        );
        m.release_if_empty(AllocId(4));
        assert_eq!((m.len(), m.pages_held()), (0, 0));
    }

    /// A sliding window of live ids counting up holds a few pages, not one per id
    /// ever seen.
    #[test]
    fn memory_follows_the_live_ids() {
        let mut m = IdMap::new();
        for id in 0..100_000u64 {
            m.insert(AllocId(id), id);
            if id >= 50 {
                assert_eq!(m.remove(AllocId(id - 50)), Some(id - 50));
            }
        }
        assert_eq!(m.len(), 50);
        assert!(m.pages_held() <= 2, "{} pages", m.pages_held());
    }

    /// Ids counting up past one that stays live (a model's weights, allocated first)
    /// keep a directory of a few pages, not one entry per page ever seen: the live
    /// id's page moves behind the directory and is still found, changed and freed.
    #[test]
    fn the_directory_follows_the_live_ids_past_a_long_lived_one() {
        let mut m = IdMap::new();
        m.insert(AllocId(0), u64::MAX);
        for id in 1..1_000_000u64 {
            m.insert(AllocId(id), id);
            if id >= 51 {
                assert_eq!(m.remove(AllocId(id - 50)), Some(id - 50));
            }
        }
        assert_eq!(m.len(), 51);
        assert!(m.pages_held() <= 3, "{} pages", m.pages_held());
        assert!(
            m.directory_len() <= 2 * TRIM_MIN,
            "{} directory entries for {} pages seen",
            m.directory_len(),
            1_000_000 / PAGE_SLOTS
        );
        assert_eq!(m.get(AllocId(0)), Some(&u64::MAX));
        *m.get_mut(AllocId(0)).unwrap() -= 1;
        assert!(m.place(AllocId(0)).is_none(), "behind the directory");
        let ids: Vec<u64> = m.iter().map(|(id, _)| id.0).take(2).collect();
        assert_eq!(ids, [0, 999_950], "the page behind comes first");
        assert_eq!(m.insert_vacant(AllocId(1), 1), Ok(()), "a new id behind");
        assert_eq!(m.remove(AllocId(0)), Some(u64::MAX - 1));
        assert_eq!(m.remove(AllocId(1)), Some(1));
        assert_eq!((m.len(), m.get(AllocId(0))), (50, None));
        assert!(m.pages_held() <= 2, "{} pages", m.pages_held());
    }

    /// Ids in an order the directory's cuts do not expect (counting up, then from 0
    /// again, jumps, some left live) agree with a hash map throughout.
    #[test]
    fn cuts_keep_every_value() {
        let mut m = IdMap::new();
        let mut reference = HashMap::new();
        let mut ids: Vec<u64> = (0..200_000).collect();
        ids.extend(0..100_000);
        ids.extend((0..50_000).map(|i| i * 97 % 300_000));
        ids.extend((1_000_000..1_100_000).rev());
        for (n, &id) in ids.iter().enumerate() {
            if n % 3 == 2 || (id % 1000 == 7 && reference.contains_key(&id)) {
                assert_eq!(m.remove(AllocId(id)), reference.remove(&id), "remove {id}");
            } else {
                assert_eq!(
                    m.insert(AllocId(id), n),
                    reference.insert(id, n),
                    "insert {id}"
                );
            }
            if n % 1000 == 0 {
                let probe = ids[n / 2];
                assert_eq!(m.get(AllocId(probe)), reference.get(&probe), "get {probe}");
            }
        }
        assert_eq!(m.len(), reference.len());
        let mut expected: Vec<(u64, usize)> = reference.into_iter().collect();
        expected.sort_unstable();
        let got: Vec<(u64, usize)> = m.iter().map(|(id, &v)| (id.0, v)).collect();
        assert_eq!(got, expected, "iteration in id order");
        let drained: Vec<(u64, usize)> = m.drain().into_iter().map(|(id, v)| (id.0, v)).collect();
        assert_eq!(drained, expected);
        assert_eq!((m.len(), m.pages_held()), (0, 0));
    }

    /// Iteration and draining give dense ids in order, then the sparse ones.
    #[test]
    fn iterates_in_id_order() {
        let mut m = IdMap::new();
        for id in [700u64, 3, DENSE_LIMIT + 5, 256] {
            m.insert(AllocId(id), ());
        }
        let ids: Vec<u64> = m.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, [3, 256, 700, DENSE_LIMIT + 5]);
        let drained: Vec<u64> = m.drain().into_iter().map(|(id, _)| id.0).collect();
        assert_eq!(drained, ids);
        assert!(m.is_empty() && m.get(AllocId(3)).is_none());
    }
}
