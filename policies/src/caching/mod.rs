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
//! - taking over PyTorch's state where a trace that starts mid-run begins
//!   ([`Policy::adopt`], `adopt.rs`);
//! - every statistic of `torch.cuda.memory_stats()` ([`CachingStats`]).
//!
//! - private pools (`pools.rs`): CUDA graph captures and `torch.cuda.MemPool`, one
//!   small/large pool pair per pool, requests routed by the allocations to pools under
//!   way (`beginAllocateToPool` / `endAllocateToPool`), use counts (`releasePool`), a
//!   pool's free segments given back by a cache release once no use is left, no cache
//!   release of the default pools and no retry during a capture, `use_on_oom` and
//!   `no_split` MemPools, completed frees deferred during a capture
//!   (`graph_capture_record_stream_reuse`);
//! - run-time calls ([`AllocatorCall`]): settings changed mid-run, peak and accumulated
//!   statistics reset, the allocator disabled (`caching_allocator_enable(False)`: one
//!   `cudaMalloc` per request, outside the statistics).
//!
//! Not modelled: IPC, multi-device peer access, custom MemPool allocators and the
//! `cudaMallocAsync` backend. `release_lock_on_cudamalloc` changes only thread
//! interleaving and has no effect here.
//!
//! Files: this one holds the block and pool types, the public API and the [`Policy`]
//! impl; `adopt.rs` adopting a recorded state, `malloc.rs` the malloc ladder, `release.rs` cache releases and garbage
//! collection, `expandable.rs` expandable segments, `free.rs` freeing and merging,
//! `invariants.rs` the from-scratch checks, `config.rs` `PYTORCH_CUDA_ALLOC_CONF`,
//! `stats.rs` `memory_stats()`.

mod adopt;
mod config;
mod expandable;
mod free;
mod free_set;
mod invariants;
mod malloc;
mod pools;
mod release;
mod restore;
mod stats;

pub use config::{
    AllocConfError, CachingConfig, CachingDefaults, MemoryLimit, LARGE_BUFFER_BYTES, MIB,
    MIN_BLOCK_BYTES, MIN_LARGE_ALLOC_BYTES, ROUNDUP_INTERVALS, ROUND_LARGE_BYTES,
    SMALL_BUFFER_BYTES, SMALL_SIZE_BYTES,
};
pub use expandable::expandable_range_bytes;
use stats::Tallies;
pub use stats::{CachingStats, PoolKind, Stat, StatArray};

use std::collections::{BTreeMap, BTreeSet, HashSet};

pub use pools::PoolInfo;

use crate::device::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment,
    VirtualMemory,
};
use crate::policy::{
    AllocError, Allocation, AllocatorCall, BlockSnapshot, BlockState, CallError, CallOutcome,
    Policy, PolicyStats, PoolId, PoolStreams, Request, SegmentSnapshot, StreamId,
    MAX_REQUEST_BYTES,
};
use crate::slab::{DenseSlab, Slab, Vacancy};

const NIL: u32 = u32::MAX;

/// Up to this many streams, [`CachingPolicy::stream_slot`] scans them all without a
/// branch per stream.
const FEW_STREAMS: usize = 8;

/// Up to this many streams, [`CachingPolicy::stream_slot`] scans them until it finds
/// the stream; past it, it looks the stream up in a hashed map (a scan of a thousand
/// streams on every request was most of a replay's time).
const SCANNED_STREAMS: usize = 64;

/// `if cond { a } else { b }` by a mask, not a branch: for choices that follow the
/// trace's data (a small or a large request, a neighbour or none), which a branch
/// predictor gets wrong about as often as right.
#[inline(always)]
const fn pick(cond: bool, a: u64, b: u64) -> u64 {
    let m = (cond as u64).wrapping_neg();
    (a & m) | (b & !m)
}

/// [`pick`] of `u32`s.
#[inline(always)]
const fn pick32(cond: bool, a: u32, b: u32) -> u32 {
    let m = (cond as u32).wrapping_neg();
    (a & m) | (b & !m)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In its pool's free set (or, unmapped, in the unmapped set).
    Free,
    /// Handed out.
    Allocated,
    /// `free()` was called but the block waits for other streams.
    Pending,
    /// No block: an empty slot of the block table (the block it held last is kept
    /// only as this slot's bytes, never read).
    Vacant,
}

