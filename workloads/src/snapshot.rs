//! PyTorch memory snapshot pickles (`torch.cuda.memory._dump_snapshot(path)`), the
//! file users already have, read into a [`RecordedRun`].
//!
//! **A reader built for snapshots.** The pickle is run by a streaming pickle machine
//! (the private `pickle` module, no Python needed) that reads the file in blocks and
//! turns each trace entry and segment into a typed record (in `schema`: entries decoded
//! from their keys directly, most of them without ever becoming a dict; segments
//! through `serde`-derived structs) as soon as its list receives it, so a snapshot
//! never exists as a generic value tree. Stack frames, `forward_frames`, `internal_metadata` and the
//! host allocator's traces are skipped as they are read unless asked for
//! ([`SnapshotOptions::keep_frames`]). Reading takes memory about the size of the file
//! or less (docs/performance.md has the figures). A replay need not hold the entries
//! at all: [`plan_stream`] and [`StreamPlan::events`] read the file twice, keeping only
//! what the whole trace decides (the private `stream` module).
//!
//! What is taken (PyTorch 2.1 to 2.15; keys this crate does not use are ignored):
//!
//! - `device_traces[device]`: each entry (`action`, `addr`, `size`, `stream`; an `oom`
//!   entry has `device_free` instead of `addr`) becomes a [`RecordedEntry`], in order
//!   (`oom` entries get address 0). `annotate` entries become [`Action::Annotate`] with
//!   their text in [`SnapshotInfo::annotations`]; entries of a private pool
//!   (`pool_id` other than `(0, 0)`, PyTorch 2.15 on) are listed in
//!   [`SnapshotInfo::entry_pools`];
//!   actions this crate does not know are kept as [`Action::Other`] and need no
//!   fields. `user_metadata`, `compile_context` and `time_us` are read but not kept
//!   (`time_us` places the external annotations).
//! - `allocator_settings`: every setting, in [`SnapshotInfo::allocator_settings`];
//!   `PYTORCH_CUDA_ALLOC_CONF` also becomes the `alloc_conf` of [`RecordedRun::meta`]
//!   (`None` when the snapshot has no settings, as before PyTorch 2.5).
//! - `segments` of the chosen device become [`RecordedSegment`]s with their pool id,
//!   `is_expandable` and blocks (address, size, requested size, state).
//! - `external_annotations` of the device, placed at the first entry recorded at or
//!   after their time, in [`SnapshotInfo::external_annotations`].
//! - `host_segments` / `host_traces` (pinned host memory) are noted, not replayed.
//! - The last `oom` entry, if any, becomes [`RecordedRun::oom`], with a message made
//!   from the entry (the snapshot does not hold PyTorch's error text) and `trace_len`
//!   = its index + 1.
//! - Not in a snapshot, so left unknown: the cap, the device's total memory and name,
//!   the PyTorch version, checkpoints and final statistics.
//!
//! Integers stay exact: addresses and stream handles are 64-bit values that Python
//! may pickle as short or long ints; negative ones (the `int64_t` view PyTorch gives
//! some handles) are taken as their 64-bit pattern. Sizes must be non-negative.
//!
//! **Inferred `empty_cache`** ([`infer_empty_cache`]): snapshots do not record
//! `torch.cuda.empty_cache()` calls, but the segment releases they make; an
//! [`Action::EmptyCache`] entry is inserted before each such run of releases. Because
//! of the insertions, [`RecordedRun::source_indexes`] maps entries back to the
//! pickle's own 0-based entry indexes (an inserted entry takes the index of the run's
//! first entry), so `entry N` in messages and event locations always means
//! `device_traces[device][N]` of the file. A run right before a segment allocation is a
//! malloc's own by position, unless the stack frames show `torch.cuda.empty_cache()`:
//! a snapshot whose bytes name `empty_cache` and that has such a run is read again from
//! its file with frames (the private `seen` module).
//!
//! **Private pools** (CUDA graphs, MemPools): the pool of each request is its entry's
//! `pool_id` (2.15), or that of the listed segment its block lies in (2.11's
//! `segment_pool_id`, for memory not given back before the snapshot was taken); the
//! reader turns them into the trace's pool windows ([`RecordedRun::calls`]) and says
//! in [`TraceMeta::caveats`] what it cannot attribute or place. The rules are in
//! [`SnapshotPools`]'s module (`snapshot/pools.rs`) and `docs/trace-format.md`;
//! [`SnapshotInfo::pools`] has the pool of every request. The `alloc` entries of a
//! checkpoint restore (`torch.compile`'s CUDA graph trees setting their pool back) get
//! their `restore_block` from their stack frames: while reading, the private `seen`
//! module looks for the trees' file name in the bytes, and a snapshot that names it
//! and shows private pools is read again from its file with frames (not kept unless
//! asked for); one that names it and shows no private pool gets a warning (the trees'
//! pool was gone).
//!
//! **Reading keeps what the file holds; replaying checks it can.** A snapshot whose
//! recording started late or whose ring buffer wrapped, one taken without a trace
//! (`include_traces=False`, or a bare `torch.cuda.memory_snapshot()` list of
//! segments), or one recorded with `skip_actions` that left out what a replay needs,
//! reads fine (its segments describe the allocator's state at the end) but
//! [`RecordedRun::to_trace`] refuses it with [`RecordedRun::check_replayable`]'s
//! message saying what is missing.
//!
//! Errors name `entry N` (0-based index into the device trace), `segment N` (0-based
//! index into `segments`) or `byte N` (where the pickle stops making sense). Hostile
//! bytes cannot make the reader overflow its stack, run for long or take memory out of
//! proportion to the input: see the private `pickle` module for the bounds. As with any
//! pickle, only load files from sources you trust.

mod empty_cache;
#[cfg(test)]
mod lane_tests;
mod pickle;
mod pools;
mod replayable;
mod schema;
mod seen;
mod stream;
mod value_de;
mod write;

use std::fmt;
use std::io;
use std::path::Path;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

pub use empty_cache::infer_empty_cache;
pub use pools::SnapshotPools;
pub use schema::Frame;
pub use stream::{plan_stream, plan_stream_with, StreamEvents, StreamPlan, WholeTrace};
pub use write::{snapshot_bytes, write_snapshot, SnapshotEncoding, SnapshotEntry, SnapshotOut};

use crate::csv::file_stem;
use crate::recorded::{Action, RecordedEntry, RecordedOom, RecordedRun, RecordedSegment};
use crate::size::format_size_human;
use crate::trace::{PoolId, TraceMeta};
use crate::{Format, ReadError};
use empty_cache::{empty_cache_points, insert_at};
use pickle::{Items, Limits, PickleError, Value};
use schema::{EntryStore, SegmentStore};
use value_de::escape;

/// How to read a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Keep the stack frames of trace entries ([`SnapshotInfo::frames`]). Off by
    /// default: frames are most of a snapshot's bytes and no replay needs them.
    pub keep_frames: bool,
}

/// What only a snapshot pickle records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotInfo {
    /// The device whose trace was read.
    pub device: usize,
    /// How many device traces the snapshot holds.
    pub device_traces: usize,
    /// Whether the snapshot holds a trace at all (`device_traces` present and not
    /// empty): `false` for `include_traces=False` and bare `memory_snapshot()` lists.
    pub traced: bool,
    /// `allocator_settings`, every key as written, in file order.
    pub allocator_settings: Vec<(String, SettingValue)>,
    /// The `annotate` entries: metadata attached to live allocations.
    pub annotations: Vec<Annotation>,
    /// `external_annotations` of this device (profiler ranges and the like).
    pub external_annotations: Vec<ExternalAnnotation>,
    /// Entries of a private memory pool: (entry index in the file, pool id).
    pub entry_pools: Vec<(u64, (u64, u64))>,
    /// The pool of each request, as far as the snapshot says (see [`SnapshotPools`]).
    pub pools: SnapshotPools,
    /// Whether the snapshot holds pinned host memory (`host_segments`,
    /// `host_traces`), which is not replayed.
    pub host_memory: bool,
    /// Stack frames of the trace entries, when asked for.
    pub frames: Option<Frames>,
}

impl SnapshotInfo {
    /// The allocator setting `name`, if recorded.
    pub fn setting(&self, name: &str) -> Option<&SettingValue> {
        self.allocator_settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// An `annotate` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    /// Index of the entry in the file's trace.
    pub entry: u64,
    /// Base address of the allocation annotated.
    pub addr: u64,
    /// The annotation (`user_metadata`).
    pub text: String,
}

/// An element of the snapshot's `external_annotations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalAnnotation {
    /// The first entry of the trace recorded at or after it (the trace's length if
    /// none): where it falls in the trace.
    pub entry: u64,
    /// `time_us`, if recorded.
    pub time_us: Option<u64>,
    /// Its other fields (PyTorch writes `stage` and `name`), as text.
    pub fields: Vec<(String, String)>,
}

