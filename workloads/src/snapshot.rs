//! PyTorch memory snapshot pickles (`torch.cuda.memory._dump_snapshot(path)`), the
//! file users already have, read into a [`RecordedRun`].
//!
//! The pickle holds only dicts, lists, tuples, strings, numbers and bools, so it is
//! decoded to a generic [`serde_pickle::Value`] and walked; no Python is needed. What
//! is taken:
//!
//! - `device_traces[device]`: each entry (a dict with `action`, `addr`, `size`,
//!   `stream`; an `oom` entry has `device_free` instead of `addr`) becomes a
//!   [`RecordedEntry`], in order (`oom` entries get address 0). Entries of actions
//!   this crate does not know (annotations of other PyTorch versions) are kept as
//!   [`Action::Other`] and need no fields.
//! - `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]` becomes
//!   the `alloc_conf` of [`RecordedRun::meta`] ("" when absent).
//! - `segments` of the chosen device become [`RecordedSegment`]s, blocks as
//!   (size, state).
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
//! **Inferred `empty_cache`.** Snapshots do not record `torch.cuda.empty_cache()`
//! calls, but they record what such a call does: a run of consecutive
//! `segment_free`/`segment_unmap` entries. The allocator also releases segments inside
//! a malloc (garbage collection, the retry before an OOM), and those runs are always
//! followed by the malloc's `segment_alloc`/`segment_map`, or by its `oom`. So a run
//! of `segment_free`/`segment_unmap` entries whose next entry (skipping `snapshot`
//! entries) is not `segment_alloc`, `segment_map` or `oom` (or that ends the trace) is
//! taken as an `empty_cache` call, and an [`Action::EmptyCache`] entry is inserted
//! before the run. An `empty_cache` call that released nothing left no trace and
//! cannot be recovered; it has no effect on PyTorch's memory either. Because of the
//! insertions, [`RecordedRun::source_indexes`] maps entries back to the pickle's own
//! 0-based entry indexes (an inserted entry takes the index of the run's first
//! entry), so `entry N` in messages and event locations always means
//! `device_traces[device][N]` of the file.
//!
//! **Wrapped or late recordings are refused, not rebuilt.** A trace replays from an
//! empty allocator only if recording started before the first CUDA allocation and the
//! ring buffer (`max_entries`) never wrapped. Reading checks this: the segments the
//! trace leaves (`segment_alloc` minus `segment_free`, by address; for expandable
//! segments, mapped minus unmapped bytes) must be exactly the snapshot's `segments`
//! list, and no `segment_free` may free a segment the trace never allocated. A
//! snapshot that fails this is refused with an [`ReadErrorKind::Invalid`] error that
//! says to call `torch.cuda.memory._record_memory_history()` before the first CUDA
//! allocation. (Rebuilding the starting state backwards from `segments`, as
//! pytorch.org/memory_viz does, is possible but would replay a guess.)
//!
//! Errors name `entry N` (0-based index into the device trace) or `segment N`
//! (0-based index into `segments`).
//!
//! serde-pickle converts nested values recursively, so a pickle nesting containers
//! deeper than 256 levels (real snapshots nest about six) is refused before decoding,
//! by a scan of its opcodes that needs no recursion (`pickle_depth`): a crafted file
//! gets an error, not a stack overflow. As with any pickle, only load files from
//! sources you trust.
//!
//! [`ReadErrorKind::Invalid`]: crate::ReadErrorKind::Invalid

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use serde_pickle::{DeOptions, HashableValue, Value};

use crate::pickle_depth::DepthError;

/// Deepest nesting accepted in a snapshot pickle (real ones nest about six levels).
const MAX_NESTING: u32 = 256;

use crate::csv::file_stem;
use crate::recorded::{Action, RecordedEntry, RecordedOom, RecordedRun, RecordedSegment};
use crate::size::format_size_human;
use crate::trace::TraceMeta;
use crate::{Format, ReadError};

type Dict = BTreeMap<HashableValue, Value>;

