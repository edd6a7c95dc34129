//! Giving memory back: releasing cached segments, garbage collection, completing
//! pending frees.

use super::*;

impl CachingPolicy {
    /// `release_available_cached_blocks`: with `max_split_size_mb`, frees the smallest
    /// oversize cached block that covers the request, else the largest ones downwards
    /// until enough is freed (same pool and stream; `slot`: the stream's).
    pub(super) fn release_available_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        owner: u32,
        pool_kind: PoolKind,
        slot: u32,
        size: u64,
    ) -> Result<bool, DeviceError> {
        let max_split = self.config.max_split_size_bytes;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = size.max(max_split);
        let set = &self.pool(owner, pool_kind).blocks;
        let hit = set
            .first_at_least(&self.blocks, slot, key_size)
            .map(|at| at.entry.id);
        let usable = hit.filter(|&id| {
            let b = self.block(id);
            b.stream == slot && !b.expandable()
        });
        if let Some(id) = usable {
            self.release_block(device, id)?;
            return Ok(true);
        }
        // No single block is large enough: free oversize blocks from the largest down.
        // The walk goes down the stream's blocks only (PyTorch's walk stops at another
        // stream's block).
        let set = &self.pool(owner, pool_kind).blocks;
        let mut cursor = set.last_below(&self.blocks, slot, key_size);
        let mut total_released = 0u64;
        while let Some(at) = cursor {
            let cur = at.entry.id;
            let (cur_size, cur_expandable) = {
                let b = self.block(cur);
                (b.size, b.expandable())
            };
            if !(total_released < key_size && cur_size >= max_split) {
                break;
            }
            cursor = self.pool(owner, pool_kind).blocks.prev(&self.blocks, at);
            if !cur_expandable {
                total_released += cur_size;
                self.release_block(device, cur)?;
            }
        }
        Ok(total_released >= key_size)
    }

    /// `release_cached_blocks(mempool_id)`. For the default pools (`empty_cache()`, the
    /// retry before an OOM) with no capture under way: completes pending frees, then frees
    /// every whole free segment (large pool, then small) and unmaps free pages of
    /// expandable segments. Then, for the default pools even during a capture, or for
    /// `pool` alone (its pending frees completed first): the free segments of every
    /// private pool with no use left (small, then large), and the pool itself once it
    /// holds no segment.
    pub(super) fn release_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        pool: PoolId,
    ) -> Result<(), DeviceError> {
        if pool.is_default() && self.captures.is_empty() {
            self.synchronize_and_free_events(None);
            self.release_blocks(device, 0, PoolKind::Large)?;
            self.release_blocks(device, 0, PoolKind::Small)?;
        }
        let freeable: Vec<PoolId> = self.freeable.iter().copied().collect();
        for id in freeable {
            if !pool.is_default() && id != pool {
                continue;
            }
            let slot = self.private[&id].slot;
            if !pool.is_default() && self.captures.is_empty() {
                self.synchronize_and_free_events(Some(slot));
            }
            self.release_blocks(device, slot, PoolKind::Small)?;
            self.release_blocks(device, slot, PoolKind::Large)?;
            if self.private[&id].cuda_malloc_count == 0 {
                self.private.remove(&id);
                self.freeable.remove(&id);
            }
        }
        Ok(())
    }

    /// `synchronize_and_free_events`: every pending block (of one pool pair, if given)
    /// returns to its pool.
    fn synchronize_and_free_events(&mut self, owner: Option<u32>) {
        self.stats.num_sync_all_streams += 1;
        let ids: Vec<u32> = self
            .pending
            .iter()
            .copied()
            .filter(|&id| owner.is_none_or(|o| self.block(id).owner == o))
            .collect();
        for id in ids {
            self.pending.remove(&id);
            if self.deferred.remove(&id).is_none() {
                // The program's own completed free is still to come.
                let serial = self.block(id).stamp;
                self.completed_early.insert(serial);
            }
            self.free_block(id);
        }
    }

    /// `release_blocks`: frees whole free segments of one pool, in free-set order.
    fn release_blocks(
        &mut self,
        device: &mut dyn Device,
        owner: u32,
        pool_kind: PoolKind,
    ) -> Result<(), DeviceError> {
        // Only these can be released: a whole segment (its block without neighbours,
        // which releasing another whole one leaves so) or an expandable block, unmapped
        // after the whole segments are freed. Picked while the set is read, from the
        // least that a release can give back in the pool up (`BlockPool::
        // smallest_release`: a smaller block is neither a whole segment nor covers a
        // page), so that a pool of many split blocks under repeated out-of-memory
        // retries neither copies nor reads every block each time.
        let releasable = |id: &u32| {
            let b = self.blocks.live(*id);
            b.expandable() || (b.prev == NIL && b.next == NIL)
        };
        let pool = self.pool(owner, pool_kind);
        let (to_unmap, whole): (Vec<u32>, Vec<u32>) = pool
            .blocks
            .iter_from(&self.blocks, &self.streams, pool.releasable_from())
            .map(|(_, e)| e.id)
            .filter(releasable)
            .partition(|&id| self.blocks.live(id).expandable());
        for id in whole {
            self.release_block(device, id)?;
        }
        for id in to_unmap {
            self.unmap_block(device, id)?;
            let b = self.block(id);
            if b.prev == NIL && b.next == NIL {
                self.release_expandable_segment(device, id)?;
            }
        }
        Ok(())
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    fn release_block(&mut self, device: &mut dyn Device, id: u32) -> Result<(), DeviceError> {
        let b = *self.block(id);
        debug_assert!(!b.expandable() && b.prev == NIL && b.next == NIL);
        self.stats.num_device_free += 1;
        let segment = self
            .segments
            .remove(b.segment)
            .expect("released block has no segment");
        device.free_segment(segment)?;
        self.total_allocated -= b.size;
        self.count_pool_segment(b.owner, false, false);
        self.stats.segment.decrease(b.pool(), 1);
        self.stats.reserved_bytes.decrease(b.pool(), b.size);
        if b.size >= self.config.max_split_size_bytes {
            self.stats.oversize_segments.decrease(1);
        }
        self.pools[b.owner as usize]
            .get_mut(b.pool())
            .blocks
            .remove(&mut self.blocks, id);
        self.delete_block(id);
        Ok(())
    }

    /// `garbage_collect_cached_blocks`: above `threshold × limit` reserved, frees whole
    /// free large-pool segments at least as old as the mean, pass after pass.
    pub(super) fn garbage_collect_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        allowed: u64,
    ) -> Result<(), DeviceError> {
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated - gc_threshold;
        let clock = self.pools[0].large.get_free_blocks_call_count;
        // Only unsplit blocks count, and none is smaller than the least a release can
        // give back (`BlockPool::smallest_release`).
        let from = self.pools[0].large.releasable_from();
        let mut total_age = 0u64;
        let mut freeable = 0u64;
        for (_, entry) in self.pools[0]
            .large
            .blocks
            .iter_from(&self.blocks, &self.streams, from)
        {
            let id = entry.id;
            if !self.is_split(id) {
                total_age += clock - self.block(id).stamp;
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut reclaimed = 0u64;
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let ids: Vec<u32> = self.pools[0]
                .large
                .blocks
                .iter_from(&self.blocks, &self.streams, from)
                .map(|(_, e)| e.id)
                .collect();
            for id in ids {
                let b = self.block(id);
                let age = clock - b.stamp;
                if b.prev == NIL && b.next == NIL && !b.expandable() && age as f64 >= age_threshold
                {
                    block_freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    freeable -= 1;
                    self.release_block(device, id)?;
                }
            }
        }
        Ok(())
    }
}
