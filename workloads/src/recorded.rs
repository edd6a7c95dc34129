//! Recorded PyTorch runs: the allocator's own event trace, as in
//! `torch.cuda.memory._snapshot()["device_traces"]`, with what PyTorch decided
//! (segment allocations, OOMs) and, for runs recorded with `record_torch.py`, its
//! statistics at checkpoints.
//!
//! Two sources produce a [`RecordedRun`]: the JSON files of `record_torch.py`
//! ([`read_recorded_json`]) and PyTorch's snapshot pickles
//! ([`crate::snapshot::read_snapshot_pickle`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::trace::{AllocId, Event, LocationKind, PoolId, PoolStreams, Trace, TraceMeta};
use crate::{Format, ReadError};

/// What a trace entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block handed out; `size` is the requested bytes.
    Alloc,
    /// `free()` called; the block may still wait for other streams.
    FreeRequested,
    /// The block is back in its pool.
    FreeCompleted,
    /// `cudaMalloc` of a segment.
    SegmentAlloc,
    /// `cudaFree` of a segment.
    SegmentFree,
    /// Pages mapped into an expandable segment.
    SegmentMap,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap,
    /// A malloc failed; `size` is the rounded request.
    Oom,
    /// `torch.cuda.empty_cache()` was called (a marker `record_torch.py` inserts).
    EmptyCache,
    /// `_snapshot()` was called; no effect.
    Snapshot,
    /// `torch.cuda.memory._annotate_memory`: metadata attached to the live allocation
    /// at `addr` (the text is in [`crate::snapshot::SnapshotInfo::annotations`]); no
    /// effect on memory.
    Annotate,
    /// Actions of other PyTorch versions; no effect.
    Other,
}

impl Action {
    /// Parses PyTorch's action name; unknown names become [`Action::Other`].
    pub fn from_name(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "empty_cache" => Action::EmptyCache,
            "snapshot" => Action::Snapshot,
            "annotate" => Action::Annotate,
            _ => Action::Other,
        }
    }

    /// PyTorch's name for the action.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::EmptyCache => "empty_cache",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
            Action::Other => "other",
        }
    }

    /// Whether the entry is a decision about device memory (`segment_*`).
    pub fn is_segment_op(self) -> bool {
        matches!(
            self,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        )
    }
}

/// One entry of a recorded trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedEntry {
    /// What happened.
    pub action: Action,
    /// Block or segment address (for `oom`, 0).
    pub addr: u64,
    /// Bytes (see [`Action`] for which bytes).
    pub size: u64,
    /// Raw stream handle, 0 for the default stream.
    pub stream: u64,
}

/// PyTorch's statistics at a labelled point of a recorded run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Checkpoint {
    /// The label given by the recording script.
    pub label: String,
    /// Number of trace entries recorded at that moment, not counting inserted
    /// `empty_cache` markers.
    pub trace_len: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// `allocated_bytes.all.peak`.
    pub max_allocated: u64,
    /// `reserved_bytes.all.peak`.
    pub max_reserved: u64,
    /// `inactive_split_bytes.all.current`.
    pub inactive_split: u64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: u64,
    /// `num_ooms`.
    pub num_ooms: u64,
    /// `segment.all.current`.
    pub segments: u64,
    /// `cudaMemGetInfo` free bytes.
    pub driver_free: u64,
}

/// The OOM a recorded run raised.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RecordedOom {
    /// First line of PyTorch's `OutOfMemoryError` message.
    pub message: String,
    /// Trace length when it was raised.
    pub trace_len: u64,
}

/// A segment of the final `memory_snapshot()`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RecordedSegment {
    /// Segment base address.
    pub address: u64,
    /// Segment bytes (for an expandable segment, the mapped bytes).
    pub total_size: u64,
    /// Raw stream handle.
    pub stream: u64,
    /// `"small"` or `"large"`.
    pub segment_type: String,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<RecordedBlock>,
    /// Whether it is an expandable segment (snapshots only; `false` otherwise).
    #[serde(default)]
    pub is_expandable: bool,
    /// The memory pool owning it, `(0, 0)` for the default pool (snapshots, and the
    /// recorder's JSON of format 2 as `segment_pool_id`).
    #[serde(default, alias = "segment_pool_id")]
    pub pool_id: (u64, u64),
}

/// A block of a [`RecordedSegment`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "(u64, String)")]
pub struct RecordedBlock {
    /// Block address (the segment's address plus the sizes of the blocks before it).
    pub address: u64,
    /// Block bytes.
    pub size: u64,
    /// Bytes the program asked for (snapshots only; `None` in `record_torch.py` JSON).
    pub requested_size: Option<u64>,
    /// Allocated, freed but waiting for other streams, or free.
    pub state: BlockState,
}

impl From<(u64, String)> for RecordedBlock {
    /// A `record_torch.py` block, `[size, state]`; its address is set once the segment
    /// is known.
    fn from((size, state): (u64, String)) -> RecordedBlock {
        RecordedBlock {
            address: 0,
            size,
            requested_size: None,
            state: BlockState::from_name(&state),
        }
    }
}

/// The state of a [`RecordedBlock`], as PyTorch's snapshot names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// `active_allocated`: handed out to the program.
    ActiveAllocated,
    /// `active_pending_free` (`active_awaiting_free` in older versions): freed by the
    /// program, waiting for the streams that used it.
    ActivePendingFree,
    /// `inactive`: free, cached.
    Inactive,
    /// A name this crate does not know, kept as written.
    Other(String),
}