/// Reads `device_traces[device]` and the matching segments of a PyTorch snapshot
/// pickle (see the module docs).
///
/// # Errors
/// I/O errors; a file that is not a pickle or not a snapshot dict
/// ([`ReadErrorKind::Syntax`](crate::ReadErrorKind::Syntax)); `device` out of range,
/// entries with missing or negative fields, and wrapped or late recordings
/// ([`ReadErrorKind::Invalid`](crate::ReadErrorKind::Invalid)).
pub fn read_snapshot_pickle(path: &Path, device: usize) -> Result<RecordedRun, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
    read_snapshot_pickle_from(io::BufReader::new(file), path, device)
}

/// As [`read_snapshot_pickle`], from any reader; `path` names the source in messages
/// and names the run (its stem).
///
/// # Errors
/// As [`read_snapshot_pickle`].
pub fn read_snapshot_pickle_from(
    mut reader: impl io::Read,
    path: &Path,
    device: usize,
) -> Result<RecordedRun, ReadError> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::io(path, &e))?;
    // serde-pickle recurses into nested values: refuse absurd nesting first.
    match crate::pickle_depth::max_nesting(&bytes, MAX_NESTING) {
        Ok(_) => {}
        Err(DepthError::TooDeep { offset }) => {
            return Err(ReadError::syntax(
                path,
                Some(format!("byte {offset}")),
                format!(
                "values nest more than {MAX_NESTING} levels deep: not a PyTorch memory snapshot"
            ),
            ))
        }
        Err(DepthError::Malformed { offset, what }) => {
            return Err(ReadError::syntax(
                path,
                Some(format!("byte {offset}")),
                format!("not a Python pickle ({what})"),
            ))
        }
    }
    let options = DeOptions::new()
        .decode_strings()
        .replace_unresolved_globals()
        .replace_recursive_structures();
    let value = serde_pickle::value_from_slice(&bytes, options).map_err(|e| {
        ReadError::syntax(
            path,
            None,
            format!("not a Python pickle: {}", one_line(&e.to_string())),
        )
    })?;
    let not_snapshot = |what: &str| {
        ReadError::syntax(
            path,
            None,
            format!(
                "not a PyTorch memory snapshot ({what}; expected the dict written by \
                 torch.cuda.memory._dump_snapshot, with 'device_traces' and 'segments')"
            ),
        )
    };
    let Value::Dict(top) = &value else {
        return Err(not_snapshot(&format!("the pickle holds {}", kind(&value))));
    };
    let Some(traces) = get(top, "device_traces") else {
        return Err(not_snapshot("no 'device_traces'"));
    };
    let Some(traces) = as_list(traces) else {
        return Err(not_snapshot("'device_traces' is not a list"));
    };
    let Some(trace) = traces.get(device) else {
        let have = match traces.len() {
            0 => "no device traces (memory history was not recorded)".to_string(),
            1 => "1 device trace (device 0)".to_string(),
            n => format!("{n} device traces (devices 0 to {})", n - 1),
        };
        return Err(ReadError::invalid(
            path,
            None,
            format!("device {device} is not in the snapshot: it has {have}"),
        ));
    };
    let Some(trace) = as_list(trace) else {
        return Err(not_snapshot(&format!(
            "device_traces[{device}] is not a list"
        )));
    };

    let mut raw = Vec::with_capacity(trace.len());
    let mut last_oom = None;
    for (index, entry) in trace.iter().enumerate() {
        let at =
            |message: String| ReadError::invalid(path, Some(format!("entry {index}")), message);
        let (entry, device_free) = parse_entry(entry).map_err(at)?;
        if entry.action == Action::Oom {
            last_oom = Some((index, entry.size, device_free));
        }
        raw.push(entry);
    }

    let segments = match get(top, "segments") {
        None => return Err(not_snapshot("no 'segments'")),
        Some(list) => match as_list(list) {
            Some(list) => list,
            None => return Err(not_snapshot("'segments' is not a list")),
        },
    };
    let mut kept = Vec::new();
    for (index, segment) in segments.iter().enumerate() {
        let at =
            |message: String| ReadError::invalid(path, Some(format!("segment {index}")), message);
        if let Some(s) = parse_segment(segment, device).map_err(at)? {
            kept.push(s);
        }
    }

    check_complete(path, &raw, &kept)?;

    let alloc_conf = match get(top, "allocator_settings") {
        Some(Value::Dict(settings)) => match get(settings, "PYTORCH_CUDA_ALLOC_CONF") {
            Some(Value::String(conf)) => conf.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    };
    let (entries, source_indexes) = infer_empty_cache(&raw);
    Ok(RecordedRun {
        name: file_stem(path),
        path: path.to_path_buf(),
        meta: TraceMeta {
            format: Some(Format::TorchPickle),
            alloc_conf: Some(alloc_conf),
            ..TraceMeta::default()
        },
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
        segments: kept.into_iter().map(|(s, _)| s).collect(),
        ..RecordedRun::default()
    })
}

