//! The trace model: what a program asked of its allocator, in order.

use std::fmt;
use std::path::PathBuf;

use crate::start::StartState;
use crate::Format;

/// Identifies one allocation within a trace, from its `alloc` to its `free`.
/// An id may be reused after its allocation was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocId(pub u64);

impl fmt::Display for AllocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A private memory pool of PyTorch's allocator: its `MempoolId_t` pair. CUDA graphs
/// get `(N, 0)`, `torch.cuda.MemPool` and `graph_pool_handle()` `(0, N)`; `(0, 0)` is
/// the default pools and never names a private pool. Written `[1, 0]` in YAML, `1:0`
/// in CSV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// Whether this is `(0, 0)`, the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId(0, 0)
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// Which requests an allocation to a pool routes to it.
///
/// One word: the list is boxed so that an [`Event`] is 32 bytes with its variant in a
/// tag byte of its own (see [`Event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
// A box around the `Vec` keeps this enum one pointer wide (a `Vec` is three words,
// a boxed slice two), which keeps `Event` at 32 bytes; the list is read once per
// (rare) pool call.
#[allow(clippy::box_collection)]
pub enum PoolStreams {
    /// Every request (`torch.cuda.use_mem_pool`: the current thread's requests on every
    /// stream; a trace has one thread).
    All,
    /// Requests on these streams (a graph capture: the capturing streams); built by
    /// [`PoolStreams::only`].
    Only(Box<Vec<u64>>),
}

impl PoolStreams {
    /// The requests on `streams`.
    pub fn only(streams: Vec<u64>) -> PoolStreams {
        PoolStreams::Only(Box::new(streams))
    }
}

/// One trace line.
///
/// 32 bytes (a held trace's events are most of its memory): every variant's fields fit
/// in 24 bytes, so the variant is a tag byte of its own, which the engine's dispatch
/// reads with one load, where a variant of 32 bytes (a `Vec` beside a [`PoolId`])
/// made the event 40 bytes with its variant encoded in a niche of that `Vec`'s first
/// word (decoded with several instructions per event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The program asks for `size_bytes` on `stream` (0 = the default stream; other
    /// values are opaque ids, such as PyTorch's raw `cudaStream_t`).
    Alloc {
        /// Names the allocation for its later `Free`.
        id: AllocId,
        /// Bytes asked for.
        size_bytes: u64,
        /// The stream it is used on.
        stream: u64,
    },
    /// The program dropped an allocation that other streams may still use
    /// (`record_stream`): PyTorch's `free_requested` when its `free_completed` comes
    /// later. The memory is not reusable until the allocation's [`Event::Free`]; a
    /// policy that tracks streams stops counting it as allocated from here, others
    /// ignore it. Written `free_requested` in YAML and CSV.
    FreeRequested {
        /// The allocation, still live until its `Free`.
        id: AllocId,
    },
    /// The allocation's memory may be reused from here: the completed free (PyTorch's
    /// `free_completed`; also ends an allocation whose free was requested earlier).
    /// Written `free` in YAML and CSV (`free_completed` is read as the same).
    Free {
        /// The allocation.
        id: AllocId,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A `torch.cuda.MemPool(use_on_oom=.., no_split=..)` is created: the pool exists,
    /// with one use (the object). Written `create_pool`.
    CreatePool {
        /// The pool.
        pool: PoolId,
        /// It may serve a default-pool request that would otherwise run out of memory.
        use_on_oom: bool,
        /// It never splits a block.
        no_split: bool,
    },
    /// Allocation to a private pool begins (`beginAllocateToPool`: a CUDA graph capture
    /// begins, a `use_mem_pool` block is entered): from here the requests `streams`
    /// selects are served from `pool` (created if new, otherwise given one more use).
    /// Written `begin_allocate_to_pool`.
    BeginAllocateToPool {
        /// The pool.
        pool: PoolId,
        /// The requests routed to it.
        streams: PoolStreams,
    },
    /// Allocation to `pool` ends (`endAllocateToPool`: the capture ends, the
    /// `use_mem_pool` block is left). Written `end_allocate_to_pool`.
    EndAllocateToPool {
        /// The pool.
        pool: PoolId,
    },
    /// One use of `pool` ends (`releasePool`: a graph is reset or destroyed, a
    /// `use_mem_pool` block or a `MemPool` ends). With no use left, a later cache
    /// release gives its free segments back. Written `release_pool`.
    ReleasePool {
        /// The pool.
        pool: PoolId,
    },
    /// `emptyCache(pool)`: one released private pool's free segments go back (what a
    /// `MemPool` does as it is destroyed). Written `empty_cache` with a `pool`.
    EmptyPoolCache {
        /// The pool.
        pool: PoolId,
    },
    /// `torch.cuda.memory._set_allocator_settings(conf)`. Written
    /// `set_allocator_settings`.
    SetAllocatorSettings {
        /// The `PYTORCH_CUDA_ALLOC_CONF` string.
        conf: String,
    },
    /// `torch.cuda.reset_peak_memory_stats()`. Written `reset_peak_memory_stats`.
    ResetPeakStats,
    /// `torch.cuda.reset_accumulated_memory_stats()`. Written
    /// `reset_accumulated_memory_stats`.
    ResetAccumulatedStats,
    /// `torch.cuda.memory.caching_allocator_enable(enabled)`: while disabled, each
    /// request is its own `cudaMalloc`. Written `caching_allocator_enable`.
    SetEnabled {
        /// Whether the caching allocator is on.
        enabled: bool,
    },
    /// The next [`Event::Alloc`] is one block of a private pool set back to a
    /// checkpoint (`setCheckpointPoolState`, which `torch.compile`'s CUDA graph trees
    /// call before recording a graph on another path of their tree): PyTorch frees
    /// every block of the pool, then carves each checkpointed segment again block by
    /// block from its start. The allocation takes the free block of `pool` that starts
    /// at device address `addr` (as the recording had it), exactly its own size (no
    /// rounding), splitting the block when it is larger, whatever the best fit would
    /// be. Written `restore_block`.
    RestoreBlock {
        /// The pool being set back.
        pool: PoolId,
        /// Where the block starts.
        addr: u64,
    },
    /// A label with no effect on memory, e.g. an iteration boundary.
    Mark {
        /// Free text.
        label: String,
    },
}