impl BlockState {
    /// Parses PyTorch's name of a block state.
    pub fn from_name(name: &str) -> BlockState {
        match name {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => BlockState::Other(other.to_string()),
        }
    }

    /// PyTorch's name of the state.
    pub fn name(&self) -> &str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Other(name) => name,
        }
    }
}

/// A recorded PyTorch run: its allocator trace and, where recorded, its settings,
/// limit and statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedRun {
    /// Short name (the file stem).
    pub name: String,
    /// The file it was read from.
    pub path: PathBuf,
    /// What the file records about the run (format, `PYTORCH_CUDA_ALLOC_CONF`, cap,
    /// device, PyTorch version); carried over to the trace by
    /// [`RecordedRun::to_trace`].
    pub meta: TraceMeta,
    /// The trace, oldest first.
    pub entries: Vec<RecordedEntry>,
    /// For each entry, its index in the source file's trace, used in messages and
    /// event locations; empty when every entry's index is its own. Snapshot pickles
    /// fill it because the `empty_cache` entries inferred by
    /// [`crate::snapshot::read_snapshot_pickle`] are not in the file (each takes the
    /// index of the entry it was inserted before).
    pub source_indexes: Vec<u64>,
    /// Statistics at labelled points.
    pub checkpoints: Vec<Checkpoint>,
    /// The OOM raised, if any.
    pub oom: Option<RecordedOom>,
    /// Final segments.
    pub segments: Vec<RecordedSegment>,
    /// `torch.cuda.memory_stats()` at the end, flattened.
    pub final_stats: Vec<(String, f64)>,
    /// For each entry, its `time_us` (microseconds since the epoch, as PyTorch
    /// recorded it; 0 where an entry has none); empty when the source records no
    /// times.
    pub times_us: Vec<u64>,
    /// What only a snapshot pickle records (settings, annotations, pools, frames);
    /// `None` for `record_torch.py` JSON.
    pub snapshot: Option<crate::snapshot::SnapshotInfo>,
    /// Allocator calls the recording saw that its trace entries do not show (private
    /// pools, statistics resets, settings changes), each with the entry it follows
    /// (`None`: before the first entry), in the order they happened. For a snapshot,
    /// the private-pool calls inferred from the pool of each request
    /// ([`crate::snapshot::SnapshotPools`]). [`RecordedRun::to_trace`] puts them into
    /// the trace.
    pub calls: Vec<(Option<u64>, Event)>,
    /// The recorder's JSON (format 2): the requests served from a private pool, each
    /// with its pool (index into [`RecordedRun::entries`]); the other requests were the
    /// default pools'. Empty for snapshots (their reader's attribution is in
    /// [`crate::snapshot::SnapshotInfo::pools`]).
    pub request_pools: Vec<(u64, PoolId)>,
    /// The recorder's JSON (format 2): private pools' segments its snapshots saw while
    /// the run went on (address, bytes, pool), which tell the pool of a segment given
    /// back inside a trace that starts mid-run. Empty for snapshots.
    pub segment_pools: Vec<(u64, u64, PoolId)>,
}

impl RecordedRun {
    /// The requests of the run as a trace: `alloc` → alloc, `free_requested` →
    /// free_requested (only when its `free_completed` is not the very next entry: a
    /// free that completes at once is a plain free), `free_completed` → free,
    /// `empty_cache` markers → empty_cache, and each `oom` → the alloc that failed (with
    /// the rounded size PyTorch recorded; rounding is idempotent). Locations are entry
    /// indexes in the source file (see [`RecordedRun::source_indexes`]); the trace
    /// carries the run's [`TraceMeta`].
    ///
    /// A trace that does not start from an empty allocator (a ring buffer that wrapped,
    /// a recording started late; see [`RecordedRun::starts_empty`]) gets the state at
    /// its first entry ([`Trace::start`], rebuilt by [`RecordedRun::rebuild_start`]);
    /// its live blocks keep ids `0..n` and the trace's own allocations are numbered
    /// after them.
    ///
    /// # Errors
    /// When the state at the first entry cannot be rebuilt (no final segments, or a
    /// trace that does not fit them); for snapshots, also what
    /// [`RecordedRun::check_replayable`] refuses.
    pub fn to_trace(&self) -> Result<Trace, ReadError> {
        self.to_trace_with_entries().map(|(trace, _)| trace)
    }