/// Inserts an [`Action::EmptyCache`] entry before every run of
/// `segment_free`/`segment_unmap` entries that no `segment_alloc`, `segment_map` or
/// `oom` follows (skipping `snapshot` entries); see the module docs. Returns the new
/// entries and, for each, the index of the input entry it came from (an inserted
/// entry gets the index of the run's first entry).
pub fn infer_empty_cache(entries: &[RecordedEntry]) -> (Vec<RecordedEntry>, Vec<u64>) {
    let releases = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let mut out = Vec::with_capacity(entries.len());
    let mut indexes = Vec::with_capacity(entries.len());
    let mut i = 0;
    while i < entries.len() {
        if releases(entries[i].action) {
            let start = i;
            let mut end = i;
            while end < entries.len() && releases(entries[end].action) {
                end += 1;
            }
            let next = entries[end..]
                .iter()
                .find(|e| e.action != Action::Snapshot)
                .map(|e| e.action);
            let inside_malloc = matches!(
                next,
                Some(Action::SegmentAlloc | Action::SegmentMap | Action::Oom)
            );
            if !inside_malloc {
                out.push(RecordedEntry {
                    action: Action::EmptyCache,
                    addr: 0,
                    size: 0,
                    stream: 0,
                });
                indexes.push(start as u64);
            }
            for (k, e) in entries.iter().enumerate().take(end).skip(start) {
                out.push(*e);
                indexes.push(k as u64);
            }
            i = end;
        } else {
            out.push(entries[i]);
            indexes.push(i as u64);
            i += 1;
        }
    }
    (out, indexes)
}

