//! The arena's chunks and superblocks by slot, each with its free list, and beside them
//! a compact copy of each list's bound (at least its longest free range:
//! [`FreeList`](super::free_list::FreeList)), so that first fit over a stream's
//! superblocks (or the global arena's chunks) passes over those that cannot hold the
//! request by one load each, in one array, instead of searching their lists; and the
//! lists themselves ([`Order`]: a stream arena's superblocks, the global arena's chunks,
//! the orphan superblocks) in runs of [`RUN`], each run with an upper bound of its members' bounds, so that a
//! search passes over a run that cannot hold the request by one load.
//!
//! RMM searches every superblock's list in turn; so did this policy, and a stream with
//! many superblocks (thousands of small blocks live) made each small allocation a walk
//! of hundreds of lists: ~10⁴ live blocks of 512 B to 64 KiB replayed 12× slower than 25
//! (docs/performance.md, "Cost against length and live allocations"); with the bounds
//! alone it was still one load per superblock (3.5·10⁵ live, ~4 500 superblocks: 3.5×
//! slower than caching). The choice is the same: the first region in arena order whose
//! free list holds the request, and the first range there (a run is passed over only
//! when no member's bound, so no member's longest range, reaches the request). A
//! region's free list changes only through this table, which keeps the copies in step
//! ([`Regions::check`] holds them to the lists): a free raises its run's bound, a search
//! that reads a run through without a fit brings it down to just below the request.

use super::{Holder, Place, Region};
use crate::slab::Slab;

/// The regions of an [`Order`] are passed over in runs of this many.
pub(super) const RUN: usize = 64;

/// The run of a region in no order (an orphan superblock).
pub(super) const NO_RUN: u32 = u32::MAX;

/// How many runs an order of `len` regions has: none for one run's worth or fewer.
fn runs_for(len: usize) -> usize {
    if len > RUN {
        len.div_ceil(RUN)
    } else {
        0
    }
}

/// Regions in arena order, each as its place and slot: a stream arena's superblocks or
/// the global arena's chunks. Changed only through [`Regions`], which keeps the bounds
/// of its runs.
#[derive(Debug, Default)]
pub(super) struct Order {
    items: Vec<(Place, u32)>,
    /// By run (`items[k * RUN..]`): its id in [`Regions::run_bound`]; none when there
    /// are no more than [`RUN`] regions.
    runs: Vec<u32>,
}

impl Order {
    /// An empty order.
    pub(super) const EMPTY: Order = Order {
        items: Vec::new(),
        runs: Vec::new(),
    };

    /// The regions, in arena order.
    #[inline(always)]
    pub(super) fn items(&self) -> &[(Place, u32)] {
        &self.items
    }

    /// How many regions.
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// No region.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Chunks and superblocks by slot (a live block names its region's slot).
#[derive(Debug, Default)]
pub(super) struct Regions {
    slab: Slab<Region>,
    /// By slot: the bound of the free list of the region there (0 for a vacant slot).
    bound: Vec<u64>,
    /// By run id: at least the largest bound of the run's members.
    run_bound: Vec<u64>,
    /// Run ids no order uses.
    spare_runs: Vec<u32>,
}

impl Regions {
    /// Adds `region`; its slot.
    pub(super) fn insert(&mut self, region: Region) -> u32 {
        let bound = region.free.bound();
        let slot = self.slab.insert(region);
        let i = slot as usize;
        if self.bound.len() <= i {
            self.bound.resize(i + 1, 0);
        }
        self.bound[i] = bound;
        slot
    }

    /// Takes the region in `slot` out (it must be in no order).
    pub(super) fn remove(&mut self, slot: u32) -> Option<Region> {
        let region = self.slab.remove(slot)?;
        assert_eq!(
            region.run, NO_RUN,
            "arena: a region removed while in an order"
        );
        self.bound[slot as usize] = 0;
        Some(region)
    }

    /// Puts the region in `slot` (at `place`) into `order`, in arena order.
    pub(super) fn place_in(&mut self, order: &mut Order, place: Place, slot: u32) {
        let at = order.items.partition_point(|&(p, _)| p < place);
        order.items.insert(at, (place, slot));
        if order.runs.len() != runs_for(order.items.len()) {
            self.regroup(order, at / RUN);
            return;
        }
        // Each run from `at`'s on gains the region now at its front (`at`'s run the new
        // one) and passes its last to the next run: each is raised by the one it gains
        // (the bound of one that left is still an upper bound of those that stay).
        for k in at / RUN..order.runs.len() {
            self.join_run(order, k, if k == at / RUN { at } else { k * RUN });
        }
    }

