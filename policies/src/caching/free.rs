//! The free path: a block returns to its pool and merges with free neighbours.

use super::*;

impl CachingPolicy {
    /// The program freed the block: allocated bytes drop, the block waits (`Pending`)
    /// until it returns to its pool.
    pub(super) fn mark_free_requested(&mut self, id: u32) {
        let max_split = self.config.max_split_size_bytes;
        let block = self.block_mut(id);
        block.state = State::Pending;
        let (pool, size) = (block.pool, block.size);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
    }

    /// `free_block`: returns a block to its pool, merging with free neighbours.
    pub(super) fn free_block(&mut self, id: u32) {
        let (original_size, requested, pool, expandable) = {
            let b = self.block(id);
            debug_assert_eq!(b.state, State::Pending);
            (b.size, b.requested, b.pool, b.expandable)
        };
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [self.block(id).prev, self.block(id).next] {
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        {
            let b = self.block_mut(id);
            b.state = State::Free;
            b.serial = 0;
        }
        self.insert_into_blocks(id);
        if self.is_split(id) {
            net_blocks += 1;
            net_bytes += self.block(id).size as i64;
        }
        let s = &mut self.stats;
        if !expandable {
            s.inactive_split.change(pool, net_blocks);
            s.inactive_split_bytes.change(pool, net_bytes);
        }
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, original_size);
        s.requested_bytes.decrease(pool, requested);
    }

    /// `try_merge_blocks`: absorbs a free neighbour; returns its size, or 0.
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.block(src).clone();
        if s.state != State::Free || self.block(dst).mapped != s.mapped {
            return 0;
        }
        if self.block(dst).prev == src {
            let d = self.block_mut(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.block_mut(s.prev).next = dst;
            }
        } else {
            self.block_mut(dst).next = s.next;
            if s.next != NIL {
                self.block_mut(s.next).prev = dst;
            }
        }
        self.block_mut(dst).size += s.size;
        let pool = self.pool_mut(s.owner, s.pool);
        if s.mapped {
            pool.blocks.remove(&(s.stream.0, s.size, s.addr));
        } else {
            pool.unmapped.remove(&(s.stream.0, s.addr));
        }
        self.delete_block(src);
        s.size
    }
}
