//! A snapshot pickle's replay, streamed: two passes over the file (three with private
//! pools), none holding its entries.
//!
//! Turning a snapshot's entries into a trace needs the whole of them ([`RecordedRun::to_trace`]):
//! whether the trace starts from an empty allocator, and if not the state at its first
//! entry (rebuilt by undoing the trace from its end on the final segments,
//! [`RecordedRun::rebuild_start`]), `check_replayable`'s counts, the private pool of
//! each request and the addresses of every segment operation (the device's address
//! hints). [`plan_stream`], the **first pass**, reads the file with the entries of
//! each device trace sent to a tally instead of a store (`schema::EntryStore::sink`),
//! which keeps what the whole trace decides in memory that follows the live blocks and
//! segments, not the number of entries: the counts of each action, the live block
//! addresses and segments (the forward check that the trace frees nothing it did not
//! allocate, and leaves the segments the snapshot lists), the blocks the trace frees
//! before it allocates them (live at its first entry, with what their first free says
//! of them), and the segment operations (address hints: 40 bytes per `segment_*`
//! entry). For a trace that starts mid-run it then rebuilds the state at the first
//! entry from those: the segments by undoing the segment operations alone on the final
//! segments, the blocks from their first frees and the final segments (see
//! `rebuild`). Its answer is a [`StreamPlan`], or [`WholeTrace`] with the reason the
//! trace needs the whole-trace reader.
//!
//! [`StreamPlan::events`], the **second pass**, reads the file again on a thread of its
//! own and gives the trace's events as they come, with the entry each came from,
//! exactly as [`RecordedRun::to_trace`] makes them from the held entries: ids in
//! order (a mid-run trace's live blocks first, in address order), a `free_requested`
//! dropped when the very next entry completes it, and the `empty_cache` calls the held
//! reader infers (`empty_cache::empty_cache_points`: a run of segment releases that no
//! segment allocation, map or `oom` follows) decided as the entry after the run
//! arrives, placed before the run's first entry. Releases, snapshots and annotations
//! make no events, so an inferred call lands at the same event index as in the held
//! trace. For a trace that starts mid-run it also makes, forward, the checks undoing
//! the trace makes on its blocks (`Verify`); where one fails, undoing the whole trace
//! would have failed, and [`StreamEvents::finish`] says so: the replay is then the
//! whole-trace path's.
//!
//! **Private pools** (CUDA graphs, MemPools) take a pass of their own between the
//! two, when the snapshot shows any (an entry's `pool_id`, a listed segment of one):
//! `pools::PoolStream` follows the pools forward, one entry at a time, and makes what
//! the held reader's attribution makes from the whole trace (`pools::attribute`,
//! `Attribution::events`): the pool of each request (by entry, or by address from the
//! final segments and, for each of their bytes, the last segment operation that
//! allocated or unmapped it, which the first pass kept), the runs of requests of one
//! pool and their windows, the kept use dropped before a pool's first release after
//! its last request, which runs of releases were a pool's own `emptyCache` or an
//! `empty_cache()` (decided as the entry, the request or the end of the trace that
//! settles each comes), and the caveats. It keeps the segments, the live blocks of
//! private pools, the runs of requests (the windows: about 50 bytes a run) and
//! the runs of releases, not the entries. The second pass then places the calls and
//! the inferred `empty_cache` entries where `to_trace` places them.
//!
//! What streams: a snapshot that [`RecordedRun::check_replayable`] and `to_trace`
//! accept, with or without private pools, starting from an empty allocator (its trace
//! frees nothing it did not allocate and leaves exactly the segments it lists) or
//! mid-run (a ring buffer that wrapped, a recording started late) from a state that
//! undoing the trace rebuilds, private pools' segments included (the pools live at the
//! first entry lose their `create_pool`, as in the held run), unless the snapshot shows
//! private pools and a segment of that state is given back inside the trace: the held
//! path tells its pool from the requests in it, which this pass does not follow. The
//! rest (any problem, which the whole-trace reader reports with all its details)
//! answers [`WholeTrace`]: read it whole.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use crate::hash::FastMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::empty_cache::{ends_inside_malloc, is_release, passed_over};
use super::pickle::{self, Limits, SinkFactory, Value};
use super::pools::{self, CallCursor, PoolPlan, PoolStream};
use super::schema::{self, EntrySink};
use super::seen::{self, Scan, Seen};
use super::{Parts, Snapshot, SnapshotOptions};
use crate::csv::file_stem;
use crate::recorded::{Action, RecordedEntry, RecordedRun, RecordedSegment};
use crate::start::{past_the_end, Journal, Live, StartState, Undo};
use crate::trace::{AllocId, Event, LocationKind, PoolId, Trace, TraceMeta};
use crate::Format;

/// Why a snapshot's replay cannot stream: read it whole ([`crate::read_source`]),
/// which replays the same events or reports the problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WholeTrace {
    /// The file does not read as a snapshot, or an entry or segment is wrong: the
    /// whole-trace reader names it.
    Problem,
    /// The snapshot cannot be replayed as it is (no trace, actions left out, an
    /// address allocated twice): the whole-trace reader says what is missing.
    NotReplayable,
    /// The trace starts mid-run (or ends with other segments than the snapshot
    /// lists) and undoing it on the final segments fails (or its entries run past the
    /// end of the address space), or the snapshot shows private pools and a segment
    /// live at the first entry is given back inside the trace (its pool is told from
    /// the requests in it): the whole-trace reader says why, or replays it.
    StartsMidRun,
    /// The second pass did not read what the first did (the file changed).
    Changed,
    /// The snapshot needs its stack frames (`seen::frames_needed`: the CUDA graph trees
    /// with their pool, which may have set it back to checkpoints, or
    /// `torch.cuda.empty_cache()` where a release could be a malloc's), or has none
    /// where a release could be a malloc's: the whole-trace reader reads them to find
    /// those restores' allocations and which segment releases `empty_cache()` made, or
    /// says what it cannot tell.
    Frames,
}

/// What the first pass found: enough to replay the snapshot's trace as the second
/// pass reads it ([`StreamPlan::events`]).
#[derive(Debug)]
pub struct StreamPlan {
    /// The run without its trace: name, path, metadata (format, `alloc_conf`; no
    /// caveats: a snapshot's come from its private pools), the snapshot's settings,
    /// and as `entries` only the segment operations, with their indexes in the file in
    /// `source_indexes` (what the address hints read). No segments: the first pass
    /// checked the trace against them, and nothing after needs them.
    pub run: RecordedRun,
    /// Entries of the device's trace in the file.
    pub entries: u64,
    /// `alloc` and `oom` entries (each an `alloc` event).
    pub allocs: u64,
    /// The serial number of the device's list of entries among the pickle's.
    serial: u32,
    limits: Limits,
    /// A trace that starts mid-run: its state at the first entry.
    start: Option<MidRun>,
    /// A snapshot that shows private pools: the calls that route its requests and the
    /// inferred `empty_cache` entries, as the held reader places them.
    routed: Option<Arc<PoolPlan>>,
}

