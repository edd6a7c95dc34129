//! PyTorch's CUDA caching allocator (`backend:native`), rule for rule.
//!
//! The structure follows `c10/cuda/CUDACachingAllocator.cpp` (PyTorch 2.11) closely
//! enough that each method here names the PyTorch function it reproduces. What it models:
//!
//! - rounding (`round_size`, 512-byte blocks, `roundup_power2_divisions`);
//! - the small pool (rounded requests ≤ 1 MiB, 2 MiB segments) and the large pool
//!   (< 10 MiB → one `large_segment_size` segment, default 20 MiB; larger → rounded
//!   up to 2 MiB), one free-block set per pool ordered by (stream, size, address), so
//!   blocks are never reused across streams;
//! - best fit (`get_free_block`) with the oversize rules of `max_split_size_mb` and
//!   `max_non_split_rounding_mb`, split rules (small: rest ≥ 512 B; large: rest > 1 MiB
//!   and request below `max_split_size`), merging with free neighbours on free;
//! - the malloc ladder: best fit; garbage collection (`garbage_collection_threshold`,
//!   with a memory limit); `cudaMalloc`; `release_available_cached_blocks` (with
//!   `max_split_size_mb`); `release_cached_blocks` (every whole free segment, all
//!   streams) and a counted retry; then OOM;
//! - the per-process memory limit (`set_per_process_memory_fraction`), checked with the
//!   segment size against total reserved bytes before `cudaMalloc`;
//! - expandable segments: one growing virtual segment per stream and pool, 2 MiB pages in
//!   the small pool and `large_segment_size` pages in the large one, mapped on demand and
//!   unmapped by `empty_cache` where a whole page is free;
//! - `record_stream`-style delayed frees: [`CachingPolicy::free_requested`] drops the
//!   allocated bytes, [`Policy::free`] returns the block to its pool later, and a cache
//!   release completes every pending free first (PyTorch's `synchronize_and_free_events`);
//! - every statistic of `torch.cuda.memory_stats()` ([`CachingStats`]).
//!
//! Not modelled: CUDA graph private pools and MemPools, IPC, multi-device peer access
//! and the `cudaMallocAsync` backend. `release_lock_on_cudamalloc` changes only thread
//! interleaving and has no effect here.

mod config;
mod stats;

pub use config::{
    AllocConfError, CachingConfig, MemoryLimit, LARGE_BUFFER_BYTES, MIB, MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC_BYTES, ROUNDUP_INTERVALS, ROUND_LARGE_BYTES, SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
};
pub use stats::{CachingStats, PoolKind, Stat, StatArray};

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::device::{AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, Segment};
use crate::policy::{
    AllocError, Allocation, BlockSnapshot, BlockState, Policy, PolicyStats, Request,
    SegmentSnapshot, StreamId, MAX_REQUEST_BYTES,
};
use crate::slab::Slab;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In its pool's free set (or, unmapped, in the unmapped set).
    Free,
    /// Handed out.
    Allocated,
    /// `free()` was called but the block waits for other streams.
    Pending,
}

#[derive(Clone, Debug)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    stream: StreamId,
    pool: PoolKind,
    prev: u32,
    next: u32,
    state: State,
    mapped: bool,
    expandable: bool,
    /// Index into `segments` (or `expandables` when `expandable`).
    segment: u32,
    gc_count_base: u64,
    /// Serial of the current tenant; 0 while free.
    serial: u64,
}

impl Block {
    /// A free block that never had a tenant, alone in its (new) segment.
    fn whole(
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolKind,
        segment: u32,
        expandable: bool,
        mapped: bool,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            state: State::Free,
            mapped,
            expandable,
            segment,
            gc_count_base: 0,
            serial: 0,
        }
    }

    /// A free piece of the same segment as `self`, linked between `prev` and `next`.
    fn piece(&self, addr: u64, size: u64, mapped: bool, prev: u32, next: u32) -> Block {
        Block {
            prev,
            next,
            ..Block::whole(
                addr,
                size,
                self.stream,
                self.pool,
                self.segment,
                self.expandable,
                mapped,
            )
        }
    }
}

type SizeKey = (u64, u64, u64);
type AddrKey = (u64, u64);

/// One pool's free blocks: PyTorch's `BlockPool`.
#[derive(Debug, Default)]
struct BlockPool {
    /// Free mapped blocks by (stream, size, address).
    blocks: BTreeMap<SizeKey, u32>,
    /// Unmapped address space of expandable segments by (stream, address).
    unmapped: BTreeMap<AddrKey, u32>,
    /// `get_free_block` calls while garbage collection is on: the clock of block ages.
    get_free_blocks_call_count: u64,
}

/// One expandable segment: a reserved address range, mapped page by page.
#[derive(Debug)]
struct ExpandableSegment {
    range: AddressRange,
    page_bytes: u64,
    mapped_pages: Vec<bool>,
    mapped_bytes: u64,
}

