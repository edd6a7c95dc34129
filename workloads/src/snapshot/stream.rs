//! A snapshot pickle's replay, streamed: two passes over the file, neither holding
//! its entries.
//!
//! Turning a snapshot's entries into a trace needs the whole of them ([`RecordedRun::to_trace`]):
//! whether the trace starts from an empty allocator, `check_replayable`'s counts,
//! the private pool of each request and the addresses of every segment operation (the
//! device's address hints). [`plan_stream`], the **first pass**, reads the file with
//! the entries of each device trace sent to a tally instead of a store
//! (`schema::EntryStore::sink`), which keeps what the whole trace decides in memory
//! that follows the live blocks and segments, not the number of entries: the counts of
//! each action, the live block addresses and segments (the forward check that the
//! trace frees nothing it did not allocate, and leaves the segments the snapshot
//! lists), and the segment operations (address hints: 40 bytes per `segment_*`
//! entry). Its answer is a [`StreamPlan`], or [`WholeTrace`] with the reason the trace
//! needs the whole-trace reader.
//!
//! [`StreamPlan::events`], the **second pass**, reads the file again on a thread of its
//! own and gives the trace's events as they come, with the entry each came from,
//! exactly as [`RecordedRun::to_trace`] makes them from the held entries: ids in
//! order, a `free_requested` dropped when the very next entry completes it, and the
//! `empty_cache` calls the held reader infers (`empty_cache::empty_cache_points`: a
//! run of segment releases that no segment allocation, map or `oom` follows) decided
//! as the entry after the run arrives, placed before the run's first entry. Releases,
//! snapshots and annotations make no events, so an inferred call lands at the same
//! event index as in the held trace.
//!
//! What streams: a snapshot that starts from an empty allocator (its trace frees
//! nothing it did not allocate and leaves exactly the segments it lists), shows no
//! private pool (no entry's `pool_id`, no listed segment of one), and that
//! [`RecordedRun::check_replayable`] and `to_trace` accept. The rest (a ring buffer
//! that wrapped or a recording started late, whose start state is rebuilt backwards
//! from the final segments; private pools, whose windows need every request's pool;
//! any problem, which the whole-trace reader reports with all its details) answers
//! [`WholeTrace`]: read it whole. A ring buffer holds at most `max_entries` entries,
//! so the traces that need the whole-trace reader for their start are bounded by what
//! the recording kept.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

use super::pickle::{self, Limits, SinkFactory, Value};
use super::schema::EntrySink;
use super::{Parts, Snapshot, SnapshotOptions};
use crate::csv::file_stem;
use crate::recorded::{Action, RecordedEntry, RecordedRun};
use crate::trace::{AllocId, Event, LocationKind, Trace, TraceMeta};
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
    /// The snapshot shows private pools, whose windows need every request's pool.
    PrivatePools,
    /// The trace starts mid-run (or ends with other segments than the snapshot
    /// lists): its start state is rebuilt from the whole trace.
    StartsMidRun,
    /// The second pass did not read what the first did (the file changed).
    Changed,
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
}