    /// [`RecordedRun::to_trace`], and for each event of the trace the index into
    /// [`RecordedRun::entries`] of the entry it came from (which, unlike the event's
    /// location, counts the `empty_cache` entries inferred in snapshot pickles).
    ///
    /// # Errors
    /// As [`RecordedRun::to_trace`].
    pub fn to_trace_with_entries(&self) -> Result<(Trace, Vec<usize>), ReadError> {
        if self.snapshot.is_some() {
            self.check_replayable()?;
        }
        let mut start = self.start_state()?;
        // A trace that starts mid-run: the private pools live at its first entry are
        // the state's, and the calls that made them are left out.
        let own_calls;
        let run_calls: &[(Option<u64>, Event)] = match start.as_mut() {
            Some(s) if self.snapshot.is_some() => {
                own_calls = s.snapshot_calls(&self.calls);
                &own_calls
            }
            Some(s) => {
                own_calls = s.fold_recorded_calls(&self.calls);
                &own_calls
            }
            None => &self.calls,
        };
        let mut events = Vec::new();
        let mut locations = Vec::new();
        let mut entry_indexes = Vec::new();
        let mut live: HashMap<u64, AllocId> = start
            .iter()
            .flat_map(|s| &s.segments)
            .flat_map(|s| &s.blocks)
            .map(|b| (b.addr, b.id))
            .collect();
        let mut next_id = live.len() as u64;
        // Calls are recorded at entry positions (a mark's `snapshot` entry): each goes
        // after the entry it names.
        let mut calls = run_calls.iter().peekable();
        let mut push_calls = |after: Option<usize>,
                              events: &mut Vec<Event>,
                              locations: &mut Vec<u64>,
                              entry_indexes: &mut Vec<usize>| {
            while let Some((at, event)) = calls.next_if(|(at, _)| at.map(|a| a as usize) <= after) {
                events.push(event.clone());
                let index = at.map_or(0, |a| a as usize);
                locations.push(self.source_index(index));
                entry_indexes.push(index);
            }
        };
        push_calls(None, &mut events, &mut locations, &mut entry_indexes);
        for (index, e) in self.entries.iter().enumerate() {
            if index > 0 {
                push_calls(
                    Some(index - 1),
                    &mut events,
                    &mut locations,
                    &mut entry_indexes,
                );
            }
            let event = match e.action {
                Action::Alloc | Action::Oom => {
                    let id = AllocId(next_id);
                    next_id += 1;
                    if e.action == Action::Alloc && live.insert(e.addr, id).is_some() {
                        return Err(
                            self.not_from_empty(index, "allocates an address that is already live")
                        );
                    }
                    Event::Alloc {
                        id,
                        size_bytes: e.size,
                        stream: e.stream,
                    }
                }
                Action::FreeCompleted => match live.remove(&e.addr) {
                    Some(id) => Event::Free { id },
                    None => {
                        return Err(self.not_from_empty(
                            index,
                            "frees an address that was never allocated in the trace",
                        ))
                    }
                },
                Action::FreeRequested => {
                    let Some(&id) = live.get(&e.addr) else {
                        return Err(self.not_from_empty(
                            index,
                            "frees an address that was never allocated in the trace",
                        ));
                    };
                    let completes_now = self
                        .entries
                        .get(index + 1)
                        .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                    if completes_now {
                        continue;
                    }
                    Event::FreeRequested { id }
                }
                Action::EmptyCache => Event::EmptyCache,
                _ => continue,
            };
            events.push(event);
            locations.push(self.source_index(index));
            entry_indexes.push(index);
        }
        push_calls(
            Some(usize::MAX),
            &mut events,
            &mut locations,
            &mut entry_indexes,
        );
        // Each event at the time of its entry; threads may record slightly out of
        // order, and a trace's times never go back.
        let mut latest = 0u64;
        let mut times_us: Vec<u64> = if self.times_us.len() == self.entries.len() {
            entry_indexes
                .iter()
                .map(|&i| {
                    latest = latest.max(self.times_us.get(i).copied().unwrap_or(0));
                    latest
                })
                .collect()
        } else {
            Vec::new()
        };
        if latest == 0 {
            times_us.clear();
        }
        let mut meta = self.meta.clone();
        let shows_pools = (self.snapshot.as_ref()).is_some_and(|s| !s.pools.shown.is_empty());
        if let Some(caveat) = start
            .as_ref()
            .filter(|_| shows_pools)
            .and_then(|s| s.unknown_pool_caveat())
        {
            meta.caveats.push(caveat);
        }
        let trace = Trace {
            name: self.name.clone(),
            path: Some(self.path.clone()),
            events,
            locations,
            location_kind: LocationKind::Entry,
            meta,
            id_names: Vec::new(),
            times_us,
            start,
        };
        Ok((trace, entry_indexes))
    }

    /// Index in the source file of entry `index` (see [`RecordedRun::source_indexes`]).
    pub fn source_index(&self, index: usize) -> u64 {
        self.source_indexes
            .get(index)
            .copied()
            .unwrap_or(index as u64)
    }

    fn not_from_empty(&self, index: usize, what: &str) -> ReadError {
        ReadError::invalid(
            &self.path,
            Some(format!("entry {}", self.source_index(index))),
            format!(
                "the recorded trace {what}: recording started after allocations existed or its ring buffer wrapped, \
                 so it cannot be replayed from an empty allocator (record with \
                 torch.cuda.memory._record_memory_history(max_entries=...) before the first CUDA allocation)"
            ),
        )
    }
}

#[derive(Deserialize)]
struct RecordedJson {
    #[serde(default)]
    workload: Option<String>,
    #[serde(default)]
    alloc_conf: String,
    #[serde(default)]
    cap_bytes: Option<u64>,
    #[serde(default)]
    total_bytes: Option<u64>,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    torch: Option<String>,
    events: Vec<(String, u64, u64, u64, TimeUs)>,
    #[serde(default)]
    checkpoints: Vec<Checkpoint>,
    #[serde(default)]
    oom: Option<RecordedOom>,
    #[serde(default)]
    segments: Vec<RecordedSegment>,
    #[serde(default)]
    final_stats: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    pools: Vec<JsonPool>,
    #[serde(default)]
    pool_windows: Vec<JsonWindow>,
    #[serde(default)]
    pool_releases: Vec<JsonRelease>,
    #[serde(default)]
    request_pools: Vec<(u64, u64, u64)>,
    #[serde(default)]
    calls: Vec<JsonCall>,
    #[serde(default)]
    pool_segments: Vec<JsonPoolSegment>,
}

/// A private pool's segment the recorder saw (format 2).
#[derive(Deserialize)]
struct JsonPoolSegment {
    address: u64,
    total_size: u64,
    pool: (u64, u64),
}