/// Refuses a trace that does not account for the snapshot's segments (late start or
/// wrapped ring buffer).
fn check_complete(
    path: &Path,
    entries: &[RecordedEntry],
    segments: &[(RecordedSegment, bool)],
) -> Result<(), ReadError> {
    let refuse = |location: Option<String>, what: String| {
        ReadError::invalid(
            path,
            location,
            format!(
                "{what}: the recording started after allocations existed or its ring buffer wrapped, so it \
                 cannot be replayed from an empty allocator (call \
                 torch.cuda.memory._record_memory_history(max_entries=...) before the first CUDA allocation, \
                 with max_entries above the number of trace entries)"
            ),
        )
    };
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut mapped: u64 = 0;
    for (index, e) in entries.iter().enumerate() {
        let problem = match e.action {
            Action::SegmentAlloc => live.insert(e.addr, e.size).map(|_| {
                format!(
                    "segment_alloc at {:#x}, a segment that is already live",
                    e.addr
                )
            }),
            Action::SegmentFree => match live.remove(&e.addr) {
                Some(_) => None,
                None => Some(format!(
                    "segment_free of {:#x}, a segment the trace never allocated",
                    e.addr
                )),
            },
            Action::SegmentMap => {
                mapped = mapped.saturating_add(e.size);
                None
            }
            Action::SegmentUnmap => match mapped.checked_sub(e.size) {
                Some(rest) => {
                    mapped = rest;
                    None
                }
                None => Some("segment_unmap of more bytes than the trace mapped".to_string()),
            },
            _ => None,
        };
        if let Some(what) = problem {
            return Err(refuse(Some(format!("entry {index}")), what));
        }
    }
    let listed: HashMap<u64, u64> = segments
        .iter()
        .filter(|(_, expandable)| !expandable)
        .map(|(s, _)| (s.address, s.total_size))
        .collect();
    let listed_mapped = segments
        .iter()
        .filter(|(_, expandable)| *expandable)
        .fold(0u64, |sum, (s, _)| sum.saturating_add(s.total_size));
    if live != listed {
        let bytes = |m: &HashMap<u64, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
        return Err(refuse(
            None,
            format!(
                "the trace leaves {} segment(s) of {} but the snapshot lists {} of {}",
                live.len(),
                format_size_human(bytes(&live)),
                listed.len(),
                format_size_human(bytes(&listed))
            ),
        ));
    }
    if mapped != listed_mapped {
        return Err(refuse(
            None,
            format!(
                "the trace leaves {} mapped in expandable segments but the snapshot lists {}",
                format_size_human(mapped),
                format_size_human(listed_mapped)
            ),
        ));
    }
    Ok(())
}

/// One trace entry, and its `device_free` (for `oom`).
fn parse_entry(value: &Value) -> Result<(RecordedEntry, u64), String> {
    let Value::Dict(d) = value else {
        return Err(format!("a trace entry is a dict, found {}", kind(value)));
    };
    let action = match get(d, "action") {
        Some(Value::String(a)) => Action::from_name(a),
        Some(other) => return Err(format!("'action' is {}, expected a string", kind(other))),
        None => return Err("the entry has no 'action'".into()),
    };
    // Entries without effect on memory need no fields; all others need theirs.
    let needs_fields = !matches!(action, Action::Other | Action::Snapshot);
    let field = |key: &str, bits: bool| -> Result<u64, String> {
        match get(d, key) {
            Some(v) => if bits { handle(v) } else { size(v) }.map_err(|e| format!("'{key}' {e}")),
            None if needs_fields => Err(format!("the {} entry has no '{key}'", action.name())),
            None => Ok(0),
        }
    };
    let (addr, device_free) = if action == Action::Oom {
        (0, field("device_free", false)?)
    } else {
        (field("addr", true)?, 0)
    };
    let entry = RecordedEntry {
        action,
        addr,
        size: field("size", false)?,
        stream: field("stream", true)?,
    };
    Ok((entry, device_free))
}

/// A segment of `device` (None for other devices), with its `is_expandable`.
fn parse_segment(value: &Value, device: usize) -> Result<Option<(RecordedSegment, bool)>, String> {
    let Value::Dict(d) = value else {
        return Err(format!("a segment is a dict, found {}", kind(value)));
    };
    let num = |key: &str, bits: bool| -> Result<u64, String> {
        let v = get(d, key).ok_or_else(|| format!("the segment has no '{key}'"))?;
        if bits { handle(v) } else { size(v) }.map_err(|e| format!("'{key}' {e}"))
    };
    // Snapshots have always named the device; treat a missing one as device 0.
    let seg_device = match get(d, "device") {
        Some(v) => size(v).map_err(|e| format!("'device' {e}"))?,
        None => 0,
    };
    if seg_device != device as u64 {
        return Ok(None);
    }
    let segment_type = match get(d, "segment_type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(format!(
                "'segment_type' is {}, expected a string",
                kind(other)
            ))
        }
        None => String::new(),
    };
    let expandable = matches!(get(d, "is_expandable"), Some(Value::Bool(true)));
    let mut blocks = Vec::new();
    if let Some(list) = get(d, "blocks") {
        let list =
            as_list(list).ok_or_else(|| format!("'blocks' is {}, expected a list", kind(list)))?;
        for (i, b) in list.iter().enumerate() {
            let Value::Dict(b) = b else {
                return Err(format!("block {i} is {}, expected a dict", kind(b)));
            };
            let size = get(b, "size")
                .ok_or_else(|| format!("block {i} has no 'size'"))
                .and_then(|v| size(v).map_err(|e| format!("block {i}: 'size' {e}")))?;
            let state = match get(b, "state") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(format!("block {i} has no 'state' string")),
            };
            blocks.push((size, state));
        }
    }
    Ok(Some((
        RecordedSegment {
            address: num("address", true)?,
            total_size: num("total_size", false)?,
            stream: num("stream", true)?,
            segment_type,
            allocated_size: num("allocated_size", false)?,
            blocks,
        },
        expandable,
    )))
}