/// One block: 64 bytes, one cache line (the fields most paths read are its first
/// half; the flags pack its pool, whether it is mapped and whether it is in an
/// expandable segment).
#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    /// While allocated or pending, the serial of the current tenant (never 0); while
    /// free, the pool's GC clock when the block went into its free set (PyTorch's
    /// `gc_count_base`): the two are never needed at once.
    stamp: u64,
    /// Its stream's slot in [`CachingPolicy::streams`] (and in its pool's free set).
    stream: u32,
    /// Slot of the owning pool pair in `pools` (0: the default pools).
    owner: u32,
    prev: u32,
    next: u32,
    /// Index into `segments` (or `expandables` when `expandable`).
    segment: u32,
    /// Its neighbours in its pool's free set (while it is in one).
    link: free_set::Link,
    /// Its size class in its pool's free set; [`free_set::NO_CLASS`] while in none.
    class: u16,
    state: State,
    /// [`LARGE`], [`MAPPED`], [`EXPANDABLE`].
    flags: u8,
}

const _: () = assert!(
    std::mem::size_of::<Block>() == 64,
    "a block is one cache line"
);

/// [`Block::flags`]: in the large pool (else the small one).
const LARGE: u8 = 1;
/// [`Block::flags`]: mapped (only blocks of expandable segments are ever unmapped).
const MAPPED: u8 = 2;
/// [`Block::flags`]: part of an expandable segment.
const EXPANDABLE: u8 = 4;

impl Block {
    /// A free block that never had a tenant, alone in its (new) segment.
    #[allow(clippy::too_many_arguments)]
    fn whole(
        addr: u64,
        size: u64,
        stream: u32,
        pool: PoolKind,
        owner: u32,
        segment: u32,
        expandable: bool,
        mapped: bool,
    ) -> Block {
        let flags = match pool {
            PoolKind::Small => 0,
            PoolKind::Large => LARGE,
        } | if mapped { MAPPED } else { 0 }
            | if expandable { EXPANDABLE } else { 0 };
        Block {
            addr,
            size,
            requested: 0,
            stamp: 0,
            stream,
            owner,
            prev: NIL,
            next: NIL,
            segment,
            link: free_set::Link::UNLINKED,
            class: free_set::NO_CLASS,
            state: State::Free,
            flags,
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
                self.pool(),
                self.owner,
                self.segment,
                self.expandable(),
                mapped,
            )
        }
    }

    /// Its pool (small or large).
    #[inline(always)]
    fn pool(&self) -> PoolKind {
        if self.flags & LARGE != 0 {
            PoolKind::Large
        } else {
            PoolKind::Small
        }
    }

    /// Whether its memory is mapped.
    #[inline(always)]
    fn mapped(&self) -> bool {
        self.flags & MAPPED != 0
    }

    /// Whether it is part of an expandable segment.
    #[inline(always)]
    fn expandable(&self) -> bool {
        self.flags & EXPANDABLE != 0
    }

    /// Marks its memory mapped or not.
    fn set_mapped(&mut self, mapped: bool) {
        if mapped {
            self.flags |= MAPPED;
        } else {
            self.flags &= !MAPPED;
        }
    }

    /// Whether it is in a free set now.
    fn in_free_set(&self) -> bool {
        self.class != free_set::NO_CLASS
    }
}

impl Vacancy for Block {
    #[inline(always)]
    fn is_vacant(&self) -> bool {
        self.state == State::Vacant
    }

    #[inline(always)]
    fn vacate(&mut self) {
        self.state = State::Vacant;
    }
}

/// The free sets read a block's key and links from its record in the block table.
impl free_set::NodeTable for DenseSlab<Block> {
    #[inline(always)]
    fn key(&self, id: u32) -> (u64, u64) {
        let b = self.live(id);
        (b.size, b.addr)
    }