/// The stack frames of trace entries: each distinct frame stored once, the stacks one
/// after the other in one arena (each distinct stack once while the reader finds
/// repeats: see `schema::FrameTable`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frames {
    /// The distinct frames.
    pub frames: Vec<Frame>,
    /// The stacks, one after the other, as indexes into `frames`, innermost frame
    /// first as PyTorch writes them.
    pub stack_frames: Vec<u32>,
    /// Where each stack ends in `stack_frames` (stack `k` starts where `k - 1` ends).
    pub stack_ends: Vec<usize>,
    /// (entry index in the file, stack index) for each entry with frames.
    pub entries: Vec<(u64, u32)>,
}

impl Frames {
    /// The frames of stack `index` (none for an index out of range).
    pub fn stack(&self, index: u32) -> impl Iterator<Item = &Frame> {
        self.stack_indexes(index)
            .iter()
            .map(|&f| &self.frames[f as usize])
    }

    /// The frame indexes of stack `index` (empty for an index out of range).
    pub fn stack_indexes(&self, index: u32) -> &[u32] {
        let k = index as usize;
        let Some(&end) = self.stack_ends.get(k) else {
            return &[];
        };
        let start = if k == 0 { 0 } else { self.stack_ends[k - 1] };
        self.stack_frames.get(start..end).unwrap_or(&[])
    }

    /// How many stacks there are.
    pub fn stack_count(&self) -> usize {
        self.stack_ends.len()
    }

    /// Adds a stack of frame indexes; returns its index.
    pub fn push_stack(&mut self, frames: &[u32]) -> u32 {
        self.stack_frames.extend_from_slice(frames);
        self.stack_ends.push(self.stack_frames.len());
        (self.stack_ends.len() - 1) as u32
    }
}

/// A value of `allocator_settings`.
#[derive(Clone, Debug, PartialEq)]
pub enum SettingValue {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// An integer above `i64::MAX`.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A string.
    Text(String),
    /// A list or tuple.
    List(Vec<SettingValue>),
    /// A dict, keys as text, in file order.
    Map(Vec<(String, SettingValue)>),
}

