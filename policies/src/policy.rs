//! The policy side of the boundary: requests in, allocations out.

use crate::device::{Device, DeviceAddr, DeviceError};

/// A CUDA stream as PyTorch records it: the raw `cudaStream_t` value, 0 for the
/// default stream. Ordered by value, as PyTorch's free-block sets are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

/// What a policy is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes as the program asked; must be > 0.
    pub size_bytes: u64,
    /// The stream the memory is used on.
    pub stream: StreamId,
}

/// Requests of this size or more are refused at once, as PyTorch refuses them
/// ("Tried to allocate more than 1EB memory"); it also keeps every policy's
/// arithmetic far from overflow.
pub const MAX_REQUEST_BYTES: u64 = 1 << 60;

/// A live allocation. Not `Clone`: one owner (the replay engine's live table) holds
/// it from [`Policy::allocate`] to [`Policy::free`], which borrows it (the owner drops
/// it after: the 56 bytes are not moved to be freed). Freeing it twice, or freeing an
/// allocation of another policy, panics in every policy.
#[derive(Debug, PartialEq, Eq)]
pub struct Allocation {
    /// First byte handed to the program.
    pub addr: DeviceAddr,
    /// Bytes as asked.
    pub requested_bytes: u64,
    /// Bytes the policy set aside for it (after rounding, and including any remainder
    /// it chose not to split off).
    pub block_bytes: u64,
    /// The stream it was requested on.
    pub stream: StreamId,
    /// Policy-private handle to its block.
    pub(crate) block: u32,
    /// Policy-private serial number, unique over the policy's lifetime.
    pub(crate) serial: u64,
}

/// A private memory pool: PyTorch's `MempoolId_t` pair. CUDA graphs get `(N, 0)`,
/// `torch.cuda.MemPool` and `graph_pool_handle()` `(0, N)`; `(0, 0)` names the default
/// pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The default pools, `(0, 0)`.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this is `(0, 0)`, the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId::DEFAULT
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// Which requests an allocation to a pool routes (the filter of PyTorch's
/// `beginAllocateToPool`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolStreams {
    /// Every request (`torch.cuda.use_mem_pool`, which routes the current thread on
    /// every stream; a trace has one thread).
    All,
    /// Requests on these streams (a graph capture: the capturing streams).
    Only(Vec<StreamId>),
}

impl PoolStreams {
    /// Whether a request on `stream` is routed.
    pub fn routes(&self, stream: StreamId) -> bool {
        match self {
            PoolStreams::All => true,
            PoolStreams::Only(streams) => streams.contains(&stream),
        }
    }
}

/// A call to the allocator other than a request, a free or `empty_cache()`: PyTorch's
/// private-pool API (CUDA graphs, `torch.cuda.MemPool`) and its run-time settings.
#[derive(Clone, Debug, PartialEq)]
pub enum AllocatorCall<'a> {
    /// `torch.cuda.MemPool(use_on_oom=.., no_split=..)`: `createOrIncrefPool`.
    CreatePool {
        /// The pool.
        pool: PoolId,
        /// The pool may serve a request of the default pools that would run out of memory.
        use_on_oom: bool,
        /// The pool never splits a block.
        no_split: bool,
    },
    /// `beginAllocateToPool`: from here, requests `streams` selects go to `pool` (graph
    /// capture begins; `use_mem_pool` is entered). Creates the pool or adds a use.
    BeginAllocateToPool {
        /// The pool.
        pool: PoolId,
        /// Which requests go there.
        streams: &'a PoolStreams,
    },
    /// `endAllocateToPool`: requests stop going to `pool` (the capture ends; the
    /// `use_mem_pool` block is left).
    EndAllocateToPool {
        /// The pool.
        pool: PoolId,
    },
    /// `releasePool`: one use of `pool` ends (a graph is reset or destroyed; a
    /// `use_mem_pool` block or a `MemPool` ends). At no use left, the pool's free
    /// segments are given back at the next cache release.
    ReleasePool {
        /// The pool.
        pool: PoolId,
    },
    /// `emptyCache(pool)` of one private pool (what a `MemPool` does when it is destroyed).
    EmptyPoolCache {
        /// The pool.
        pool: PoolId,
    },
    /// `torch.cuda.memory._set_allocator_settings(conf)`: settings changed mid-run.
    SetAllocatorSettings {
        /// A `PYTORCH_CUDA_ALLOC_CONF` string.
        conf: &'a str,
    },
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeakStats,
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    ResetAccumulatedStats,
    /// `torch.cuda.memory.caching_allocator_enable(enabled)`.
    SetEnabled(bool),
    /// The next request is one block of a private pool set back to a checkpoint
    /// (`setCheckpointPoolState`): it takes the free block of `pool` that starts at
    /// `addr`, exactly the request's bytes (no rounding), splitting the block when it
    /// is larger, instead of the best fit.
    RestoreBlock {
        /// The pool being set back.
        pool: PoolId,
        /// Where the block starts.
        addr: DeviceAddr,
    },
}