    #[inline(always)]
    fn slot(&self, id: u32) -> u32 {
        self.live(id).stream
    }

    #[inline(always)]
    fn link(&self, id: u32) -> &free_set::Link {
        &self.live(id).link
    }

    #[inline(always)]
    fn link_mut(&mut self, id: u32) -> &mut free_set::Link {
        &mut self.live_mut(id).link
    }

    #[inline(always)]
    fn place(&self, id: u32) -> (free_set::Link, u16) {
        let b = self.live(id);
        (b.link, b.class)
    }

    #[inline(always)]
    fn place_mut(&mut self, id: u32) -> (&mut free_set::Link, &mut u16) {
        let b = self.live_mut(id);
        (&mut b.link, &mut b.class)
    }

    #[inline(always)]
    fn set_key(&mut self, id: u32, slot: u32, size: u64, addr: u64) {
        // Only a check, and only in debug builds (a lookup here would cost a bounds
        // check per insert in release builds too).
        #[cfg(debug_assertions)]
        {
            let b = self.live(id);
            assert_eq!(
                (b.stream, b.size, b.addr),
                (slot, size, addr),
                "block {id} goes into a free set under another key"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = (id, slot, size, addr);
    }
}

type AddrKey = (u64, u64);

/// One pool's free blocks: PyTorch's `BlockPool`.
#[derive(Debug)]
struct BlockPool {
    /// Free mapped blocks by (stream, size, address).
    blocks: free_set::FreeSet,
    /// Unmapped address space of expandable segments by (stream, address).
    unmapped: BTreeMap<AddrKey, u32>,
    /// `get_free_block` calls while garbage collection is on: the clock of block ages.
    get_free_blocks_call_count: u64,
    /// The least memory a cache release can give back at once in this pool, over every
    /// segment it ever got: a segment's size, or an expandable segment's page (`u64::MAX`:
    /// no segment yet). A release frees whole segments, whose one block is the
    /// segment's size, and unmaps the pages that free blocks of expandable segments
    /// cover whole, so it passes over the free blocks smaller than this: a pool of many
    /// split blocks under repeated out-of-memory retries reads only those that may give
    /// memory back.
    smallest_release: u64,
}

impl Default for BlockPool {
    fn default() -> Self {
        BlockPool {
            blocks: free_set::FreeSet::default(),
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
            smallest_release: u64::MAX,
        }
    }
}

impl BlockPool {
    /// A segment joins the pool: `release` is its size, or an expandable segment's
    /// page size (see [`BlockPool::smallest_release`]).
    fn got_segment(&mut self, release: u64) {
        self.smallest_release = self.smallest_release.min(release);
    }

    /// The smallest free block a cache release must read: a smaller one is no whole
    /// segment and covers no page of an expandable one.
    fn releasable_from(&self) -> u64 {
        self.smallest_release
    }
}

/// The small and large pool of one owner (the default pools, or a private pool).
#[derive(Debug, Default)]
struct PoolPair {
    /// The owner's id ((0, 0) for the default pools).
    id: PoolId,
    small: BlockPool,
    large: BlockPool,
}

impl PoolPair {
    fn get(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn get_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }
}

/// A private pool: PyTorch's `PrivatePool`.
#[derive(Debug)]
struct PrivatePool {
    /// Its pool pair in `CachingPolicy::pools`.
    slot: u32,
    /// Live uses: graphs captured into it, `use_mem_pool` blocks, the `MemPool` object.
    use_count: u64,
    /// Segments (and expandable mappings) got for it and not yet given back
    /// (`cudaMalloc_count`).
    cuda_malloc_count: u64,
    /// It got an expandable segment's mapping once: its count then follows mappings and
    /// unmappings, not segments (see [`CachingPolicy::count_pool_segment`]).
    had_expandable: bool,
}

/// One expandable segment: a reserved address range, mapped page by page, one physical
/// chunk per page (PyTorch's `ExpandableSegment`).
#[derive(Debug)]
struct ExpandableSegment {
    range: AddressRange,
    page_bytes: u64,
    /// The chunk mapped at each page (PyTorch's `handles_`): as long as the highest
    /// mapped page, trimmed after unmaps.
    handles: Vec<Option<PhysicalChunk>>,
    mapped_bytes: u64,
}

/// Allocations made while the allocator was disabled, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct UncachedTotals {
    count: u64,
    bytes: u64,
    requested: u64,
}

impl UncachedTotals {
    fn add(&mut self, bytes: u64, requested: u64) {
        self.count += 1;
        self.bytes += bytes;
        self.requested += requested;
    }