impl fmt::Display for SettingValue {
    /// Python's notation (`True`, `0.0`, `{'1': 0}` is written `{1: 0}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingValue::None => f.write_str("None"),
            SettingValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            SettingValue::Int(i) => write!(f, "{i}"),
            SettingValue::UInt(u) => write!(f, "{u}"),
            SettingValue::Float(x) => write!(f, "{x:?}"),
            SettingValue::Text(s) => f.write_str(s),
            SettingValue::List(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            SettingValue::Map(items) => {
                f.write_str("{")?;
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl<'de> Deserialize<'de> for SettingValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SettingValue, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SettingValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a plain value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<SettingValue, E> {
                Ok(SettingValue::None)
            }
            fn visit_none<E: de::Error>(self) -> Result<SettingValue, E> {
                Ok(SettingValue::None)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<SettingValue, E> {
                Ok(SettingValue::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SettingValue, E> {
                Ok(SettingValue::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SettingValue, E> {
                Ok(i64::try_from(v).map_or(SettingValue::UInt(v), SettingValue::Int))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<SettingValue, E> {
                Ok(SettingValue::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SettingValue, E> {
                Ok(SettingValue::Text(v.to_string()))
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<SettingValue, E> {
                Ok(SettingValue::Text(String::new()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SettingValue, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = seq.next_element()? {
                    items.push(v);
                }
                Ok(SettingValue::List(items))
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SettingValue, A::Error> {
                let mut items = Vec::new();
                while let Some((k, v)) = map.next_entry::<SettingValue, SettingValue>()? {
                    items.push((k.to_string(), v));
                }
                Ok(SettingValue::Map(items))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads `device_traces[device]` and the matching segments of a PyTorch snapshot
/// pickle (see the module docs).
///
/// # Errors
/// I/O errors; a file that is not a pickle or not a snapshot
/// ([`ReadErrorKind::Syntax`](crate::ReadErrorKind::Syntax)); `device` out of range and
/// entries or segments with missing or negative fields
/// ([`ReadErrorKind::Invalid`](crate::ReadErrorKind::Invalid)).
pub fn read_snapshot_pickle(path: &Path, device: usize) -> Result<RecordedRun, ReadError> {
    read_snapshot_pickle_with(path, device, &SnapshotOptions::default())
}

/// [`read_snapshot_pickle`] with options.
///
/// # Errors
/// As [`read_snapshot_pickle`].
pub fn read_snapshot_pickle_with(
    path: &Path,
    device: usize,
    options: &SnapshotOptions,
) -> Result<RecordedRun, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
    let mut limits = Limits::default();
    // A regular file cannot hold more than its size; other sources keep the default cap.
    if let Ok(meta) = file.metadata() {
        if meta.is_file() {
            limits.max_input = meta.len();
        }
    }
    let (run, needs_frames) = read(file, path, device, options, limits)?;
    reread_with_frames(run, needs_frames, path, device, options)
}

/// A run read without stack frames from a snapshot that needs them
/// ([`seen::frames_needed`]: the CUDA graph trees with their pool, or
/// `torch.cuda.empty_cache()` where a release could be a malloc's): read again from
/// `path` with frames, so that the allocations of the trees' checkpoint restores take
/// their blocks ([`Event::RestoreBlock`]) and the releases of `empty_cache()` are
/// known, when `path` is a regular file (else the run as read, whose caveat says so).
/// Frames not asked for are not kept.
///
/// [`Event::RestoreBlock`]: crate::Event::RestoreBlock
fn reread_with_frames(
    run: RecordedRun,
    needs_frames: bool,
    path: &Path,
    device: usize,
    options: &SnapshotOptions,
) -> Result<RecordedRun, ReadError> {
    if !needs_frames || options.keep_frames {
        return Ok(run);
    }
    let Ok(file) = std::fs::File::open(path) else {
        return Ok(run);
    };
    let Some(len) = file
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
    else {
        return Ok(run);
    };
    let limits = Limits {
        max_input: len,
        ..Limits::default()
    };
    let framed = SnapshotOptions { keep_frames: true };
    let (mut again, _) = read(file, path, device, &framed, limits)?;
    if let Some(s) = again.snapshot.as_mut() {
        s.frames = None;
    }
    Ok(again)
}

/// The format table's reader ([`crate::Format::TorchPickle`]): as
/// [`read_snapshot_pickle_with`], bounded by the file's size when it is a regular file.
pub(crate) fn read_input(input: crate::Input<'_>) -> Result<RecordedRun, ReadError> {
    let mut limits = Limits::default();
    if let Some(len) = input.len {
        limits.max_input = len;
    }
    let options = SnapshotOptions::default();
    let (run, needs_frames) = read(input.reader, input.path, input.device, &options, limits)?;
    reread_with_frames(run, needs_frames, input.path, input.device, &options)
}

/// As [`read_snapshot_pickle`], from any reader; `path` names the source in messages
/// and names the run (its stem). The reader is consumed as the pickle needs it (an
/// endless source stops with an error); a source that does not end within 16 GiB is
/// refused.
///
/// # Errors
/// As [`read_snapshot_pickle`].
pub fn read_snapshot_pickle_from(
    reader: impl io::Read,
    path: &Path,
    device: usize,
) -> Result<RecordedRun, ReadError> {
    read(
        reader,
        path,
        device,
        &SnapshotOptions::default(),
        Limits::default(),
    )
    .map(|(run, _)| run)
}

/// [`read_snapshot_pickle_from`] with options.
///
/// # Errors
/// As [`read_snapshot_pickle`].
pub fn read_snapshot_pickle_from_with(
    reader: impl io::Read,
    path: &Path,
    device: usize,
    options: &SnapshotOptions,
) -> Result<RecordedRun, ReadError> {
    read(reader, path, device, options, Limits::default()).map(|(run, _)| run)
}

/// The stack frames PyTorch recorded for the entry of event `index` of `trace`, a trace
/// read from the snapshot pickle that `reader` reads again, this time with frames (only
/// an out-of-memory needs them): innermost first, each `file:line name`. Empty when
/// `trace` is not a snapshot's, the entry has no frames, or the pickle no longer reads.
/// The command line's `replay` and the Python package show them at an out-of-memory.
pub fn event_stack(
    trace: &crate::Trace,
    index: u64,
    reader: impl io::Read,
    device: usize,
) -> Vec<String> {
    if trace.meta.format != Some(Format::TorchPickle) {
        return Vec::new();
    }
    let Some(&entry) = trace.locations.get(index as usize) else {
        return Vec::new();
    };
    let path = trace
        .path
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from(&trace.name));
    let options = SnapshotOptions { keep_frames: true };
    let Ok(run) = read_snapshot_pickle_from_with(reader, &path, device, &options) else {
        return Vec::new();
    };
    let Some(frames) = run.snapshot.and_then(|s| s.frames) else {
        return Vec::new();
    };
    let Some(&(_, stack)) = frames.entries.iter().find(|(e, _)| *e == entry) else {
        return Vec::new();
    };
    frames
        .stack(stack)
        .map(|f| format!("{}:{} {}", f.filename, f.line, f.name))
        .collect()
}

/// The run, and whether it needs its stack frames ([`seen::frames_needed`]).
fn read(
    reader: impl io::Read,
    path: &Path,
    device: usize,
    options: &SnapshotOptions,
    limits: Limits,
) -> Result<(RecordedRun, bool), ReadError> {
    let found = std::rc::Rc::new(std::cell::Cell::new(seen::Seen::default()));
    let scan = seen::Scan::new(reader, std::rc::Rc::clone(&found));
    let (root, frames) =
        pickle::read_value(scan, limits, options.keep_frames).map_err(|e| match *e {
            PickleError::Io(e) => ReadError::io(path, &e),
            PickleError::Bad { offset, message } => {
                ReadError::syntax(path, Some(format!("byte {offset}")), escape(&message))
            }
        })?;
    let snapshot = Snapshot {
        path,
        device,
        options,
        frames: std::cell::RefCell::new(frames),
        seen: found.get(),
        needs_frames: std::cell::Cell::new(false),
    };
    let run = snapshot.assemble(&root)?;
    Ok((run, snapshot.needs_frames.get()))
}

/// What a snapshot holds for one device, read ([`Snapshot::parts`]).
struct Parts {
    /// The device's trace entries (none kept in a streamed read).
    store: EntryStore,
    /// The device's segments.
    segments: Vec<RecordedSegment>,
    /// What only a snapshot records, as far as read (annotations, pools and frames are
    /// filled from the entries by [`Snapshot::finish`]).
    info: SnapshotInfo,
    /// `PYTORCH_CUDA_ALLOC_CONF` of the settings.
    alloc_conf: Option<String>,
}

/// Turns the pickled value into a run.
struct Snapshot<'a> {
    path: &'a Path,
    device: usize,
    options: &'a SnapshotOptions,
    /// The stack frames read (when kept).
    frames: std::cell::RefCell<schema::FrameTable>,
    /// What the file's bytes named.
    seen: seen::Seen,
    /// Whether the trace needs its stack frames ([`seen::frames_needed`]; set when
    /// it is assembled).
    needs_frames: std::cell::Cell<bool>,
}

impl Snapshot<'_> {
    fn not_snapshot(&self, what: &str) -> ReadError {
        ReadError::syntax(
            self.path,
            None,
            format!(
                "not a PyTorch memory snapshot ({what}; expected the dict written by \
                 torch.cuda.memory._dump_snapshot, with 'device_traces' and 'segments')"
            ),
        )
    }

    fn invalid(&self, location: Option<String>, message: String) -> ReadError {
        ReadError::invalid(self.path, location, escape(&message))
    }

    fn assemble(&self, root: &Value) -> Result<RecordedRun, ReadError> {
        let Parts {
            store,
            segments,
            info,
            alloc_conf,
        } = self.parts(root)?;
        self.finish(store, segments, info, alloc_conf)
    }

    /// What the pickle holds for the chosen device, before its entries become a run
    /// (a streamed read's store holds no entries: its sink had them).
    fn parts(&self, root: &Value) -> Result<Parts, ReadError> {
        let top = match root {
            Value::Dict(d) => d,
            // torch.cuda.memory_snapshot() pickled: the segments alone.
            Value::List(_) => return self.segments_only(root),
            other => return Err(self.not_snapshot(&format!("the pickle holds {}", other.kind()))),
        };
        let traces = top.get("device_traces");
        let segments = top.get("segments");
        if traces.is_none() && segments.is_none() {
            return Err(self.not_snapshot("no 'device_traces'"));
        }
        let mut info = SnapshotInfo {
            device: self.device,
            ..SnapshotInfo::default()
        };
        let store = match &traces {
            None => EntryStore::default(),
            Some(traces) => self.device_trace(traces, &mut info)?,
        };
        let segments = match &segments {
            None => Vec::new(),
            Some(list) => self.segments(list)?,
        };
        if let Some(settings) = top.get("allocator_settings") {
            if let SettingValue::Map(items) =
                schema::convert::<SettingValue>(&settings, "'allocator_settings'")
                    .map_err(|m| self.invalid(None, m))?
            {
                info.allocator_settings = items;
            }
        }
        let alloc_conf = match info.setting("PYTORCH_CUDA_ALLOC_CONF") {
            Some(SettingValue::Text(conf)) => Some(conf.clone()),
            _ => None,
        };
        if let Some(list) = top.get("external_annotations") {
            let raw: Vec<schema::RawExternal> = schema::convert(&list, "'external_annotations'")
                .map_err(|m| self.invalid(None, m))?;
            info.external_annotations = raw
                .into_iter()
                .filter(|a| a.device.is_none_or(|d| d == self.device as u64))
                .map(|a| ExternalAnnotation {
                    entry: match a.time_us {
                        Some(t) => store.times.partition_point(|&x| x < t) as u64,
                        None => store.entries.len() as u64,
                    },
                    time_us: a.time_us,
                    fields: a.fields,
                })
                .collect();
        }
        info.host_memory = top.get("host_segments").is_some() || top.get("host_traces").is_some();
        Ok(Parts {
            store,
            segments,
            info,
            alloc_conf,
        })
    }

    /// A pickled `torch.cuda.memory_snapshot()`: a list of segments, no trace.
    fn segments_only(&self, root: &Value) -> Result<Parts, ReadError> {
        let segments = self.segments(root)?;
        let info = SnapshotInfo {
            device: self.device,
            ..SnapshotInfo::default()
        };
        Ok(Parts {
            store: EntryStore::default(),
            segments,
            info,
            alloc_conf: None,
        })
    }

    /// The chosen device's entries, and how many devices there are.
    fn device_trace(
        &self,
        traces: &Value,
        info: &mut SnapshotInfo,
    ) -> Result<EntryStore, ReadError> {
        let Value::List(list) = traces else {
            return Err(self.not_snapshot("'device_traces' is not a list"));
        };
        let items = list.items.borrow();
        let Items::Values(per_device) = &*items else {
            return Err(self.not_snapshot(
                "'device_traces' holds records, expected one list of entries per device",
            ));
        };
        info.device_traces = per_device.len();
        info.traced = !per_device.is_empty();
        if per_device.is_empty() {
            return Ok(EntryStore::default());
        }
        let Some(trace) = per_device.get(self.device) else {
            let have = match per_device.len() {
                1 => "1 device trace (device 0)".to_string(),
                n => format!("{n} device traces (devices 0 to {})", n - 1),
            };
            return Err(ReadError::invalid(
                self.path,
                None,
                format!(
                    "device {} is not in the snapshot: it has {have}",
                    self.device
                ),
            ));
        };
        let Value::List(trace) = trace else {
            return Err(self.not_snapshot(&format!(
                "device_traces[{}] is {}, not a list",
                self.device,
                trace.kind()
            )));
        };
        let mut items = trace.items.borrow_mut();
        let store = match &mut *items {
            Items::Entries(store) => std::mem::take(&mut **store),
            Items::Values(values) => {
                let mut frames = self.frames.borrow_mut();
                let table = self.options.keep_frames.then_some(&mut *frames);
                schema::entries_of(values, table)
            }
            Items::Segments(_) => {
                return Err(
                    self.not_snapshot(&format!("device_traces[{}] holds segments", self.device))
                )
            }
        };
        if let Some((index, message)) = &store.error {
            return Err(self.invalid(Some(format!("entry {index}")), message.clone()));
        }
        Ok(store)
    }

    /// The chosen device's segments.
    fn segments(&self, list: &Value) -> Result<Vec<RecordedSegment>, ReadError> {
        let Value::List(list) = list else {
            return Err(self.not_snapshot("'segments' is not a list"));
        };
        let mut items = list.items.borrow_mut();
        let store: SegmentStore = match &mut *items {
            Items::Segments(store) => std::mem::take(&mut **store),
            Items::Values(values) => schema::segments_of(values),
            Items::Entries(_) => return Err(self.not_snapshot("'segments' holds trace entries")),
        };
        let device = self.device as u64;
        if let Some((index, _, message)) = store
            .errors
            .iter()
            .find(|(_, d, _)| d.is_none_or(|d| d == device))
        {
            return Err(self.invalid(Some(format!("segment {index}")), message.clone()));
        }
        Ok(store
            .segments
            .into_iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, s)| s)
            .collect())
    }

    fn finish(
        &self,
        store: EntryStore,
        segments: Vec<RecordedSegment>,
        mut info: SnapshotInfo,
        alloc_conf: Option<String>,
    ) -> Result<RecordedRun, ReadError> {
        let EntryStore {
            entries,
            times,
            pools,
            pool_ids,
            device_free,
            annotations,
            stacks,
            ..
        } = store;
        let last_oom = entries
            .iter()
            .rposition(|e| e.action == Action::Oom)
            .map(|i| {
                let free = device_free
                    .iter()
                    .find(|&&(k, _)| k == i as u64)
                    .map_or(0, |&(_, f)| f);
                (i, entries[i].size, free)
            });
        info.entry_pools = pools.iter().map(|&(i, p)| (i, (p.0, p.1))).collect();
        info.annotations = annotations
            .into_iter()
            .map(|(i, text)| Annotation {
                entry: i,
                addr: entries[i as usize].addr,
                text,
            })
            .collect();
        if self.options.keep_frames {
            info.frames = Some(self.frames.take().into_frames(stacks));
        }
        // The CUDA graph trees' allocations and their checkpoint restores', by frames.
        let from_frames = match &info.frames {
            Some(frames) => from_frames(&entries, frames),
            _ => pools::FromFrames::default(),
        };
        // The pool of each request, and the releases that were a private pool's own
        // emptyCache rather than torch.cuda.empty_cache().
        let entry_pools: Vec<(u64, PoolId)> =
            pools.iter().map(|&(i, p)| (i, PoolId(p.0, p.1))).collect();
        let every_entry = !entries.is_empty() && pool_ids == entries.len() as u64;
        let attribution = pools::attribute(&entries, &entry_pools, every_entry, &segments);
        let mut pool_caches = Vec::new();
        let gc_possible = gc_possible(&info);
        // The first run of releases taken for a malloc's own by position alone.
        let mut ambiguous: Option<usize> = None;
        let points = empty_cache_points(&entries, |start, end, inside_malloc| {
            // `torch.cuda.empty_cache()` by its frames, wherever the releases fall.
            let called = from_frames
                .empty_caches
                .get(from_frames.empty_caches.partition_point(|&i| i < start))
                .is_some_and(|&i| i < end);
            if called {
                return true;
            }
            match attribution.release_run(start, end, inside_malloc, gc_possible) {
                pools::ReleaseRun::Malloc => {
                    ambiguous.get_or_insert(start);
                    false
                }
                pools::ReleaseRun::EmptyCache => true,
                pools::ReleaseRun::PoolCache(slot) => {
                    pool_caches.push((start, slot));
                    false
                }
            }
        });
        let source_indexes = empty_cache::source_indexes(entries.len(), &points);
        let pools::Routing {
            calls,
            caveats,
            pools: pool_summary,
        } = attribution.events(
            &entries,
            entries.len() + points.len(),
            &source_indexes,
            &pool_caches,
            &from_frames,
            &points,
        );
        drop(attribution);
        let shows_pools = !pool_summary.shown.is_empty();
        let needs_frames = seen::frames_needed(self.seen, shows_pools, ambiguous.is_some());
        self.needs_frames.set(needs_frames);
        let mut caveats = caveats;
        caveats.extend(seen::caveat(
            self.seen,
            shows_pools,
            needs_frames && !self.options.keep_frames,
        ));
        if let Some(at) = ambiguous.filter(|_| !self.seen.frames) {
            caveats.push(seen::no_frames_caveat(at));
        }
        info.pools = pool_summary;
        // The inferred entries go in place (a snapshot's trace can be millions of
        // entries: no copy); each takes the time of the entry it was inserted before.
        let mut entries = entries;
        insert_at(&mut entries, &points, |_| empty_cache::EMPTY_CACHE);
        let times_us = if times.iter().any(|&t| t > 0) {
            let mut times = times;
            insert_at(&mut times, &points, |t| t);
            times
        } else {
            Vec::new()
        };
        Ok(RecordedRun {
            name: file_stem(self.path),
            path: self.path.to_path_buf(),
            meta: TraceMeta {
                format: Some(Format::TorchPickle),
                alloc_conf,
                caveats,
                ..TraceMeta::default()
            },
            calls,
            entries,
            source_indexes,
            oom: last_oom.map(|(index, size, device_free)| RecordedOom {
                message: format!(
                    "CUDA out of memory: tried to allocate {} with {} free on the device \
                     (from the snapshot's oom entry {index})",
                    format_size_human(size),
                    format_size_human(device_free)
                ),
                trace_len: index as u64 + 1,
            }),
            segments,
            snapshot: Some(info),
            times_us,
            ..RecordedRun::default()
        })
    }
}

/// What the stack frames say ([`pools::FromFrames`]): the `alloc` entries (indexes in
/// the file) whose stack holds a checkpoint restore's frame ([`seen::is_restore_frame`])
/// or a frame of the CUDA graph trees' file ([`seen::is_trees_frame`]), and the
/// segment releases whose stack holds `torch.cuda.empty_cache()`'s
/// ([`seen::is_empty_cache_frame`]).
fn from_frames(entries: &[RecordedEntry], frames: &Frames) -> pools::FromFrames {
    // Per frame, then per stack (computed once): restore, trees, empty_cache.
    let marks: Vec<[bool; 3]> = frames
        .frames
        .iter()
        .map(|f| {
            [
                seen::is_restore_frame(&f.name),
                seen::is_trees_frame(&f.filename),
                seen::is_empty_cache_frame(&f.name, &f.filename),
            ]
        })
        .collect();
    let mut stacks: Vec<Option<[bool; 3]>> = vec![None; frames.stack_count()];
    let mut out = pools::FromFrames::default();
    for &(entry, stack) in &frames.entries {
        let Some(e) = entries.get(entry as usize) else {
            continue;
        };
        let release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        if e.action != Action::Alloc && !release {
            continue;
        }
        let Some(slot) = stacks.get_mut(stack as usize) else {
            continue;
        };
        let [restore, trees, empty_cache] = *slot.get_or_insert_with(|| {
            let mut any = [false; 3];
            for &f in frames.stack_indexes(stack) {
                let m = marks.get(f as usize).copied().unwrap_or_default();
                for (a, b) in any.iter_mut().zip(m) {
                    *a |= b;
                }
            }
            any
        });
        let entry = entry as usize;
        if release {
            if empty_cache {
                out.empty_caches.push(entry);
            }
            continue;
        }
        if restore {
            out.restores.push(entry);
        }
        if trees {
            out.trees.push(entry);
        }
    }
    out.restores.sort_unstable();
    out.trees.sort_unstable();
    out.empty_caches.sort_unstable();
    out
}

/// Whether garbage collection may give back default-pool segments inside any malloc:
/// it runs only with a threshold above 0 (unknown before 2.5: assumed on).
fn gc_possible(info: &SnapshotInfo) -> bool {
    match info.setting("garbage_collection_threshold") {
        Some(SettingValue::Float(t)) => *t > 0.0,
        Some(SettingValue::Int(t)) => *t > 0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_pickle::{HashableValue, Value as P};

    use super::*;
    use crate::recorded::{read_recorded_json, BlockState, RecordedBlock, RecordedEntry};
    use crate::trace::Event;

    fn s(text: &str) -> HashableValue {
        HashableValue::String(text.into())
    }

    fn dict(pairs: Vec<(&str, P)>) -> P {
        P::Dict(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn entry(action: &str, addr: i64, size: i64) -> P {
        dict(vec![
            ("action", P::String(action.into())),
            ("addr", P::I64(addr)),
            ("size", P::I64(size)),
            ("stream", P::I64(0)),
            ("time_us", P::I64(1)),
        ])
    }

    fn segment(address: i64, total_size: i64, expandable: bool) -> P {
        dict(vec![
            ("device", P::I64(0)),
            ("address", P::I64(address)),
            ("total_size", P::I64(total_size)),
            ("allocated_size", P::I64(0)),
            ("stream", P::I64(0)),
            ("segment_type", P::String("large".into())),
            ("is_expandable", P::Bool(expandable)),
            ("segment_pool_id", P::Tuple(vec![P::I64(0), P::I64(0)])),
            ("frames", P::List(vec![])),
            (
                "blocks",
                P::List(vec![dict(vec![
                    ("size", P::I64(total_size)),
                    ("state", P::String("inactive".into())),
                ])]),
            ),
        ])
    }

    fn snapshot(traces: Vec<Vec<P>>, segments: Vec<P>) -> P {
        dict(vec![
            ("segments", P::List(segments)),
            (
                "device_traces",
                P::List(traces.into_iter().map(P::List).collect()),
            ),
            (
                "allocator_settings",
                dict(vec![(
                    "PYTORCH_CUDA_ALLOC_CONF",
                    P::String("expandable_segments:True".into()),
                )]),
            ),
        ])
    }

    fn pickle(v: &P) -> Vec<u8> {
        serde_pickle::value_to_vec(v, serde_pickle::SerOptions::new()).unwrap()
    }

    fn read(v: &P, device: usize) -> Result<RecordedRun, ReadError> {
        read_snapshot_pickle_from(&pickle(v)[..], Path::new("snap.pickle"), device)
    }

    fn read_bytes(bytes: &[u8]) -> Result<RecordedRun, ReadError> {
        read_snapshot_pickle_from(bytes, Path::new("x.pickle"), 0)
    }

    const G: i64 = 1 << 30;

    /// Entries, settings and segments are taken as documented, oom entries get address
    /// 0 and become the run's oom, and an empty_cache is inferred before a release run.
    #[test]
    fn reads_synthetic_snapshot() {
        let oom = dict(vec![
            ("action", P::String("oom".into())),
            ("device_free", P::I64(5 << 20)),
            ("size", P::I64(2 * G)),
            ("stream", P::I64(0)),
        ]);
        let trace = vec![
            entry("segment_alloc", 0x1000_0000, G),    // 0
            entry("alloc", 0x1000_0000, 100),          // 1
            entry("segment_alloc", 0x9000_0000, G),    // 2
            entry("alloc", 0x9000_0000, 200),          // 3
            entry("free_requested", 0x9000_0000, 200), // 4
            entry("free_completed", 0x9000_0000, 200), // 5
            entry("snapshot", 0, 0),                   // 6
            entry("segment_free", 0x9000_0000, G),     // 7: empty_cache
            entry("snapshot", 0, 0),                   // 8
            entry("free_requested", 0x1000_0000, 100), // 9
            entry("free_completed", 0x1000_0000, 100), // 10
            oom,                                       // 11
        ];
        let run = read(
            &snapshot(vec![trace], vec![segment(0x1000_0000, G, false)]),
            0,
        )
        .unwrap();
        assert_eq!(
            run.meta.alloc_conf.as_deref(),
            Some("expandable_segments:True")
        );
        assert_eq!(run.meta.format, Some(crate::Format::TorchPickle));
        assert_eq!(run.name, "snap");
        let actions: Vec<Action> = run.entries.iter().map(|e| e.action).collect();
        assert_eq!(actions[7], Action::EmptyCache);
        assert_eq!(actions[8], Action::SegmentFree);
        assert_eq!(
            run.source_indexes,
            vec![0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11]
        );
        assert_eq!(
            run.entries[12],
            RecordedEntry {
                action: Action::Oom,
                addr: 0,
                size: 2 << 30,
                stream: 0
            }
        );
        let oom = run.oom.as_ref().unwrap();
        assert_eq!(oom.trace_len, 12);
        assert!(
            oom.message.contains("2.00 GiB") && oom.message.contains("5.00 MiB"),
            "{}",
            oom.message
        );
        assert_eq!(run.segments.len(), 1);
        assert_eq!(
            run.segments[0].blocks,
            vec![RecordedBlock {
                address: 0x1000_0000,
                size: 1 << 30,
                requested_size: None,
                state: BlockState::Inactive
            }]
        );
        let t = run.to_trace().unwrap();
        assert_eq!(
            t.events.iter().skip(3).collect::<Vec<_>>(),
            vec![
                &Event::EmptyCache,
                &Event::Free {
                    id: crate::AllocId(0)
                },
                &Event::Alloc {
                    id: crate::AllocId(2),
                    size_bytes: 2 << 30,
                    stream: 0
                }
            ]
        );
        // Locations are the pickle's own entry indexes.
        assert_eq!(t.locations, vec![1, 3, 5, 7, 10, 11]);
    }

    /// Big and negative integers stay exact: a stream handle above 2^63 pickled as a
    /// long int, and a negative (int64 view) address, read as their 64-bit patterns.
    #[test]
    fn integers_stay_exact() {
        let big = 0xffff_8000_0000_1234u64;
        let mut e = entry("alloc", -2, 7);
        if let P::Dict(d) = &mut e {
            d.insert(s("stream"), P::Int(big.into()));
        }
        let mut f = entry("free_completed", -2, 7);
        if let P::Dict(d) = &mut f {
            d.insert(s("stream"), P::Int(big.into()));
        }
        let run = read(&snapshot(vec![vec![e, f]], vec![]), 0).unwrap();
        assert_eq!(run.entries[0].addr, u64::MAX - 1);
        assert_eq!(run.entries[0].stream, big);
        let bad = read(&snapshot(vec![vec![entry("alloc", 1, -7)]], vec![]), 0).unwrap_err();
        assert_eq!(
            bad.to_string(),
            "snap.pickle: entry 0: 'size' is -7, expected a non-negative integer"
        );
    }

    /// Only the chosen device's trace and segments are read; a device out of range is
    /// an error naming how many devices there are.
    #[test]
    fn device_selection() {
        let mut seg1 = segment(0x5000, 2 << 20, false);
        if let P::Dict(d) = &mut seg1 {
            d.insert(s("device"), P::I64(1));
        }
        let snap = snapshot(
            vec![vec![], vec![entry("segment_alloc", 0x5000, 2 << 20)]],
            vec![seg1],
        );
        assert!(read(&snap, 0).unwrap().entries.is_empty());
        assert_eq!(read(&snap, 1).unwrap().segments.len(), 1);
        assert_eq!(read(&snap, 1).unwrap().snapshot.unwrap().device_traces, 2);
        assert_eq!(
            read(&snap, 2).unwrap_err().to_string(),
            "snap.pickle: device 2 is not in the snapshot: it has 2 device traces (devices 0 to 1)"
        );
    }

    /// A recording that started late or wrapped reads (its segments are kept) and
    /// becomes a trace with its starting state rebuilt; one with no entries at all is
    /// refused; expandable segments are rebuilt by mapped runs.
    #[test]
    fn wrapped_or_late_recordings_are_rebuilt() {
        let to_trace = |v: &P| read(v, 0).unwrap().to_trace();
        // No entries: nothing to replay.
        let late = read(&snapshot(vec![vec![]], vec![segment(0x1000, G, false)]), 0).unwrap();
        assert_eq!(late.segments.len(), 1);
        let late = late.to_trace().unwrap_err();
        assert_eq!(late.kind(), crate::ReadErrorKind::Invalid);
        let msg = late.to_string();
        assert!(
            msg.starts_with("snap.pickle: the trace of device 0 has no entries but the snapshot lists 1 segment(s), 1.00 GiB reserved"),
            "{msg}"
        );
        // A segment the trace never allocated is there from the start.
        let late = to_trace(&snapshot(
            vec![vec![
                entry("segment_alloc", 0x9000, G),
                entry("alloc", 0x9000, 5),
                entry("free_requested", 0x9000, 5),
                entry("free_completed", 0x9000, 5),
            ]],
            vec![segment(0x1000, G, false), segment(0x9000, G, false)],
        ))
        .unwrap();
        let start = late.start.expect("rebuilt");
        assert_eq!(start.segments.len(), 1);
        assert_eq!(
            (start.segments[0].addr, start.segments[0].size_bytes),
            (0x1000, G as u64)
        );
        assert!(start.segments[0].blocks.is_empty());
        // The trace frees a segment it never allocated: it was there, empty.
        let wrapped = to_trace(&snapshot(
            vec![vec![entry("segment_free", 0x1000, G)]],
            vec![],
        ))
        .unwrap();
        assert_eq!(wrapped.start.expect("rebuilt").reserved_bytes(), G as u64);
        // It frees a block outside every segment: no state fits.
        let bad = to_trace(&snapshot(
            vec![vec![entry("free_completed", 0x5000_0000, 5)]],
            vec![segment(0x1000, G, false)],
        ))
        .unwrap_err()
        .to_string();
        assert!(
            bad.starts_with(
                "snap.pickle: entry 0: free_completed of 0x50000000, outside every segment"
            ),
            "{bad}"
        );
        // Expandable: a mapped run from the start, cut by the undone mapping.
        let ok = snapshot(
            vec![vec![
                entry("segment_map", 0x1000, 40 << 20),
                entry("segment_unmap", 0x1000 + (20 << 20), 20 << 20),
            ]],
            vec![segment(0x1000, 20 << 20, true)],
        );
        assert!(to_trace(&ok).unwrap().start.is_none());
        let late = to_trace(&snapshot(
            vec![vec![entry("segment_map", 0x1000, 20 << 20)]],
            vec![segment(0x1000, 40 << 20, true)],
        ))
        .unwrap();
        let start = late.start.expect("rebuilt");
        assert_eq!(start.segments.len(), 1);
        let run = &start.segments[0];
        assert!(run.expandable);
        assert_eq!((run.addr, run.size_bytes), (0x1000 + (20 << 20), 20 << 20));
    }

    /// Files that are not pickles, or pickles that are not snapshots, are syntax errors
    /// saying so; malformed entries name their index.
    #[test]
    fn not_a_snapshot() {
        let e = read_bytes(b"hello").unwrap_err();
        assert_eq!(e.kind(), crate::ReadErrorKind::Syntax);
        assert_eq!(
            e.to_string(),
            "x.pickle: byte 0: memo key 101 was never stored"
        );
        let e = read_bytes(&[0x80, 4, 0xfe]).unwrap_err().to_string();
        assert_eq!(
            e,
            "x.pickle: byte 2: not a Python pickle (unknown opcode 0xfe)"
        );
        let e = read(&P::I64(3), 0).unwrap_err().to_string();
        assert!(
            e.starts_with("snap.pickle: not a PyTorch memory snapshot (the pickle holds an int;"),
            "{e}"
        );
        let e = read(&dict(vec![("other", P::List(vec![]))]), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no 'device_traces'"), "{e}");
        let e = read(
            &snapshot(vec![vec![entry("snapshot", 0, 0), P::I64(3)]], vec![]),
            0,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1: a trace entry is a dict, found an int"
        );
        let no_addr = dict(vec![
            ("action", P::String("alloc".into())),
            ("size", P::I64(1)),
        ]);
        let e = read(&snapshot(vec![vec![no_addr]], vec![]), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 0: the alloc entry has no 'addr'"
        );
        let no_action = dict(vec![("addr", P::I64(1))]);
        let e = read(
            &snapshot(vec![vec![entry("snapshot", 0, 0), no_action]], vec![]),
            0,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1: the entry has no 'action'"
        );
        let odd = dict(vec![("action", P::String("user_defined".into()))]);
        assert_eq!(
            read(&snapshot(vec![vec![odd]], vec![]), 0).unwrap().entries[0].action,
            Action::Other
        );
        let mut bad_segment = segment(0x1000, G, false);
        if let P::Dict(d) = &mut bad_segment {
            d.remove(&s("stream"));
        }
        let e = read(&snapshot(vec![vec![]], vec![bad_segment]), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: segment 0: the segment has no 'stream'"
        );
    }

    /// Truncated or corrupted pickles never panic.
    #[test]
    fn corrupted_pickles_do_not_panic() {
        let path = oracle_dir().join("seed000.pickle");
        let bytes = std::fs::read(&path).unwrap();
        for cut in (0..bytes.len()).step_by(7) {
            let _ = read_snapshot_pickle_from(&bytes[..cut], &path, 0);
        }
        let mut flipped = bytes.clone();
        for i in (0..flipped.len()).step_by(13) {
            flipped[i] ^= 0x5a;
            let _ = read_snapshot_pickle_from(&flipped[..], &path, 0);
            flipped[i] ^= 0x5a;
        }
    }

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn oracle_dir() -> PathBuf {
        repo().join("tests/data/oracle/h100-torch2.11-pickles")
    }

    fn synthetic(name: &str) -> PathBuf {
        repo().join("tests/data/torch/synthetic").join(name)
    }

    /// Drops the JSON's empty_cache markers that released nothing (no segment release
    /// follows before the next request): the snapshot cannot show them. Returns how
    /// many were dropped.
    fn drop_silent_markers(run: &mut RecordedRun) -> usize {
        let entries = std::mem::take(&mut run.entries);
        let mut kept = Vec::new();
        let mut dropped = 0;
        for (i, e) in entries.iter().enumerate() {
            if e.action == Action::EmptyCache {
                let next = entries[i + 1..]
                    .iter()
                    .find(|e| e.action != Action::Snapshot);
                if !matches!(
                    next.map(|e| e.action),
                    Some(Action::SegmentFree | Action::SegmentUnmap)
                ) {
                    dropped += 1;
                    continue;
                }
            }
            kept.push(*e);
        }
        run.entries = kept;
        dropped
    }

    /// Every real PyTorch 2.11 pickle gives the same trace events (alloc sizes and
    /// streams, free order, empty_cache positions) as the record_torch.py JSON of the
    /// same run, the same segment entries and final segments, and the same OOM point.
    #[test]
    fn real_pickles_match_their_json() {
        let dir = oracle_dir();
        let mut pickles: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
            .collect();
        pickles.sort();
        assert!(pickles.len() >= 6, "{pickles:?}");
        let mut silent = Vec::new();
        let mut inferred = 0;
        for p in &pickles {
            let run = read_snapshot_pickle(p, 0).unwrap_or_else(|e| panic!("{e}"));
            let mut json = read_recorded_json(&p.with_extension("json")).unwrap();
            if drop_silent_markers(&mut json) > 0 {
                silent.push(run.name.clone());
            }
            let name = p.display();
            let (t, jt) = (run.to_trace().unwrap(), json.to_trace().unwrap());
            assert_eq!(t.events, jt.events, "{name}");
            inferred += t.events.iter().filter(|e| **e == Event::EmptyCache).count();
            let no_marker = |r: &RecordedRun| -> Vec<RecordedEntry> {
                r.entries
                    .iter()
                    .copied()
                    .filter(|e| e.action != Action::EmptyCache)
                    .collect()
            };
            assert_eq!(no_marker(&run), no_marker(&json), "{name}");
            // The JSON has no requested sizes; everything else agrees.
            let without_requested = |r: &RecordedRun| {
                let mut segments = r.segments.clone();
                for b in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
                    b.requested_size = None;
                }
                segments
            };
            assert_eq!(without_requested(&run), json.segments, "{name}");
            assert!(run
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .all(|b| b.requested_size.is_some()));
            assert_eq!(run.meta.alloc_conf, json.meta.alloc_conf, "{name}");
            assert_eq!(
                run.oom.as_ref().map(|o| o.trace_len),
                json.oom.as_ref().map(|o| o.trace_len),
                "{name}"
            );
            let info = run.snapshot.as_ref().unwrap();
            assert!(info.traced && !info.host_memory && info.frames.is_none());
            assert_eq!(
                info.setting("expandable_segments"),
                Some(&SettingValue::Bool(
                    run.meta
                        .alloc_conf
                        .as_deref()
                        .unwrap_or("")
                        .contains("expandable")
                ))
            );
            // Every location is an index of the pickle's trace.
            let pickled = run
                .entries
                .iter()
                .filter(|e| e.action != Action::EmptyCache)
                .count();
            assert!(
                t.locations.iter().all(|&l| (l as usize) < pickled),
                "{name}"
            );
        }
        // seed002_retain's empty_cache released a segment and is recovered; seed000's
        // released nothing (every segment was in use) and is invisible in the pickle.
        assert!(inferred >= 1);
        assert_eq!(silent, vec!["seed000".to_string()]);
    }

    // --- Hostile input (issue 14): each failed on the serde-pickle reader. ---

    /// Protocol 4 header.
    fn proto4() -> Vec<u8> {
        vec![0x80, 4]
    }

    /// LONG_BINGET / LONG_BINPUT of a memo key.
    fn get(p: &mut Vec<u8>, key: u32) {
        p.push(b'j');
        p.extend(key.to_le_bytes());
    }

    /// A million nested lists are refused where they pass 256 levels, without
    /// recursion.
    #[test]
    fn absurd_nesting_is_an_error() {
        let mut p = proto4();
        p.extend(std::iter::repeat_n(b']', 1_000_000));
        p.extend(std::iter::repeat_n(b'a', 999_999));
        p.push(b'.');
        let err = read_bytes(&p).unwrap_err().to_string();
        // The k-th APPEND (from 0) puts a list of depth k + 1 into another; k = 255
        // is the first whose element is 256 deep.
        assert_eq!(
            err,
            format!(
                "x.pickle: byte {}: values nest more than 256 levels deep: not a PyTorch memory snapshot",
                2 + 1_000_000 + 255
            )
        );
    }

    /// Lists chained through memo references (each list appended into the one before,
    /// fetched from the memo after it was already placed) cannot build a chain deeper
    /// than the limit, in either order: the stack-overflow abort of issue 14, item 1.
    #[test]
    fn memo_chains_do_not_overflow() {
        let n = 100_000u32;
        let lists = |p: &mut Vec<u8>| {
            for _ in 0..n {
                p.extend([b']', 0x94, b'0']); // EMPTY_LIST, MEMOIZE, POP
            }
        };
        // Forward: L0.append(L1), L1.append(L2), ...: L1 is already inside L0.
        let mut p = proto4();
        lists(&mut p);
        for i in 0..n - 1 {
            get(&mut p, i);
            get(&mut p, i + 1);
            p.extend([b'a', b'0']);
        }
        p.extend([b'N', b'.']);
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(
            err.contains("changes a container after placing it in another"),
            "{err}"
        );
        // Backward: L(n-2).append(L(n-1)), L(n-3).append(L(n-2)), ...: each deeper.
        let mut p = proto4();
        lists(&mut p);
        for i in (0..n - 1).rev() {
            get(&mut p, i);
            get(&mut p, i + 1);
            p.extend([b'a', b'0']);
        }
        get(&mut p, 0);
        p.push(b'.');
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(
            err.contains("values nest more than 256 levels deep"),
            "{err}"
        );
        // A list appended into itself.
        let mut p = proto4();
        p.extend([b']', 0x94]);
        get(&mut p, 0);
        p.extend([b'a', b'.']);
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(err.contains("a container contains itself"), "{err}");
    }

    /// A megabyte of MARK opcodes is refused at the 1025th (issue 14, item 4: it grew
    /// to gigabytes).
    #[test]
    fn mark_bombs_are_refused_early() {
        let mut p = proto4();
        p.extend(std::iter::repeat_n(b'(', 1 << 20));
        let err = read_bytes(&p).unwrap_err().to_string();
        assert_eq!(
            err,
            "x.pickle: byte 1026: more than 1024 MARKs are open at once: not a PyTorch memory snapshot"
        );
        // Values piling up on the stack are capped too.
        let mut p = proto4();
        p.extend(std::iter::repeat_n(b'N', 2 << 20));
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(
            err.contains("more than 1048576 values wait on the pickle stack"),
            "{err}"
        );
    }

    /// Integers of millions of digits are never converted (issue 14, item 5: a
    /// protocol 0 LONG of 8 M digits took 53 s); where a number is needed they are an
    /// error saying it does not fit in 64 bits.
    #[test]
    fn huge_integers_are_not_converted() {
        let mut p = b"L".to_vec();
        p.extend(std::iter::repeat_n(b'7', 8 << 20));
        p.extend(b"L\n.");
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(err.contains("the pickle holds an int"), "{err}");
        // The same as an entry's size, in binary (LONG4 of 4 MB).
        let mut p = proto4();
        p.extend(b"}(\x8c\x0ddevice_traces]]}(");
        for key in ["action", "addr", "stream"] {
            p.push(0x8c);
            p.push(key.len() as u8);
            p.extend(key.as_bytes());
            if key == "action" {
                p.extend(b"\x8c\x05alloc");
            } else {
                p.extend(b"K\x01");
            }
        }
        p.extend(b"\x8c\x04size\x8b");
        p.extend((4u32 << 20).to_le_bytes());
        p.extend(std::iter::repeat_n(0x11, 4 << 20));
        p.extend(b"uaau.");
        let err = read_bytes(&p).unwrap_err().to_string();
        assert_eq!(
            err,
            "x.pickle: entry 0: 'size' is an integer that does not fit in 64 bits"
        );
    }

    /// Messages never carry the input's control characters (issue 14, item 10):
    /// terminal escape sequences in a pickle are escaped.
    #[test]
    fn messages_escape_control_characters() {
        let mut p = proto4();
        p.extend(b"}(\x8c\x0ddevice_traces]]}(\x8c\x06actionc\x1b[2J\x1b]0;owned\x07\nx\nuaau.");
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(!err.chars().any(char::is_control), "{err:?}");
        assert!(
            err.starts_with("x.pickle: entry 0: 'action' is a Python object (\\u{1b}[2J\\u{1b}]0;owned\\u{7}.x)"),
            "{err}"
        );
        let mut p = proto4();
        p.extend(b"\x8c\x05\x1b[31m\x8b\xff\xff\xff\xff.");
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(!err.chars().any(char::is_control), "{err:?}");
    }

    /// Endless input stops with an error (issue 14, item 8): zeros at the first byte,
    /// an endless run of valid opcodes at the input cap; `/dev/zero` itself too.
    #[test]
    fn endless_input_stops() {
        let err = read_snapshot_pickle_from(io::repeat(0), Path::new("zero"), 0)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "zero: byte 0: not a Python pickle (unknown opcode 0x00)"
        );
        // Push None, pop it, forever.
        struct NonePop;
        impl io::Read for NonePop {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = if i % 2 == 0 { b'N' } else { b'0' };
                }
                Ok(buf.len() & !1)
            }
        }
        let limits = Limits {
            max_input: 8 << 20,
            ..Limits::default()
        };
        let err = super::read(
            NonePop,
            Path::new("endless"),
            0,
            &SnapshotOptions::default(),
            limits,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("the input goes on past 8388608 bytes without ending the pickle"),
            "{err}"
        );
        if Path::new("/dev/zero").exists() {
            let err = read_snapshot_pickle(Path::new("/dev/zero"), 0)
                .unwrap_err()
                .to_string();
            assert!(err.contains("unknown opcode 0x00"), "{err}");
        }
    }

    /// A length prefix larger than the file is refused before anything is allocated.
    #[test]
    fn bogus_lengths_are_refused() {
        let mut p = proto4();
        p.push(0x8d); // BINUNICODE8
        p.extend(u64::MAX.to_le_bytes());
        let err = read_bytes(&p).unwrap_err().to_string();
        assert!(err.contains("is larger than"), "{err}");
        let mut p = proto4();
        p.push(b'X');
        p.extend((1000u32).to_le_bytes());
        p.extend(b"short");
        let err = read_bytes(&p).unwrap_err().to_string();
        assert_eq!(err, "x.pickle: byte 7: the pickle ends inside a string");
    }

    // --- PyTorch up to 2.15 (issue 9). ---

    /// The same 2.15-shaped run pickled in protocols 0, 2, 4 and 5 reads the same, and
    /// every newer field is read: annotate entries, pool ids, user metadata (string
    /// and dict), forward frames and internal metadata (skipped), every allocator
    /// setting, external annotations placed by time, host memory noted, expandable
    /// and private-pool segments, blocks with addresses, requested sizes and states.
    #[test]
    fn reads_torch_2_15_snapshots() {
        let runs: Vec<RecordedRun> = [0, 2, 4, 5]
            .iter()
            .map(|p| read_snapshot_pickle(&synthetic(&format!("torch215_p{p}.pickle")), 0).unwrap())
            .collect();
        for r in &runs[1..] {
            assert_eq!(r.entries, runs[0].entries);
            assert_eq!(r.segments, runs[0].segments);
            assert_eq!(r.snapshot, runs[0].snapshot);
        }
        let run = &runs[0];
        let info = run.snapshot.as_ref().unwrap();
        assert_eq!(
            run.meta.alloc_conf.as_deref(),
            Some("expandable_segments:True,max_split_size_mb:512")
        );
        assert_eq!(info.allocator_settings.len(), 9);
        assert_eq!(
            info.setting("max_split_size"),
            Some(&SettingValue::Int(512 << 20))
        );
        assert_eq!(
            info.setting("garbage_collection_threshold"),
            Some(&SettingValue::Float(0.0))
        );
        assert_eq!(
            info.setting("roundup_power2_divisions").unwrap().to_string(),
            "{1: 0, 2: 0, 4: 0, 8: 0, 16: 0, 32: 0, 64: 0, 128: 0, 256: 0, 512: 0, 1024: 0, 2048: 0, 4096: 0, 8192: 0, 16384: 0, 32768: 0}"
        );
        let actions: Vec<&str> = run.entries.iter().map(|e| e.action.name()).collect();
        assert_eq!(
            actions,
            vec![
                "segment_alloc",
                "alloc",
                "alloc",
                "annotate",
                "segment_map",
                "alloc",
                "free_requested",
                "free_completed",
                "segment_alloc",
                "alloc",
                "snapshot",
                "free_requested",
                "alloc",
                "free_requested"
            ]
        );
        let s1 = 0x7F00_0000_0000u64;
        assert_eq!(
            info.annotations,
            vec![Annotation {
                entry: 3,
                addr: s1 + (4 << 20),
                text: "packed for backward".into()
            }]
        );
        assert_eq!(info.entry_pools, vec![(8, (1, 0)), (9, (1, 0))]);
        assert!(info.host_memory && info.traced);
        assert_eq!(info.device_traces, 1);
        let ext: Vec<(u64, String)> = info
            .external_annotations
            .iter()
            .map(|a| (a.entry, format!("{:?}", a.fields)))
            .collect();
        // time_us T0 + 10 falls after entry 0 (T0 + 7), T0 + 30 after entry 3 (T0 + 28).
        assert_eq!(
            ext,
            vec![
                (
                    1,
                    r#"[("stage", "START"), ("name", "forward")]"#.to_string()
                ),
                (4, r#"[("stage", "END"), ("name", "forward")]"#.to_string()),
            ]
        );
        assert_eq!(run.segments.len(), 3);
        let expandable = &run.segments[1];
        assert!(expandable.is_expandable && expandable.pool_id == (0, 0));
        assert_eq!(expandable.stream, 0x5581_0000_0AB0);
        assert_eq!(run.segments[2].pool_id, (1, 0));
        let blocks = &run.segments[0].blocks;
        assert_eq!(
            blocks[2],
            RecordedBlock {
                address: s1 + (12 << 20),
                size: (2 << 20) + 512,
                requested_size: Some((2 << 20) + 100),
                state: BlockState::ActivePendingFree
            }
        );
        assert_eq!(blocks[1].state, BlockState::ActiveAllocated);
        assert_eq!(blocks[3].state, BlockState::Inactive);
        // The graph's request (entry 9) is routed to its pool (1, 0) by its pool_id:
        // the pool is created and allocated to on the request's stream around it.
        let t = run.to_trace().unwrap();
        let calls: Vec<(u64, &Event)> = t
            .events
            .iter()
            .zip(&t.locations)
            .filter(|(e, _)| {
                !matches!(
                    e,
                    Event::Alloc { .. } | Event::Free { .. } | Event::FreeRequested { .. }
                )
            })
            .map(|(e, &at)| (at, e))
            .collect();
        let g = crate::trace::PoolId(1, 0);
        assert_eq!(
            calls,
            vec![
                (
                    8,
                    &Event::CreatePool {
                        pool: g,
                        use_on_oom: false,
                        no_split: false
                    }
                ),
                (
                    8,
                    &Event::BeginAllocateToPool {
                        pool: g,
                        streams: crate::trace::PoolStreams::only(vec![0])
                    }
                ),
                (9, &Event::EndAllocateToPool { pool: g }),
                (9, &Event::ReleasePool { pool: g }),
            ]
        );
        assert_eq!(info.pools.request_pools, vec![(9, g)]);
        assert_eq!((info.pools.by_entry, info.pools.by_address), (5, 0));
        // The free of entry 11 waits for another stream right after the graph's
        // request: whether a capture still deferred it, the snapshot cannot say.
        assert_eq!(run.meta.caveats.len(), 1, "{:?}", run.meta.caveats);
        assert!(
            run.meta.caveats[0].contains("1 free(s) waiting for other streams (entries 11)"),
            "{:?}",
            run.meta.caveats
        );
        // Without the private pool, the run replays: annotations and snapshots are no
        // requests, the pending frees (freed, waiting for other streams) are not frees yet.
        let run = read_snapshot_pickle(&synthetic("torch215_default_pool.pickle"), 0).unwrap();
        let t = run.to_trace().unwrap();
        let sizes: Vec<String> = t
            .events
            .iter()
            .map(|e| match e {
                Event::Alloc { id, size_bytes, .. } => format!("+{} {size_bytes}", id.0),
                Event::Free { id } => format!("-{}", id.0),
                Event::FreeRequested { id } => format!("~{}", id.0),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            sizes,
            vec![
                "+0 4194304",
                "+1 8388608",
                "+2 3145728",
                "-0",
                "~2",
                "+3 2097252",
                "~3"
            ]
        );
    }

    /// Stack frames are skipped by default and kept when asked, each distinct stack
    /// once (PyTorch shares them between entries), the same in protocols 4 and 0.
    #[test]
    fn frames_only_when_asked() {
        let options = SnapshotOptions { keep_frames: true };
        for keep in [false, true] {
            let options = SnapshotOptions { keep_frames: keep };
            let p4 = read_snapshot_pickle_with(&synthetic("torch215_frames.pickle"), 0, &options);
            let p0 =
                read_snapshot_pickle_with(&synthetic("torch215_frames_p0.pickle"), 0, &options);
            let (p4, p0) = (p4.unwrap(), p0.unwrap());
            assert_eq!(p4.entries, p0.entries);
            assert_eq!(p4.segments, p0.segments);
            assert_eq!(p4.snapshot, p0.snapshot);
        }
        let path = synthetic("torch215_frames.pickle");
        let plain = read_snapshot_pickle(&path, 0).unwrap();
        assert_eq!(plain.snapshot.as_ref().unwrap().frames, None);
        let run = read_snapshot_pickle_with(&path, 0, &options).unwrap();
        assert_eq!(run.entries, plain.entries);
        let frames = run.snapshot.as_ref().unwrap().frames.as_ref().unwrap();
        assert_eq!(frames.entries.len(), plain.entries.len());
        assert_eq!(frames.stack_count(), 5);
        // Three frames a stack, the last two shared by all.
        assert_eq!(frames.frames.len(), 7);
        let first: Vec<&Frame> = frames.stack(frames.entries[0].1).collect();
        assert_eq!(
            first[2],
            &Frame {
                filename: "/home/user/project/train.py".into(),
                line: 12,
                name: "main".into()
            }
        );
    }

    /// Snapshots that cannot be replayed read fine and say what is missing when
    /// converted: no trace (include_traces=False, a bare memory_snapshot() list) and
    /// skip_actions that left out what a replay needs.
    #[test]
    fn missing_trace_parts_are_named() {
        let message = |name: &str| {
            let run = read_snapshot_pickle(&synthetic(name), 0).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(run.segments.len(), 1, "{name}");
            run.to_trace().unwrap_err().to_string()
        };
        let m = message("no_traces.pickle");
        assert!(m.contains("the snapshot holds no trace, only the allocator's state when it was taken (1 segment(s), 2.00 MiB reserved)"), "{m}");
        assert!(m.contains("include_traces=False"), "{m}");
        let m = message("segments_only.pickle");
        assert!(m.contains("the snapshot holds no trace"), "{m}");
        let m = message("skip_free_completed.pickle");
        assert!(m.contains("no 'free_completed' entries though it has 'free_requested' entries: it was recorded with skip_actions"), "{m}");
        let m = message("skip_alloc.pickle");
        assert!(
            m.contains("no 'alloc' entries though it frees blocks and creates segments"),
            "{m}"
        );
    }

    // --- The entry lane (issue 12: 200 MB/s). ---

    /// How many entries of device 0's trace the pickle machine's entry lane read.
    pub(super) fn lane_entries(bytes: &[u8]) -> u64 {
        lane_entries_with(bytes, false)
    }

    /// How many entries of device 0's trace the entry lane read, frames kept or not.
    pub(super) fn lane_entries_with(bytes: &[u8], keep_frames: bool) -> u64 {
        let (root, _) = pickle::read_value(bytes, Limits::default(), keep_frames).unwrap();
        let Value::Dict(top) = root else {
            panic!("not a dict")
        };
        let Some(Value::List(traces)) = top.get("device_traces") else {
            panic!("no device_traces")
        };
        let per_device = traces.items.borrow();
        let Items::Values(per_device) = &*per_device else {
            panic!("device_traces holds records")
        };
        let Value::List(trace) = &per_device[0] else {
            panic!("not a list")
        };
        let items = trace.items.borrow();
        match &*items {
            Items::Entries(store) => store.by_lane,
            _ => 0,
        }
    }

    /// The entry lane reads the real snapshots' entries exactly as the general machine
    /// does (frames kept or not): same entries, segments and snapshot
    /// information, and the lane did read most of them.
    #[test]
    fn entry_lane_reads_as_the_general_machine() {
        let keep = SnapshotOptions { keep_frames: true };
        for name in ["gpt_train_small", "random_stress", "multistream"] {
            let path = oracle_dir().join(format!("{name}.pickle"));
            let bytes = std::fs::read(&path).unwrap();
            let lane = read_snapshot_pickle(&path, 0).unwrap();
            let general = read_snapshot_pickle_with(&path, 0, &keep).unwrap();
            assert_eq!(lane.entries, general.entries, "{name}");
            assert_eq!(lane.segments, general.segments, "{name}");
            assert_eq!(lane.times_us, general.times_us, "{name}");
            let mut info = general.snapshot.clone().unwrap();
            info.frames = None;
            assert_eq!(lane.snapshot.as_ref(), Some(&info), "{name}");
            let entries = lane.entries.len() as u64;
            let by_lane = lane_entries(&bytes);
            if entries > 2000 {
                assert!(
                    by_lane >= entries - 1000 - 100,
                    "{name}: {by_lane} of {entries}"
                );
            }
        }
    }

    /// An entry the lane reads names itself in errors as the general machine would,
    /// and entries the lane cannot read (a nested value, a long string, an odd key)
    /// hand over to the general machine mid-entry and read the same.
    #[test]
    fn entry_lane_hands_over_and_names_entries() {
        let many = |bad: Option<(usize, P)>| {
            let mut entries: Vec<P> = (0..1500)
                .map(|i| {
                    let addr = 0x1000 + (i as i64 / 2) * 512;
                    if i % 2 == 0 {
                        entry("alloc", addr, 512)
                    } else {
                        entry("free_completed", addr, 512)
                    }
                })
                .collect();
            if let Some((i, e)) = bad {
                entries[i] = e;
            }
            snapshot(vec![entries], vec![])
        };
        let plain = read(&many(None), 0).unwrap();
        assert_eq!(plain.entries.len(), 1500);
        assert!(lane_entries(&pickle(&many(None))) >= 499);
        // Handed over: a dict value, a long string, a float and an int key.
        let mut odd = entry("alloc", 0x1000 + 600 * 512, 512);
        if let P::Dict(d) = &mut odd {
            d.insert(s("user_metadata"), dict(vec![("k", P::String("v".into()))]));
            d.insert(s("compile_context"), P::String("x".repeat(100)));
            d.insert(s("ratio"), P::F64(0.5));
            d.insert(HashableValue::I64(7), P::I64(1));
        }
        let snap = many(Some((1200, odd)));
        let run = read(&snap, 0).unwrap();
        assert_eq!(run.entries, plain.entries);
        assert!(lane_entries(&pickle(&snap)) < lane_entries(&pickle(&many(None))));
        // Errors in lane-read entries name the entry.
        let e = read(&many(Some((1200, entry("alloc", 1, -7)))), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1200: 'size' is -7, expected a non-negative integer"
        );
        let no_addr = dict(vec![
            ("action", P::String("alloc".into())),
            ("size", P::I64(1)),
        ]);
        let e = read(&many(Some((1300, no_addr))), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1300: the alloc entry has no 'addr'"
        );
        let bad_action = dict(vec![("action", P::I64(3)), ("addr", P::I64(1))]);
        let e = read(&many(Some((1400, bad_action))), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1400: 'action' is 3, expected a string"
        );
        let none_addr = dict(vec![
            ("action", P::String("alloc".into())),
            ("addr", P::None),
            ("size", P::I64(1)),
            ("stream", P::I64(0)),
        ]);
        let e = read(&many(Some((1100, none_addr))), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1100: the alloc entry has no 'addr'"
        );
    }
}