/// A private pool the recorder saw (format 2).
#[derive(Deserialize)]
struct JsonPool {
    id: (u64, u64),
    kind: String,
    #[serde(default)]
    created_at: Option<u64>,
    #[serde(default)]
    use_on_oom: bool,
    #[serde(default)]
    no_split: bool,
    #[serde(default)]
    custom_allocator: bool,
}

/// Where allocation to a pool was under way (format 2): entries `begin < i < end`.
#[derive(Deserialize)]
struct JsonWindow {
    pool: Option<(u64, u64)>,
    scope: String,
    #[serde(default)]
    streams: Vec<u64>,
    begin: Option<u64>,
    end: Option<u64>,
    #[serde(default = "yes")]
    closed: bool,
}

impl JsonWindow {
    /// Whether the window routes the requests of its streams only: a graph capture
    /// (`"capture"`) or allocation to a pool from one stream outside a capture
    /// (`"stream"`: `_cuda_beginAllocateCurrentStreamToPool`, as inductor's CUDA graph
    /// trees warm up in their pool); `use_mem_pool` (`"thread"`) routes every stream.
    fn stream_scoped(&self) -> bool {
        self.scope == "capture" || self.scope == "stream"
    }
}

fn yes() -> bool {
    true
}

/// The end of one use of a pool (format 2).
#[derive(Deserialize)]
struct JsonRelease {
    pool: (u64, u64),
    at: Option<u64>,
    how: String,
}

/// A call that changes the allocator without a trace entry (format 2).
#[derive(Deserialize)]
struct JsonCall {
    call: String,
    at: Option<u64>,
    /// Where the call returned (`set_checkpoint_pool_state`; recorders before it was
    /// written leave it out: the call then ends at the next mark).
    #[serde(default)]
    end: Option<u64>,
    #[serde(default)]
    args: Vec<serde_json::Value>,
}