/// What the first pass keeps of one list of entries.
#[derive(Default)]
struct Tally {
    len: u64,
    counts: [u64; 12],
    /// Live block addresses, each with whether its free was requested: the trace's own
    /// and, once it frees what it did not allocate, those it found live at its start.
    blocks: FastMap<u64, bool>,
    /// Blocks live at the first entry (the trace frees them before it allocates them):
    /// address → what their first free says.
    start_blocks: FastMap<u64, FirstFree>,
    /// Live segments (address → size), while the trace frees only what it allocated.
    segments: FastMap<u64, u64>,
    mapped: u64,
    /// The trace frees, releases or unmaps what it did not allocate or map.
    midrun: bool,
    /// An `alloc` at an address already live (which `to_trace` refuses).
    alloc_over_live: bool,
    /// A block's entries out of PyTorch's order (alloc, free_requested,
    /// free_completed), or a block found live at the start twice: the start state
    /// cannot be rebuilt.
    broken: bool,
    /// An entry whose bytes run past the end of the 64-bit address space.
    past_end: bool,
    /// The segment operations, with their indexes.
    segment_ops: Vec<(u64, RecordedEntry)>,
    /// The private pools entries name (`pool_id`, PyTorch 2.15 on), in the order they
    /// first come.
    entry_pools: Vec<PoolId>,
    pools_seen: HashMap<PoolId, ()>,
    /// The last entry with effect was a segment release (`empty_cache_points`' runs).
    releasing: bool,
    /// A run of releases came right before a segment allocation or an `oom` (by
    /// position a malloc's own; `seen::frames_needed`).
    ambiguous: bool,
}

/// What the first free of a block live at the first entry says of it.
#[derive(Clone, Copy)]
struct FirstFree {
    /// Its free was requested before the first entry (the trace completes it first).
    pending: bool,
    /// The size of its first `free_completed` (its requested size); `None` until one
    /// comes (the final segments then say it).
    requested: Option<u64>,
}

fn slot(a: Action) -> usize {
    match a {
        Action::Alloc => 0,
        Action::FreeRequested => 1,
        Action::FreeCompleted => 2,
        Action::SegmentAlloc => 3,
        Action::SegmentFree => 4,
        Action::SegmentMap => 5,
        Action::SegmentUnmap => 6,
        Action::Oom => 7,
        Action::EmptyCache => 8,
        Action::Snapshot => 9,
        Action::Annotate => 10,
        Action::Other => 11,
    }
}

impl Tally {
    /// `RecordedRun::trace_starts_empty` and `leaves_listed_segments`, forward, one
    /// entry at a time (the two follow the same maps while nothing unknown is freed);
    /// and for a trace that starts mid-run, the blocks live at its start, as undoing
    /// the trace from its end finds them (`crate::start`): a block whose first entry is
    /// a free.
    fn entry(&mut self, index: u64, e: RecordedEntry, pool: Option<schema::PoolId>) {
        self.len = index + 1;
        if let Some(p) = pool {
            self.pool(PoolId(p.0, p.1));
        }
        self.counts[slot(e.action)] += 1;
        self.past_end |= e.addr.checked_add(e.size).is_none();
        if !passed_over(e.action) {
            self.ambiguous |= self.releasing && ends_inside_malloc(e.action);
            self.releasing = is_release(e.action);
        }
        if e.action.is_segment_op() {
            self.segment_ops.push((index, e));
        }
        match e.action {
            Action::Alloc => {
                let over_live = self.blocks.insert(e.addr, false).is_some();
                self.alloc_over_live |= over_live;
                self.broken |= over_live;
            }
            Action::FreeRequested => match self.blocks.get_mut(&e.addr) {
                Some(pending) => {
                    self.broken |= *pending;
                    *pending = true;
                }
                None => {
                    self.midrun = true;
                    self.first_free(e.addr, false, None);
                    self.blocks.insert(e.addr, true);
                }
            },
            Action::FreeCompleted => match self.blocks.remove(&e.addr) {
                Some(pending) => {
                    self.broken |= !pending;
                    if !self.start_blocks.is_empty() {
                        if let Some(f) = self.start_blocks.get_mut(&e.addr) {
                            f.requested.get_or_insert(e.size);
                        }
                    }
                }
                None => {
                    self.midrun = true;
                    self.first_free(e.addr, true, Some(e.size));
                }
            },
            Action::SegmentAlloc if !self.midrun => {
                self.segments.insert(e.addr, e.size);
            }
            Action::SegmentFree if !self.midrun && self.segments.remove(&e.addr).is_none() => {
                self.midrun = true;
            }
            Action::SegmentMap if !self.midrun => {
                self.mapped = self.mapped.saturating_add(e.size);
            }
            Action::SegmentUnmap if !self.midrun => match self.mapped.checked_sub(e.size) {
                Some(m) => self.mapped = m,
                None => self.midrun = true,
            },
            _ => {}
        }
    }

    /// A free of `addr`, a block not live: live at the first entry, unless the trace
    /// freed it before (found here) or allocated it before (found by the second pass),
    /// which undoing the trace refuses.
    #[cold]
    fn first_free(&mut self, addr: u64, pending: bool, requested: Option<u64>) {
        if self
            .start_blocks
            .insert(addr, FirstFree { pending, requested })
            .is_some()
        {
            self.broken = true;
        }
    }

    /// An entry of a private pool.
    #[cold]
    fn pool(&mut self, pool: PoolId) {
        if self.pools_seen.insert(pool, ()).is_none() {
            self.entry_pools.push(pool);
        }
    }

    fn count(&self, a: Action) -> u64 {
        self.counts[slot(a)]
    }
}

/// Memo slots a streamed read keeps densely (`pickle::Limits::memo_window`): 16 MiB
/// of slots, up to twice that before the oldest go.
const MEMO_WINDOW: usize = 1 << 20;

fn limits_of(path: &Path, memo_window: usize) -> Result<(std::fs::File, Limits), WholeTrace> {
    let file = std::fs::File::open(path).map_err(|_| WholeTrace::Problem)?;
    let mut limits = Limits {
        memo_window,
        ..Limits::default()
    };
    if let Ok(meta) = file.metadata() {
        if meta.is_file() {
            limits.max_input = meta.len();
        }
    }
    Ok((file, limits))
}

/// The first pass over the snapshot pickle at `path` (device `device`'s trace): what
/// the whole trace decides, kept in memory that follows its live blocks and segments;
/// see the module docs.
///
/// # Errors
/// [`WholeTrace`]: why the trace needs the whole-trace reader (which reports any
/// problem of the file).
pub fn plan_stream(path: &Path, device: usize) -> Result<StreamPlan, WholeTrace> {
    plan_stream_with(path, device, MEMO_WINDOW)
}