    fn sub(&mut self, bytes: u64, requested: u64) {
        self.count -= 1;
        self.bytes -= bytes;
        self.requested -= requested;
    }
}

/// PyTorch's caching allocator for one device. See the module docs for what it models.
#[derive(Debug)]
pub struct CachingPolicy {
    label: String,
    config: CachingConfig,
    /// PyTorch's statistics, except `active` and `active_bytes` while
    /// `active_mirrors_allocation` (read them through [`CachingPolicy::caching_stats`]),
    /// each `StatArray` kept as a [`stats::Tally`].
    stats: Tallies,
    /// Until the first free that waits for other streams (`free_requested`) or an
    /// adopted state, every block stops being allocated and active in the same call, so
    /// `active` and `active_bytes` equal `allocation` and `allocated_bytes` field for
    /// field (current, peak, allocated, freed; all pools and each): they are not kept
    /// then, but copied where read, and from that event on kept
    /// ([`CachingPolicy::keep_active_stats`]).
    active_mirrors_allocation: bool,
    /// The blocks by id; a vacant slot's block is [`State::Vacant`].
    blocks: DenseSlab<Block>,
    /// The streams seen, in the order they came: a block keeps its stream's slot here
    /// (see [`CachingPolicy::stream_slot`]).
    streams: Vec<StreamId>,
    /// Each stream's slot in `streams`, kept once there are more than
    /// [`SCANNED_STREAMS`] (empty before).
    stream_slots: std::collections::HashMap<StreamId, u32, foldhash::fast::RandomState>,
    /// Free blocks by owner: slot 0 the default pools, then one pair per private pool
    /// ever created (slots are not reused).
    pools: Vec<PoolPair>,
    /// Live private pools (PyTorch's `graph_pools`).
    private: BTreeMap<PoolId, PrivatePool>,
    /// Private pools with no use left, whose free segments a cache release gives back
    /// (`graph_pools_freeable`; PyTorch walks a hash map, this walks ids in order).
    freeable: BTreeSet<PoolId>,
    /// Allocations to private pools under way, oldest first (`captures_underway`).
    captures: Vec<(PoolId, PoolStreams)>,
    /// MemPools that may serve a default-pool request about to run out (`use_on_oom_pools`).
    use_on_oom: BTreeSet<PoolId>,
    /// MemPools that never split a block (`no_split_pools`).
    no_split: BTreeSet<PoolId>,
    /// Blocks whose free completed during a capture but whose return to the pool waits
    /// (`deferred_blocks`): the serial of each, by block.
    deferred: BTreeMap<u32, bool>,
    /// Pending blocks whose free was requested during a capture.
    capture_frees: BTreeSet<u32>,
    /// Serials of adopted blocks waiting for other streams in a pool being allocated
    /// to when the state was adopted, whose free completes at once if it comes during
    /// a capture (`caching/adopt.rs`).
    adopted_frees: BTreeSet<u64>,
    /// `caching_allocator_enable`; while off, requests bypass the cache.
    enabled: bool,
    /// Allocations made while the allocator was disabled: one segment each, with the
    /// bytes asked for.
    uncached: Slab<(Segment, u64)>,
    /// The allocations of `uncached`, summed (read after every event by [`Policy::stats`]).
    uncached_totals: UncachedTotals,
    /// [`CachingPolicy::rounds_to_divisions`] of `config`, kept as the settings change.
    power2_divisions: bool,
    /// [`CachingPolicy::collects_garbage`] of `config`, kept as the settings change.
    gc_threshold_set: bool,
    /// The last out-of-memory came from a request made while disabled.
    last_oom_uncached: bool,
    /// `max_split_size` of `memory_stats()`: the setting when the allocator was created
    /// (PyTorch does not update it when the settings change).
    stats_max_split_size: u64,
    segments: Slab<Segment>,
    expandables: Vec<Option<ExpandableSegment>>,
    /// Expandable segments holding memory (`mapped_bytes > 0`), counted as they change.
    mapped_expandables: u64,
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
    /// The block the next request takes, set by [`AllocatorCall::RestoreBlock`].
    restore: Option<restore::Restore>,
    /// [`Policy::restores_missed`].
    restores_missed: u64,
}

impl CachingPolicy {
    /// A caching allocator with the given configuration.
    pub fn new(config: CachingConfig) -> CachingPolicy {
        let label = match config.to_alloc_conf() {
            conf if conf.is_empty() => "caching".to_string(),
            conf => format!("caching[{conf}]"),
        };
        let stats_max_split_size = config.max_split_size_bytes;
        let power2_divisions = CachingPolicy::rounds_to_divisions(&config);
        let gc_threshold_set = CachingPolicy::collects_garbage(&config);
        CachingPolicy {
            label,
            config,
            stats: Tallies::default(),
            active_mirrors_allocation: true,
            blocks: DenseSlab::default(),
            streams: Vec::new(),
            stream_slots: Default::default(),
            pools: vec![PoolPair::default()],
            private: BTreeMap::new(),
            freeable: BTreeSet::new(),
            captures: Vec::new(),
            use_on_oom: BTreeSet::new(),
            no_split: BTreeSet::new(),
            deferred: BTreeMap::new(),
            capture_frees: BTreeSet::new(),
            adopted_frees: BTreeSet::new(),
            enabled: true,
            uncached: Slab::default(),
            uncached_totals: UncachedTotals::default(),
            last_oom_uncached: false,
            power2_divisions,
            gc_threshold_set,
            stats_max_split_size,
            segments: Slab::default(),
            expandables: Vec::new(),
            mapped_expandables: 0,
            total_allocated: 0,
            pending: BTreeSet::new(),
            completed_early: HashSet::new(),
            next_serial: 1,
            allowed: None,
            restore: None,
            restores_missed: 0,
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
    pub fn caching_stats(&self) -> CachingStats {
        let mut stats = self.stats.stats();
        if self.active_mirrors_allocation {
            stats.active = stats.allocation;
            stats.active_bytes = stats.allocated_bytes;
        }
        stats
    }

    /// From now on `active` and `active_bytes` are kept, starting from the values they
    /// mirror (see [`CachingPolicy::active_mirrors_allocation`]).
    fn keep_active_stats(&mut self) {
        if std::mem::take(&mut self.active_mirrors_allocation) {
            self.stats.active = self.stats.allocation;
            self.stats.active_bytes = self.stats.allocated_bytes;
        }
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
        if self.power2_divisions {
            let divisions = self.config.divisions_for(size);
            if divisions > 1 && size > MIN_BLOCK_BYTES * divisions {
                return roundup_power2_next_division(size, divisions);
            }
        }
        size.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    }

    /// Whether `config` rounds any size to power-of-two divisions (some interval of
    /// `roundup_power2_divisions` above 1): else [`CachingPolicy::round_size`] need
    /// not look its size's interval up.
    fn rounds_to_divisions(config: &CachingConfig) -> bool {
        config.roundup_power2_divisions.iter().any(|&d| d > 1)
    }

    /// Whether `config` sets a `garbage_collection_threshold` (which collects garbage
    /// where a memory limit is set too).
    fn collects_garbage(config: &CachingConfig) -> bool {
        config.garbage_collection_threshold > 0.0
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
        if tried_bytes >= MAX_REQUEST_BYTES {
            return "CUDA out of memory. Tried to allocate more than 1EB memory.".to_string();
        }
        if std::mem::take(&mut self.last_oom_uncached) {
            // cudaMalloc's own error, raised by C10_CUDA_CHECK while the allocator is off.
            return "CUDA error: out of memory".to_string();
        }
        let d: DeviceStats = device.stats();
        let allowed = self
            .allowed_bytes(device)
            .map(|a| format!("{} allowed; ", format_size(a)))
            .unwrap_or_default();
        let allocated = self.stats.allocated_bytes.current();
        let reserved = self.stats.reserved_bytes.current();
        let private = self.free_bytes_in_private_pools();
        let private_msg = if private > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(private)
            )
        } else {
            String::new()
        };
        format!(
            "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. \
             {allowed}Of the allocated memory {} is allocated by PyTorch, {private_msg}and {} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
             See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(tried_bytes),
            format_size(d.total_bytes),
            format_size(d.free_bytes()),
            format_size(allocated + private),
            format_size(reserved - allocated - private),
        )
    }