/// What a policy did with an [`AllocatorCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The policy models the call and applied it.
    Applied,
    /// The policy has no such notion (pools, settings, statistics of its own) and
    /// ignored the call; its results do not reflect it.
    Ignored,
}

/// Why a policy refused an [`AllocatorCall`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// PyTorch would raise here: the call is not valid in this state (a pool ended that
    /// was not begun, a settings string PyTorch refuses, ...). The trace is bad input.
    #[error("{message}")]
    Rejected {
        /// PyTorch's message, or what is wrong.
        message: String,
    },
    /// A device failure while the call gave memory back.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Current state only; peaks and time belong to `sim::metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    /// Sum of `requested_bytes` of live allocations.
    pub requested_bytes: u64,
    /// Sum of `block_bytes` of live allocations.
    pub allocated_bytes: u64,
    /// Bytes held from the device: live segments plus physical chunks (the mapped pages
    /// of expandable segments).
    pub reserved_bytes: u64,
    /// Live allocations.
    pub allocation_count: u64,
    /// Live device segments (an expandable segment counts once, while it has mapped pages).
    pub segment_count: u64,
}

impl PolicyStats {
    /// Reserved but not allocated: memory the policy holds for later.
    pub fn cached_bytes(&self) -> u64 {
        self.reserved_bytes - self.allocated_bytes
    }
}

/// Why a request was not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// No memory could be had, even after the policy's own recovery (the caching policy
    /// frees cached segments and retries, as PyTorch does). A result, not a failure: the
    /// policy's live allocations are untouched.
    #[error(
        "out of memory: tried to allocate {tried_bytes} bytes for a request of {requested_bytes}"
    )]
    OutOfMemory {
        /// Bytes the program asked for.
        requested_bytes: u64,
        /// Bytes the policy last tried to get from the device (PyTorch's "Tried to
        /// allocate": the segment size, not the request).
        tried_bytes: u64,
        /// The policy's state after the failed attempt.
        stats: PolicyStats,
    },
    /// A request of zero bytes: there is nothing to allocate (PyTorch hands out a null
    /// pointer without calling its allocator).
    #[error("a request of zero bytes")]
    ZeroSize,
    /// A device failure other than running out of memory; the run cannot go on.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// State of one block in a [`SegmentSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out and live.
    Allocated,
    /// Freed by the program but not yet reusable (waiting on other streams).
    PendingFree,
    /// Free and cached by the policy.
    Free,
}

/// One block of a [`SegmentSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSnapshot {
    /// First byte.
    pub addr: DeviceAddr,
    /// Size of the block.
    pub size_bytes: u64,
    /// Bytes the current (or last) tenant asked for; 0 if never used.
    pub requested_bytes: u64,
    /// Whether it is in use.
    pub state: BlockState,
}

/// One segment (or mapped range of an expandable segment) with its blocks, in address
/// order, in the spirit of PyTorch's `memory_snapshot()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// First byte.
    pub addr: DeviceAddr,
    /// Sum of its block sizes.
    pub size_bytes: u64,
    /// Stream that owns the segment (0 where the policy has no streams).
    pub stream: StreamId,
    /// A short pool name ("small", "large", "buddy", ...).
    pub pool: &'static str,
    /// Blocks tiling the segment in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// Whether a free block could serve a request, and if not why: what an out-of-memory
/// explanation sorts free bytes by ([`Policy::free_block_use`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeBlockUse {
    /// It could (by the policy's rules, it is large enough and allowed).
    Fits,
    /// It is too small for the request: the memory is there, in pieces (fragmentation).
    TooSmall,
    /// It belongs to another stream's cache, which the policy does not lend.
    OtherStream,
    /// It is in a pool the request does not draw from (PyTorch's small and large pools).
    OtherPool,
    /// The policy's split rules keep the request out of it (PyTorch's
    /// `max_split_size_mb` and oversize tolerance).
    Unsplittable,
}

/// Why a request ran out of memory, as an explanation sums it up: which of the memory
/// the request could not use would have been enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OomCause {
    /// Enough memory was free, but in pieces the request could not use (too small,
    /// another pool, kept whole by split rules, rounding).
    Fragmentation,
    /// Enough memory was free in other streams' caches.
    StreamCache,
    /// Enough memory waited for frees pending on other streams (`record_stream`).
    PendingFrees,
    /// Even all free memory together was too little.
    TooLittleMemory,
}

impl OomCause {
    /// A short name: `fragmentation`, `stream cache`, `pending frees`, `too little
    /// memory`.
    pub fn name(self) -> &'static str {
        match self {
            OomCause::Fragmentation => "fragmentation",
            OomCause::StreamCache => "stream cache",
            OomCause::PendingFrees => "pending frees",
            OomCause::TooLittleMemory => "too little memory",
        }
    }
}