/// The recorder's pools, windows, releases and calls as trace events with their
/// positions, and the caveats of what the events cannot say.
fn json_calls(
    json: &RecordedJson,
    entries: &[RecordedEntry],
) -> (Vec<(Option<u64>, Event)>, Vec<String>) {
    // (position, rank at that position, order of appearance, event)
    let mut calls: Vec<(Option<u64>, u8, usize, Event)> = Vec::new();
    let mut caveats = Vec::new();
    let push = |at: Option<u64>, rank: u8, event: Event, calls: &mut Vec<_>| {
        let n = calls.len();
        calls.push((at, rank, n, event));
    };
    let request_pools: HashMap<u64, PoolId> = json
        .request_pools
        .iter()
        .map(|&(i, a, b)| (i, PoolId(a, b)))
        .collect();
    for p in &json.pools {
        let pool = PoolId(p.id.0, p.id.1);
        if p.custom_allocator {
            caveats.push(format!(
                "MemPool {pool} has a custom allocator, which is not modelled: its segments are replayed as cudaMalloc's"
            ));
        }
        if p.kind == "mem_pool" && !pool.is_default() {
            push(
                p.created_at,
                0,
                Event::CreatePool {
                    pool,
                    use_on_oom: p.use_on_oom,
                    no_split: p.no_split,
                },
                &mut calls,
            );
        }
    }
    let mut windows: Vec<(Option<u64>, u64, PoolId, PoolStreams)> = Vec::new();
    // Allocations of a checkpoint restore (`set_checkpoint_pool_state`), by entry.
    let mut restored: HashSet<u64> = HashSet::new();
    for w in &json.pool_windows {
        let Some((a, b)) = w.pool else {
            caveats.push(
                "a pool window has no pool id (a capture that failed?): its requests are replayed from the default pools".to_string(),
            );
            continue;
        };
        let pool = PoolId(a, b);
        if w.closed && w.begin.is_none() && w.end.is_none() {
            // Begun and ended before the first entry: its use is all that is left.
            push(
                None,
                0,
                Event::BeginAllocateToPool {
                    pool,
                    streams: if w.stream_scoped() {
                        PoolStreams::only(w.streams.clone())
                    } else {
                        PoolStreams::All
                    },
                },
                &mut calls,
            );
            push(None, 0, Event::EndAllocateToPool { pool }, &mut calls);
            continue;
        }
        let end = if w.closed { w.end } else { None };
        let inside = |i: u64| w.begin.is_none_or(|b| i > b) && end.is_none_or(|e| i < e);
        let streams = if w.stream_scoped() {
            // A capture routes every stream it spreads to; the recorder lists the one it
            // began on, and the requests attributed to the pool show the others (a
            // stream's window routes its stream only, which is all they show).
            let mut streams = w.streams.clone();
            for (&i, &p) in &request_pools {
                if p == pool && inside(i) {
                    if let Some(e) = entries.get(i as usize) {
                        if !streams.contains(&e.stream) {
                            streams.push(e.stream);
                        }
                    }
                }
            }
            streams.sort_unstable();
            PoolStreams::only(streams)
        } else {
            PoolStreams::All
        };
        push(
            w.begin,
            1,
            Event::BeginAllocateToPool {
                pool,
                streams: streams.clone(),
            },
            &mut calls,
        );
        if let Some(end) = end {
            push(Some(end), 0, Event::EndAllocateToPool { pool }, &mut calls);
        }
        windows.push((w.begin, end.unwrap_or(u64::MAX), pool, streams));
    }
    for r in &json.pool_releases {
        let pool = PoolId(r.pool.0, r.pool.1);
        push(r.at, 0, Event::ReleasePool { pool }, &mut calls);
        if r.how == "mem_pool_destroyed" {
            push(r.at, 0, Event::EmptyPoolCache { pool }, &mut calls);
        }
    }
    for c in &json.calls {
        let event = match c.call.as_str() {
            "reset_peak_memory_stats" => Event::ResetPeakStats,
            "reset_accumulated_memory_stats" => Event::ResetAccumulatedStats,
            "set_allocator_settings" => match c.args.first().and_then(|v| v.as_str()) {
                Some(conf) => Event::SetAllocatorSettings {
                    conf: conf.to_string(),
                },
                None => {
                    caveats.push("a set_allocator_settings call without its string".into());
                    continue;
                }
            },
            "caching_allocator_enable" => match c.args.first().and_then(|v| v.as_bool()) {
                Some(enabled) => Event::SetEnabled { enabled },
                None => Event::SetEnabled { enabled: true },
            },
            "set_checkpoint_pool_state" => {
                // Inductor's CUDA graph trees set a private pool back to a checkpoint when
                // they record a graph on another path of the tree: every block of the pool
                // freed, then each checkpointed block allocated again where it was, then
                // the checkpoint's free blocks freed. The trace shows those frees and
                // allocations as entries; each allocation to a private pool inside the
                // call takes the block it names.
                let Some(at) = c.at else {
                    caveats.push(
                        "the run set a private pool back to a checkpointed state before its first recorded entry (torch.compile's CUDA graph trees recording another path): where those blocks went is not known, so the pool can differ from there on".to_string(),
                    );
                    continue;
                };
                let end = c.end.unwrap_or_else(|| {
                    entries
                        .iter()
                        .enumerate()
                        .skip(at as usize + 1)
                        .find(|(_, e)| e.action == Action::Snapshot)
                        .map_or(entries.len() as u64, |(i, _)| i as u64)
                });
                for i in at + 1..end.min(entries.len() as u64) {
                    let e = &entries[i as usize];
                    if let (Action::Alloc, Some(&pool)) = (e.action, request_pools.get(&i)) {
                        if !pool.is_default() {
                            push(
                                Some(i - 1),
                                3,
                                Event::RestoreBlock { pool, addr: e.addr },
                                &mut calls,
                            );
                            restored.insert(i);
                        }
                    }
                }
                continue;
            }
            other => {
                caveats.push(format!(
                    "the run called {other} mid-run, which a trace cannot carry: the replay keeps the setting it started with"
                ));
                continue;
            }
        };
        push(c.at, 2, event, &mut calls);
    }
    // Requests the windows route to another pool than the one that served them: a
    // request of another thread inside a use_mem_pool block (PyTorch routes the
    // block's thread only), which a trace cannot say.
    let mut misrouted = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !matches!(e.action, Action::Alloc | Action::Oom) {
            continue;
        }
        let i = i as u64;
        if restored.contains(&i) {
            // Placed by its restore, not routed.
            continue;
        }
        let routed = windows
            .iter()
            .filter(|(b, end, _, streams)| {
                b.is_none_or(|b| i > b)
                    && i < *end
                    && match streams {
                        PoolStreams::All => true,
                        PoolStreams::Only(list) => list.contains(&e.stream),
                    }
            })
            .max_by_key(|(b, ..)| *b)
            .map_or(PoolId::default(), |w| w.2);
        let served = request_pools.get(&i).copied().unwrap_or_default();
        let fallback = served != routed
            && routed.is_default()
            && json
                .pools
                .iter()
                .any(|p| p.use_on_oom && PoolId(p.id.0, p.id.1) == served);
        if served != routed && !fallback {
            misrouted.push(i);
        }
    }
    if !misrouted.is_empty() {
        let shown: Vec<String> = misrouted.iter().take(5).map(u64::to_string).collect();
        caveats.push(format!(
            "{} request(s) were served from another pool than the pool windows route them to (entries {}{}): \
             another thread's requests inside a use_mem_pool block, which a trace cannot express",
            misrouted.len(),
            shown.join(", "),
            if misrouted.len() > 5 { ", ..." } else { "" }
        ));
    }
    calls.sort_by_key(|(at, rank, n, _)| (at.map_or(0, |a| a + 1), *rank, *n));
    (
        calls.into_iter().map(|(at, _, _, e)| (at, e)).collect(),
        caveats,
    )
}

/// An event's `time_us`: microseconds as a number (a float is truncated), or `null`
/// (0).
struct TimeUs(u64);