    /// Takes the `i`-th region out of `order`; its place and slot.
    pub(super) fn take_out(&mut self, order: &mut Order, i: usize) -> (Place, u32) {
        let (place, slot) = order.items.remove(i);
        self.region_mut(slot).run = NO_RUN;
        if order.runs.len() != runs_for(order.items.len()) {
            self.regroup(order, i / RUN);
            return (place, slot);
        }
        // Each run from `i`'s on gains the region now at its end, from the next run.
        for k in i / RUN..order.runs.len() {
            let last = (k + 1) * RUN - 1;
            if last < order.items.len() {
                self.join_run(order, k, last);
            }
        }
        (place, slot)
    }

    /// Makes the `i`-th region of `order` a member of its `k`-th run, raising the run's
    /// bound by its own.
    fn join_run(&mut self, order: &Order, k: usize, i: usize) {
        let id = order.runs[k];
        let slot = order.items[i].1;
        self.region_mut(slot).run = id;
        let bound = self.bound[slot as usize];
        let run_bound = &mut self.run_bound[id as usize];
        *run_bound = (*run_bound).max(bound);
    }

    /// Adds `items` (in arena order, none in an order) to `order`: one at a time when
    /// they are few (a memory move and a region for each run after its place), else
    /// in one pass over both (every region of the order touched twice).
    pub(super) fn merge_into(&mut self, order: &mut Order, items: Vec<(Place, u32)>) {
        if items.len() <= order.len() / RUN {
            for (place, slot) in items {
                self.place_in(order, place, slot);
            }
            return;
        }
        let held = self.take_all(order);
        let mut merged = Vec::with_capacity(held.len() + items.len());
        let (mut a, mut b) = (held.into_iter().peekable(), items.into_iter().peekable());
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            let next = if x.0 < y.0 { a.next() } else { b.next() };
            merged.extend(next);
        }
        merged.extend(a);
        merged.extend(b);
        self.fill(order, merged);
    }

    /// Empties `order`; its regions, in arena order.
    pub(super) fn take_all(&mut self, order: &mut Order) -> Vec<(Place, u32)> {
        for &(_, slot) in &order.items {
            self.region_mut(slot).run = NO_RUN;
        }
        self.spare_runs.append(&mut order.runs);
        std::mem::take(&mut order.items)
    }

    /// Fills the empty `order` with `items` (in arena order).
    pub(super) fn fill(&mut self, order: &mut Order, items: Vec<(Place, u32)>) {
        assert!(
            order.is_empty(),
            "arena: filling an order that is not empty"
        );
        order.items = items;
        self.regroup(order, 0);
    }

    /// Gives `order` one run id per [`RUN`] regions (none when it has no more than
    /// one run's worth: it is read through anyway), and sets the members and the bound
    /// of every run from `from` on.
    fn regroup(&mut self, order: &mut Order, from: usize) {
        let want = runs_for(order.items.len());
        if want == 0 {
            for &(_, slot) in &order.items {
                self.region_mut(slot).run = NO_RUN;
            }
        }
        let from = if order.runs.is_empty() { 0 } else { from };
        while order.runs.len() > want {
            let id = order.runs.pop().expect("more runs than wanted");
            self.spare_runs.push(id);
        }
        while order.runs.len() < want {
            let id = self.spare_runs.pop().unwrap_or_else(|| {
                self.run_bound.push(0);
                u32::try_from(self.run_bound.len() - 1).expect("arena: over 2^32 runs")
            });
            order.runs.push(id);
        }
        let runs = order.items.chunks(RUN).zip(&order.runs);
        for (run, &id) in runs.skip(from) {
            let mut bound = 0;
            for &(_, slot) in run {
                self.region_mut(slot).run = id;
                bound = bound.max(self.bound[slot as usize]);
            }
            self.run_bound[id as usize] = bound;
        }
    }

    /// The region in `slot`, to change.
    fn region_mut(&mut self, slot: u32) -> &mut Region {
        self.slab
            .get_mut(slot)
            .expect("arena: an order names an empty slot")
    }

    /// The region in `slot`.
    #[inline]
    pub(super) fn get(&self, slot: u32) -> Option<&Region> {
        self.slab.get(slot)
    }