impl Event {
    /// Whether the event is an allocator call beyond requests, frees, `empty_cache()`
    /// and marks.
    pub fn is_allocator_call(&self) -> bool {
        !matches!(
            self,
            Event::Alloc { .. }
                | Event::FreeRequested { .. }
                | Event::Free { .. }
                | Event::EmptyCache
                | Event::Mark { .. }
        )
    }

    /// The private pool the event is about, if any.
    pub fn pool(&self) -> Option<PoolId> {
        match *self {
            Event::CreatePool { pool, .. }
            | Event::BeginAllocateToPool { pool, .. }
            | Event::EndAllocateToPool { pool }
            | Event::ReleasePool { pool }
            | Event::EmptyPoolCache { pool }
            | Event::RestoreBlock { pool, .. } => Some(pool),
            _ => None,
        }
    }

    /// The op name YAML and CSV write.
    pub fn op_name(&self) -> &'static str {
        match self {
            Event::Alloc { .. } => "alloc",
            Event::FreeRequested { .. } => "free_requested",
            Event::Free { .. } => "free",
            Event::EmptyCache | Event::EmptyPoolCache { .. } => "empty_cache",
            Event::Mark { .. } => "mark",
            Event::CreatePool { .. } => "create_pool",
            Event::BeginAllocateToPool { .. } => "begin_allocate_to_pool",
            Event::EndAllocateToPool { .. } => "end_allocate_to_pool",
            Event::ReleasePool { .. } => "release_pool",
            Event::SetAllocatorSettings { .. } => "set_allocator_settings",
            Event::ResetPeakStats => "reset_peak_memory_stats",
            Event::ResetAccumulatedStats => "reset_accumulated_memory_stats",
            Event::SetEnabled { .. } => "caching_allocator_enable",
            Event::RestoreBlock { .. } => "restore_block",
        }
    }

    /// The allocation the event is about, if any.
    pub fn id(&self) -> Option<AllocId> {
        match *self {
            Event::Alloc { id, .. } | Event::FreeRequested { id } | Event::Free { id } => Some(id),
            _ => None,
        }
    }
}