fn get<'a>(d: &'a Dict, key: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(key.to_string()))
}

fn as_list(v: &Value) -> Option<&[Value]> {
    match v {
        Value::List(l) | Value::Tuple(l) => Some(l),
        _ => None,
    }
}

/// An address or stream handle: any 64-bit pattern (negative = the int64 view).
fn handle(v: &Value) -> Result<u64, String> {
    match v {
        Value::I64(i) => Ok(*i as u64),
        Value::Int(big) => u64::try_from(big)
            .or_else(|_| i64::try_from(big).map(|i| i as u64))
            .map_err(|_| format!("is {big}, which does not fit in 64 bits")),
        other => Err(format!("is {}, expected an integer", kind(other))),
    }
}

/// A byte count or index: a non-negative integer below 2^64.
fn size(v: &Value) -> Result<u64, String> {
    match v {
        Value::I64(i) => {
            u64::try_from(*i).map_err(|_| format!("is {i}, expected a non-negative integer"))
        }
        Value::Int(big) => u64::try_from(big)
            .map_err(|_| format!("is {big}, expected a non-negative integer below 2^64")),
        other => Err(format!("is {}, expected an integer", kind(other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::I64(_) | Value::Int(_) => "an int",
        Value::F64(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Set(_) | Value::FrozenSet(_) => "a set",
        Value::Dict(_) => "a dict",
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::recorded::read_recorded_json;
    use crate::trace::Event;

    /// A pickle nested a million levels deep is refused with its byte offset, not a
    /// stack overflow.
    #[test]
    fn absurd_nesting_is_an_error() {
        let mut p = vec![0x80, 4];
        p.extend(std::iter::repeat_n(b']', 1_000_000));
        p.extend(std::iter::repeat_n(b'a', 999_999));
        p.push(b'.');
        let err = read_snapshot_pickle_from(&p[..], Path::new("deep.pickle"), 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("deep.pickle: byte 1000257: values nest more than 256 levels deep"),
            "{err}"
        );
    }

    fn s(text: &str) -> HashableValue {
        HashableValue::String(text.into())
    }

    fn dict(pairs: Vec<(&str, Value)>) -> Value {
        Value::Dict(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn entry(action: &str, addr: i64, size: i64) -> Value {
        dict(vec![
            ("action", Value::String(action.into())),
            ("addr", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("stream", Value::I64(0)),
            ("time_us", Value::I64(1)),
        ])
    }

    fn segment(address: i64, total_size: i64, expandable: bool) -> Value {
        dict(vec![
            ("device", Value::I64(0)),
            ("address", Value::I64(address)),
            ("total_size", Value::I64(total_size)),
            ("allocated_size", Value::I64(0)),
            ("stream", Value::I64(0)),
            ("segment_type", Value::String("large".into())),
            ("is_expandable", Value::Bool(expandable)),
            (
                "segment_pool_id",
                Value::Tuple(vec![Value::I64(0), Value::I64(0)]),
            ),
            ("frames", Value::List(vec![])),
            (
                "blocks",
                Value::List(vec![dict(vec![
                    ("size", Value::I64(total_size)),
                    ("state", Value::String("inactive".into())),
                ])]),
            ),
        ])
    }

    fn snapshot(traces: Vec<Vec<Value>>, segments: Vec<Value>) -> Value {
        dict(vec![
            ("segments", Value::List(segments)),
            (
                "device_traces",
                Value::List(traces.into_iter().map(Value::List).collect()),
            ),
            (
                "allocator_settings",
                dict(vec![(
                    "PYTORCH_CUDA_ALLOC_CONF",
                    Value::String("expandable_segments:True".into()),
                )]),
            ),
        ])
    }

    fn pickle(v: &Value) -> Vec<u8> {
        serde_pickle::value_to_vec(v, serde_pickle::SerOptions::new()).unwrap()
    }

    fn read(v: &Value, device: usize) -> Result<RecordedRun, ReadError> {
        read_snapshot_pickle_from(&pickle(v)[..], Path::new("snap.pickle"), device)
    }

    const G: i64 = 1 << 30;

    /// Entries, settings and segments are taken as documented, oom entries get address
    /// 0 and become the run's oom, and an empty_cache is inferred before a release run.
    #[test]
    fn reads_synthetic_snapshot() {
        let oom = dict(vec![
            ("action", Value::String("oom".into())),
            ("device_free", Value::I64(5 << 20)),
            ("size", Value::I64(2 * G)),
            ("stream", Value::I64(0)),
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
            vec![(1 << 30, "inactive".to_string())]
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

    /// Releases inside a malloc (followed by segment_alloc, segment_map or oom, past
    /// snapshots) are not empty_cache calls; one at the very end is.
    #[test]
    fn empty_cache_inference_rule() {
        let e = |action: Action| RecordedEntry {
            action,
            addr: 0,
            size: 0,
            stream: 0,
        };
        let (out, _) = infer_empty_cache(&[
            e(Action::SegmentFree),
            e(Action::Snapshot),
            e(Action::SegmentAlloc),
            e(Action::SegmentUnmap),
            e(Action::SegmentMap),
            e(Action::SegmentFree),
            e(Action::Oom),
            e(Action::SegmentFree),
            e(Action::SegmentUnmap),
            e(Action::Alloc),
            e(Action::SegmentFree),
        ]);
        let actions: Vec<&str> = out.iter().map(|e| e.action.name()).collect();
        assert_eq!(
            actions,
            vec![
                "segment_free",
                "snapshot",
                "segment_alloc",
                "segment_unmap",
                "segment_map",
                "segment_free",
                "oom",
                "empty_cache",
                "segment_free",
                "segment_unmap",
                "alloc",
                "empty_cache",
                "segment_free",
            ]
        );
    }

    /// Big and negative integers stay exact: a stream handle above 2^63 pickled as a
    /// long int, and a negative (int64 view) address, read as their 64-bit patterns.
    #[test]
    fn integers_stay_exact() {
        let big = 0xffff_8000_0000_1234u64;
        let mut e = entry("alloc", -2, 7);
        if let Value::Dict(d) = &mut e {
            d.insert(s("stream"), Value::Int(big.into()));
        }
        let mut f = entry("free_completed", -2, 7);
        if let Value::Dict(d) = &mut f {
            d.insert(s("stream"), Value::Int(big.into()));
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
        if let Value::Dict(d) = &mut seg1 {
            d.insert(s("device"), Value::I64(1));
        }
        let snap = snapshot(
            vec![vec![], vec![entry("segment_alloc", 0x5000, 2 << 20)]],
            vec![seg1],
        );
        assert!(read(&snap, 0).unwrap().entries.is_empty());
        assert_eq!(read(&snap, 1).unwrap().segments.len(), 1);
        assert_eq!(
            read(&snap, 2).unwrap_err().to_string(),
            "snap.pickle: device 2 is not in the snapshot: it has 2 device traces (devices 0 to 1)"
        );
        assert!(read(&snapshot(vec![], vec![]), 0)
            .unwrap_err()
            .to_string()
            .contains("no device traces"));
    }

    /// A recording that started late or wrapped is refused with the advice to record
    /// from the start; expandable segments are checked by mapped bytes.
    #[test]
    fn wrapped_or_late_recordings_are_refused() {
        // A segment the trace never allocated is listed.
        let late = read(&snapshot(vec![vec![]], vec![segment(0x1000, G, false)]), 0).unwrap_err();
        assert_eq!(late.kind(), crate::ReadErrorKind::Invalid);
        let msg = late.to_string();
        assert!(msg.starts_with("snap.pickle: the trace leaves 0 segment(s) of 0 B but the snapshot lists 1 of 1.00 GiB: the recording started after"), "{msg}");
        assert!(
            msg.contains("torch.cuda.memory._record_memory_history("),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        // The trace frees a segment it never allocated.
        let wrapped = read(
            &snapshot(vec![vec![entry("segment_free", 0x1000, G)]], vec![]),
            0,
        )
        .unwrap_err();
        assert!(
            wrapped.to_string().starts_with(
                "snap.pickle: entry 0: segment_free of 0x1000, a segment the trace never allocated"
            ),
            "{wrapped}"
        );
        // Expandable: mapped bytes must match the listed expandable segments.
        let ok = snapshot(
            vec![vec![
                entry("segment_map", 0x1000, 40 << 20),
                entry("segment_unmap", 0x1000 + (20 << 20), 20 << 20),
            ]],
            vec![segment(0x1000, 20 << 20, true)],
        );
        assert!(read(&ok, 0).is_ok());
        let bad = snapshot(
            vec![vec![entry("segment_map", 0x1000, 20 << 20)]],
            vec![segment(0x1000, 40 << 20, true)],
        );
        assert!(read(&bad, 0)
            .unwrap_err()
            .to_string()
            .contains("mapped in expandable segments"));
    }

    /// Files that are not pickles, or pickles that are not snapshots, are syntax errors
    /// saying so; malformed entries name their index.
    #[test]
    fn not_a_snapshot() {
        let path = Path::new("x.pickle");
        let e = read_snapshot_pickle_from(&b"hello"[..], path, 0).unwrap_err();
        assert_eq!(e.kind(), crate::ReadErrorKind::Syntax);
        assert!(
            e.to_string()
                .starts_with("x.pickle: byte 2: not a Python pickle ("),
            "{e}"
        );
        let e = read(&Value::List(vec![]), 0).unwrap_err().to_string();
        assert!(
            e.starts_with("snap.pickle: not a PyTorch memory snapshot (the pickle holds a list;"),
            "{e}"
        );
        let e = read(&dict(vec![("segments", Value::List(vec![]))]), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no 'device_traces'"), "{e}");
        let e = read(
            &snapshot(vec![vec![entry("snapshot", 0, 0), Value::I64(3)]], vec![]),
            0,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 1: a trace entry is a dict, found an int"
        );
        let no_addr = dict(vec![
            ("action", Value::String("alloc".into())),
            ("size", Value::I64(1)),
        ]);
        let e = read(&snapshot(vec![vec![no_addr]], vec![]), 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snap.pickle: entry 0: the alloc entry has no 'addr'"
        );
        let odd = dict(vec![("action", Value::String("user_defined".into()))]);
        assert_eq!(
            read(&snapshot(vec![vec![odd]], vec![]), 0).unwrap().entries[0].action,
            Action::Other
        );
    }

    /// Truncated or corrupted pickles never panic.
    #[test]
    fn corrupted_pickles_do_not_panic() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/oracle/h100-torch2.11-pickles/seed000.pickle");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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

    fn oracle_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/oracle/h100-torch2.11-pickles")
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
            assert_eq!(run.segments, json.segments, "{name}");
            assert_eq!(run.meta.alloc_conf, json.meta.alloc_conf, "{name}");
            assert_eq!(
                run.oom.as_ref().map(|o| o.trace_len),
                json.oom.as_ref().map(|o| o.trace_len),
                "{name}"
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
}