/// PyTorch's caching allocator for one device. See the module docs for what it models.
#[derive(Debug)]
pub struct CachingPolicy {
    label: String,
    config: CachingConfig,
    stats: CachingStats,
    blocks: Slab<Block>,
    small: BlockPool,
    large: BlockPool,
    segments: Slab<Segment>,
    expandables: Vec<Option<ExpandableSegment>>,
    /// Bytes held from the device, all pools (PyTorch's `total_allocated_memory`).
    total_allocated: u64,
    /// Blocks freed by the program but waiting for other streams.
    pending: BTreeSet<u32>,
    /// Serials whose pending free a cache release completed before the program's own
    /// completion arrived.
    completed_early: HashSet<u64>,
    next_serial: u64,
    /// The memory limit, resolved against the device's total at first use.
    allowed: Option<Option<u64>>,
}

impl CachingPolicy {
    /// A caching allocator with the given configuration.
    pub fn new(config: CachingConfig) -> CachingPolicy {
        let label = match config.to_alloc_conf() {
            conf if conf.is_empty() => "caching".to_string(),
            conf => format!("caching[{conf}]"),
        };
        CachingPolicy {
            label,
            config,
            stats: CachingStats::default(),
            blocks: Slab::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            segments: Slab::default(),
            expandables: Vec::new(),
            total_allocated: 0,
            pending: BTreeSet::new(),
            completed_early: HashSet::new(),
            next_serial: 1,
            allowed: None,
        }
    }

    /// Replaces the label returned by [`Policy::name`].
    pub fn with_label(mut self, label: impl Into<String>) -> CachingPolicy {
        self.label = label.into();
        self
    }

    /// The configuration in force.
    pub fn config(&self) -> &CachingConfig {
        &self.config
    }