/// A live block of a state a policy is asked to adopt ([`Policy::adopt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptBlock {
    /// First byte.
    pub addr: DeviceAddr,
    /// The block's size; `None` when only the requested size is known, and the policy
    /// decides it as its own rules would have.
    pub size_bytes: Option<u64>,
    /// Bytes the program asked for.
    pub requested_bytes: u64,
    /// Whether the program already freed it and it waits for other streams (its
    /// [`Policy::free`] comes later, without a [`Policy::free_requested`]).
    pub pending_free: bool,
}

/// Which of PyTorch's pools an adopted segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdoptPool {
    /// Blocks of at most 1 MiB, 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

/// A segment of a state a policy is asked to adopt: one device segment, or one mapped
/// run of an expandable segment. The space between its live blocks is free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptSegment {
    /// First byte.
    pub addr: DeviceAddr,
    /// Bytes (mapped bytes of the run, for an expandable segment).
    pub size_bytes: u64,
    /// The stream that owns it.
    pub stream: StreamId,
    /// Its pool, when known (else the policy tells it from the size).
    pub pool: Option<AdoptPool>,
    /// Whether it is a mapped run of an expandable segment.
    pub expandable: bool,
    /// The private pool it belongs to (one of the [`AdoptPrivatePool`]s given with
    /// it), or [`PoolId::DEFAULT`].
    pub pool_id: PoolId,
    /// Live blocks in address order.
    pub blocks: Vec<AdoptBlock>,
}

/// A private pool live when a state a policy is asked to adopt was taken (a CUDA
/// graph's pool, a `torch.cuda.MemPool`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptPrivatePool {
    /// The pool.
    pub id: PoolId,
    /// Its live uses (captured graphs, `use_mem_pool` blocks, the `MemPool` object);
    /// 0: released, its free segments given back at the next cache release.
    pub uses: u64,
    /// The pool may serve a default-pool request that would run out of memory.
    pub use_on_oom: bool,
    /// The pool never splits a block.
    pub no_split: bool,
    /// Allocation to it under way (`beginAllocateToPool` before the state, no
    /// `endAllocateToPool` yet): the requests it routes. Such pools are listed in the
    /// order their allocations began.
    pub routing: Option<PoolStreams>,
}

/// Why a policy did not adopt a state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdoptError {
    /// The policy has no way to take over another allocator's state.
    #[error("the {policy} policy cannot start from a recorded allocator state (only the caching policy, which reproduces PyTorch's allocator, can)")]
    Unsupported {
        /// The policy's name.
        policy: String,
    },
    /// The state contradicts the policy's rules or itself.
    #[error("the recorded state cannot be adopted: {0}")]
    Invalid(String),
    /// The device could not take the state's memory (out of memory included).
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// An allocation policy: carves device segments into allocations.
///
/// Policies know nothing about traces, files, time or CUDA: they see requests and a
/// `&mut dyn Device`, so the same code runs in simulation and on a GPU.
pub trait Policy {
    /// A short label, e.g. `caching` or `buddy`.
    fn name(&self) -> &str;