    /// `free()` without the block returning to its pool: the program dropped the tensor
    /// but other streams still use it (`record_stream`). Allocated bytes drop now; the
    /// block becomes reusable at [`Policy::free`] or at the next cache release.
    ///
    /// # Panics
    /// If the allocation is not live in this policy.
    pub fn free_requested(&mut self, allocation: &Allocation) {
        if Self::is_uncached(allocation) {
            // `recordStream` ignores memory the cache did not hand out.
            return;
        }
        let id = allocation.block;
        let block = self.live_tenant(allocation);
        assert_eq!(block.state, State::Allocated, "free requested twice");
        // The block stays active after it stops being allocated.
        self.keep_active_stats();
        self.mark_free_requested(id);
        self.pending.insert(id);
        if !self.captures.is_empty() {
            self.capture_frees.insert(id);
        }
    }

    // ------------------------------------------------------------- plumbing

    /// Block `id`, which a link or a free set names (live by the policy's invariants:
    /// only debug builds check that the slot is not vacant).
    #[inline(always)]
    fn block(&self, id: u32) -> &Block {
        self.blocks.live(id)
    }

    /// [`CachingPolicy::block`], mutably.
    #[inline(always)]
    fn block_mut(&mut self, id: u32) -> &mut Block {
        self.blocks.live_mut(id)
    }