    /// PyTorch's statistics (`torch.cuda.memory_stats()`).
    pub fn caching_stats(&self) -> &CachingStats {
        &self.stats
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// `torch.cuda.set_per_process_memory_fraction` (or an exact byte limit).
    pub fn set_memory_limit(&mut self, limit: MemoryLimit) {
        self.config.memory_limit = limit;
        self.allowed = None;
    }

    /// The limit on reserved bytes for this device, if any.
    pub fn allowed_bytes(&mut self, device: &dyn Device) -> Option<u64> {
        if self.allowed.is_none() {
            let total = device.stats().total_bytes;
            self.allowed = Some(self.config.allowed_bytes(total));
        }
        self.allowed.flatten()
    }

    /// `round_size`: the block size PyTorch uses for a request of `size` bytes.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_BYTES {
            return MIN_BLOCK_BYTES;
        }
        let divisions = self.config.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_BYTES * divisions {
            roundup_power2_next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        }
    }

    /// `get_allocation_size`: the segment size `cudaMalloc` is asked for when a rounded
    /// request of `size` bytes finds no cached block.
    pub fn allocation_size(&self, size: u64) -> u64 {
        if size <= SMALL_SIZE_BYTES {
            SMALL_BUFFER_BYTES
        } else if size < MIN_LARGE_ALLOC_BYTES {
            self.config.large_segment_size_bytes
        } else {
            size.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
        }
    }

    /// PyTorch's out-of-memory message for a failed request, with the device's figures.
    pub fn oom_message(&mut self, tried_bytes: u64, device: &dyn Device) -> String {
        let d: DeviceStats = device.stats();
        let allowed = self
            .allowed_bytes(device)
            .map(|a| format!("{} allowed; ", format_size(a)))
            .unwrap_or_default();
        let allocated = self.stats.allocated_bytes.all.current;
        let reserved = self.stats.reserved_bytes.all.current;
        format!(
            "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. \
             {allowed}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
             See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(tried_bytes),
            format_size(d.total_bytes),
            format_size(d.free_bytes()),
            format_size(allocated),
            format_size(reserved - allocated),
        )
    }

    /// `free()` without the block returning to its pool: the program dropped the tensor
    /// but other streams still use it (`record_stream`). Allocated bytes drop now; the
    /// block becomes reusable at [`Policy::free`] or at the next cache release.
    ///
    /// # Panics
    /// If the allocation is not live in this policy.
    pub fn free_requested(&mut self, allocation: &Allocation) {
        let id = allocation.block;
        let block = self.live_tenant(allocation);
        assert_eq!(block.state, State::Allocated, "free requested twice");
        self.mark_free_requested(id);
        self.pending.insert(id);
    }

    // ----------------------------------------------------------------- malloc

    /// `DeviceCachingAllocator::malloc`.
    fn malloc(
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
        let allowed = self.allowed_bytes(device);
        let size = self.round_size(orig_size);
        let pool = if size <= SMALL_SIZE_BYTES {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let alloc_size = self.allocation_size(size);
        let expandable = self.config.expandable_segments;
        let gc_enabled = allowed.is_some() && self.config.garbage_collection_threshold > 0.0;

        let mut found = self.get_free_block(pool, stream, size, expandable, gc_enabled);
        if found.is_none() {
            if let (true, Some(allowed)) = (gc_enabled, allowed) {
                self.garbage_collect_cached_blocks(device, allowed)?;
            }
            let args = AllocArgs {
                pool,
                stream,
                size,
                alloc_size,
                expandable,
                allowed,
            };
            found = self.alloc_block(device, &args, false)?;
            if found.is_none()
                && self.release_available_cached_blocks(device, pool, stream, size)?
            {
                found = self.alloc_block(device, &args, false)?;
            }
            if found.is_none() {
                self.release_cached_blocks(device)?;
                found = self.alloc_block(device, &args, true)?;
            }
        }
        let Some(block) = found else {
            self.stats.num_ooms += 1;
            return Err(AllocError::OutOfMemory {
                requested_bytes: orig_size,
                tried_bytes: alloc_size,
                stats: self.stats(),
            });
        };
        let split = self.should_split(block, size, expandable);
        Ok(self.alloc_found_block(block, size, orig_size, split))
    }

    /// `get_free_block`: the smallest free block of the stream that fits, subject to the
    /// oversize rules; removed from the pool.
    fn get_free_block(
        &mut self,
        pool_kind: PoolKind,
        stream: StreamId,
        size: u64,
        expandable_active: bool,
        gc_enabled: bool,
    ) -> Option<u32> {
        let max_split = self.config.max_split_size_bytes;
        let rounding = self.config.max_non_split_rounding_bytes;
        let blocks = &self.blocks;
        let pool = match pool_kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        };
        if gc_enabled {
            pool.get_free_blocks_call_count += 1;
        }
        let b = |id: u32| blocks.get(id).expect("pool holds a dead block");
        let expandable_size = |id: u32| {
            let blk = b(id);
            let next_unmapped = match blk.next {
                NIL => 0,
                n if !b(n).mapped => b(n).size,
                _ => 0,
            };
            blk.size + next_unmapped
        };
        let mut it = pool.blocks.range((stream.0, size, 0)..);
        let (&(s, _, _), &first) = it.next()?;
        if s != stream.0 {
            return None;
        }
        let mut cur = first;
        if b(cur).expandable {
            if expandable_active {
                // Judge a block that touches unmapped space by what it can grow to.
                while b(cur).expandable {
                    match it.next() {
                        Some((&(s2, _, _), &n))
                            if s2 == stream.0 && expandable_size(n) < expandable_size(cur) =>
                        {
                            cur = n
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off: skip expandable blocks.
                loop {
                    let (&(s2, _, _), &n) = it.next()?;
                    if s2 != stream.0 {
                        return None;
                    }
                    cur = n;
                    if !b(n).expandable {
                        break;
                    }
                }
            }
        }
        let found = b(cur);
        // Rule A: a normal request never takes an oversize block.
        if size < max_split && found.size >= max_split {
            return None;
        }
        // Rule B: an oversize request takes a larger oversize block only within the
        // rounding tolerance.
        if size >= max_split && found.size >= size.saturating_add(rounding) {
            return None;
        }
        let key = (found.stream.0, found.size, found.addr);
        pool.blocks.remove(&key);
        Some(cur)
    }

    /// `should_split`.
    fn should_split(&self, id: u32, size: u64, expandable_active: bool) -> bool {
        let block = self.block(id);
        let remaining = block.size - size;
        if block.pool == PoolKind::Small || expandable_active {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < self.config.max_split_size_bytes && remaining > SMALL_SIZE_BYTES
        }
    }

    /// `alloc_found_block`: carves the request from the front of the block.
    fn alloc_found_block(&mut self, id: u32, size: u64, orig_size: u64, split: bool) -> Allocation {
        let already_split = self.is_split(id);
        let (pool, expandable) = {
            let b = self.block(id);
            (b.pool, b.expandable)
        };
        let block_id = if split {
            let remaining = id;
            let r = self.block(remaining).clone();
            let new_id = self.insert_block(r.piece(r.addr, size, true, r.prev, remaining));
            if r.prev != NIL {
                self.block_mut(r.prev).next = new_id;
            }
            let rem = self.block_mut(remaining);
            rem.prev = new_id;
            rem.addr += size;
            rem.size -= size;
            let remaining_size = rem.size;
            self.insert_into_blocks(remaining);
            if already_split && !expandable {
                self.stats.inactive_split_bytes.decrease(pool, size);
            } else if !expandable {
                self.stats
                    .inactive_split_bytes
                    .increase(pool, remaining_size);
                self.stats.inactive_split.increase(pool, 1);
            }
            new_id
        } else {
            if already_split && !expandable {
                let block_size = self.block(id).size;
                self.stats.inactive_split_bytes.decrease(pool, block_size);
                self.stats.inactive_split.decrease(pool, 1);
            }
            id
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let max_split = self.config.max_split_size_bytes;
        let block = self.block_mut(block_id);
        block.state = State::Allocated;
        block.requested = orig_size;
        block.serial = serial;
        let (block_size, addr, stream) = (block.size, block.addr, block.stream);
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, block_size);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, block_size);
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
            return self.try_allocate_expandable_block(device, a.pool, a.stream, a.size);
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
        let id = self.insert_block(Block::whole(
            addr, size, a.stream, a.pool, slot, false, true,
        ));
        self.stats.segment.increase(a.pool, 1);
        self.stats.reserved_bytes.increase(a.pool, size);
        if size >= self.config.max_split_size_bytes {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        Ok(Some(id))
    }

    /// `release_available_cached_blocks`: with `max_split_size_mb`, frees the smallest
    /// oversize cached block that covers the request, else the largest ones downwards
    /// until enough is freed (same pool and stream).
    fn release_available_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        pool_kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<bool, DeviceError> {
        let max_split = self.config.max_split_size_bytes;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = size.max(max_split);
        let key = (stream.0, key_size, 0);
        let hit = self
            .pool(pool_kind)
            .blocks
            .range(key..)
            .next()
            .map(|(_, &id)| id);
        let usable = hit.filter(|&id| {
            let b = self.block(id);
            b.stream == stream && !b.expandable
        });
        if let Some(id) = usable {
            self.release_block(device, id)?;
            return Ok(true);
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut cursor = self
            .pool(pool_kind)
            .blocks
            .range(..key)
            .next_back()
            .map(|(k, &id)| (*k, id));
        let mut total_released = 0u64;
        while let Some((cur_key, cur)) = cursor {
            let (cur_size, cur_stream, cur_expandable) = {
                let b = self.block(cur);
                (b.size, b.stream, b.expandable)
            };
            if !(total_released < key_size && cur_size >= max_split && cur_stream == stream) {
                break;
            }
            cursor = self
                .pool(pool_kind)
                .blocks
                .range(..cur_key)
                .next_back()
                .map(|(k, &id)| (*k, id));
            if !cur_expandable {
                total_released += cur_size;
                self.release_block(device, cur)?;
            }
        }
        Ok(total_released >= key_size)
    }

    /// `release_cached_blocks`: completes pending frees, then frees every whole free
    /// segment (large pool, then small) and unmaps free pages of expandable segments.
    fn release_cached_blocks(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        self.synchronize_and_free_events();
        self.release_blocks(device, PoolKind::Large)?;
        self.release_blocks(device, PoolKind::Small)?;
        Ok(())
    }

    /// `synchronize_and_free_events`: every pending block returns to its pool.
    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        for id in std::mem::take(&mut self.pending) {
            let serial = self.block(id).serial;
            self.completed_early.insert(serial);
            self.free_block(id);
        }
    }

    /// `release_blocks`: frees whole free segments of one pool, in free-set order.
    fn release_blocks(
        &mut self,
        device: &mut dyn Device,
        pool_kind: PoolKind,
    ) -> Result<(), DeviceError> {
        let ids: Vec<u32> = self.pool(pool_kind).blocks.values().copied().collect();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.block(id);
            if b.expandable {
                to_unmap.push(id);
            } else if b.prev == NIL && b.next == NIL {
                self.release_block(device, id)?;
            }
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
        let b = self.block(id).clone();
        debug_assert!(!b.expandable && b.prev == NIL && b.next == NIL);
        self.stats.num_device_free += 1;
        let segment = self
            .segments
            .remove(b.segment)
            .expect("released block has no segment");
        device.free_segment(segment)?;
        self.total_allocated -= b.size;
        self.stats.segment.decrease(b.pool, 1);
        self.stats.reserved_bytes.decrease(b.pool, b.size);
        if b.size >= self.config.max_split_size_bytes {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool_mut(b.pool)
            .blocks
            .remove(&(b.stream.0, b.size, b.addr));
        self.delete_block(id);
        Ok(())
    }

    /// `garbage_collect_cached_blocks`: above `threshold × limit` reserved, frees whole
    /// free large-pool segments at least as old as the mean, pass after pass.
    fn garbage_collect_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        allowed: u64,
    ) -> Result<(), DeviceError> {
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated - gc_threshold;
        let clock = self.large.get_free_blocks_call_count;
        let mut total_age = 0u64;
        let mut freeable = 0u64;
        for &id in self.large.blocks.values() {
            if !self.is_split(id) {
                total_age += clock - self.block(id).gc_count_base;
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
            let ids: Vec<u32> = self.large.blocks.values().copied().collect();
            for id in ids {
                let b = self.block(id);
                let age = clock - b.gc_count_base;
                if b.prev == NIL && b.next == NIL && !b.expandable && age as f64 >= age_threshold {
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

    // ----------------------------------------------------- expandable segments

    /// `try_allocate_expandable_block`: maps just enough pages at the lowest place that
    /// can hold the request.
    fn try_allocate_expandable_block(
        &mut self,
        device: &mut dyn Device,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<u32>, DeviceError> {
        let mut candidate = self.find_expandable_block(device, pool, stream, size)?;
        if !self.block(candidate).mapped {
            let len = self.block(candidate).size.min(size);
            if !self.map_block(device, candidate, len)? {
                return Ok(None);
            }
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self.block(candidate).next;
            let len = remaining.min(self.block(next).size);
            if !self.map_block(device, next, len)? {
                return Ok(None);
            }
            candidate = next;
        }
        let b = self.block(candidate);
        let key = (b.stream.0, b.size, b.addr);
        self.pool_mut(pool).blocks.remove(&key);
        Ok(Some(candidate))
    }

    /// `find_expandable_block`: the lowest address where free and unmapped space of the
    /// stream's expandable segments adds up to `size`; a new segment if there is none.
    fn find_expandable_block(
        &mut self,
        device: &mut dyn Device,
        pool_kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<u32, DeviceError> {
        let allocatable = |blocks: &Slab<Block>, id: u32| {
            id != NIL && blocks.get(id).is_some_and(|b| b.state == State::Free)
        };
        let unmapped: Vec<u32> = self
            .pool(pool_kind)
            .unmapped
            .range((stream.0, 0)..)
            .take_while(|(k, _)| k.0 == stream.0)
            .map(|(_, &id)| id)
            .collect();
        for id in unmapped {
            let mut c = id;
            let prev = self.block(c).prev;
            if allocatable(&self.blocks, prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < size && allocatable(&self.blocks, b) {
                bytes += self.block(b).size;
                b = self.block(b).next;
            }
            if bytes >= size {
                return Ok(c);
            }
        }
        let page_bytes = match pool_kind {
            PoolKind::Small => SMALL_BUFFER_BYTES,
            PoolKind::Large => self.config.large_segment_size_bytes,
        };
        let stats = device.stats();
        let total = if stats.total_bytes > 0 {
            stats.total_bytes
        } else {
            stats.capacity_bytes
        };
        // PyTorch reserves 1 1/8 of the device's memory for each expandable segment.
        let max_handles = (total + total / 8).div_ceil(page_bytes);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        let range = vm.reserve_range(page_bytes * max_handles)?;
        let (addr, va_size) = (range.addr.0, range.size_bytes);
        self.expandables.push(Some(ExpandableSegment {
            range,
            page_bytes,
            mapped_pages: vec![false; max_handles as usize],
            mapped_bytes: 0,
        }));
        let es = (self.expandables.len() - 1) as u32;
        let id = self.insert_block(Block::whole(
            addr, va_size, stream, pool_kind, es, true, false,
        ));
        self.pool_mut(pool_kind)
            .unmapped
            .insert((stream.0, addr), id);
        Ok(id)
    }

    /// `map_block`: maps the pages under the first `size` bytes of an unmapped block and
    /// merges them with free neighbours. `Ok(false)` when the device is out of memory.
    fn map_block(
        &mut self,
        device: &mut dyn Device,
        id: u32,
        size: u64,
    ) -> Result<bool, DeviceError> {
        let b = self.block(id).clone();
        debug_assert!(!b.mapped && size <= b.size);
        let es = self.expandables[b.segment as usize]
            .as_mut()
            .expect("dead expandable segment");
        let page = es.page_bytes;
        let base = es.range.addr.0;
        let begin = (b.addr - base) / page;
        let end = (b.addr + size - base).div_ceil(page);
        debug_assert_eq!(base + begin * page, b.addr);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        match vm.map_pages(&es.range, begin * page, page, end - begin) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
        let mapped_size = (end - begin) * page;
        for p in begin..end {
            es.mapped_pages[p as usize] = true;
        }
        es.mapped_bytes += mapped_size;
        self.pool_mut(b.pool).unmapped.remove(&(b.stream.0, b.addr));
        self.block_mut(id).mapped = true;
        if mapped_size < b.size {
            let rest = self.insert_block(b.piece(
                b.addr + mapped_size,
                b.size - mapped_size,
                false,
                id,
                b.next,
            ));
            if b.next != NIL {
                self.block_mut(b.next).prev = rest;
            }
            self.block_mut(id).next = rest;
            self.pool_mut(b.pool)
                .unmapped
                .insert((b.stream.0, b.addr + mapped_size), rest);
            self.block_mut(id).size = mapped_size;
        }
        let prev = self.block(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.block(id).next;
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        self.total_allocated += mapped_size;
        self.stats.reserved_bytes.increase(b.pool, mapped_size);
        self.stats.num_device_alloc += 1;
        Ok(true)
    }

    /// `unmap_block`: unmaps every page lying wholly inside a free expandable block.
    fn unmap_block(&mut self, device: &mut dyn Device, id: u32) -> Result<(), DeviceError> {
        let b = self.block(id).clone();
        let es = self.expandables[b.segment as usize]
            .as_mut()
            .expect("dead expandable segment");
        let page = es.page_bytes;
        let base = es.range.addr.0;
        let begin = (b.addr - base).div_ceil(page);
        let end = (b.addr + b.size - base) / page;
        if begin >= end {
            return Ok(());
        }
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        vm.unmap_pages(&es.range, begin * page, page, end - begin)?;
        for p in begin..end {
            es.mapped_pages[p as usize] = false;
        }
        let unmapped_addr = base + begin * page;
        let unmapped_size = (end - begin) * page;
        es.mapped_bytes -= unmapped_size;
        self.pool_mut(b.pool)
            .blocks
            .remove(&(b.stream.0, b.size, b.addr));
        let before_size = unmapped_addr - b.addr;
        if before_size > 0 {
            let before = self.insert_block(b.piece(b.addr, before_size, true, b.prev, id));
            if b.prev != NIL {
                self.block_mut(b.prev).next = before;
            }
            self.block_mut(id).prev = before;
            self.insert_into_blocks(before);
        }
        let after_size = b.size - (before_size + unmapped_size);
        if after_size > 0 {
            let after = self.insert_block(b.piece(
                unmapped_addr + unmapped_size,
                after_size,
                true,
                id,
                b.next,
            ));
            if b.next != NIL {
                self.block_mut(b.next).prev = after;
            }
            self.block_mut(id).next = after;
            self.insert_into_blocks(after);
        }
        {
            let blk = self.block_mut(id);
            blk.addr = unmapped_addr;
            blk.size = unmapped_size;
            blk.mapped = false;
        }
        let prev = self.block(id).prev;
        self.try_merge_blocks(id, prev);
        let next = self.block(id).next;
        self.try_merge_blocks(id, next);
        let blk = self.block(id);
        let key = (blk.stream.0, blk.addr);
        self.pool_mut(b.pool).unmapped.insert(key, id);
        self.total_allocated -= unmapped_size;
        self.stats.reserved_bytes.decrease(b.pool, unmapped_size);
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// `release_expandable_segment`: drops a segment whose every page is unmapped.
    fn release_expandable_segment(
        &mut self,
        device: &mut dyn Device,
        id: u32,
    ) -> Result<(), DeviceError> {
        let b = self.block(id).clone();
        let es = self.expandables[b.segment as usize]
            .take()
            .expect("dead expandable segment");
        assert!(
            !b.mapped && b.size == es.range.size_bytes,
            "block disagrees with segment"
        );
        self.pool_mut(b.pool).unmapped.remove(&(b.stream.0, b.addr));
        self.delete_block(id);
        let vm = device.virtual_memory().ok_or(DeviceError::Unsupported {
            what: "virtual memory management (needed by expandable segments)",
        })?;
        vm.release_range(es.range)
    }

    // ------------------------------------------------------------------- free

    fn mark_free_requested(&mut self, id: u32) {
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
    fn free_block(&mut self, id: u32) {
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
    fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
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
        let pool = self.pool_mut(s.pool);
        if s.mapped {
            pool.blocks.remove(&(s.stream.0, s.size, s.addr));
        } else {
            pool.unmapped.remove(&(s.stream.0, s.addr));
        }
        self.delete_block(src);
        s.size
    }

    // ------------------------------------------------------------- plumbing

    fn block(&self, id: u32) -> &Block {
        self.blocks.get(id).expect("dead block")
    }

    fn block_mut(&mut self, id: u32) -> &mut Block {
        self.blocks.get_mut(id).expect("dead block")
    }

    fn is_split(&self, id: u32) -> bool {
        let b = self.block(id);
        b.prev != NIL || b.next != NIL
    }

    fn pool(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn insert_block(&mut self, block: Block) -> u32 {
        self.blocks.insert(block)
    }

    fn delete_block(&mut self, id: u32) {
        self.blocks.remove(id);
    }

    /// `BlockPool::insert_into_blocks`: into the free set, stamped with the GC clock.
    fn insert_into_blocks(&mut self, id: u32) {
        let (pool_kind, key) = {
            let b = self.block(id);
            (b.pool, (b.stream.0, b.size, b.addr))
        };
        let clock = self.pool(pool_kind).get_free_blocks_call_count;
        self.block_mut(id).gc_count_base = clock;
        let previous = self.pool_mut(pool_kind).blocks.insert(key, id);
        debug_assert!(previous.is_none(), "two free blocks with one key");
    }

    /// The block of a live allocation, checking that the allocation is its tenant.
    fn live_tenant(&self, allocation: &Allocation) -> &Block {
        let block = self
            .blocks
            .get(allocation.block)
            .filter(|b| b.serial == allocation.serial && b.state != State::Free)
            .unwrap_or_else(|| {
                panic!(
                    "allocation at {} is not live in this caching policy (freed twice, or from another policy)",
                    allocation.addr
                )
            });
        block
    }
}

/// What one malloc asks of `alloc_block`.
struct AllocArgs {
    pool: PoolKind,
    stream: StreamId,
    size: u64,
    alloc_size: u64,
    expandable: bool,
    allowed: Option<u64>,
}

impl Default for CachingPolicy {
    fn default() -> Self {
        CachingPolicy::new(CachingConfig::default())
    }
}

impl Policy for CachingPolicy {
    fn name(&self) -> &str {
        &self.label
    }

    fn allocate(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError> {
        self.malloc(device, request.size_bytes, request.stream)
    }

    fn free(
        &mut self,
        _device: &mut dyn Device,
        allocation: Allocation,
    ) -> Result<(), DeviceError> {
        if self.completed_early.remove(&allocation.serial) {
            // A cache release already returned this pending block to its pool.
            return Ok(());
        }
        let id = allocation.block;
        if self.live_tenant(&allocation).state == State::Allocated {
            self.mark_free_requested(id);
        } else {
            self.pending.remove(&id);
        }
        self.free_block(id);
        Ok(())
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        self.release_cached_blocks(device)
    }

    fn detailed_stats(&self) -> Vec<(String, i64)> {
        self.stats.flatten(self.config.max_split_size_bytes)
    }

    fn describe_oom(&mut self, tried_bytes: u64, device: &dyn Device) -> Option<String> {
        Some(self.oom_message(tried_bytes, device))
    }

    fn stats(&self) -> PolicyStats {
        let s = &self.stats;
        PolicyStats {
            requested_bytes: s.requested_bytes.all.current,
            allocated_bytes: s.allocated_bytes.all.current,
            reserved_bytes: s.reserved_bytes.all.current,
            allocation_count: s.allocation.all.current,
            // An expandable segment counts while it holds memory; one whose first
            // mapping failed is only address space (PyTorch keeps it for reuse too).
            segment_count: s.segment.all.current
                + self
                    .expandables
                    .iter()
                    .flatten()
                    .filter(|e| e.mapped_bytes > 0)
                    .count() as u64,
        }
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        for (id, b) in self.blocks.iter() {
            let head = b.mapped && (b.prev == NIL || !self.block(b.prev).mapped);
            if !head {
                continue;
            }
            let mut blocks = Vec::new();
            let mut cur = id;
            while cur != NIL && self.block(cur).mapped {
                let c = self.block(cur);
                blocks.push(BlockSnapshot {
                    addr: DeviceAddr(c.addr),
                    size_bytes: c.size,
                    requested_bytes: c.requested,
                    state: match c.state {
                        State::Allocated => BlockState::Allocated,
                        State::Pending => BlockState::PendingFree,
                        State::Free => BlockState::Free,
                    },
                });
                cur = c.next;
            }
            out.push(SegmentSnapshot {
                addr: DeviceAddr(b.addr),
                size_bytes: blocks.iter().map(|x| x.size_bytes).sum(),
                stream: b.stream,
                pool: match b.pool {
                    PoolKind::Small => "small",
                    PoolKind::Large => "large",
                },
                blocks,
            });
        }
        out.sort_by_key(|s| s.addr);
        out
    }

    fn check_invariants(&self) {
        let mut allocated = (0u64, 0u64);
        let mut active = (0u64, 0u64, 0u64);
        let mut inactive_split = (0u64, 0u64);
        let mut free_mapped = 0usize;
        let mut unmapped = 0usize;
        let mut reserved = 0u64;
        for (id, b) in self.blocks.iter() {
            assert!(
                b.size > 0 && b.size % MIN_BLOCK_BYTES == 0,
                "block size {} not a positive multiple of 512",
                b.size
            );
            for (n, forward) in [(b.prev, false), (b.next, true)] {
                if n == NIL {
                    continue;
                }
                let nb = self.block(n);
                assert_eq!(
                    if forward { nb.prev } else { nb.next },
                    id,
                    "broken block links"
                );
                let (lo, hi) = if forward { (b, nb) } else { (nb, b) };
                assert_eq!(
                    lo.addr + lo.size,
                    hi.addr,
                    "neighbouring blocks do not touch"
                );
                assert!(
                    nb.segment == b.segment
                        && nb.expandable == b.expandable
                        && nb.stream == b.stream
                        && nb.pool == b.pool,
                    "neighbours in different segments"
                );
                if forward && b.state == State::Free && nb.state == State::Free {
                    assert_ne!(b.mapped, nb.mapped, "two free neighbours were not merged");
                }
            }
            match (b.state, b.mapped) {
                (State::Free, true) => {
                    free_mapped += 1;
                    assert_eq!(
                        self.pool(b.pool).blocks.get(&(b.stream.0, b.size, b.addr)),
                        Some(&id),
                        "free block missing from its pool"
                    );
                    if !b.expandable && (b.prev != NIL || b.next != NIL) {
                        inactive_split.0 += 1;
                        inactive_split.1 += b.size;
                    }
                }
                (State::Free, false) => {
                    assert!(b.expandable, "unmapped block outside an expandable segment");
                    unmapped += 1;
                    assert_eq!(
                        self.pool(b.pool).unmapped.get(&(b.stream.0, b.addr)),
                        Some(&id),
                        "unmapped block missing from its pool"
                    );
                }
                (State::Allocated, _) | (State::Pending, _) => {
                    assert!(b.mapped, "allocated block is not mapped");
                    assert!(b.serial > 0, "allocated block without a tenant");
                    if b.state == State::Allocated {
                        allocated.0 += 1;
                        allocated.1 += b.size;
                    } else {
                        assert!(self.pending.contains(&id), "pending block not tracked");
                    }
                    active.0 += 1;
                    active.1 += b.size;
                    active.2 += b.requested;
                }
            }
            if b.prev == NIL && !b.expandable {
                let seg = self
                    .segments
                    .get(b.segment)
                    .expect("block of a freed segment");
                assert_eq!(
                    seg.addr.0, b.addr,
                    "segment head is not at the segment base"
                );
                let mut covered = 0;
                let mut cur = id;
                while cur != NIL {
                    covered += self.block(cur).size;
                    cur = self.block(cur).next;
                }
                assert_eq!(covered, seg.size_bytes, "blocks do not tile their segment");
                reserved += seg.size_bytes;
            }
            if b.prev == NIL && b.expandable {
                let es = self.expandables[b.segment as usize]
                    .as_ref()
                    .expect("block of a released expandable segment");
                assert_eq!(
                    es.range.addr.0, b.addr,
                    "expandable head is not at the range base"
                );
                let mut covered = 0;
                let mut cur = id;
                while cur != NIL {
                    let c = self.block(cur);
                    let first_page = (c.addr - es.range.addr.0) / es.page_bytes;
                    let last_page = (c.addr + c.size - 1 - es.range.addr.0) / es.page_bytes;
                    if c.mapped {
                        for p in first_page..=last_page {
                            assert!(
                                es.mapped_pages[p as usize],
                                "mapped block over an unmapped page"
                            );
                        }
                    } else {
                        assert_eq!(
                            (c.addr - es.range.addr.0) % es.page_bytes,
                            0,
                            "unmapped block not page aligned"
                        );
                        assert_eq!(c.size % es.page_bytes, 0, "unmapped block not whole pages");
                        for p in first_page..=last_page {
                            assert!(
                                !es.mapped_pages[p as usize],
                                "unmapped block over a mapped page"
                            );
                        }
                    }
                    covered += c.size;
                    cur = c.next;
                }
                assert_eq!(
                    covered, es.range.size_bytes,
                    "blocks do not tile their expandable segment"
                );
                let mapped = es.mapped_pages.iter().filter(|&&m| m).count() as u64 * es.page_bytes;
                assert_eq!(mapped, es.mapped_bytes, "expandable segment mapped bytes");
                reserved += es.mapped_bytes;
            }
        }
        let s = &self.stats;
        assert_eq!(
            free_mapped,
            self.small.blocks.len() + self.large.blocks.len(),
            "pool holds stale blocks"
        );
        assert_eq!(
            unmapped,
            self.small.unmapped.len() + self.large.unmapped.len(),
            "unmapped set holds stale blocks"
        );
        assert_eq!(
            reserved, s.reserved_bytes.all.current,
            "reserved_bytes disagrees with the segments"
        );
        assert_eq!(
            reserved, self.total_allocated,
            "total_allocated_memory disagrees with the segments"
        );
        assert_eq!(
            allocated,
            (s.allocation.all.current, s.allocated_bytes.all.current),
            "allocated stats"
        );
        assert_eq!(
            active,
            (
                s.active.all.current,
                s.active_bytes.all.current,
                s.requested_bytes.all.current
            ),
            "active stats"
        );
        assert_eq!(
            inactive_split,
            (
                s.inactive_split.all.current,
                s.inactive_split_bytes.all.current
            ),
            "inactive_split stats"
        );
        for a in [
            &s.allocation,
            &s.segment,
            &s.active,
            &s.inactive_split,
            &s.allocated_bytes,
            &s.reserved_bytes,
            &s.active_bytes,
            &s.inactive_split_bytes,
            &s.requested_bytes,
        ] {
            assert_eq!(
                a.all.current,
                a.small_pool.current + a.large_pool.current,
                "pool stats do not add up"
            );
        }
    }
}

/// `roundup_power2_next_division`.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor2 = 1u64 << (63 - size.leading_zeros());
    let step = floor2 >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor2 << 1;
    }
    let round_floor = size & !(step - 1);
    if round_floor == size {
        size
    } else {
        round_floor + step
    }
}

/// PyTorch's `format_size`: "N bytes" up to 1 KiB, then KiB / MiB / GiB with two decimals.
pub fn format_size(size: u64) -> String {
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", size as f64 / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", size as f64 / 1_048_576.0)
    } else {
        format!("{:.2} GiB", size as f64 / 1_073_741_824.0)
    }
}

#[cfg(test)]
mod tests;