/// Every op name YAML and CSV read, for messages.
pub const OP_NAMES: &str = "alloc, free, free_requested, empty_cache, mark, create_pool, \
    begin_allocate_to_pool, end_allocate_to_pool, release_pool, set_allocator_settings, \
    reset_peak_memory_stats, reset_accumulated_memory_stats, caching_allocator_enable or \
    restore_block";

/// How the positions in [`Trace::locations`] are counted, for messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocationKind {
    /// Line numbers in a text file, from 1 (CSV).
    #[default]
    Line,
    /// Position in the trace's event list, from 0 as every replay output counts events
    /// (YAML, generated traces).
    Event,
    /// Index of the entry in a recorded PyTorch trace, from 0 as PyTorch counts them
    /// (recorded-run JSON, snapshot pickles).
    Entry,
}

/// A workload: a named sequence of events and where each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Short name used in reports (the file stem, or the generator's name).
    pub name: String,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// The events, in order.
    pub events: Vec<Event>,
    /// For each event, its position in the source (same length as `events`, or empty
    /// when positions are simply 1, 2, 3, ...).
    pub locations: Vec<u64>,
    /// How `locations` count.
    pub location_kind: LocationKind,
    /// What the source says about how and where it was recorded.
    pub meta: TraceMeta,
    /// The ids as the source wrote them, when it wrote names rather than numbers
    /// (`weights`, `kv_cache_3`, an RMM log's pointers): id `i` was written
    /// `id_names[i]`. Names are interned to dense ids on reading, so a replay sees
    /// plain numbers; writers and messages show the names ([`Trace::id_name`]).
    /// Empty when the ids are the numbers the source wrote.
    pub id_names: Vec<String>,
    /// For each event, when it happened, in microseconds from an origin of the
    /// source's choosing (same length as `events`, never decreasing), or empty when
    /// the source records no time. Plots draw over it.
    pub times_us: Vec<u64>,
    /// The allocator's state before the first event, for a trace that starts mid-run
    /// (rebuilt from a recording's final segments, see [`crate::start`]); `None`: the
    /// trace starts from an empty allocator.
    pub start: Option<StartState>,
}

/// An id as a trace's source wrote it ([`Trace::id_name`]): its name, or its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdName<'a> {
    /// A number (the source wrote numbers, or this name is a decimal number).
    Number(u64),
    /// A name.
    Name(&'a str),
}

impl fmt::Display for IdName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdName::Number(n) => write!(f, "{n}"),
            IdName::Name(s) => f.write_str(s),
        }
    }
}

/// What a trace's source records about the run behind it, filled by the readers (all
/// of it only by the recorded-run readers: YAML and CSV name only their format). One
/// struct, so that no consumer re-derives a recorded setting from a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceMeta {
    /// The format the trace was read from; `None` for traces built in code (generators).
    pub format: Option<Format>,
    /// The recording script's workload name.
    pub workload: Option<String>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string the run had (`Some("")`: PyTorch's defaults);
    /// `None` when the source does not record one.
    pub alloc_conf: Option<String>,
    /// The cap given to `torch.cuda.set_per_process_memory_fraction(cap / total)`.
    pub cap_bytes: Option<u64>,
    /// The device's total memory as `cudaMemGetInfo` reported it.
    pub total_bytes: Option<u64>,
    /// The device's name.
    pub device: Option<String>,
    /// The PyTorch version that recorded it.
    pub torch_version: Option<String>,
    /// Why a replay of this trace cannot be exact, as the reader found it (private
    /// pools the trace cannot route, calls it cannot carry): each a sentence that
    /// `replay`, `compare` and `fidelity` print as a warning, and that marks their
    /// numbers as not exact. Empty for traces replayed as written.
    pub caveats: Vec<String>,
    /// Where the driver put the recorded run's segments, for a simulated device to follow:
    /// read from a YAML trace's `recorded` block (written by `convert` from a recorded
    /// run). Recorded runs themselves leave it empty: their hints come from their
    /// entries (`sim::recorded::address_hints`).
    pub addresses: Option<RecordedAddresses>,
}

/// The recorded run's segment addresses, in the order PyTorch obtained them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedAddresses {
    /// (bytes, address) of each `cudaMalloc`, in order.
    pub segments: Vec<(u64, u64)>,
    /// Base address of each expandable segment's reserved range, in order of creation.
    pub ranges: Vec<u64>,
}