    /// The expandable segment in slot `segment`, which a block of it names (live by
    /// the policy's invariants: a segment's slot is emptied only with its last block).
    fn expandable(&self, segment: u32) -> &ExpandableSegment {
        self.expandables[segment as usize]
            .as_ref()
            .expect("a block of a released expandable segment")
    }

    /// [`CachingPolicy::expandable`], mutably.
    fn expandable_mut(&mut self, segment: u32) -> &mut ExpandableSegment {
        self.expandables[segment as usize]
            .as_mut()
            .expect("a block of a released expandable segment")
    }

    fn is_split(&self, id: u32) -> bool {
        let b = self.block(id);
        b.prev != NIL || b.next != NIL
    }

    fn pool(&self, owner: u32, kind: PoolKind) -> &BlockPool {
        self.pools[owner as usize].get(kind)
    }

    fn pool_mut(&mut self, owner: u32, kind: PoolKind) -> &mut BlockPool {
        self.pools[owner as usize].get_mut(kind)
    }

    /// The slot of `stream` in [`CachingPolicy::streams`], made if it has none.
    #[inline(always)]
    fn stream_slot(&mut self, stream: StreamId) -> u32 {
        // Few streams, and requests name them in no predictable order: a scan of every
        // slot that picks the match without a branch per slot (a scan that stops at the
        // match mispredicts its exit about half the time with two streams).
        if self.streams.len() <= FEW_STREAMS {
            let mut found = NIL;
            for (i, &s) in self.streams.iter().enumerate() {
                found = pick32(s == stream, i as u32, found);
            }
            if found != NIL {
                return found;
            }
        } else if self.streams.len() <= SCANNED_STREAMS {
            if let Some(i) = self.streams.iter().position(|&s| s == stream) {
                return i as u32;
            }
        } else if let Some(&i) = self.stream_slots.get(&stream) {
            return i;
        }
        self.add_stream(stream)
    }