/// [`plan_stream`] keeping `memo_window` pickle memo slots densely (up to twice that
/// before the oldest go; [`plan_stream`] keeps 2^20: 16 MiB): a smaller window takes
/// less memory, a slot let go and referred to later fails the read (tests use a
/// window of a few slots to show that real snapshots refer to none).
///
/// # Errors
/// As [`plan_stream`].
pub fn plan_stream_with(
    path: &Path,
    device: usize,
    memo_window: usize,
) -> Result<StreamPlan, WholeTrace> {
    let (file, limits) = limits_of(path, memo_window)?;
    let tallies: Rc<RefCell<Vec<Tally>>> = Rc::default();
    let shared = Rc::clone(&tallies);
    let factory: SinkFactory = Box::new(move |serial| -> EntrySink {
        shared.borrow_mut().push(Tally::default());
        let tallies = Rc::clone(&shared);
        let at = serial as usize;
        Box::new(move |index, entry, pool| tallies.borrow_mut()[at].entry(index, entry, pool))
    });
    let found = Rc::new(std::cell::Cell::new(Seen::default()));
    let scan = Scan::new(std::io::BufReader::new(file), Rc::clone(&found));
    let root =
        pickle::read_value_streaming(scan, limits, factory).map_err(|_| WholeTrace::Problem)?;
    let seen = found.get();
    let options = SnapshotOptions::default();
    let snapshot = Snapshot {
        path,
        device,
        options: &options,
        frames: RefCell::default(),
        seen,
        needs_frames: std::cell::Cell::new(false),
    };
    let Parts {
        store,
        segments,
        info,
        alloc_conf,
    } = snapshot.parts(&root).map_err(|_| WholeTrace::Problem)?;
    drop(root);
    if store.sink.is_none() || !info.traced {
        // No list of entries for this device (an empty trace, or none).
        return Err(WholeTrace::NotReplayable);
    }
    let serial = store.serial;
    let tally = std::mem::take(
        tallies
            .borrow_mut()
            .get_mut(serial as usize)
            .ok_or(WholeTrace::Problem)?,
    );
    if tally.len == 0 {
        return Err(WholeTrace::NotReplayable);
    }
    // `check_replayable`'s counts.
    let frees = tally.count(Action::FreeRequested) + tally.count(Action::FreeCompleted);
    let created = tally.count(Action::SegmentAlloc) + tally.count(Action::SegmentMap);
    if (tally.count(Action::Alloc) == 0 && frees > 0 && created > 0)
        || (tally.count(Action::FreeCompleted) == 0 && tally.count(Action::FreeRequested) > 0)
    {
        return Err(WholeTrace::NotReplayable);
    }
    // `leaves_listed_segments`.
    let leaves_listed = segments.is_empty() || {
        let listed: FastMap<u64, u64> = segments
            .iter()
            .filter(|s| !s.is_expandable)
            .map(|s| (s.address, s.total_size))
            .collect();
        let listed_mapped: u64 = segments
            .iter()
            .filter(|s| s.is_expandable)
            .map(|s| s.total_size)
            .sum();
        tally.segments == listed && tally.mapped == listed_mapped
    };
    let start = if !tally.midrun && leaves_listed {
        if tally.alloc_over_live {
            return Err(WholeTrace::NotReplayable);
        }
        None
    } else {
        Some(rebuild(&tally, &segments)?)
    };
    let allocs = tally.count(Action::Alloc) + tally.count(Action::Oom);
    // Private pools: a pass of its own over the file routes the requests as the held
    // reader does (`pools::PoolStream`).
    let every_entry = store.pool_ids == tally.len;
    let pools = PoolStream::new(
        &tally.entry_pools,
        every_entry,
        &segments,
        &tally.segment_ops,
        super::gc_possible(&info),
        allocs,
    );
    if seen::stream_declines(seen, pools.shows_pools(), tally.ambiguous) {
        return Err(WholeTrace::Frames);
    }
    // Only the caveat of the trees without their pool can come here.
    let trees = seen::caveat(seen, pools.shows_pools(), false);
    let routed = if pools.shows_pools() {
        let mut plan = pool_pass(path, serial, limits, tally.len, pools)?;
        // From a state with private pools: as `RecordedRun::to_trace` has it.
        if let Some(s) = &start {
            // Segments the trace gives back whose pool the segment operations do not
            // say: the held path tells it from the requests in them.
            if s.start.segments.iter().any(|g| g.pool.is_none()) {
                return Err(WholeTrace::StartsMidRun);
            }
            let live: Vec<PoolId> = s.start.pools.iter().map(|p| p.id).collect();
            plan.started_with(&live);
            plan.caveats.extend(s.start.unknown_pool_caveat());
        }
        Some(Arc::new(plan))
    } else {
        None
    };
    let (source_indexes, entries): (Vec<u64>, Vec<RecordedEntry>) =
        tally.segment_ops.into_iter().unzip();
    Ok(StreamPlan {
        run: RecordedRun {
            name: file_stem(path),
            path: path.to_path_buf(),
            meta: TraceMeta {
                format: Some(Format::TorchPickle),
                alloc_conf,
                caveats: routed
                    .as_ref()
                    .map(|r| r.caveats.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .chain(trees)
                    .collect(),
                ..TraceMeta::default()
            },
            entries,
            source_indexes,
            snapshot: Some(info),
            ..RecordedRun::default()
        },
        entries: tally.len,
        allocs,
        serial,
        limits,
        start,
        routed,
    })
}

/// The pass over the file that routes a snapshot's requests to its private pools
/// (`pools::PoolStream`), before the events are made.
fn pool_pass(
    path: &Path,
    serial: u32,
    limits: Limits,
    expected: u64,
    pools: PoolStream,
) -> Result<PoolPlan, WholeTrace> {
    let file = std::fs::File::open(path).map_err(|_| WholeTrace::Changed)?;
    let limits = Limits {
        skip_segments: true,
        ..limits
    };
    let shared = Rc::new(RefCell::new(Some(pools)));
    let sink = Rc::clone(&shared);
    let factory: SinkFactory = Box::new(move |s| -> EntrySink {
        if s == serial {
            let pools = Rc::clone(&sink);
            Box::new(move |index, entry, pool| {
                if let Some(p) = pools.borrow_mut().as_mut() {
                    p.entry(index, &entry, pool.map(|p| PoolId(p.0, p.1)));
                }
            })
        } else {
            Box::new(|_, _, _| {})
        }
    });
    let root = pickle::read_value_streaming(std::io::BufReader::new(file), limits, factory);
    let read = matches!(root, Ok(Value::Dict(_)));
    drop(root);
    let pools = shared.borrow_mut().take().ok_or(WholeTrace::Changed)?;
    if !read || pools.failed || pools.entries() != expected {
        return Err(WholeTrace::Changed);
    }
    Ok(pools.finish())
}

/// The state at the first entry of a trace that starts mid-run, as
/// [`RecordedRun::rebuild_start`] rebuilds it from the whole trace, from what the first
/// pass kept: the segments by undoing the segment operations (kept for the address
/// hints) on the final segments, which needs no block (a block entry changes no
/// segment); the blocks from the first free of each block live at the start and the
/// final segments' blocks the trace does not leave live. The checks the undoing makes
/// on blocks (each block's entries in PyTorch's order, a block freed inside a segment,
/// no block in a segment allocated or pages mapped right after) are the second pass's,
/// forward from this state ([`Verify`]), which ends where the final segments do.
fn rebuild(tally: &Tally, segments: &[RecordedSegment]) -> Result<MidRun, WholeTrace> {
    if tally.broken || tally.past_end || past_the_end(segments).is_some() {
        return Err(WholeTrace::StartsMidRun);
    }
    let mut state = Undo::at_end(segments);
    let final_blocks = std::mem::take(&mut state.live);
    state.journal();
    let mut steps: Vec<(u64, Journal)> = Vec::new();
    for (index, e) in tally.segment_ops.iter().rev() {
        state.undo(e).map_err(|_| WholeTrace::StartsMidRun)?;
        steps.push((*index, state.take_journal()));
    }
    steps.reverse();
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    for (&addr, first) in &tally.start_blocks {
        let block = match first.requested {
            Some(requested) => Live {
                size: None,
                requested,
                pending: first.pending,
            },
            // Its free requested in the trace, not completed: the final segments say it.
            None => match final_blocks.get(&addr) {
                Some(b) => Live {
                    pending: false,
                    ..b.clone()
                },
                None => return Err(WholeTrace::StartsMidRun),
            },
        };
        live.insert(addr, block);
    }
    for (&addr, b) in &final_blocks {
        if !tally.blocks.contains_key(&addr) && !live.contains_key(&addr) {
            live.insert(addr, b.clone());
        }
    }
    state.live = live;
    let start = state.into_start().map_err(|_| WholeTrace::StartsMidRun)?;
    let mut verify = Verify {
        blocks: BTreeMap::new(),
        segments: BTreeMap::new(),
        steps: Vec::with_capacity(steps.len()),
        journal: Vec::new(),
        next_step: 0,
        final_blocks: final_blocks.iter().map(|(&a, b)| (a, b.pending)).collect(),
    };
    for s in &start.segments {
        verify.segments.insert(s.addr, s.size_bytes);
        for b in &s.blocks {
            verify.blocks.insert(b.addr, b.pending_free);
        }
    }
    for (index, changes) in steps {
        // Undone in order, so redone in the reverse order.
        verify.journal.extend(changes.into_iter().rev());
        verify.steps.push((index, verify.journal.len()));
    }
    Ok(MidRun { start, verify })
}

/// A trace that starts mid-run: its state at the first entry, and what the second pass
/// checks of it.
#[derive(Clone, Debug)]
struct MidRun {
    start: StartState,
    verify: Verify,
}

/// The checks undoing the trace makes on its blocks ([`RecordedRun::rebuild_start`]),
/// made forward from the rebuilt state as the second pass reads the entries: the state
/// after each entry is the one undoing finds before undoing it, so where every check
/// holds and the blocks end as the final segments list them, undoing the whole trace
/// succeeds and reaches the state the replay started from.
#[derive(Clone, Debug)]
struct Verify {
    /// Live blocks: address → free requested.
    blocks: BTreeMap<u64, bool>,
    /// Segments (address → bytes), as undoing finds them.
    segments: BTreeMap<u64, u64>,
    /// Each segment operation's index in the file, and the end of its changes in
    /// `journal`.
    steps: Vec<(u64, usize)>,
    /// The segments' changes, each a key and its bytes after the operation (`None`:
    /// no segment there), in the order they are redone.
    journal: Vec<(u64, Option<u64>)>,
    next_step: usize,
    /// The final segments' live blocks: address → free requested.
    final_blocks: BTreeMap<u64, bool>,
}

impl Verify {
    /// Redoes entry `index`; whether undoing it would succeed.
    fn entry(&mut self, index: u64, e: &RecordedEntry) -> bool {
        match e.action {
            Action::Alloc => self.blocks.insert(e.addr, false).is_none(),
            Action::FreeRequested => match self.blocks.get_mut(&e.addr) {
                Some(pending) if !*pending => {
                    *pending = true;
                    true
                }
                _ => false,
            },
            Action::FreeCompleted => {
                self.blocks.remove(&e.addr) == Some(true)
                    && self
                        .segments
                        .range(..=e.addr)
                        .next_back()
                        .is_some_and(|(&a, &size)| e.addr < a.saturating_add(size))
            }
            action if action.is_segment_op() => {
                let Some(&(at, end)) = self.steps.get(self.next_step) else {
                    return false;
                };
                if at != index {
                    return false;
                }
                let begin = match self.next_step {
                    0 => 0,
                    n => self.steps[n - 1].1,
                };
                self.next_step += 1;
                for &(key, size) in &self.journal[begin..end] {
                    match size {
                        Some(size) => self.segments.insert(key, size),
                        None => self.segments.remove(&key),
                    };
                }
                let empty = |blocks: &BTreeMap<u64, bool>, addr: u64, size: u64| {
                    blocks
                        .range(addr..addr.saturating_add(size))
                        .next()
                        .is_none()
                };
                match action {
                    Action::SegmentAlloc => match self.segments.get(&e.addr) {
                        Some(&size) => empty(&self.blocks, e.addr, size),
                        None => false,
                    },
                    Action::SegmentMap => empty(&self.blocks, e.addr, e.size),
                    _ => true,
                }
            }
            _ => true,
        }
    }

    /// After the last entry: every segment operation redone, the blocks as listed.
    fn finish(&self) -> bool {
        self.next_step == self.steps.len() && self.blocks == self.final_blocks
    }
}

/// Events sent from the reading thread at once.
const BATCH: usize = 8192;

impl StreamPlan {
    /// The state at the first entry of a trace that starts mid-run, as
    /// [`RecordedRun::rebuild_start`] rebuilds it; `None` for a trace that starts from an
    /// empty allocator. The second pass checks it ([`StreamEvents::finish`]).
    pub fn start(&self) -> Option<&StartState> {
        self.start.as_ref().map(|m| &m.start)
    }

    /// The trace without its events, for reports: name, path, metadata, locations
    /// counted in entries of the file, and the state at its first entry
    /// ([`StreamPlan::start`]). Of the events it holds only, for a snapshot with
    /// private pools, one call naming each pool (`release_pool`), in the order the
    /// trace first names them, so that [`Trace::pools`] names them as it does on the
    /// whole trace.
    pub fn shell(&self) -> Trace {
        let events: Vec<Event> = (self.routed.iter().flat_map(|r| r.pools()))
            .map(|pool| Event::ReleasePool { pool })
            .collect();
        Trace {
            name: self.run.name.clone(),
            path: Some(self.run.path.clone()),
            events,
            locations: Vec::new(),
            location_kind: LocationKind::Entry,
            meta: self.run.meta.clone(),
            id_names: Vec::new(),
            times_us: Vec::new(),
            start: self.start().cloned(),
        }
    }

    /// The second pass: the trace's events as the file is read again (on a thread
    /// of its own), each with the index of the file's entry it came from. Check
    /// [`StreamEvents::finish`] after the last: a file that changed since the first
    /// pass ends the events early.
    pub fn events(&self) -> StreamEvents {
        self.events_with(self.limits.memo_window)
    }

    /// [`StreamPlan::events`] with another memo window (see [`plan_stream_with`]).
    pub fn events_with(&self, memo_window: usize) -> StreamEvents {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(Event, u64)>>(4);
        let path: PathBuf = self.run.path.clone();
        // The second pass needs the trace only: the segments are not kept.
        let limits = Limits {
            memo_window,
            skip_segments: true,
            ..self.limits
        };
        let (serial, expected) = (self.serial, self.entries);
        let start = self.start.clone();
        let routed = self.routed.clone();
        let handle = std::thread::Builder::new()
            .name("snapshot-reader".into())
            .spawn(move || second_pass(&path, serial, limits, expected, start, routed, tx))
            .ok();
        StreamEvents {
            rx,
            batch: Vec::new().into_iter(),
            failed_to_start: handle.is_none(),
            handle,
        }
    }
}

/// The events of a snapshot's trace as the second pass reads them
/// ([`StreamPlan::events`]).
pub struct StreamEvents {
    rx: Receiver<Vec<(Event, u64)>>,
    batch: std::vec::IntoIter<(Event, u64)>,
    handle: Option<JoinHandle<Result<(), WholeTrace>>>,
    failed_to_start: bool,
}

impl Iterator for StreamEvents {
    type Item = (Event, u64);

    #[inline]
    fn next(&mut self) -> Option<(Event, u64)> {
        loop {
            if let Some(item) = self.batch.next() {
                return Some(item);
            }
            self.batch = self.rx.recv().ok()?.into_iter();
        }
    }
}

impl StreamEvents {
    /// Whether the second pass gave every event of the trace the first pass planned,
    /// from the state it planned.
    ///
    /// # Errors
    /// [`WholeTrace::Changed`] when it did not (the file changed, or the reading
    /// thread did not start); [`WholeTrace::StartsMidRun`] when the trace does not fit
    /// the state rebuilt for its first entry (undoing the whole trace fails).
    pub fn finish(self) -> Result<(), WholeTrace> {
        let StreamEvents {
            rx,
            batch,
            handle,
            failed_to_start,
        } = self;
        // Events not taken: the reader stops sending, and ends.
        drop((rx, batch));
        if failed_to_start {
            return Err(WholeTrace::Changed);
        }
        match handle.map(JoinHandle::join) {
            Some(Ok(result)) => result,
            _ => Err(WholeTrace::Changed),
        }
    }
}

/// Makes the trace's events from the entries as they come, as `to_trace` makes them
/// from the held ones (see the module docs), and sends them in batches.
struct Events {
    tx: SyncSender<Vec<(Event, u64)>>,
    batch: Vec<(Event, u64)>,
    /// Live blocks: address → id.
    live: FastMap<u64, AllocId>,
    next_id: u64,
    /// A `free_requested` (its entry, address and id) waiting for the next entry,
    /// which drops it if it completes the free at once.
    pending: Option<(u64, u64, AllocId)>,
    /// An open run of segment releases: its first entry, and whether a `snapshot` or
    /// `annotate` entry has ended it (the entry deciding it is still to come).
    run: Option<(u64, bool)>,
    entries: u64,
    /// The checks of a trace that starts mid-run.
    verify: Option<Verify>,
    /// A snapshot with private pools: its calls and inferred `empty_cache` entries.
    splice: Option<Splice>,
    /// The entries do not make a trace (the file changed since the first pass).
    failed: bool,
    /// The receiver is gone (the replay stopped): nothing more is sent.
    stopped: bool,
}

impl Events {
    #[inline]
    fn push(&mut self, event: Event, at: u64) {
        if self.stopped {
            return;
        }
        self.batch.push((event, at));
        if self.batch.len() == BATCH {
            self.send();
        }
    }

    fn send(&mut self) {
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        if !batch.is_empty() && self.tx.send(batch).is_err() {
            self.stopped = true;
        }
    }

    #[inline]
    fn entry(&mut self, index: u64, e: RecordedEntry) {
        self.entries += 1;
        if self.failed || index + 1 != self.entries {
            self.failed = true;
            return;
        }
        if let Some(v) = &mut self.verify {
            if !v.entry(index, &e) {
                self.failed = true;
                return;
            }
        }
        if let Some(splice) = self.splice.take() {
            self.spliced(index, e, splice);
            return;
        }
        if let Some((at, addr, id)) = self.pending.take() {
            if !(e.action == Action::FreeCompleted && e.addr == addr) {
                self.push(Event::FreeRequested { id }, at);
            }
        }
        // `empty_cache_points`, forward.
        match e.action {
            Action::SegmentFree | Action::SegmentUnmap => match self.run {
                None => self.run = Some((index, false)),
                Some((start, true)) => {
                    self.push(Event::EmptyCache, start);
                    self.run = Some((index, false));
                }
                Some((_, false)) => {}
            },
            Action::Snapshot | Action::Annotate => {
                if let Some((start, _)) = self.run {
                    self.run = Some((start, true));
                }
            }
            next => {
                if let Some((start, _)) = self.run.take() {
                    if !ends_inside_malloc(next) {
                        self.push(Event::EmptyCache, start);
                    }
                }
            }
        }
        self.event(index, e);
    }

    /// The events of entry `index` itself (`to_trace`'s).
    #[inline]
    fn event(&mut self, index: u64, e: RecordedEntry) {
        match e.action {
            Action::Alloc | Action::Oom => {
                let id = AllocId(self.next_id);
                self.next_id += 1;
                if e.action == Action::Alloc && self.live.insert(e.addr, id).is_some() {
                    self.failed = true;
                    return;
                }
                self.push(
                    Event::Alloc {
                        id,
                        size_bytes: e.size,
                        stream: e.stream,
                    },
                    index,
                );
            }
            Action::FreeCompleted => match self.live.remove(&e.addr) {
                Some(id) => self.push(Event::Free { id }, index),
                None => self.failed = true,
            },
            Action::FreeRequested => match self.live.get(&e.addr) {
                Some(&id) => self.pending = Some((index, e.addr, id)),
                None => self.failed = true,
            },
            Action::EmptyCache => self.push(Event::EmptyCache, index),
            _ => {}
        }
    }

    /// Entry `index` of a snapshot with private pools: the inferred `empty_cache`
    /// entries are the pool pass's, and the calls go in after the entries they name,
    /// counted with those (as `to_trace` pushes them).
    fn spliced(&mut self, index: u64, e: RecordedEntry, mut splice: Splice) {
        if let Some((at, addr, id)) = self.pending.take() {
            if !(e.action == Action::FreeCompleted && e.addr == addr) {
                self.push(Event::FreeRequested { id }, at);
            }
        }
        if splice.plan.points.get(splice.next_point) == Some(&index) {
            let position = index + splice.next_point as u64;
            self.calls_through(&mut splice, position);
            self.push(Event::EmptyCache, index);
            splice.next_point += 1;
        }
        let position = index + splice.next_point as u64;
        self.calls_through(&mut splice, position);
        self.splice = Some(splice);
        self.event(index, e);
    }

    /// The calls placed before the entry at `position` (counted with the inferred
    /// `empty_cache` entries).
    fn calls_through(&mut self, splice: &mut Splice, position: u64) {
        while let Some((at, event)) = splice.plan.next_call(&mut splice.next_call, position) {
            let location = pools::source_of(&splice.plan.points, at.unwrap_or(0));
            self.push(event, location);
        }
    }

    /// After the last entry: the `free_requested` and the run of releases still open.
    fn end(&mut self) {
        if let Some((at, _, id)) = self.pending.take() {
            self.push(Event::FreeRequested { id }, at);
        }
        if let Some(mut splice) = self.splice.take() {
            self.calls_through(&mut splice, u64::MAX);
        }
        if let Some((start, _)) = self.run.take() {
            self.push(Event::EmptyCache, start);
        }
        self.send();
    }
}

/// Where the second pass of a snapshot with private pools is in its [`PoolPlan`].
struct Splice {
    plan: Arc<PoolPlan>,
    next_call: CallCursor,
    next_point: usize,
}

/// The reading thread of [`StreamPlan::events`].
fn second_pass(
    path: &Path,
    serial: u32,
    limits: Limits,
    expected: u64,
    start: Option<MidRun>,
    routed: Option<Arc<PoolPlan>>,
    tx: SyncSender<Vec<(Event, u64)>>,
) -> Result<(), WholeTrace> {
    let file = std::fs::File::open(path).map_err(|_| WholeTrace::Changed)?;
    // A trace that starts mid-run: its live blocks keep ids `0..n`, its own
    // allocations are numbered after them (as `to_trace` numbers them).
    let (live, verify) = match start {
        Some(MidRun { start, verify }) => {
            let live: FastMap<u64, AllocId> = (start.segments.iter())
                .flat_map(|s| &s.blocks)
                .map(|b| (b.addr, b.id))
                .collect();
            (live, Some(verify))
        }
        None => (FastMap::default(), None),
    };
    let mid_run = verify.is_some();
    let events = Rc::new(RefCell::new(Events {
        tx,
        batch: Vec::with_capacity(BATCH),
        next_id: live.len() as u64,
        live,
        pending: None,
        run: None,
        entries: 0,
        verify,
        splice: routed.map(|plan| Splice {
            plan,
            next_call: CallCursor::default(),
            next_point: 0,
        }),
        failed: false,
        stopped: false,
    }));
    let shared = Rc::clone(&events);
    let factory: SinkFactory = Box::new(move |s| -> EntrySink {
        if s == serial {
            let events = Rc::clone(&shared);
            Box::new(move |index, entry, _| events.borrow_mut().entry(index, entry))
        } else {
            Box::new(|_, _, _| {})
        }
    });
    let root = pickle::read_value_streaming(std::io::BufReader::new(file), limits, factory);
    let read = matches!(root, Ok(Value::Dict(_)));
    drop(root);
    let mut events = events.borrow_mut();
    if !read || events.entries != expected || (events.failed && !mid_run) {
        return Err(WholeTrace::Changed);
    }
    if events.failed || events.verify.as_ref().is_some_and(|v| !v.finish()) {
        return Err(WholeTrace::StartsMidRun);
    }
    events.end();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference to a memo slot let go (a value the entry lane does not read,
    /// memoized with each entry) fails the streamed read, which then takes the
    /// whole-trace path, rather than reading another value; without a window it reads.
    #[test]
    fn a_slot_let_go_is_no_value() {
        let short = |p: &mut Vec<u8>, s: &str| {
            p.push(0x8c);
            p.push(s.len() as u8);
            p.extend_from_slice(s.as_bytes());
        };
        // {'device_traces': [[<1200 entries, each with a memoized 'compile_context'>]],
        //  'r': <the first entry's compile_context again>}
        let mut p = b"\x80\x04}\x94(".to_vec();
        short(&mut p, "device_traces");
        p.extend_from_slice(b"\x94]\x94(]\x94");
        for i in 0..1200u32 {
            // Appended in batches of 100, as Python's pickler batches them: the entry
            // lane reads those after the first batch.
            if i % 100 == 0 {
                p.push(b'(');
            }
            p.extend_from_slice(b"}\x94(");
            for (k, v) in [("action", "alloc"), ("compile_context", "N/A")] {
                short(&mut p, k);
                short(&mut p, v);
                if k == "compile_context" {
                    p.push(0x94);
                }
            }
            short(&mut p, "addr");
            p.push(b'J');
            p.extend_from_slice(&(i * 512).to_le_bytes());
            short(&mut p, "size");
            p.extend_from_slice(b"K\x01");
            short(&mut p, "stream");
            p.extend_from_slice(b"K\x00u");
            if i % 100 == 99 {
                p.push(b'e');
            }
        }
        p.push(b'e');
        short(&mut p, "r");
        // Entry i's dict is slot 4 + 2i, its compile_context slot 5 + 2i: entry 150's.
        p.push(b'j');
        p.extend_from_slice(&305u32.to_le_bytes());
        p.extend_from_slice(b"u.");
        let limits = |memo_window| Limits {
            memo_window,
            ..Limits::default()
        };
        let sinks = || -> SinkFactory { Box::new(|_| Box::new(|_, _, _| {})) };
        assert!(pickle::read_value_streaming(&p[..], limits(0), sinks()).is_ok());
        let e = pickle::read_value_streaming(&p[..], limits(100), sinks()).unwrap_err();
        assert!(
            format!("{e:?}").contains("memo key 305 was never stored"),
            "{e:?}"
        );
    }

    use crate::recorded::{BlockState, RecordedBlock};
    use crate::snapshot::{snapshot_bytes, SnapshotEncoding, SnapshotEntry, SnapshotOut};

    const S: u64 = 0x1000_0000;
    const T: u64 = 0x2000_0000;
    const SEG: u64 = 2 << 20;

    /// A final segment at `address` whose live blocks are `live` (512 bytes each).
    fn segment(address: u64, live: &[u64]) -> RecordedSegment {
        let mut blocks = Vec::new();
        let mut at = address;
        for &a in live {
            if a > at {
                blocks.push(RecordedBlock {
                    address: at,
                    size: a - at,
                    requested_size: Some(0),
                    state: BlockState::Inactive,
                });
            }
            blocks.push(RecordedBlock {
                address: a,
                size: 512,
                requested_size: Some(512),
                state: BlockState::ActiveAllocated,
            });
            at = a + 512;
        }
        blocks.push(RecordedBlock {
            address: at,
            size: address + SEG - at,
            requested_size: Some(0),
            state: BlockState::Inactive,
        });
        RecordedSegment {
            address,
            total_size: SEG,
            stream: 0,
            segment_type: "large".into(),
            allocated_size: 512 * live.len() as u64,
            blocks,
            is_expandable: false,
            pool_id: (0, 0),
        }
    }

    /// Whether the snapshot of `segments` and `entries` streams, and if so with the
    /// held path's start state and events; `None` where the held path refuses it or
    /// replays it from an empty allocator (undoing it failed).
    fn streams(segments: Vec<RecordedSegment>, entries: &[(Action, u64)]) -> Option<bool> {
        let snapshot = SnapshotOut {
            segments,
            entries: entries
                .iter()
                .map(|&(action, addr)| SnapshotEntry {
                    action,
                    addr,
                    size: if action.is_segment_op() { SEG } else { 512 },
                    stream: 0,
                    time_us: None,
                    stack: None,
                })
                .collect(),
            ..SnapshotOut::default()
        };
        let dir = std::env::temp_dir().join(format!("allocsim-verify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.pickle", entries.len()));
        std::fs::write(&path, snapshot_bytes(&snapshot, SnapshotEncoding::Pickle)).unwrap();
        let held = crate::read_snapshot_pickle(&path, 0).and_then(|r| r.to_trace());
        let streamed = plan_stream(&path, 0).ok().and_then(|plan| {
            let mut events = plan.events();
            let got: Vec<(Event, u64)> = events.by_ref().collect();
            events.finish().ok().map(|()| (plan, got))
        });
        std::fs::remove_file(&path).unwrap();
        match (held, streamed) {
            (Ok(trace), Some((plan, got))) if trace.start.is_some() => {
                assert_eq!(plan.start(), trace.start.as_ref());
                let expected: Vec<(Event, u64)> =
                    trace.events.into_iter().zip(trace.locations).collect();
                assert!(got == expected, "{entries:?}");
                Some(true)
            }
            (Ok(trace), None) if trace.start.is_some() => Some(false),
            (_, None) => None,
            (held, Some(_)) => panic!("streamed where held gives {held:?}: {entries:?}"),
        }
    }

    /// Each check that undoing the trace makes on blocks, made forward by the second
    /// pass, refuses what undoing refuses (the whole-trace path then reports it or
    /// replays from an empty allocator): a block freed in a segment released before,
    /// a segment allocated over a live block, blocks that end otherwise than the final
    /// segments list them, a block allocated twice; the same traces without the fault
    /// stream from the state undoing rebuilds.
    #[test]
    fn the_second_pass_refuses_what_undoing_refuses() {
        use Action::{Alloc, FreeCompleted as Fc, FreeRequested as Fr, SegmentAlloc, SegmentFree};
        let e = S + 4096;
        // A block live at the start (freed first), another allocated and left live.
        let fine = [(Fr, e), (Fc, e), (Alloc, S)];
        assert_eq!(streams(vec![segment(S, &[S])], &fine), Some(true));
        // Freed in a segment released before it (the segment at T, live at the start).
        let c = T + 512;
        let fine = [(Fr, e), (Fc, e), (Fr, c), (Fc, c), (SegmentFree, T)];
        assert_eq!(streams(vec![segment(S, &[])], &fine), Some(true));
        let late = [(Fr, e), (Fc, e), (Fr, c), (SegmentFree, T), (Fc, c)];
        assert_eq!(streams(vec![segment(S, &[])], &late), None);
        // A segment allocated over a block live right after it.
        let d = T + 1024;
        let fine = [
            (Fr, e),
            (Fc, e),
            (SegmentAlloc, T),
            (Alloc, d),
            (Fr, d),
            (Fc, d),
        ];
        let segments = || vec![segment(S, &[]), segment(T, &[])];
        assert_eq!(streams(segments(), &fine), Some(true));
        let over = [
            (Fr, e),
            (Fc, e),
            (Alloc, d),
            (SegmentAlloc, T),
            (Fr, d),
            (Fc, d),
        ];
        assert_eq!(streams(segments(), &over), None);
        // A block the trace leaves live that the final segments list free.
        assert_eq!(
            streams(vec![segment(S, &[])], &[(Fr, e), (Fc, e), (Alloc, S)]),
            None
        );
        // A block allocated, freed, then freed again.
        let twice = [
            (Fr, e),
            (Fc, e),
            (Alloc, S),
            (Fr, S),
            (Fc, S),
            (Fr, S),
            (Fc, S),
        ];
        assert_eq!(streams(vec![segment(S, &[])], &twice), None);
    }
}

#[cfg(test)]
mod pool_tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use serde_pickle::{HashableValue, Value as P};

    use super::*;

    const SEG: i64 = 2 << 20;
    const BASE: i64 = 0x7f00_0000_0000;

    fn dict(pairs: Vec<(&str, P)>) -> P {
        P::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| (HashableValue::String(k.into()), v))
                .collect(),
        )
    }

    fn pool(p: (i64, i64)) -> P {
        P::Tuple(vec![P::I64(p.0), P::I64(p.1)])
    }

    struct Seg {
        addr: i64,
        pool: (i64, i64),
        /// Block offsets: free, live, or live with its free requested.
        blocks: [u8; 8],
    }

    /// A random trace of four pools (the default ones, two graphs' and a MemPool's)
    /// from an empty allocator: segments allocated and given back at reused
    /// addresses (one at a time or in runs, followed or not by a malloc's segment, an
    /// `oom` or a `snapshot` entry), blocks allocated and freed at once or after
    /// waiting for other streams, on three streams. `mode` 0: every entry carries its
    /// `pool_id` (2.15); 1: none does (2.11: by address); 2: only the private pools'
    /// entries do. Some of the pools' segments are given back at the end. The last
    /// entry has a stack frame.
    fn pool_trace(seed: u64, mode: u8) -> P {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let pools = [(0, 0), (1, 0), (0, 1), (2, 0)];
        let mut segs: Vec<Seg> = Vec::new();
        let mut entries: Vec<P> = Vec::new();
        let mut time = 0;
        let mut push = |entries: &mut Vec<P>,
                        action: &str,
                        addr: i64,
                        size: i64,
                        stream: i64,
                        p: (i64, i64)| {
            time += 1;
            let mut items = vec![
                ("action", P::String(action.into())),
                (
                    if action == "oom" {
                        "device_free"
                    } else {
                        "addr"
                    },
                    P::I64(addr),
                ),
                ("size", P::I64(size)),
                ("stream", P::I64(stream)),
                ("time_us", P::I64(time)),
            ];
            if mode == 0 || (mode == 2 && p != (0, 0)) {
                items.push(("pool_id", pool(p)));
            }
            entries.push(dict(items));
        };
        let n = rng.gen_range(20..160);
        let pick_pool = |rng: &mut ChaCha8Rng| pools[rng.gen_range(0..4usize)];
        for _ in 0..n {
            let r = rng.gen_range(0..100);
            if r < 12 {
                let used: Vec<i64> = segs.iter().map(|s| s.addr).collect();
                let free: Vec<i64> = (0..6)
                    .map(|k| BASE + k * SEG)
                    .filter(|a| !used.contains(a))
                    .collect();
                if let Some(&addr) = free.get(rng.gen_range(0..free.len().max(1))) {
                    let p = pick_pool(&mut rng);
                    push(&mut entries, "segment_alloc", addr, SEG, 0, p);
                    segs.push(Seg {
                        addr,
                        pool: p,
                        blocks: [0; 8],
                    });
                }
            } else if r < 22 {
                // A run of releases of empty segments, then what may follow.
                let empty: Vec<usize> = (0..segs.len())
                    .filter(|&i| segs[i].blocks.iter().all(|&b| b == 0))
                    .collect();
                let take = rng.gen_range(1..=3usize).min(empty.len());
                for &i in empty.iter().rev().take(take) {
                    let s = segs.remove(i);
                    push(&mut entries, "segment_free", s.addr, SEG, 0, s.pool);
                }
                match rng.gen_range(0..4) {
                    0 => push(&mut entries, "snapshot", 0, 0, 0, (0, 0)),
                    1 => {
                        let p = pick_pool(&mut rng);
                        push(&mut entries, "oom", 1 << 20, 1 << 40, 0, p);
                    }
                    _ => {}
                }
            } else if r < 60 {
                if segs.is_empty() {
                    continue;
                }
                let i = rng.gen_range(0..segs.len());
                if let Some(k) = segs[i].blocks.iter().position(|&b| b == 0) {
                    segs[i].blocks[k] = 1;
                    let (addr, p) = (segs[i].addr + 512 * k as i64, segs[i].pool);
                    let stream = rng.gen_range(0..3);
                    push(&mut entries, "alloc", addr, 512, stream, p);
                }
            } else if r < 92 {
                let live: Vec<(usize, usize)> = (0..segs.len())
                    .flat_map(|i| (0..8).map(move |k| (i, k)))
                    .filter(|&(i, k)| segs[i].blocks[k] != 0)
                    .collect();
                if live.is_empty() {
                    continue;
                }
                let (i, k) = live[rng.gen_range(0..live.len())];
                let (addr, p) = (segs[i].addr + 512 * k as i64, segs[i].pool);
                if segs[i].blocks[k] == 1 && rng.gen_range(0..4) == 0 {
                    push(&mut entries, "free_requested", addr, 512, 0, p);
                    segs[i].blocks[k] = 2;
                } else {
                    if segs[i].blocks[k] == 1 && rng.gen_bool(0.5) {
                        push(&mut entries, "free_requested", addr, 512, 0, p);
                    }
                    push(&mut entries, "free_completed", addr, 512, 0, p);
                    segs[i].blocks[k] = 0;
                }
            } else if r < 96 {
                let p = pick_pool(&mut rng);
                push(
                    &mut entries,
                    "oom",
                    1 << 20,
                    1 << 40,
                    rng.gen_range(0..3),
                    p,
                );
            } else {
                push(&mut entries, "snapshot", 0, 0, 0, (0, 0));
            }
        }
        // Everything freed; some segments given back.
        for s in &mut segs {
            for k in 0..8 {
                if s.blocks[k] != 0 {
                    let addr = s.addr + 512 * k as i64;
                    push(&mut entries, "free_completed", addr, 512, 0, s.pool);
                    s.blocks[k] = 0;
                }
            }
        }
        segs.retain(|s| {
            let back = rng.gen_bool(0.3);
            if back {
                push(&mut entries, "segment_free", s.addr, SEG, 0, s.pool);
            }
            !back
        });
        let segments: Vec<P> = segs
            .iter()
            .map(|s| {
                dict(vec![
                    ("device", P::I64(0)),
                    ("address", P::I64(s.addr)),
                    ("total_size", P::I64(SEG)),
                    ("allocated_size", P::I64(0)),
                    ("stream", P::I64(0)),
                    ("segment_type", P::String("large".into())),
                    ("segment_pool_id", pool(s.pool)),
                    ("is_expandable", P::Bool(false)),
                    (
                        "blocks",
                        P::List(vec![dict(vec![
                            ("address", P::I64(s.addr)),
                            ("size", P::I64(SEG)),
                            ("requested_size", P::I64(0)),
                            ("state", P::String("inactive".into())),
                        ])]),
                    ),
                ])
            })
            .collect();
        let mut top = vec![
            ("segments", P::List(segments)),
            ("device_traces", P::List(vec![P::List(with_frame(entries))])),
        ];
        if seed % 3 == 0 {
            top.push((
                "allocator_settings",
                dict(vec![("garbage_collection_threshold", P::F64(0.0))]),
            ));
        }
        dict(top)
    }

    /// `entries` with a stack frame on the last (kept by `cut_head`): a snapshot with
    /// frames and no `empty_cache` call streams with its releases read by position.
    fn with_frame(mut entries: Vec<P>) -> Vec<P> {
        let frame = dict(vec![
            ("filename", P::String("train.py".into())),
            ("line", P::I64(1)),
            ("name", P::String("step".into())),
        ]);
        if let Some(P::Dict(d)) = entries.last_mut() {
            d.insert(HashableValue::String("frames".into()), P::List(vec![frame]));
        }
        entries
    }

    /// `pool_trace` with the first `k` entries of its trace cut off, as a ring buffer
    /// that wrapped keeps it, every `free_completed` after its `free_requested` (as
    /// PyTorch records a free, which undoing the trace relies on).
    fn cut_head(mut p: P, k: usize) -> P {
        let key = |k: &str| HashableValue::String(k.into());
        let field = |e: &P, k: &str| match e {
            P::Dict(d) => d.get(&key(k)).cloned(),
            _ => None,
        };
        if let P::Dict(top) = &mut p {
            if let Some(P::List(traces)) = top.get_mut(&key("device_traces")) {
                if let Some(P::List(entries)) = traces.first_mut() {
                    let mut out: Vec<P> = Vec::with_capacity(entries.len());
                    for e in entries.drain(..) {
                        let completed =
                            field(&e, "action") == Some(P::String("free_completed".into()));
                        let requested = out.last().is_some_and(|l| {
                            field(l, "action") == Some(P::String("free_requested".into()))
                                && field(l, "addr") == field(&e, "addr")
                        });
                        if completed && !requested {
                            let mut r = e.clone();
                            if let P::Dict(d) = &mut r {
                                d.insert(key("action"), P::String("free_requested".into()));
                            }
                            out.push(r);
                        }
                        out.push(e);
                    }
                    let k = k.min(out.len().saturating_sub(1));
                    out.drain(..k);
                    *entries = out;
                }
            }
        }
        p
    }

    /// `plan` streams `trace`'s events at the same entries (the held reader's trace of
    /// the same file), and its shell has `trace`'s state at the first entry, metadata
    /// and pools (random snapshot `seed`).
    fn assert_streams_as_held(plan: &StreamPlan, trace: &Trace, seed: u64) {
        let mut events = plan.events();
        let got: Vec<(Event, u64)> = events.by_ref().collect();
        events.finish().unwrap();
        let expected: Vec<(Event, u64)> = trace
            .events
            .iter()
            .cloned()
            .zip(trace.locations.clone())
            .collect();
        assert!(got == expected, "seed {seed}: {got:?}\n{expected:?}");
        let shell = plan.shell();
        assert_eq!(shell.start, trace.start, "seed {seed}");
        assert_eq!(shell.meta, trace.meta, "seed {seed}");
        assert_eq!(shell.pools(), trace.pools(), "seed {seed}");
    }

    /// `plan` of a file the held reader refuses ends its events with an error.
    fn assert_stream_fails(plan: &StreamPlan, seed: u64) {
        let mut events = plan.events();
        events.by_ref().for_each(drop);
        assert!(
            events.finish().is_err(),
            "seed {seed}: streamed what held refuses"
        );
    }

    /// Snapshots with private pools that start mid-run (the head of `pool_trace` cut
    /// off) stream as the held reader replays them: the same state at the first entry
    /// (private pools' segments in their pools, the pools live then), the same events
    /// (no `create_pool` of a pool live at the first entry), caveats and pools; or, where
    /// a segment the trace gives back has no pool the segment operations say, the
    /// streamed read declines and the held one replays.
    #[test]
    fn private_pools_mid_run_stream_as_held() {
        let dir = std::env::temp_dir().join(format!("allocsim-midpools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut streamed, mut declined, mut with_pools) = (0, 0, 0);
        for seed in 0..300u64 {
            let mode = (seed % 3) as u8;
            let path = dir.join(format!("{seed}.pickle"));
            let k = 10 + (seed as usize % 30);
            let bytes = serde_pickle::value_to_vec(
                &cut_head(pool_trace(seed, mode), k),
                serde_pickle::SerOptions::new(),
            )
            .unwrap();
            std::fs::write(&path, bytes).unwrap();
            let held = crate::read_snapshot_pickle(&path, 0).and_then(|r| r.to_trace());
            match (held, plan_stream(&path, 0)) {
                (Ok(trace), Ok(plan)) => {
                    assert_streams_as_held(&plan, &trace, seed);
                    streamed += 1;
                    with_pools += usize::from(trace.start.is_some_and(|s| !s.pools.is_empty()));
                }
                (Ok(trace), Err(WholeTrace::StartsMidRun)) => {
                    // A segment given back in the trace (its pool told by the requests
                    // in it, or not at all), or a trace the held path takes as starting
                    // empty: the held path replays.
                    declined += usize::from(trace.start.is_some());
                }
                (Ok(_), Err(why)) => panic!("seed {seed}: did not stream: {why:?}"),
                (Err(_), Ok(plan)) => assert_stream_fails(&plan, seed),
                (Err(_), Err(_)) => {}
            }
            std::fs::remove_file(&path).unwrap();
        }
        // Both ways had work to do, private pools live at the first entry included.
        assert!(
            streamed > 30 && declined > 20 && with_pools > 15,
            "{streamed} {declined} {with_pools}"
        );
    }

    /// Snapshots with private pools stream exactly as the held reader turns them into
    /// a trace: the same events at the same entries (the pool windows, the kept uses
    /// dropped, the pools' own `emptyCache`, the inferred `empty_cache` calls), the
    /// same caveats and pools, on random traces of every kind of pool attribution
    /// (by entry, by address, mixed), with and without garbage collection.
    #[test]
    fn private_pools_stream_as_held() {
        let dir = std::env::temp_dir().join(format!("allocsim-pools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut streamed, mut calls, mut caveats) = (0, 0, 0);
        let (mut empty_caches, mut pool_caches) = (0, 0);
        for seed in 0..600u64 {
            let mode = (seed % 3) as u8;
            let path = dir.join(format!("{seed}.pickle"));
            let bytes = serde_pickle::value_to_vec(
                &pool_trace(seed, mode),
                serde_pickle::SerOptions::new(),
            )
            .unwrap();
            std::fs::write(&path, bytes).unwrap();
            let held = crate::read_snapshot_pickle(&path, 0).and_then(|r| r.to_trace());
            let plan = plan_stream(&path, 0);
            match (held, plan) {
                (Ok(trace), Ok(plan)) => {
                    assert_streams_as_held(&plan, &trace, seed);
                    streamed += 1;
                    calls += trace.events.iter().filter(|e| e.pool().is_some()).count();
                    for e in &trace.events {
                        match e {
                            Event::EmptyCache => empty_caches += 1,
                            Event::EmptyPoolCache { .. } => pool_caches += 1,
                            _ => {}
                        }
                    }
                    caveats += trace.meta.caveats.len();
                }
                (Err(_), Ok(plan)) => assert_stream_fails(&plan, seed),
                (Ok(_), Err(why)) => panic!("seed {seed}: did not stream: {why:?}"),
                (Err(_), Err(_)) => {}
            }
            std::fs::remove_file(&path).unwrap();
        }
        // Every rule had work to do.
        assert!(
            streamed > 500
                && calls > 2000
                && caveats > 300
                && empty_caches > 300
                && pool_caches > 50,
            "{streamed} {calls} {caveats} {empty_caches} {pool_caches}"
        );
    }
}