impl TraceMeta {
    /// The metadata of a trace read from a `format` file that records nothing else.
    pub fn of_format(format: Format) -> TraceMeta {
        TraceMeta {
            format: Some(format),
            ..TraceMeta::default()
        }
    }

    /// The fraction the run passed to `set_per_process_memory_fraction`, `cap / total`
    /// (PyTorch's limit is then `floor(fraction × total)` in double arithmetic), when
    /// both are recorded.
    pub fn memory_fraction(&self) -> Option<f64> {
        match (self.cap_bytes, self.total_bytes) {
            (Some(cap), Some(total)) if total > 0 => Some(cap as f64 / total as f64),
            _ => None,
        }
    }
}

impl Trace {
    /// A trace with no source file; locations are event numbers.
    pub fn new(name: impl Into<String>, events: Vec<Event>) -> Trace {
        Trace {
            name: name.into(),
            path: None,
            events,
            locations: Vec::new(),
            location_kind: LocationKind::Event,
            meta: TraceMeta::default(),
            id_names: Vec::new(),
            times_us: Vec::new(),
            start: None,
        }
    }

    /// How the source wrote `id`: its name when the trace has named ids
    /// ([`Trace::id_names`]), else its number.
    pub fn id_name(&self, id: AllocId) -> IdName<'_> {
        match usize::try_from(id.0)
            .ok()
            .and_then(|i| self.id_names.get(i))
        {
            Some(name) => IdName::Name(name),
            None => IdName::Number(id.0),
        }
    }

    /// When event `index` happened (see [`Trace::times_us`]), if recorded.
    pub fn time_us(&self, index: usize) -> Option<u64> {
        self.times_us.get(index).copied()
    }

    /// Where event `index` came from, e.g. `line 17`, `event 3` or `entry 120`.
    pub fn location(&self, index: usize) -> String {
        let n = self
            .locations
            .get(index)
            .copied()
            .unwrap_or(match self.location_kind {
                LocationKind::Line => index as u64 + 1,
                // Events and entries count from 0, as every CSV column does.
                LocationKind::Event | LocationKind::Entry => index as u64,
            });
        match self.location_kind {
            LocationKind::Line => format!("line {n}"),
            LocationKind::Event => format!("event {n}"),
            LocationKind::Entry => format!("entry {n}"),
        }
    }

    /// Event `index` as every replay output names it: `event N`, N counting the trace's
    /// events from 0 (the numbering of every CSV column and of the timeline), followed,
    /// where the source counts its own way, by the place in the file: `event 12 (line
    /// 14)` for CSV, `event 1100 (entry 1438)` for a recorded run or snapshot, whose
    /// entries include segment operations that are not events. YAML and generated
    /// traces need no second number.
    pub fn event_ref(&self, index: usize) -> String {
        match self.location_kind {
            LocationKind::Event => format!("event {index}"),
            _ => format!("event {index} ({})", self.location(index)),
        }
    }

    /// `path:line 17`-style prefix for messages about event `index`.
    pub fn describe(&self, index: usize) -> String {
        match &self.path {
            Some(p) => format!("{}: {}", p.display(), self.location(index)),
            None => format!("{}: {}", self.name, self.location(index)),
        }
    }

    /// Whether any event is an allocator call beyond requests, frees, `empty_cache()`
    /// and marks (private pools, settings, statistics resets, enabling).
    pub fn has_allocator_calls(&self) -> bool {
        self.events.iter().any(Event::is_allocator_call)
    }

    /// The private pools the trace names, in order of first appearance.
    pub fn pools(&self) -> Vec<PoolId> {
        let mut out: Vec<PoolId> = Vec::new();
        for e in &self.events {
            if let Some(p) = e.pool() {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Number of `Alloc` events.
    pub fn alloc_count(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event is 32 bytes, and so is an `Option` of one (what a reader hands the
    /// engine): a held trace's events cost 32 bytes each.
    #[test]
    fn events_are_32_bytes() {
        assert_eq!(std::mem::size_of::<Event>(), 32);
        assert_eq!(std::mem::size_of::<Option<Event>>(), 32);
        assert_eq!(std::mem::size_of::<PoolStreams>(), 8);
    }
}
