//! Private pools (CUDA graph captures, `torch.cuda.MemPool`) and the allocator calls
//! other than requests and frees: PyTorch's `beginAllocateToPool`, `endAllocateToPool`,
//! `releasePool`, `createOrIncrefPool`, `emptyCache(pool)`, `try_mempool_fallback`, the
//! frees a capture defers, run-time settings, statistics resets and
//! `caching_allocator_enable`.

use super::*;

/// Serials of allocations made while the allocator was disabled carry this bit.
const UNCACHED: u64 = 1 << 63;

/// One live private pool, as [`CachingPolicy::private_pools`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    /// The pool.
    pub id: PoolId,
    /// Live uses (PyTorch's `use_count`): captures into it, `use_mem_pool` blocks, the
    /// `MemPool` object.
    pub use_count: u64,
    /// Whether requests are being routed to it now.
    pub active: bool,
    /// Segments held for it.
    pub segments: u64,
    /// Bytes held for it (segments and mapped pages).
    pub reserved_bytes: u64,
    /// Bytes of its blocks handed out (or waiting for their free to complete).
    pub active_bytes: u64,
}

impl CachingPolicy {
    /// The live private pools, by id.
    pub fn private_pools(&self) -> Vec<PoolInfo> {
        self.private
            .iter()
            .map(|(&id, p)| {
                let mut info = PoolInfo {
                    id,
                    use_count: p.use_count,
                    active: self.captures.iter().any(|(c, _)| *c == id),
                    segments: 0,
                    reserved_bytes: 0,
                    active_bytes: 0,
                };
                for (_, b) in self.blocks.iter().filter(|(_, b)| b.owner == p.slot) {
                    if b.mapped() {
                        info.reserved_bytes += b.size;
                        if b.prev == NIL || !self.block(b.prev).mapped() {
                            info.segments += 1;
                        }
                    }
                    if b.state != State::Free {
                        info.active_bytes += b.size;
                    }
                }
                info
            })
            .collect()
    }

