//! The malloc path: rounding done, find a cached block or get a new segment.

use super::*;

impl CachingPolicy {
    /// `DeviceCachingAllocator::malloc`.
    pub(super) fn malloc(
        &mut self,
        device: &mut dyn Device,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<Allocation, AllocError> {
        if orig_size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if orig_size >= MAX_REQUEST_BYTES {
            // "Tried to allocate more than 1EB memory": refused before the allocator.
            return Err(AllocError::OutOfMemory {
                requested_bytes: orig_size,
                tried_bytes: orig_size,
                stats: self.stats(),
            });
        }
        if !self.enabled {
            return self.uncached_allocate(device, orig_size, stream);
        }
        if self.deferred.is_empty() {
            // Nothing deferred by a capture.
        } else if self.captures.is_empty() {
            // process_events: completed frees deferred by a capture return now.
            self.complete_deferred(None);
        } else if self.config.graph_capture_record_stream_reuse {
            // free_safe_blocks_in_capture: those freed during the capture on this stream.
            self.complete_deferred(Some(stream));
        }
        let allowed = self.allowed_bytes(device);
        let size = self.round_size(orig_size);
        let (owner, pool) = self.get_pool(size, stream);
        let slot = self.stream_slot(stream);
        // Expandable segments serve private pools too (only a MemPool with a custom
        // allocator, not modelled, would turn them off).
        let expandable = self.config.expandable_segments;
        let gc_enabled = allowed.is_some() && self.gc_threshold_set;
        let (block, expandable) =
            match self.get_free_block(owner, pool, slot, size, expandable, gc_enabled) {
                Some(block) => (block, expandable),
                None => {
                    let args = AllocArgs {
                        owner,
                        pool,
                        stream,
                        slot,
                        size,
                        alloc_size: self.allocation_size(size),
                        expandable,
                        allowed,
                    };
                    self.malloc_without_cached_block(device, &args, orig_size, gc_enabled)?
                }
            };
        Ok(self.alloc_found_block(block, stream, size, orig_size, expandable))
    }

    /// The rest of the malloc ladder when no cached block fits: garbage collection, a
    /// new segment, a MemPool's block, cache releases and the retry, or OOM. Returns the
    /// block and whether expandable segments still apply to it. Out of line, so the
    /// usual malloc (a cached block found) keeps few values live.
    #[cold]
    #[inline(never)]
    fn malloc_without_cached_block(
        &mut self,
        device: &mut dyn Device,
        args: &AllocArgs,
        orig_size: u64,
        gc_enabled: bool,
    ) -> Result<(u32, bool), AllocError> {
        let AllocArgs {
            owner,
            pool,
            stream,
            slot,
            size,
            alloc_size,
            allowed,
            ..
        } = *args;
        let mut expandable = args.expandable;
        if let (true, Some(allowed)) = (gc_enabled, allowed) {
            self.garbage_collect_cached_blocks(device, allowed)?;
        }
        let mut found = self.alloc_block(device, args, false)?;
        if found.is_none() && owner == 0 {
            // try_mempool_fallback: a use_on_oom MemPool's cached block, if it fits.
            found = self.try_mempool_fallback(size, stream, slot, gc_enabled);
            if found.is_some() {
                expandable = false;
            }
        }
        if found.is_none()
            && self.release_available_cached_blocks(device, owner, pool, slot, size)?
        {
            found = self.alloc_block(device, args, false)?;
        }
        if found.is_none() && self.captures.is_empty() {
            // No cache release and no retry while a capture is under way.
            self.release_cached_blocks(device, PoolId::DEFAULT)?;
            found = self.alloc_block(device, args, true)?;
        }
        let Some(block) = found else {
            self.stats.num_ooms += 1;
            return Err(AllocError::OutOfMemory {
                requested_bytes: orig_size,
                tried_bytes: alloc_size,
                stats: self.stats(),
            });
        };
        Ok((block, expandable))
    }

    /// `get_free_block`: the smallest free block of the stream (`slot`: its slot) that
    /// fits, subject to the oversize rules; removed from the pool, its record's class
    /// left for [`CachingPolicy::alloc_found_block`] to clear. Inlined into the malloc
    /// (about 25 instructions fewer a request: no call, and the request's values stay
    /// in registers rather than stack slots across it).
    #[inline(always)]
    pub(super) fn get_free_block(
        &mut self,
        owner: u32,
        pool_kind: PoolKind,
        slot: u32,
        size: u64,
        expandable_active: bool,
        gc_enabled: bool,
    ) -> Option<u32> {
        let max_split = self.config.max_split_size_bytes;
        let rounding = self.config.max_non_split_rounding_bytes;
        let blocks = &self.blocks;
        let pool = self.pools[owner as usize].get_mut(pool_kind);
        if gc_enabled {
            pool.get_free_blocks_call_count += 1;
        }
        let b = |id: u32| blocks.live(id);
        let expandable_size = |id: u32| {
            let blk = b(id);
            let next_unmapped = match blk.next {
                NIL => 0,
                n if !b(n).mapped() => b(n).size,
                _ => 0,
            };
            blk.size + next_unmapped
        };
        let set = &pool.blocks;
        // The cursor holds the block's id and size (`at.entry`).
        let mut at = set.first_at_least(blocks, slot, size)?;
        if b(at.entry.id).expandable() {
            if expandable_active {
                // Judge a block that touches unmapped space by what it can grow to.
                while b(at.entry.id).expandable() {
                    match set.next(blocks, at) {
                        Some(n) if expandable_size(n.entry.id) < expandable_size(at.entry.id) => {
                            at = n;
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off: skip expandable blocks.
                loop {
                    at = set.next(blocks, at)?;
                    if !b(at.entry.id).expandable() {
                        break;
                    }
                }
            }
        }
        let found_size = at.entry.size;
        // Rule A: a normal request never takes an oversize block.
        if size < max_split && found_size >= max_split {
            return None;
        }
        // Rule B: an oversize request takes a larger oversize block only within the
        // rounding tolerance.
        if size >= max_split && found_size >= size.saturating_add(rounding) {
            return None;
        }
        // The block's record keeps its old class: `alloc_found_block` writes it after
        // the record is copied (see `FreeSet::take_at`).
        pool.blocks.take_at(&mut self.blocks, at);
        Some(at.entry.id)
    }

    /// `should_split` for a block of `pool` and `block_size` bytes of `owner`'s pools.
    #[inline(always)]
    fn should_split(
        &self,
        owner: u32,
        pool: PoolKind,
        block_size: u64,
        size: u64,
        expandable_active: bool,
    ) -> bool {
        if !self.no_split.is_empty() && self.no_split.contains(&self.pools[owner as usize].id) {
            return false;
        }
        let remaining = block_size - size;
        // Both rules are computed and one picked without a branch: small and large
        // requests come in the trace's order.
        let small_rule = remaining >= MIN_BLOCK_BYTES;
        let large_rule = (size < self.config.max_split_size_bytes) & (remaining > SMALL_SIZE_BYTES);
        let small = (pool == PoolKind::Small) | expandable_active;
        (small & small_rule) | (!small & large_rule)
    }

    /// `alloc_found_block`: carves the request from the front of the block (split
    /// as `should_split` decides).
    fn alloc_found_block(
        &mut self,
        id: u32,
        stream: StreamId,
        size: u64,
        orig_size: u64,
        expandable_active: bool,
    ) -> Allocation {
        let b = self.block(id);
        let split = self.should_split(b.owner, b.pool(), b.size, size, expandable_active);
        self.carve(id, stream, size, orig_size, split)
    }

    /// The rest of `alloc_found_block`, `split` decided: the request takes the front
    /// of block `id` (out of its free set), which keeps the rest when `split`.
    #[inline(always)]
    pub(super) fn carve(
        &mut self,
        id: u32,
        stream: StreamId,
        size: u64,
        orig_size: u64,
        split: bool,
    ) -> Allocation {
        let serial = self.next_serial;
        self.next_serial += 1;
        let b = self.block(id);
        let (addr, block_size, slot, pool, owner, prev, next, expandable) = (
            b.addr,
            b.size,
            b.stream,
            b.pool(),
            b.owner,
            b.prev,
            b.next,
            b.expandable(),
        );
        // `|`, not `||`: no branch on whether the block has a neighbour before it.
        let already_split = (prev != NIL) | (next != NIL);
        let (block_id, block_size) = if split {
            // The request takes the front; the block keeps the rest and goes back to its
            // pool. The front is the block's record copied whole, slot to slot, then
            // given its own size, tenant and links.
            let (rest_size, rest_addr) = (block_size - size, addr + size);
            let front_id = self.blocks.insert_copy(id);
            // The block before links to the front; where there is none, the store goes
            // to the front's own `next`, written below (no branch on a neighbour that
            // the trace's order decides).
            self.block_mut(pick32(prev != NIL, prev, front_id)).next = front_id;
            let front = self.blocks.live_mut(front_id);
            front.class = free_set::NO_CLASS;
            front.size = size;
            front.requested = orig_size;
            front.next = id;
            front.state = State::Allocated;
            front.stamp = serial;
            // insert_into_blocks, with the fields at hand: the rest written once.
            let set = self.pools[owner as usize].get_mut(pool);
            let rest = self.blocks.live_mut(id);
            rest.addr = rest_addr;
            rest.size = rest_size;
            rest.prev = front_id;
            rest.stamp = set.get_free_blocks_call_count;
            // Out of its set since `get_free_block` (which left the class to clear).
            rest.class = free_set::NO_CLASS;
            let added = set
                .blocks
                .insert(&mut self.blocks, slot, rest_size, rest_addr, id);
            debug_assert!(added, "two free blocks with one key");
            if !expandable {
                // A split block's front leaves the inactive split bytes; a whole
                // block's rest joins them and counts as one more inactive split block.
                // Signed changes, picked without a branch.
                let bytes = pick(already_split, size.wrapping_neg(), rest_size);
                self.stats.inactive_split_bytes.change(pool, bytes as i64);
                // An increase by 0 changes no figure: no branch on `already_split`.
                self.stats
                    .inactive_split
                    .increase(pool, u64::from(!already_split));
            }
            (front_id, size)
        } else {
            let b = self.block_mut(id);
            // Out of its set since `get_free_block` (which left the class to clear).
            b.class = free_set::NO_CLASS;
            b.state = State::Allocated;
            b.requested = orig_size;
            b.stamp = serial;
            if already_split && !expandable {
                self.stats.inactive_split_bytes.decrease(pool, block_size);
                self.stats.inactive_split.decrease(pool, 1);
            }
            (id, block_size)
        };
        let max_split = self.config.max_split_size_bytes;
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, block_size);
        if !self.active_mirrors_allocation {
            s.active.increase(pool, 1);
            s.active_bytes.increase(pool, block_size);
        }
        s.requested_bytes.increase(pool, orig_size);
        if block_size >= max_split {
            s.oversize_allocations.increase(1);
        }
        Allocation {
            addr: DeviceAddr(addr),
            requested_bytes: orig_size,
            block_bytes: block_size,
            stream,
            block: block_id,
            serial,
        }
    }

    /// `alloc_block`: a new segment (or newly mapped pages) for the request.
    fn alloc_block(
        &mut self,
        device: &mut dyn Device,
        a: &AllocArgs,
        is_retry: bool,
    ) -> Result<Option<u32>, DeviceError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = a.allowed {
            if self.total_allocated + a.alloc_size > allowed {
                return Ok(None);
            }
        }
        if a.expandable {
            let found = self
                .try_allocate_expandable_block(device, a.owner, a.pool, a.stream, a.slot, a.size)?;
            if found.is_some() {
                self.count_pool_segment(a.owner, true, true);
            }
            return Ok(found);
        }
        let segment = match device.allocate_segment(a.alloc_size) {
            Ok(segment) => segment,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let size = segment.size_bytes;
        let addr = segment.addr.0;
        let slot = self.segments.insert(segment);
        self.total_allocated += size;
        self.count_pool_segment(a.owner, true, false);
        self.pool_mut(a.owner, a.pool).got_segment(size);
        let id = self.insert_block(Block::whole(
            addr, size, a.slot, a.pool, a.owner, slot, false, true,
        ));
        self.stats.segment.increase(a.pool, 1);
        self.stats.reserved_bytes.increase(a.pool, size);
        if size >= self.config.max_split_size_bytes {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        Ok(Some(id))
    }
}

/// What one malloc asks of `alloc_block`.
#[derive(Clone, Copy)]
struct AllocArgs {
    owner: u32,
    pool: PoolKind,
    stream: StreamId,
    /// `stream`'s slot in [`CachingPolicy::streams`].
    slot: u32,
    size: u64,
    alloc_size: u64,
    expandable: bool,
    allowed: Option<u64>,
}