    /// Gives the region in `slot` to `holder` (its free list unchanged).
    pub(super) fn set_holder(&mut self, slot: u32, holder: Holder) {
        self.slab
            .get_mut(slot)
            .expect("arena: a region slot without its region")
            .holder = holder;
    }

    /// Every region.
    pub(super) fn values(&self) -> impl Iterator<Item = &Region> {
        self.slab.values()
    }

    /// Address-ordered first fit in the region in `slot`: carves `bytes` from the first
    /// range that holds them; none where the list's bound is below `bytes` (no search),
    /// and a search that finds none brings the bound down (a carve leaves it as it was).
    #[inline(always)]
    pub(super) fn first_fit(&mut self, slot: u32, bytes: u64) -> Option<u64> {
        let region = self
            .slab
            .get_mut(slot)
            .expect("arena: an arena names an empty slot");
        if region.free.bound() < bytes {
            return None;
        }
        let addr = region.free.carve_first(bytes);
        if addr.is_none() {
            self.bound[slot as usize] = region.free.bound();
        }
        addr
    }

    /// The address first fit would carve for `bytes` in the region in `slot`, without
    /// carving it; none where the list's bound is below `bytes`, and a search that finds
    /// none brings the bound down (as in [`Regions::first_fit`], whose body this repeats
    /// with another search of the list: through one body taking the search as a
    /// closure, the dense benchmark trace ran 10 more instructions an event under
    /// arena, 412.5 → 422.5 M at 10⁶ events).
    fn peek(&mut self, slot: u32, bytes: u64) -> Option<u64> {
        let region = self
            .slab
            .get_mut(slot)
            .expect("arena: an order names an empty slot");
        if region.free.bound() < bytes {
            return None;
        }
        let addr = region.free.peek_lowering(bytes);
        if addr.is_none() {
            self.bound[slot as usize] = region.free.bound();
        }
        addr
    }

    /// First fit over `order`: the first region (arena order) whose free list holds
    /// `bytes`, carved there; its place, the block's address and the region's slot.
    #[inline(always)]
    pub(super) fn first_fit_among(
        &mut self,
        order: &Order,
        bytes: u64,
    ) -> Option<(Place, u64, u32)> {
        // The first region is tried at once (in a steady run it is usually the one
        // that holds the request), by its own list's bound, next to the list; then the
        // runs, each passed over by its bound, and a run's members by the compact copy,
        // so that passing one over reads one array. The loops of [`Regions::search`],
        // written out for first fit: through its closure the allocation's usual path
        // ran 6.4 more instructions an event (callgrind, the dense benchmark trace).
        let items = &order.items;
        let &(place, slot) = items.first()?;
        if let Some(addr) = self.first_fit(slot, bytes) {
            return Some((place, addr, slot));
        }
        if order.runs.is_empty() {
            return self.first_fit_in(&items[1..], bytes);
        }
        for (run, &id) in items.chunks(RUN).zip(&order.runs) {
            if self.run_bound[id as usize] < bytes {
                continue;
            }
            if let Some(found) = self.first_fit_in(run, bytes) {
                return Some(found);
            }
            // Read through without a fit: every member's bound is now below `bytes`.
            self.run_bound[id as usize] = bytes.saturating_sub(1);
        }
        None
    }

    /// [`Regions::first_fit_among`] over the regions of `run`, each passed over by the
    /// compact copy of its bound.
    #[inline(always)]
    fn first_fit_in(&mut self, run: &[(Place, u32)], bytes: u64) -> Option<(Place, u64, u32)> {
        for &(place, slot) in run {
            if self.bound[slot as usize] >= bytes {
                if let Some(addr) = self.first_fit(slot, bytes) {
                    return Some((place, addr, slot));
                }
            }
        }
        None
    }

    /// The first region of `order` (arena order) whose free list holds `bytes`: its
    /// index in `order` and the address first fit would carve there (nothing carved).
    pub(super) fn first_holding(&mut self, order: &Order, bytes: u64) -> Option<(usize, u64)> {
        self.search(order, bytes, |r, slot| r.peek(slot, bytes))
    }

