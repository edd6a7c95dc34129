//! The free path: a block returns to its pool and merges with free neighbours.

use super::*;

impl CachingPolicy {
    /// The program freed the block: allocated bytes drop, the block waits (`Pending`)
    /// until it returns to its pool.
    #[inline(always)]
    pub(super) fn mark_free_requested(&mut self, id: u32) {
        let max_split = self.config.max_split_size_bytes;
        let block = self.block_mut(id);
        block.state = State::Pending;
        let (pool, size) = (block.pool(), block.size);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
    }

    /// `free_block`: returns a block to its pool, merging with free neighbours.
    pub(super) fn free_block(&mut self, id: u32) {
        self.free_block_inline(id, false);
    }

    /// [`CachingPolicy::free_block`], inlined into [`Policy::free`] (the usual free):
    /// each block is looked up once, the merged block written back once. `allocated`:
    /// the block is still allocated, and [`CachingPolicy::mark_free_requested`]'s
    /// statistics change here too.
    #[inline(always)]
    pub(super) fn free_block_inline(&mut self, id: u32, allocated: bool) {
        let b = self.block(id);
        debug_assert_eq!(
            b.state,
            if allocated {
                State::Allocated
            } else {
                State::Pending
            }
        );
        // A block being freed is mapped (only free blocks of expandable segments are ever
        // unmapped), so it merges only with free mapped neighbours, which are in its
        // pool's free set, never in the unmapped set.
        debug_assert!(b.mapped(), "a block being freed is unmapped");
        let (original_size, requested, pool, expandable, owner, stream) = (
            b.size,
            b.requested,
            b.pool(),
            b.expandable(),
            b.owner,
            b.stream,
        );
        let (mut addr, mut size, mut prev, mut next) = (b.addr, b.size, b.prev, b.next);
        if allocated {
            // mark_free_requested
            self.stats.allocation.decrease(pool, 1);
            self.stats.allocated_bytes.decrease(pool, original_size);
            if original_size >= self.config.max_split_size_bytes {
                self.stats.oversize_allocations.decrease(1);
            }
        }
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        // The neighbours are pieces of the same segment: of the same pool and stream.
        // The pool's parts, the stream's lists, the block table and the streams are
        // borrowed once, apart.
        let BlockPool {
            blocks: set,
            get_free_blocks_call_count: clock,
            ..
        } = self.pools[owner as usize].get_mut(pool);
        let lists = set.stream_mut(stream);
        let blocks = &mut self.blocks;
        // try_merge_blocks with the block before, then with the block after.
        if prev != NIL {
            let p = blocks.live(prev);
            if p.state == State::Free && p.mapped() {
                debug_assert_eq!(
                    (p.owner, p.pool(), p.stream),
                    (owner, pool, stream),
                    "a piece of another pool"
                );
                let (p_addr, p_size, p_prev) = (p.addr, p.size, p.prev);
                Self::forget_free(lists, blocks, prev);
                addr = p_addr;
                size += p_size;
                prev = p_prev;
                // Where there is no block before, the store goes to this block's own
                // `next`, written below (no branch on the trace's neighbours).
                blocks.live_mut(pick32(p_prev != NIL, p_prev, id)).next = id;
                net_blocks -= 1;
                net_bytes -= p_size as i64;
            }
        }
        if next != NIL {
            let n = blocks.live(next);
            if n.state == State::Free && n.mapped() {
                debug_assert_eq!(
                    (n.owner, n.pool(), n.stream),
                    (owner, pool, stream),
                    "a piece of another pool"
                );
                let (n_size, n_next) = (n.size, n.next);
                Self::forget_free(lists, blocks, next);
                size += n_size;
                next = n_next;
                // As above: this block's own `prev` is written below.
                blocks.live_mut(pick32(n_next != NIL, n_next, id)).prev = id;
                net_blocks -= 1;
                net_bytes -= n_size as i64;
            }
        }
        // insert_into_blocks, with the fields at hand: the block written once.
        let b = blocks.live_mut(id);
        b.addr = addr;
        b.size = size;
        b.prev = prev;
        b.next = next;
        b.state = State::Free;
        b.stamp = *clock;
        let added = lists.insert(blocks, id, size);
        debug_assert!(added, "two free blocks with one key");
        if prev != NIL || next != NIL {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let s = &mut self.stats;
        if !expandable {
            s.inactive_split.change(pool, net_blocks);
            s.inactive_split_bytes.change(pool, net_bytes);
        }
        if !self.active_mirrors_allocation {
            s.active.decrease(pool, 1);
            s.active_bytes.decrease(pool, original_size);
        }
        s.requested_bytes.decrease(pool, requested);
    }

    /// A free mapped neighbour absorbed by a merge: out of its stream's lists of its
    /// pool's free set (`lists`) and out of the block table.
    #[inline(always)]
    fn forget_free(lists: &mut free_set::StreamBlocks, blocks: &mut DenseSlab<Block>, id: u32) {
        debug_assert!(blocks.live(id).mapped());
        lists.remove_vacated(blocks, id);
        blocks.vacate_live(id);
    }

    /// `try_merge_blocks`: absorbs a free neighbour; returns its size, or 0.
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = self.block(src);
        if s.state != State::Free || self.block(dst).mapped() != s.mapped() {
            return 0;
        }
        let (s_mapped, s_prev, s_next, s_size, s_addr, s_stream, s_owner, s_pool) = (
            s.mapped(),
            s.prev,
            s.next,
            s.size,
            s.addr,
            s.stream,
            s.owner,
            s.pool(),
        );
        let d = self.block_mut(dst);
        d.size += s_size;
        if d.prev == src {
            d.addr = s_addr;
            d.prev = s_prev;
            if s_prev != NIL {
                self.block_mut(s_prev).next = dst;
            }
        } else {
            d.next = s_next;
            if s_next != NIL {
                self.block_mut(s_next).prev = dst;
            }
        }
        let pool = self.pools[s_owner as usize].get_mut(s_pool);
        if s_mapped {
            pool.blocks.remove(&mut self.blocks, src);
        } else {
            pool.unmapped
                .remove(&(self.streams[s_stream as usize].0, s_addr));
        }
        self.delete_block(src);
        s_size
    }
}