/// What the first pass keeps of one list of entries.
#[derive(Default)]
struct Tally {
    len: u64,
    counts: [u64; 12],
    /// Live block addresses, and live segments (address → size), while the trace
    /// frees only what it allocated.
    blocks: HashSet<u64>,
    segments: HashMap<u64, u64>,
    mapped: u64,
    /// The trace frees, releases or unmaps what it did not allocate or map.
    midrun: bool,
    /// An `alloc` at an address already live (which `to_trace` refuses).
    alloc_over_live: bool,
    /// The segment operations, with their indexes.
    segment_ops: Vec<(u64, RecordedEntry)>,
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
    /// entry at a time (the two follow the same maps while nothing unknown is freed).
    fn entry(&mut self, index: u64, e: RecordedEntry) {
        self.len = index + 1;
        self.counts[slot(e.action)] += 1;
        if self.midrun {
            return;
        }
        if e.action.is_segment_op() {
            self.segment_ops.push((index, e));
        }
        match e.action {
            Action::Alloc if !self.blocks.insert(e.addr) => self.alloc_over_live = true,
            Action::FreeRequested if !self.blocks.contains(&e.addr) => self.midrun = true,
            Action::FreeCompleted if !self.blocks.remove(&e.addr) => self.midrun = true,
            Action::SegmentAlloc => {
                self.segments.insert(e.addr, e.size);
            }
            Action::SegmentFree if self.segments.remove(&e.addr).is_none() => self.midrun = true,
            Action::SegmentMap => self.mapped = self.mapped.saturating_add(e.size),
            Action::SegmentUnmap => match self.mapped.checked_sub(e.size) {
                Some(m) => self.mapped = m,
                None => self.midrun = true,
            },
            _ => {}
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
        Box::new(move |index, entry, _| tallies.borrow_mut()[at].entry(index, entry))
    });
    let root = pickle::read_value_streaming(std::io::BufReader::new(file), limits, factory)
        .map_err(|_| WholeTrace::Problem)?;
    let options = SnapshotOptions::default();
    let snapshot = Snapshot {
        path,
        device,
        options: &options,
        frames: RefCell::default(),
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
    if !store.pools.is_empty() || segments.iter().any(|s| s.pool_id != (0, 0)) {
        return Err(WholeTrace::PrivatePools);
    }
    if tally.midrun {
        return Err(WholeTrace::StartsMidRun);
    }
    // `leaves_listed_segments`.
    if !segments.is_empty() {
        let listed: HashMap<u64, u64> = segments
            .iter()
            .filter(|s| !s.is_expandable)
            .map(|s| (s.address, s.total_size))
            .collect();
        let listed_mapped: u64 = segments
            .iter()
            .filter(|s| s.is_expandable)
            .map(|s| s.total_size)
            .sum();
        if tally.segments != listed || tally.mapped != listed_mapped {
            return Err(WholeTrace::StartsMidRun);
        }
    }
    if tally.alloc_over_live {
        return Err(WholeTrace::NotReplayable);
    }
    let allocs = tally.count(Action::Alloc) + tally.count(Action::Oom);
    let (source_indexes, entries): (Vec<u64>, Vec<RecordedEntry>) =
        tally.segment_ops.into_iter().unzip();
    Ok(StreamPlan {
        run: RecordedRun {
            name: file_stem(path),
            path: path.to_path_buf(),
            meta: TraceMeta {
                format: Some(Format::TorchPickle),
                alloc_conf,
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
    })
}

/// Events sent from the reading thread at once.
const BATCH: usize = 8192;

impl StreamPlan {
    /// The trace without its events, for reports: name, path, metadata, locations
    /// counted in entries of the file, no start state (a streamed trace starts from
    /// an empty allocator).
    pub fn shell(&self) -> Trace {
        Trace {
            name: self.run.name.clone(),
            path: Some(self.run.path.clone()),
            events: Vec::new(),
            locations: Vec::new(),
            location_kind: LocationKind::Entry,
            meta: self.run.meta.clone(),
            id_names: Vec::new(),
            times_us: Vec::new(),
            start: None,
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
        let limits = Limits {
            memo_window,
            ..self.limits
        };
        let (serial, expected) = (self.serial, self.entries);
        let handle = std::thread::Builder::new()
            .name("snapshot-reader".into())
            .spawn(move || second_pass(&path, serial, limits, expected, tx))
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
    /// Whether the second pass gave every event of the trace the first pass planned.
    ///
    /// # Errors
    /// [`WholeTrace::Changed`] when it did not (the file changed, or the reading
    /// thread did not start).
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
    live: HashMap<u64, AllocId>,
    next_id: u64,
    /// A `free_requested` (its entry, address and id) waiting for the next entry,
    /// which drops it if it completes the free at once.
    pending: Option<(u64, u64, AllocId)>,
    /// An open run of segment releases: its first entry, and whether a `snapshot` or
    /// `annotate` entry has ended it (the entry deciding it is still to come).
    run: Option<(u64, bool)>,
    entries: u64,
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
                    let inside_malloc = matches!(
                        next,
                        Action::SegmentAlloc | Action::SegmentMap | Action::Oom
                    );
                    if !inside_malloc {
                        self.push(Event::EmptyCache, start);
                    }
                }
            }
        }
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

    /// After the last entry: the `free_requested` and the run of releases still open.
    fn end(&mut self) {
        if let Some((at, _, id)) = self.pending.take() {
            self.push(Event::FreeRequested { id }, at);
        }
        if let Some((start, _)) = self.run.take() {
            self.push(Event::EmptyCache, start);
        }
        self.send();
    }
}

/// The reading thread of [`StreamPlan::events`].
fn second_pass(
    path: &Path,
    serial: u32,
    limits: Limits,
    expected: u64,
    tx: SyncSender<Vec<(Event, u64)>>,
) -> Result<(), WholeTrace> {
    let file = std::fs::File::open(path).map_err(|_| WholeTrace::Changed)?;
    let events = Rc::new(RefCell::new(Events {
        tx,
        batch: Vec::with_capacity(BATCH),
        live: HashMap::new(),
        next_id: 0,
        pending: None,
        run: None,
        entries: 0,
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
    if !read || events.failed || events.entries != expected {
        return Err(WholeTrace::Changed);
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
}
