//! The arena's chunks and superblocks by slot, each with its free list, and beside them
//! a compact copy of each list's bound (at least its longest free range:
//! [`FreeList`](super::free_list::FreeList)), so that first fit over a stream's
//! superblocks (or the global arena's chunks) passes over those that cannot hold the
//! request by one load each, in one array, instead of searching their lists.
//!
//! RMM searches every superblock's list in turn; so did this policy, and a stream with
//! many superblocks (thousands of small blocks live) made each small allocation a walk
//! of hundreds of lists: ~10⁴ live blocks of 512 B to 64 KiB replayed 12× slower than 25
//! (docs/performance.md, "Cost against length and live allocations"). The choice is
//! the same: the first region in arena order whose free list holds the request, and the
//! first range there. A region's free list changes only through this table, which keeps
//! the copy in step ([`Regions::check`] holds it to the lists).

use super::{Holder, Place, Region};
use crate::slab::Slab;

/// Chunks and superblocks by slot (a live block names its region's slot).
#[derive(Debug, Default)]
pub(super) struct Regions {
    slab: Slab<Region>,
    /// By slot: the bound of the free list of the region there (0 for a vacant slot).
    bound: Vec<u64>,
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

    /// Takes the region in `slot` out.
    pub(super) fn remove(&mut self, slot: u32) -> Option<Region> {
        let region = self.slab.remove(slot)?;
        self.bound[slot as usize] = 0;
        Some(region)
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

    /// First fit over `candidates` (places and slots, in arena order): the first region
    /// whose free list holds `bytes`, carved there; its place, the block's address and
    /// the region's slot.
    #[inline(always)]
    pub(super) fn first_fit_among(
        &mut self,
        candidates: &[(Place, u32)],
        bytes: u64,
    ) -> Option<(Place, u64, u32)> {
        // The first region is tried at once (in a steady run it is usually the one
        // that holds the request), by its own list's bound, next to the list; the
        // others by the compact copy first, so that passing one over reads one array.
        let (&(place, slot), rest) = candidates.split_first()?;
        if let Some(addr) = self.first_fit(slot, bytes) {
            return Some((place, addr, slot));
        }
        for &(place, slot) in rest {
            if self.bound.get(slot as usize).is_some_and(|&b| b >= bytes) {
                if let Some(addr) = self.first_fit(slot, bytes) {
                    return Some((place, addr, slot));
                }
            }
        }
        None
    }

    /// The first region of `candidates` (arena order) whose free list holds `bytes`:
    /// its place and the address first fit would carve there (nothing carved).
    pub(super) fn peek_among(
        &self,
        candidates: &[(Place, u32)],
        bytes: u64,
    ) -> Option<(Place, u64)> {
        candidates.iter().find_map(|&(place, slot)| {
            if self.bound.get(slot as usize).is_none_or(|&b| b < bytes) {
                return None;
            }
            let region = self
                .slab
                .get(slot)
                .expect("arena: an arena names an empty slot");
            region.free.peek(bytes).map(|addr| (place, addr))
        })
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
        self.bound[slot as usize] = region.free.bound();
        region
    }

    /// Panics unless the slab is sound and every region's bound is the one kept beside
    /// it (and a vacant slot's is 0).
    pub(super) fn check(&self, what: &str) {
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
    }
}