    /// The first region of `order` (arena order) for which `try_one` (a search of its
    /// free list for `bytes` that brings its bound down when it finds nothing) answers:
    /// its index and the answer. Runs whose bound is below `bytes` are passed over by
    /// one load, and regions by the compact copy of their bound; a run read through
    /// without an answer has its bound brought down to just below `bytes`, since every
    /// member's bound is then below it.
    fn search(
        &mut self,
        order: &Order,
        bytes: u64,
        mut try_one: impl FnMut(&mut Regions, u32) -> Option<u64>,
    ) -> Option<(usize, u64)> {
        let mut scan = |this: &mut Regions, start: usize, run: &[(Place, u32)]| {
            for (i, &(_, slot)) in run.iter().enumerate() {
                if this.bound[slot as usize] >= bytes {
                    if let Some(found) = try_one(this, slot) {
                        return Some((start + i, found));
                    }
                }
            }
            None
        };
        if order.runs.is_empty() {
            return scan(self, 0, &order.items);
        }
        for (k, (run, &id)) in order.items.chunks(RUN).zip(&order.runs).enumerate() {
            if self.run_bound[id as usize] < bytes {
                continue;
            }
            if let Some(found) = scan(self, k * RUN, run) {
                return Some(found);
            }
            self.run_bound[id as usize] = bytes.saturating_sub(1);
        }
        None
    }

    /// Returns `addr..addr + len` to the region in `slot`, merging it with free
    /// neighbours; the region.
    #[inline(always)]
    pub(super) fn give_back(&mut self, slot: u32, addr: u64, len: u64) -> &Region {
        let region = self
            .slab
            .get_mut(slot)
            .expect("arena: a live block's chunk or superblock is gone");
        region.free.insert(addr, len);
        let bound = region.free.bound();
        self.bound[slot as usize] = bound;
        let run = region.run;
        if run != NO_RUN {
            let run_bound = &mut self.run_bound[run as usize];
            *run_bound = (*run_bound).max(bound);
        }
        region
    }

    /// Panics unless the slab is sound, every region's bound is the one kept beside it
    /// (and a vacant slot's is 0), and `orders` (every order there is) are in arena
    /// order, each region in one of them at most, in its run, under its run's bound.
    pub(super) fn check<'a>(&self, what: &str, orders: impl IntoIterator<Item = &'a Order>) {
        self.slab.check(what);
        let mut held = vec![false; self.bound.len()];
        for (slot, region) in self.slab.iter() {
            assert_eq!(
                self.bound.get(slot as usize).copied(),
                Some(region.free.bound()),
                "{what}: slot {slot}'s bound is not the one kept"
            );
            held[slot as usize] = true;
        }
        assert!(
            self.bound
                .iter()
                .zip(&held)
                .all(|(&b, &held)| held || b == 0),
            "{what}: a vacant slot keeps a bound"
        );
        let mut ordered = vec![false; self.bound.len()];
        let mut used = vec![false; self.run_bound.len()];
        for &id in &self.spare_runs {
            assert!(
                !std::mem::replace(&mut used[id as usize], true),
                "{what}: run {id} spare twice"
            );
        }
        for order in orders {
            assert!(
                order.items.windows(2).all(|w| w[0].0 < w[1].0),
                "{what}: an order out of arena order"
            );
            assert_eq!(
                order.runs.len(),
                runs_for(order.items.len()),
                "{what}: runs of an order"
            );
            for (i, &(place, slot)) in order.items.iter().enumerate() {
                let region = self
                    .slab
                    .get(slot)
                    .unwrap_or_else(|| panic!("{what}: an order names the empty slot {slot}"));
                assert_eq!(
                    region.place, place,
                    "{what}: slot {slot} listed at another place"
                );
                assert!(
                    !std::mem::replace(&mut ordered[slot as usize], true),
                    "{what}: slot {slot} in two orders"
                );
                let id = order.runs.get(i / RUN).copied().unwrap_or(NO_RUN);
                assert_eq!(region.run, id, "{what}: slot {slot} is not in its run");
                assert!(
                    id == NO_RUN || self.run_bound[id as usize] >= self.bound[slot as usize],
                    "{what}: slot {slot}'s bound is above its run's"
                );
            }
            for &id in &order.runs {
                assert!(
                    !std::mem::replace(&mut used[id as usize], true),
                    "{what}: run {id} used twice"
                );
            }
        }
        assert!(used.iter().all(|&u| u), "{what}: a run id lost");
        assert!(
            self.slab
                .iter()
                .all(|(slot, r)| ordered[slot as usize] || r.run == NO_RUN),
            "{what}: a region outside every order keeps a run"
        );
    }
}