impl<'de> Deserialize<'de> for TimeUs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TimeUs, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TimeUs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a time in microseconds")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TimeUs, E> {
                Ok(TimeUs(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TimeUs, E> {
                Ok(TimeUs(u64::try_from(v).unwrap_or(0)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TimeUs, E> {
                // `as` saturates: negative and NaN become 0.
                Ok(TimeUs(v as u64))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<TimeUs, E> {
                Ok(TimeUs(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads a recorded run written by `record_torch.py` (see the oracle README for the
/// format).
///
/// # Errors
/// I/O errors and JSON that does not have the recorded-run shape, with the line and
/// column where parsing stopped.
pub fn read_recorded_json(path: &Path) -> Result<RecordedRun, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
    read_recorded_json_from(file, path)
}

/// [`read_recorded_json`] from any reader; `path` names the source in messages.
///
/// # Errors
/// See [`read_recorded_json`].
pub fn read_recorded_json_from(
    reader: impl std::io::Read,
    path: &Path,
) -> Result<RecordedRun, ReadError> {
    // Streamed, never held whole: a file that is not JSON (/dev/zero) is refused at its
    // first byte, and memory is the run itself.
    let reader = std::io::BufReader::with_capacity(256 << 10, reader);
    let json: RecordedJson = serde_json::from_reader(reader).map_err(|e| {
        if let Some(kind) = e.io_error_kind() {
            return ReadError::io(path, &std::io::Error::new(kind, e.to_string()));
        }
        ReadError::syntax(
            path,
            Some(format!("line {} column {}", e.line(), e.column())),
            format!("not a recorded PyTorch run (record_torch.py JSON): {e}"),
        )
    })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let entries: Vec<RecordedEntry> = json
        .events
        .iter()
        .map(|(action, addr, size, stream, _)| RecordedEntry {
            action: Action::from_name(action),
            addr: *addr,
            size: *size,
            stream: *stream,
        })
        .collect();
    let (calls, caveats) = json_calls(&json, &entries);
    // Segments of format 1 do not say whether they are expandable; with
    // `expandable_segments:True` every segment of the default pool is.
    let expandable = conf_enables_expandable(&json.alloc_conf);
    Ok(RecordedRun {
        name,
        path: path.to_path_buf(),
        meta: TraceMeta {
            format: Some(Format::RecordedJson),
            workload: json.workload,
            alloc_conf: Some(json.alloc_conf),
            cap_bytes: json.cap_bytes,
            total_bytes: json.total_bytes,
            device: json.device,
            torch_version: json.torch,
            caveats,
            // A recorded run's hints come from its entries (`sim::recorded::address_hints`).
            addresses: None,
        },
        times_us: json.events.iter().map(|e| e.4 .0).collect(),
        entries,
        calls,
        request_pools: json
            .request_pools
            .iter()
            .map(|&(i, a, b)| (i, PoolId(a, b)))
            .collect(),
        segment_pools: json
            .pool_segments
            .iter()
            .map(|s| (s.address, s.total_size, PoolId(s.pool.0, s.pool.1)))
            .collect(),
        source_indexes: Vec::new(),
        checkpoints: json.checkpoints,
        oom: json.oom,
        segments: json
            .segments
            .into_iter()
            .map(|mut s| {
                s.is_expandable |= expandable;
                let mut address = s.address;
                for b in &mut s.blocks {
                    b.address = address;
                    address = address.wrapping_add(b.size);
                }
                s
            })
            .collect(),
        final_stats: json.final_stats.into_iter().collect(),
        snapshot: None,
    })
}

/// Whether a `PYTORCH_CUDA_ALLOC_CONF` string turns expandable segments on (its last
/// `expandable_segments` option says `True` or `true`, as PyTorch reads it).
fn conf_enables_expandable(conf: &str) -> bool {
    conf.split(',')
        .filter_map(|kv| kv.split_once(':'))
        .rfind(|(k, _)| k.trim() == "expandable_segments")
        .is_some_and(|(_, v)| matches!(v.trim(), "True" | "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: Action, addr: u64, size: u64) -> RecordedEntry {
        RecordedEntry {
            action,
            addr,
            size,
            stream: 0,
        }
    }

    /// Requests become trace events; segment decisions and snapshots are dropped, a
    /// `free_requested` that completes at once is a plain free, a delayed one is kept,
    /// and each event remembers its entry index and carries the run's metadata.
    #[test]
    fn requests_become_events() {
        let meta = TraceMeta {
            alloc_conf: Some("max_split_size_mb:64".into()),
            total_bytes: Some(80 << 30),
            ..TraceMeta::default()
        };
        let run = RecordedRun {
            name: "r".into(),
            meta: meta.clone(),
            entries: vec![
                entry(Action::SegmentAlloc, 100, 2 << 20),
                entry(Action::Alloc, 100, 7),
                entry(Action::Snapshot, 0, 0),
                entry(Action::FreeRequested, 100, 7),
                entry(Action::FreeCompleted, 100, 7),
                entry(Action::EmptyCache, 0, 0),
                entry(Action::SegmentFree, 100, 2 << 20),
                entry(Action::Oom, 0, 1 << 30),
                entry(Action::Alloc, 200, 9),
                entry(Action::FreeRequested, 200, 9),
                entry(Action::Alloc, 300, 3),
                entry(Action::FreeCompleted, 200, 9),
            ],
            ..RecordedRun::default()
        };
        let (t, entries) = run.to_trace_with_entries().unwrap();
        let alloc = |id, size_bytes| Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        };
        assert_eq!(
            t.events,
            vec![
                alloc(0, 7),
                Event::Free { id: AllocId(0) },
                Event::EmptyCache,
                alloc(1, 1 << 30),
                alloc(2, 9),
                Event::FreeRequested { id: AllocId(2) },
                alloc(3, 3),
                Event::Free { id: AllocId(2) },
            ]
        );
        assert_eq!(t.locations, vec![1, 4, 5, 7, 8, 9, 10, 11]);
        assert_eq!(entries, vec![1, 4, 5, 7, 8, 9, 10, 11]);
        assert_eq!(t.location(1), "entry 4");
        assert_eq!(t.meta, meta);
        assert_eq!(run.to_trace().unwrap(), t);
    }

    /// A pool window the recorder saw begin and end before the first entry (both
    /// positions `null`) is a begin and an end before the first event, not a window that
    /// routes the whole trace (which made the pool's next window "already allocated
    /// to"); from a mid-run state, the calls before the first entry are folded into the
    /// state's pools: their uses and the window still open at the first entry.
    #[test]
    fn windows_before_the_first_entry() {
        let text = r#"{"events": [["alloc", 4096, 512, 7, 0], ["free_requested", 4096, 512, 7, 0],
            ["free_completed", 4096, 512, 7, 0]],
            "pools": [{"id": [1, 0], "kind": "graph", "created_at": null}],
            "pool_windows": [
              {"pool": [1, 0], "scope": "capture", "streams": [7], "begin": null, "end": null, "closed": true},
              {"pool": [1, 0], "scope": "capture", "streams": [7], "begin": null, "end": 2, "closed": true}],
            "request_pools": [[0, 1, 0]]}"#;
        let run = read_recorded_json_from(text.as_bytes(), Path::new("r.json")).unwrap();
        let pool = PoolId(1, 0);
        let begin = Event::BeginAllocateToPool {
            pool,
            streams: PoolStreams::only(vec![7]),
        };
        let end = Event::EndAllocateToPool { pool };
        assert_eq!(
            run.calls,
            vec![
                (None, begin.clone()),
                (None, end.clone()),
                (None, begin.clone()),
                (Some(2), end.clone()),
            ]
        );
        assert!(run.meta.caveats.is_empty(), "{:?}", run.meta.caveats);
        let t = run.to_trace().unwrap();
        assert!(t.start.is_none());
        assert_eq!(&t.events[..3], &[begin.clone(), end, begin]);
        // Folded into a state at the first entry: two uses, the second window open.
        let mut state = crate::StartState::default();
        let kept = state.fold_recorded_calls(&run.calls);
        assert_eq!(kept, vec![(Some(2), Event::EndAllocateToPool { pool })]);
        assert_eq!(
            state.pools,
            vec![crate::StartPrivatePool {
                id: pool,
                uses: 2,
                use_on_oom: false,
                no_split: false,
                routing: Some(PoolStreams::only(vec![7])),
            }]
        );
        assert!(state.pools_recorded);
    }

    /// The windows of the allocate-to-pool bindings (inductor's CUDA graph trees warm
    /// up in their pool through them): scope `stream` routes its stream only, scope
    /// `thread` every stream.
    #[test]
    fn allocate_to_pool_windows() {
        let text = r#"{"events": [["alloc", 4096, 512, 7, 0], ["alloc", 8192, 512, 9, 0],
            ["free_requested", 4096, 512, 7, 0], ["free_completed", 4096, 512, 7, 0]],
            "pools": [{"id": [0, 1], "kind": "graph", "created_at": null}],
            "pool_windows": [
              {"pool": [0, 1], "kind": "allocate_to_pool", "scope": "stream", "streams": [7], "begin": null, "end": 2, "closed": true},
              {"pool": [0, 1], "kind": "allocate_to_pool", "scope": "thread", "streams": [], "begin": 2, "end": 3, "closed": true}],
            "pool_releases": [{"pool": [0, 1], "at": 3, "how": "release_pool"}],
            "request_pools": [[0, 0, 1]]}"#;
        let run = read_recorded_json_from(text.as_bytes(), Path::new("r.json")).unwrap();
        let pool = PoolId(0, 1);
        let routes: Vec<&PoolStreams> = run
            .calls
            .iter()
            .filter_map(|(_, e)| match e {
                Event::BeginAllocateToPool { streams, .. } => Some(streams),
                _ => None,
            })
            .collect();
        assert_eq!(
            routes,
            vec![&PoolStreams::only(vec![7]), &PoolStreams::All],
            "{:?}",
            run.calls
        );
        assert!(run.calls.contains(&(Some(3), Event::ReleasePool { pool })));
        assert!(run.meta.caveats.is_empty(), "{:?}", run.meta.caveats);
    }

    /// A checkpoint restore's allocations to the pool (between the call's marks, or up
    /// to the next mark when the recorder wrote no end) each follow a `restore_block`
    /// naming their address, with no caveat and none taken for misrouted.
    #[test]
    fn a_checkpoint_restore_places_its_allocations() {
        for end in [", \"end\": 5", ""] {
            let text = format!(
                r#"{{"events": [["snapshot", 0, 0, 0, 0], ["alloc", 4096, 512, 7, 0],
                ["alloc", 4608, 1024, 7, 0], ["free_requested", 4608, 1024, 7, 0],
                ["free_completed", 4608, 1024, 7, 0], ["snapshot", 0, 0, 0, 0],
                ["alloc", 8192, 512, 0, 0]],
                "pools": [{{"id": [0, 1], "kind": "graph", "created_at": null}}],
                "pool_windows": [{{"pool": [0, 1], "kind": "allocate_to_pool", "scope": "thread",
                  "streams": [], "begin": null, "end": null, "closed": true}}],
                "calls": [{{"call": "set_checkpoint_pool_state", "at": 0, "args": [0]{end}}}],
                "request_pools": [[1, 0, 1], [2, 0, 1]]}}"#
            );
            let run = read_recorded_json_from(text.as_bytes(), Path::new("r.json")).unwrap();
            assert!(run.meta.caveats.is_empty(), "{end}: {:?}", run.meta.caveats);
            let trace = run.to_trace().unwrap();
            let pool = PoolId(0, 1);
            let ops: Vec<String> = trace
                .events
                .iter()
                .map(|e| match e {
                    Event::RestoreBlock { pool: p, addr } if *p == pool => {
                        format!("restore {addr}")
                    }
                    Event::Alloc { size_bytes, .. } => format!("alloc {size_bytes}"),
                    other => other.op_name().to_string(),
                })
                .collect();
            assert_eq!(
                ops,
                [
                    "begin_allocate_to_pool",
                    "end_allocate_to_pool",
                    "restore 4096",
                    "alloc 512",
                    "restore 4608",
                    "alloc 1024",
                    "free",
                    "alloc 512"
                ],
                "{end}"
            );
        }
    }

    /// The JSON reader fills the trace metadata from the file's fields.
    #[test]
    fn json_fills_the_metadata() {
        let text = r#"{"workload": "w", "alloc_conf": "expandable_segments:True", "cap_bytes": 1024,
            "total_bytes": 4096, "device": "NVIDIA H100", "torch": "2.11.0", "events": []}"#;
        let run = read_recorded_json_from(text.as_bytes(), Path::new("r.json")).unwrap();
        assert_eq!(
            run.meta,
            TraceMeta {
                format: Some(Format::RecordedJson),
                workload: Some("w".into()),
                alloc_conf: Some("expandable_segments:True".into()),
                cap_bytes: Some(1024),
                total_bytes: Some(4096),
                device: Some("NVIDIA H100".into()),
                torch_version: Some("2.11.0".into()),
                caveats: Vec::new(),
                addresses: None,
            }
        );
        assert_eq!(run.meta.memory_fraction(), Some(0.25));
        assert_eq!(run.to_trace().unwrap().meta, run.meta);
    }

    /// A free of an address never allocated means the trace starts mid-run; its state
    /// is rebuilt from the segments the recording ends with (a private pool's segment
    /// in its pool), and a free outside every segment cannot be rebuilt, with a message
    /// naming the entry.
    #[test]
    fn a_trace_that_starts_mid_run_is_rebuilt_or_refused() {
        let mut run = RecordedRun {
            path: "x.pickle".into(),
            entries: vec![entry(Action::FreeCompleted, 5, 7)],
            ..RecordedRun::default()
        };
        assert!(!run.starts_empty());
        let err = run.to_trace().unwrap_err().to_string();
        assert!(
            err.starts_with("x.pickle: entry 0: free_completed of 0x5, outside every segment: the trace does not fit"),
            "{err}"
        );
        run.segments = vec![RecordedSegment {
            address: 0,
            total_size: 2 << 20,
            stream: 0,
            segment_type: "small".into(),
            allocated_size: 0,
            blocks: vec![RecordedBlock {
                address: 0,
                size: 2 << 20,
                requested_size: None,
                state: BlockState::Inactive,
            }],
            is_expandable: false,
            pool_id: (0, 0),
        }];
        let t = run.to_trace().unwrap();
        let start = t.start.expect("a rebuilt state");
        assert_eq!(start.segments.len(), 1);
        assert_eq!(
            start.segments[0].blocks,
            vec![crate::StartBlock {
                addr: 5,
                size_bytes: None,
                requested_bytes: 7,
                pending_free: true,
                id: AllocId(0),
            }]
        );
        assert_eq!(t.events, vec![Event::Free { id: AllocId(0) }]);
        // A state with a private pool's segment is rebuilt with the pool live at the
        // first entry (one use: a snapshot does not record more), the segment its own.
        run.segments[0].pool_id = (1, 0);
        let start = run.rebuild_start().unwrap();
        assert_eq!(start.segments[0].pool_id, PoolId(1, 0));
        assert_eq!(
            start.pools,
            vec![crate::StartPrivatePool {
                id: PoolId(1, 0),
                uses: 1,
                use_on_oom: false,
                no_split: false,
                routing: None,
            }]
        );
        assert!(start
            .describe()
            .contains("private pools (1, 0) with 1 segment(s) of 2.00 MiB"));
    }

    /// A mid-run trace whose segments or entries end past 2^64 is refused with a message
    /// naming them, not a wrap in the rebuild (found by the long fuzz campaign of
    /// 2026-11-26: expandable runs at the top of the address space overflowed).
    #[test]
    fn a_rebuild_past_the_end_of_the_address_space_is_refused() {
        let seg = |address: u64| RecordedSegment {
            address,
            total_size: 2 << 20,
            stream: 0,
            segment_type: "large".into(),
            allocated_size: 0,
            blocks: Vec::new(),
            is_expandable: true,
            pool_id: (0, 0),
        };
        let mut run = RecordedRun {
            path: "x.pickle".into(),
            entries: vec![entry(Action::FreeCompleted, 5, 7)],
            segments: vec![seg(u64::MAX - (1 << 20)), seg(0)],
            ..RecordedRun::default()
        };
        let err = run.rebuild_start().unwrap_err().to_string();
        assert_eq!(
            err,
            "x.pickle: segment at 0xffffffffffefffff: its 2097152 bytes run past the end of the \
             64-bit address space"
        );
        run.segments = vec![seg(0)];
        run.entries = vec![entry(Action::FreeCompleted, u64::MAX - 3, 7)];
        let err = run.rebuild_start().unwrap_err().to_string();
        assert_eq!(
            err,
            "x.pickle: entry 0: free_completed of 0xfffffffffffffffc: its 7 bytes run past the \
             end of the 64-bit address space"
        );
    }

    /// `expandable_segments:True` in a format-1 JSON makes its segments expandable.
    #[test]
    fn expandable_conf_is_recognized() {
        assert!(conf_enables_expandable("expandable_segments:True"));
        assert!(conf_enables_expandable(
            "max_split_size_mb:64,expandable_segments:true"
        ));
        assert!(!conf_enables_expandable(
            "expandable_segments:True,expandable_segments:False"
        ));
        assert!(!conf_enables_expandable(""));
    }
}