    #[inline(never)]
    fn add_stream(&mut self, stream: StreamId) -> u32 {
        self.streams.push(stream);
        let slot = u32::try_from(self.streams.len() - 1).expect("more than 4 billion streams");
        if self.streams.len() > SCANNED_STREAMS {
            if self.stream_slots.is_empty() {
                // The map starts with the streams scanned until now.
                self.stream_slots = self.streams.iter().zip(0..).map(|(&s, i)| (s, i)).collect();
            } else {
                self.stream_slots.insert(stream, slot);
            }
        }
        slot
    }

    /// The stream whose slot is `slot`.
    fn stream_id(&self, slot: u32) -> StreamId {
        self.streams[slot as usize]
    }

    fn insert_block(&mut self, block: Block) -> u32 {
        self.blocks.insert(block)
    }

    fn delete_block(&mut self, id: u32) {
        self.blocks.vacate(id);
    }

    /// `BlockPool::insert_into_blocks`: into the free set, stamped with the GC clock.
    fn insert_into_blocks(&mut self, id: u32) {
        let b = self.blocks.live_mut(id);
        let (owner, pool_kind, stream, size, addr) = (b.owner, b.pool(), b.stream, b.size, b.addr);
        let pool = self.pools[owner as usize].get_mut(pool_kind);
        b.stamp = pool.get_free_blocks_call_count;
        let added = pool.blocks.insert(&mut self.blocks, stream, size, addr, id);
        debug_assert!(added, "two free blocks with one key");
    }

    /// The block of a live allocation, checking that the allocation is its tenant.
    fn live_tenant(&self, allocation: &Allocation) -> &Block {
        let block = self
            .blocks
            .get(allocation.block)
            .filter(|b| b.stamp == allocation.serial && b.state != State::Free)
            .unwrap_or_else(|| {
                panic!(
                    "allocation at {} is not live in this caching policy (freed twice, or from another policy)",
                    allocation.addr
                )
            });
        block
    }
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
        if self.restore.is_some() {
            return self.restore_allocate(device, request.size_bytes, request.stream);
        }
        self.malloc(device, request.size_bytes, request.stream)
    }

    fn free(
        &mut self,
        device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        if Self::is_uncached(allocation) {
            return self.uncached_free(device, allocation);
        }
        if !self.completed_early.is_empty() && self.completed_early.remove(&allocation.serial) {
            // A cache release already returned this pending block to its pool.
            return Ok(());
        }
        let id = allocation.block;
        if self.live_tenant(allocation).state == State::Allocated {
            self.free_block_inline(id, true);
            return Ok(());
        } else if !self.captures.is_empty()
            && (self.adopted_frees.is_empty() || !self.adopted_frees.remove(&allocation.serial))
        {
            // A free waiting for other streams completes, but no event is looked at
            // during a capture: the block waits for the capture to end, or (with
            // graph_capture_record_stream_reuse, freed during the capture) for the next
            // request on its stream.
            let in_capture = self.capture_frees.contains(&id);
            self.deferred.insert(id, in_capture);
            return Ok(());
        } else {
            self.pending.remove(&id);
            self.capture_frees.remove(&id);
        }
        self.free_block(id);
        Ok(())
    }

    fn free_requested(
        &mut self,
        _device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        CachingPolicy::free_requested(self, allocation);
        Ok(())
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
        self.release_cached_blocks(device, PoolId::DEFAULT)
    }

    fn call(
        &mut self,
        device: &mut dyn Device,
        call: &AllocatorCall<'_>,
    ) -> Result<CallOutcome, CallError> {
        self.apply_call(device, call)
    }

    fn restores_missed(&self) -> u64 {
        self.restores_missed
    }

    fn adopt(
        &mut self,
        device: &mut dyn Device,
        segments: &[crate::policy::AdoptSegment],
        pools: &[crate::policy::AdoptPrivatePool],
    ) -> Result<Vec<Allocation>, crate::policy::AdoptError> {
        self.adopt_state(device, segments, pools)
    }

    fn detailed_stats(&self) -> Vec<(String, i64)> {
        self.caching_stats().flatten(self.stats_max_split_size)
    }

    fn rounded_bytes(&self, requested_bytes: u64) -> u64 {
        self.round_size(requested_bytes)
    }