    /// `get_pool`: the pool pair a request goes to (the latest allocation to a pool under
    /// way that routes its stream, else the default pools) and the small or large pool
    /// of it.
    pub(super) fn get_pool(&self, size: u64, stream: StreamId) -> (u32, PoolKind) {
        let kind = if size <= SMALL_SIZE_BYTES {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let owner = self
            .captures
            .iter()
            .rev()
            .find(|(_, streams)| streams.routes(stream))
            .map_or(0, |(id, _)| self.private[id].slot);
        (owner, kind)
    }

    /// A segment (or an expandable mapping) got for, or given back by, a private pool
    /// (`cudaMalloc_count`). PyTorch counts one per successful expandable `alloc_block`
    /// but takes one off per unmapping; the count stops at 0 where PyTorch would fail an
    /// internal assertion. `expandable`: an expandable segment's mapping or unmapping
    /// (the pool's count then no longer follows its segments).
    pub(super) fn count_pool_segment(&mut self, owner: u32, got: bool, expandable: bool) {
        if owner == 0 {
            return;
        }
        let id = self.pools[owner as usize].id;
        if let Some(p) = self.private.get_mut(&id).filter(|p| p.slot == owner) {
            p.had_expandable |= expandable;
            if got {
                p.cuda_malloc_count += 1;
            } else {
                p.cuda_malloc_count = p.cuda_malloc_count.saturating_sub(1);
            }
        }
    }

    /// `create_or_incref_pool`.
    fn create_or_incref_pool(&mut self, pool: PoolId) -> Result<(), CallError> {
        if pool.is_default() {
            return Err(rejected(
                "the pool (0, 0) is the default pools, not a private pool",
            ));
        }
        match self.private.get_mut(&pool) {
            None => {
                let slot = self.pools.len() as u32;
                self.pools.push(PoolPair {
                    id: pool,
                    ..PoolPair::default()
                });
                self.private.insert(
                    pool,
                    PrivatePool {
                        slot,
                        use_count: 1,
                        cuda_malloc_count: 0,
                        had_expandable: false,
                    },
                );
            }
            Some(p) if p.use_count == 0 => {
                return Err(rejected(format!(
                    "pool {pool} was released (no use left) and cannot be used again"
                )))
            }
            Some(p) => p.use_count += 1,
        }
        Ok(())
    }

    /// `releasePool`.
    fn release_pool(&mut self, pool: PoolId) -> Result<(), CallError> {
        let Some(p) = self.private.get_mut(&pool) else {
            return Err(rejected(format!(
                "release of pool {pool}, which does not exist"
            )));
        };
        if p.use_count == 0 {
            return Err(rejected(format!(
                "release of pool {pool}, which has no use left"
            )));
        }
        p.use_count -= 1;
        if p.use_count == 0 {
            self.freeable.insert(pool);
        }
        Ok(())
    }

    /// `try_mempool_fallback`: a default-pool request that found no memory looks, before
    /// any cache release, for a cached block in each `use_on_oom` MemPool (routing to it
    /// for the look, with a use added and taken off again).
    pub(super) fn try_mempool_fallback(
        &mut self,
        size: u64,
        stream: StreamId,
        stream_slot: u32,
        gc_enabled: bool,
    ) -> Option<u32> {
        let candidates: Vec<PoolId> = self.use_on_oom.iter().copied().collect();
        for id in candidates {
            let Some(slot) = self
                .private
                .get(&id)
                .filter(|p| p.use_count > 0)
                .map(|p| p.slot)
            else {
                continue;
            };
            let (_, kind) = self.get_pool(size, stream);
            let found = self.get_free_block(slot, kind, stream_slot, size, false, gc_enabled);
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// Completed frees a capture held back return to their pools: all of them when no
    /// capture is under way (`process_events`), or, during a capture with
    /// `graph_capture_record_stream_reuse`, those on `stream` whose free was requested
    /// during the capture (`free_safe_blocks_in_capture`; the graph's order of work is
    /// taken to put their last use before the request, as it does when the other
    /// streams' work joined the capturing stream).
    pub(super) fn complete_deferred(&mut self, stream: Option<StreamId>) {
        if self.deferred.is_empty() {
            return;
        }
        let ids: Vec<u32> = self
            .deferred
            .iter()
            .filter(|&(&id, &in_capture)| {
                stream.is_none_or(|s| in_capture && self.stream_id(self.block(id).stream) == s)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.deferred.remove(&id);
            self.capture_frees.remove(&id);
            self.pending.remove(&id);
            self.free_block(id);
        }
    }

    /// A request while the allocator is disabled: `cudaMalloc` of exactly its size, no
    /// cache, no statistics, no retry.
    pub(super) fn uncached_allocate(
        &mut self,
        device: &mut dyn Device,
        size: u64,
        stream: StreamId,
    ) -> Result<Allocation, AllocError> {
        let segment = match device.allocate_segment(size) {
            Ok(segment) => segment,
            Err(DeviceError::OutOfMemory { .. }) => {
                self.last_oom_uncached = true;
                return Err(AllocError::OutOfMemory {
                    requested_bytes: size,
                    tried_bytes: size,
                    stats: self.stats(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let (addr, bytes) = (segment.addr, segment.size_bytes);
        let slot = self.uncached.insert((segment, size));
        self.uncached_totals.add(bytes, size);
        let serial = self.next_serial | UNCACHED;
        self.next_serial += 1;
        Ok(Allocation {
            addr,
            requested_bytes: size,
            block_bytes: bytes,
            stream,
            block: slot,
            serial,
        })
    }

    /// Whether an allocation was made while the allocator was disabled.
    pub(super) fn is_uncached(allocation: &Allocation) -> bool {
        allocation.serial & UNCACHED != 0
    }

    /// `uncached_delete`: `cudaFree` of an allocation made while disabled.
    pub(super) fn uncached_free(
        &mut self,
        device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        let (segment, requested) = self
            .uncached
            .take_if(allocation.block, |(s, _)| s.addr == allocation.addr)
            .unwrap_or_else(|| {
                panic!(
                    "allocation at {} is not live in this caching policy (freed twice, or from another policy)",
                    allocation.addr
                )
            });
        self.uncached_totals.sub(segment.size_bytes, requested);
        device.free_segment(segment)
    }

    /// Bytes of free blocks in private pools (PyTorch's "allocated in private pools"
    /// of its out-of-memory message).
    pub(super) fn free_bytes_in_private_pools(&self) -> u64 {
        self.private
            .values()
            .map(|p| {
                let pair = &self.pools[p.slot as usize];
                pair.small
                    .blocks
                    .iter(&self.blocks, &self.streams)
                    .chain(pair.large.blocks.iter(&self.blocks, &self.streams))
                    .map(|(_, e)| e.size)
                    .sum::<u64>()
            })
            .sum()
    }

    /// An [`AllocatorCall`] (see [`Policy::call`]).
    pub(super) fn apply_call(
        &mut self,
        device: &mut dyn Device,
        call: &AllocatorCall<'_>,
    ) -> Result<CallOutcome, CallError> {
        match *call {
            AllocatorCall::CreatePool {
                pool,
                use_on_oom,
                no_split,
            } => {
                if self.private.contains_key(&pool) {
                    return Err(rejected(format!("pool {pool} exists already")));
                }
                self.create_or_incref_pool(pool)?;
                if use_on_oom {
                    self.use_on_oom.insert(pool);
                }
                if no_split {
                    self.no_split.insert(pool);
                }
            }
            AllocatorCall::BeginAllocateToPool { pool, streams } => {
                if self.captures.iter().any(|(c, _)| *c == pool) {
                    return Err(rejected(
                        "beginAllocateToPool: already recording to mempool_id",
                    ));
                }
                self.create_or_incref_pool(pool)?;
                self.captures.push((pool, streams.clone()));
            }
            AllocatorCall::EndAllocateToPool { pool } => {
                let Some(at) = self.captures.iter().position(|(c, _)| *c == pool) else {
                    return Err(rejected(
                        "endAllocatePool: not currently recording to mempool_id",
                    ));
                };
                self.captures.remove(at);
            }
            AllocatorCall::ReleasePool { pool } => self.release_pool(pool)?,
            AllocatorCall::EmptyPoolCache { pool } => {
                self.release_cached_blocks(device, pool)?;
            }
            AllocatorCall::SetAllocatorSettings { conf } => {
                // The memory limit was set when the allocator was created; a new string
                // does not change it.
                self.allowed_bytes(device);
                let applied = self.config.apply_alloc_conf(conf);
                self.power2_divisions = CachingPolicy::rounds_to_divisions(&self.config);
                self.gc_threshold_set = CachingPolicy::collects_garbage(&self.config);
                applied.map_err(|e| rejected(e.to_string()))?;
            }
            AllocatorCall::ResetPeakStats => self.stats.reset_peaks(),
            AllocatorCall::ResetAccumulatedStats => self.stats.reset_accumulated(),
            AllocatorCall::SetEnabled(enabled) => self.enabled = enabled,
            AllocatorCall::RestoreBlock { pool, addr } => self.restore_block(pool, addr.0)?,
        }
        Ok(CallOutcome::Applied)
    }

    /// The private-pool bookkeeping, checked from scratch.
    pub(super) fn check_pool_invariants(&self) {
        for (id, _) in &self.captures {
            assert!(
                self.private.get(id).is_some_and(|p| p.use_count > 0),
                "allocation to pool {id} under way without a live pool"
            );
        }
        for id in &self.freeable {
            assert_eq!(
                self.private.get(id).map(|p| p.use_count),
                Some(0),
                "freeable pool {id} has uses"
            );
        }
        for (id, p) in &self.private {
            assert_eq!(self.pools[p.slot as usize].id, *id, "pool slot of {id}");
            assert_eq!(
                p.use_count == 0,
                self.freeable.contains(id),
                "pool {id} freeable without being released"
            );
            let expandable = p.had_expandable
                || self
                    .blocks
                    .iter()
                    .any(|(_, b)| b.owner == p.slot && b.expandable());
            if !expandable {
                let heads = self
                    .blocks
                    .iter()
                    .filter(|(_, b)| b.owner == p.slot && b.prev == NIL)
                    .count() as u64;
                assert_eq!(heads, p.cuda_malloc_count, "cudaMalloc_count of pool {id}");
            }
        }
        for id in self.deferred.keys() {
            assert!(self.pending.contains(id), "deferred block is not pending");
        }
    }
}

fn rejected(message: impl Into<String>) -> CallError {
    CallError::Rejected {
        message: message.into(),
    }
}