    /// Serves one request.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] when the request cannot be served (live allocations
    /// are untouched; cached memory may have been released);
    /// [`AllocError::ZeroSize`] for a zero-byte request; [`AllocError::Device`] for a
    /// device failure that stops the run.
    fn allocate(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError>;

    /// Returns an allocation to the policy. The caller drops `allocation` after: it is
    /// no longer live, whatever the result.
    ///
    /// # Errors
    /// Only for device failures (a policy that frees segments at once).
    ///
    /// # Panics
    /// If the allocation did not come from this policy, or was freed already (a bug,
    /// not an error).
    fn free(&mut self, device: &mut dyn Device, allocation: &Allocation)
        -> Result<(), DeviceError>;

    /// The program dropped `allocation`, but other streams may still use it
    /// (`record_stream`; PyTorch's `free_requested`): its memory must not be reused
    /// until [`Policy::free`] returns it. A policy that tracks streams (the caching
    /// policy) stops counting it as allocated here, as PyTorch's statistics do. The
    /// default does nothing: a policy without streams keeps the allocation allocated,
    /// and in its own accounting, until the completed free, which is the safe reading
    /// of a delayed free (the memory is never reused early).
    ///
    /// # Errors
    /// Only for device failures (a policy that gives memory back here).
    ///
    /// # Panics
    /// If the allocation did not come from this policy, or its free was already
    /// requested (a bug, not an error).
    fn free_requested(
        &mut self,
        _device: &mut dyn Device,
        _allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        Ok(())
    }

    /// A call to the allocator other than a request, a free or `empty_cache()` (private
    /// pools, settings, statistics). The default ignores it: a policy without pools
    /// serves every request from its one heap, and keeps no statistics to reset.
    ///
    /// # Errors
    /// [`CallError::Rejected`] where PyTorch would raise; [`CallError::Device`] for a
    /// device failure while memory is given back.
    fn call(
        &mut self,
        _device: &mut dyn Device,
        _call: &AllocatorCall<'_>,
    ) -> Result<CallOutcome, CallError> {
        Ok(CallOutcome::Ignored)
    }

    /// Requests after an applied [`AllocatorCall::RestoreBlock`] that did not get the
    /// block it named (none there: another configuration's pool, a trace without the
    /// recorded addresses, a replay that went another way before) and were served as
    /// any other. 0 for a policy that ignores the call.
    fn restores_missed(&self) -> u64 {
        0
    }

    /// Returns every segment the policy can give back (`torch.cuda.empty_cache()`).
    ///
    /// # Errors
    /// Only for device failures.
    fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError>;

    /// Takes over an allocator state that already exists: `segments` with their live
    /// blocks, and the private `pools` they belong to (with the pools that hold no
    /// segment yet), as PyTorch held them when a trace that starts mid-run began. The device
    /// adopts the segments ([`Device::adopt_segment`],
    /// [`crate::VirtualMemory::adopt_range`]: a simulated device at their recorded
    /// addresses, a real GPU where its driver puts them; the blocks go where the device
    /// says, at their recorded offsets); the policy must be fresh. Returns one
    /// allocation per block, in the order given (segment by segment). Statistics start
    /// from this state (peaks are its values).
    ///
    /// The default refuses: only a policy that follows PyTorch's rules can continue
    /// from PyTorch's state.
    ///
    /// # Errors
    /// [`AdoptError::Unsupported`] for policies that cannot; [`AdoptError::Invalid`]
    /// for a state that contradicts the policy's rules; device failures.
    fn adopt(
        &mut self,
        device: &mut dyn Device,
        segments: &[AdoptSegment],
        pools: &[AdoptPrivatePool],
    ) -> Result<Vec<Allocation>, AdoptError> {
        let _ = (device, segments, pools);
        Err(AdoptError::Unsupported {
            policy: self.name().to_string(),
        })
    }

    /// Current accounting.
    fn stats(&self) -> PolicyStats;

    /// [`Policy::stats`] written into `out`, field by field where the policy writes
    /// them (the replay engine's figures, read after most events). Through `dyn
    /// Policy`, a result returned by value is written by the policy eight bytes at a
    /// time and copied out by the caller sixteen at a time: a load across two pending
    /// stores waits until they reach the cache. Written in place, the engine's reads
    /// match the stores. Override only to write the same figures as `stats`.
    #[inline]
    fn stats_into(&self, out: &mut PolicyStats) {
        *out = self.stats();
    }

    /// The policy's own words for an out-of-memory it just returned (the caching policy
    /// gives PyTorch's message), with the device's figures. `None` if it has none.
    fn describe_oom(&mut self, _tried_bytes: u64, _device: &dyn Device) -> Option<String> {
        None
    }

    /// Every segment with its blocks, in address order.
    fn snapshot(&self) -> Vec<SegmentSnapshot>;

    /// The block a request of `requested_bytes` takes after the policy's rounding, before
    /// any remainder it keeps unsplit: what an out-of-memory explanation counts as
    /// rounding (`block − requested`) and as an unsplit remainder (the rest of the
    /// block). The default: no rounding.
    fn rounded_bytes(&self, requested_bytes: u64) -> u64 {
        requested_bytes
    }

    /// Whether the free `block` of `segment` (from [`Policy::snapshot`]) could serve
    /// `request`, and if not why. The default judges by size alone, as a policy
    /// without streams, pools or split rules would.
    fn free_block_use(
        &self,
        segment: &SegmentSnapshot,
        block: &BlockSnapshot,
        request: Request,
    ) -> FreeBlockUse {
        let _ = segment;
        if block.size_bytes >= self.rounded_bytes(request.size_bytes) {
            FreeBlockUse::Fits
        } else {
            FreeBlockUse::TooSmall
        }
    }

    /// The policy's own limit on the bytes it reserves (PyTorch's per-process memory
    /// fraction), once known; `None` when it has none.
    fn memory_limit_bytes(&self) -> Option<u64> {
        None
    }

    /// The policy's own statistics as (name, value) pairs, e.g. the caching policy's
    /// `torch.cuda.memory_stats()` keys. Empty for a policy with none beyond
    /// [`PolicyStats`].
    fn detailed_stats(&self) -> Vec<(String, i64)> {
        Vec::new()
    }

    /// Walks the internal structures and panics at the first broken invariant.
    /// Called after every event when the replay engine checks invariants (always in tests).
    fn check_invariants(&self);
}