    /// PyTorch's `get_free_block` rules: a block serves only its own stream and pool
    /// (by the rounded size), never a normal request when it is oversize
    /// (`max_split_size_mb`), and an oversize request only within the rounding
    /// tolerance. Private pools' segments are another pool.
    fn free_block_use(
        &self,
        segment: &SegmentSnapshot,
        block: &BlockSnapshot,
        request: Request,
    ) -> crate::policy::FreeBlockUse {
        use crate::policy::FreeBlockUse;
        let size = self.round_size(request.size_bytes);
        let pool = if size <= SMALL_SIZE_BYTES {
            "small"
        } else {
            "large"
        };
        let max_split = self.config.max_split_size_bytes;
        if segment.pool != pool {
            FreeBlockUse::OtherPool
        } else if segment.stream != request.stream {
            FreeBlockUse::OtherStream
        } else if block.size_bytes < size {
            FreeBlockUse::TooSmall
        } else if (size < max_split && block.size_bytes >= max_split)
            || (size >= max_split
                && block.size_bytes
                    >= size.saturating_add(self.config.max_non_split_rounding_bytes))
        {
            FreeBlockUse::Unsplittable
        } else {
            FreeBlockUse::Fits
        }
    }

    fn memory_limit_bytes(&self) -> Option<u64> {
        self.allowed.flatten()
    }

    fn describe_oom(&mut self, tried_bytes: u64, device: &dyn Device) -> Option<String> {
        Some(self.oom_message(tried_bytes, device))
    }

    fn stats(&self) -> PolicyStats {
        let s = &self.stats;
        // Allocations made while disabled are device memory the program holds, outside
        // PyTorch's statistics.
        let u = self.uncached_totals;
        PolicyStats {
            requested_bytes: s.requested_bytes.current() + u.requested,
            allocated_bytes: s.allocated_bytes.current() + u.bytes,
            reserved_bytes: s.reserved_bytes.current() + u.bytes,
            allocation_count: s.allocation.current() + u.count,
            // An expandable segment counts while it holds memory; one whose first
            // mapping failed is only address space (PyTorch keeps it for reuse too).
            segment_count: s.segment.current() + u.count + self.mapped_expandables,
        }
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        for (id, b) in self.blocks.iter() {
            let head = b.mapped() && (b.prev == NIL || !self.block(b.prev).mapped());
            if !head {
                continue;
            }
            let mut blocks = Vec::new();
            let mut cur = id;
            while cur != NIL && self.block(cur).mapped() {
                let c = self.block(cur);
                blocks.push(BlockSnapshot {
                    addr: DeviceAddr(c.addr),
                    size_bytes: c.size,
                    requested_bytes: c.requested,
                    state: match c.state {
                        State::Allocated => BlockState::Allocated,
                        State::Pending => BlockState::PendingFree,
                        State::Free => BlockState::Free,
                        State::Vacant => unreachable!("a vacant slot is no block"),
                    },
                });
                cur = c.next;
            }
            out.push(SegmentSnapshot {
                addr: DeviceAddr(b.addr),
                size_bytes: blocks.iter().map(|x| x.size_bytes).sum(),
                stream: self.stream_id(b.stream),
                pool: match (b.pool(), b.owner) {
                    (PoolKind::Small, 0) => "small",
                    (PoolKind::Large, 0) => "large",
                    (PoolKind::Small, _) => "private small",
                    (PoolKind::Large, _) => "private large",
                },
                blocks,
            });
        }
        for (_, (seg, requested)) in self.uncached.iter() {
            out.push(SegmentSnapshot {
                addr: seg.addr,
                size_bytes: seg.size_bytes,
                stream: StreamId(0),
                pool: "uncached",
                blocks: vec![BlockSnapshot {
                    addr: seg.addr,
                    size_bytes: seg.size_bytes,
                    requested_bytes: *requested,
                    state: BlockState::Allocated,
                }],
            });
        }
        out.sort_by_key(|s| s.addr);
        out
    }

    fn check_invariants(&self) {
        self.check_all_invariants();
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
