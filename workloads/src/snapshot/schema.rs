//! The records of a snapshot pickle (trace entries decoded from their keys directly,
//! as they are read millions of times; segments and the rest as `serde`-derived
//! structs), and the stores that hold trace entries and segments converted as the
//! pickle machine reads them.
//!
//! The shapes follow PyTorch's `torch.cuda.memory._snapshot()` (2.1 to 2.15): a trace
//! entry is `{action, addr | device_free (oom), size, stream, time_us, frames,
//! compile_context, user_metadata, pool_id, forward_frames, internal_metadata}`, a
//! segment `{device, address, total_size, allocated_size, active_size,
//! requested_size, stream, segment_type, segment_pool_id, is_expandable, frames,
//! blocks}` and a block `{address, size, requested_size, state, frames}`. Keys this
//! crate does not use are ignored, so later versions that add keys still read.

use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::pickle::{Dict, Fnv, Items, List, Value};

type FnvBuild = std::hash::BuildHasherDefault<Fnv>;
use super::value_de::{escape, from_value, DeError};
use crate::recorded::{Action, BlockState, RecordedBlock, RecordedEntry, RecordedSegment};

/// An address or stream handle: any 64-bit pattern (a negative int is the `int64_t`
/// view PyTorch gives some handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Handle(pub u64);

impl<'de> Deserialize<'de> for Handle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Handle, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Handle;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Handle, E> {
                Ok(Handle(v as u64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Handle, E> {
                Ok(Handle(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A byte count or index: a non-negative integer below 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("is {v}, expected a non-negative integer")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A memory pool id, `(int, int)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct PoolId(pub u64, pub u64);

impl<'de> Deserialize<'de> for PoolId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PoolId, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PoolId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pair of integers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PoolId, A::Error> {
                let a: Handle = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let b: Handle = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(PoolId(a.0, b.0))
            }
        }
        d.deserialize_any(V)
    }
}

/// A trace entry, as far as replaying it needs, read straight from its dict's items
/// (no `serde` pass: this runs once per entry of traces of millions). A key given
/// twice takes its last value, as Python's dict keeps it; a value `None` is the key
/// absent.
#[derive(Default)]
pub(crate) struct RawEntry {
    action: Option<Action>,
    addr: Option<u64>,
    size: Option<u64>,
    stream: Option<u64>,
    device_free: Option<u64>,
    time_us: Option<u64>,
    pool_id: Option<PoolId>,
}

/// A key of a trace entry, as [`RawEntry`] reads it (the pickle machine's entry lane
/// knows keys by this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaneKey {
    Action,
    Addr,
    Size,
    Stream,
    DeviceFree,
    TimeUs,
    PoolId,
    /// A key whose container value is not kept (`frames`, which the lane never sees
    /// kept, and [`super::pickle::SKIP_KEYS`]).
    Skip,
    /// Any other string: its value is not read.
    Other,
}

impl LaneKey {
    pub(crate) fn of(key: &str) -> LaneKey {
        match key {
            "action" => LaneKey::Action,
            "addr" => LaneKey::Addr,
            "size" => LaneKey::Size,
            "stream" => LaneKey::Stream,
            "device_free" => LaneKey::DeviceFree,
            "time_us" => LaneKey::TimeUs,
            "pool_id" => LaneKey::PoolId,
            "frames" => LaneKey::Skip,
            k if super::pickle::SKIP_KEYS.contains(&k) => LaneKey::Skip,
            _ => LaneKey::Other,
        }
    }
}

/// Why `v` is not the `expected` value under `key`, worded as [`value_de`]'s
/// `serde` errors are (so messages do not depend on which path read the entry).
fn wrong(key: &str, v: &Value, expected: &str) -> String {
    let what = match v {
        Value::Huge => return format!("'{key}' is an integer that does not fit in 64 bits"),
        Value::Object(name) => return format!("'{key}' is a Python object ({})", escape(name)),
        Value::Consumed => {
            return format!("'{key}' refers back to a trace entry or segment already read")
        }
        Value::Stack(_) => return format!("'{key}' refers back to stack frames already read"),
        Value::Record => return format!("'{key}' is a trace entry already read"),
        Value::List(l) => match &*l.items.borrow() {
            Items::Values(_) => "a list".to_string(),
            Items::Entries(_) => return format!("'{key}' is a list of trace entries"),
            Items::Segments(_) => return format!("'{key}' is a list of segments"),
        },
        Value::None | Value::Skipped => "None".into(),
        Value::Bool(_) => "a bool".into(),
        Value::Int(i) => i.to_string(),
        Value::Big(u) => u.to_string(),
        Value::Float(_) => "a float".into(),
        Value::Str(_) => "a string".into(),
        Value::Bytes => "bytes".into(),
        Value::Tuple(_) => "a list".into(),
        Value::Dict(_) => "a dict".into(),
    };
    format!("'{key}' is {what}, expected {expected}")
}

/// An address or handle: any 64-bit pattern ([`Handle`]).
#[inline]
fn handle_of(key: &str, v: &Value) -> Result<u64, String> {
    match v {
        Value::Int(i) => Ok(*i as u64),
        Value::Big(u) => Ok(*u),
        other => Err(wrong(key, other, "an integer")),
    }
}

/// A byte count ([`Size`]).
#[inline]
fn size_of(key: &str, v: &Value) -> Result<u64, String> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        Value::Big(u) => Ok(*u),
        other => Err(wrong(key, other, "a non-negative integer")),
    }
}

impl RawEntry {
    /// Takes value `v` of key `key` as [`RawEntry::of`] does, for the values it reads
    /// without an error; returns false (and changes nothing) for any other (a wrong
    /// kind, a negative size, a `pool_id` that is not a pair of ints): the entry lane
    /// then hands the entry to the general machine, which says what is wrong.
    #[inline]
    pub(crate) fn set(&mut self, key: LaneKey, v: &Value) -> bool {
        let handle = |v: &Value| match v {
            Value::Int(i) => Some(Some(*i as u64)),
            Value::Big(u) => Some(Some(*u)),
            Value::None => Some(None),
            _ => None,
        };
        let size = |v: &Value| match v {
            Value::Int(i) if *i >= 0 => Some(Some(*i as u64)),
            Value::Big(u) => Some(Some(*u)),
            Value::None => Some(None),
            _ => None,
        };
        let field = match key {
            LaneKey::Other | LaneKey::Skip => return true,
            LaneKey::Action => {
                let Value::Str(s) = v else {
                    return false;
                };
                self.action = Some(Action::from_name(s));
                return true;
            }
            LaneKey::PoolId => {
                let pool = match v {
                    Value::None => None,
                    Value::Tuple(t) => match pool_of(&t.items) {
                        Some(p) => Some(p),
                        None => return false,
                    },
                    _ => return false,
                };
                self.pool_id = pool;
                return true;
            }
            LaneKey::Addr => (&mut self.addr, handle(v)),
            LaneKey::Stream => (&mut self.stream, handle(v)),
            LaneKey::TimeUs => (&mut self.time_us, handle(v)),
            LaneKey::Size => (&mut self.size, size(v)),
            LaneKey::DeviceFree => (&mut self.device_free, size(v)),
        };
        match field {
            (slot, Some(value)) => {
                *slot = value;
                true
            }
            (_, None) => false,
        }
    }

    /// Reads the keys replaying needs from an entry dict's flat items.
    fn of(items: &[Value]) -> Result<RawEntry, String> {
        let mut raw = RawEntry::default();
        for kv in items.chunks_exact(2) {
            let (k, v) = (&kv[0], &kv[1]);
            let Value::Str(key) = k else {
                // serde reads keys as field names: only strings match one.
                continue;
            };
            let key = key.as_str();
            if matches!(v, Value::None) && key != "action" {
                // `None` is the key absent (serde's `Option`).
                match key {
                    "addr" => raw.addr = None,
                    "size" => raw.size = None,
                    "stream" => raw.stream = None,
                    "device_free" => raw.device_free = None,
                    "time_us" => raw.time_us = None,
                    "pool_id" => raw.pool_id = None,
                    _ => {}
                }
                continue;
            }
            match key {
                "action" => match v {
                    Value::Str(s) => raw.action = Some(Action::from_name(s)),
                    other => return Err(wrong(key, other, "a string")),
                },
                "addr" => raw.addr = Some(handle_of(key, v)?),
                "size" => raw.size = Some(size_of(key, v)?),
                "stream" => raw.stream = Some(handle_of(key, v)?),
                "device_free" => raw.device_free = Some(size_of(key, v)?),
                "time_us" => raw.time_us = Some(handle_of(key, v)?),
                "pool_id" => raw.pool_id = Some(convert::<PoolId>(v, "'pool_id'")?),
                _ => {}
            }
        }
        Ok(raw)
    }
}

/// A pool id of two ints, as [`PoolId`]'s `serde` reads a tuple of them.
#[inline]
fn pool_of(items: &[Value]) -> Option<PoolId> {
    let part = |v: &Value| match v {
        Value::Int(i) => Some(*i as u64),
        Value::Big(u) => Some(*u),
        _ => None,
    };
    match items {
        [a, b] => Some(PoolId(part(a)?, part(b)?)),
        _ => None,
    }
}

/// `user_metadata`: a string, or (in some versions) a dict of strings.
pub(crate) struct Metadata(pub String);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Metadata, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a dict")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Metadata, E> {
                Ok(Metadata(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Metadata, E> {
                Ok(Metadata(String::new()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let mut parts = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, super::SettingValue>()? {
                    parts.push(format!("{k}: {v}"));
                }
                Ok(Metadata(parts.join(", ")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A stack frame.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number.
    pub line: u64,
    /// Function name.
    pub name: String,
}

/// Stack frames, each distinct frame and each distinct stack stored once. PyTorch
/// shares a frame dict between all the stacks it appears in; a dict is converted the
/// first time it is seen.
#[derive(Default)]
pub(crate) struct FrameTable {
    pub frames: Vec<Frame>,
    /// Frame index of each dict seen, by address; `dicts` keeps them alive so that
    /// an address stays theirs.
    by_dict: HashMap<*const Dict, u32, FnvBuild>,
    dicts: Vec<Rc<Dict>>,
    pub stacks: Vec<Rc<[u32]>>,
    by_stack: HashMap<Rc<[u32]>, u32, FnvBuild>,
}

impl FrameTable {
    /// The distinct frames and stacks, the lookup maps dropped first so that each
    /// stack is freed as it is copied out.
    pub(crate) fn into_parts(self) -> (Vec<Frame>, Vec<Vec<u32>>) {
        let FrameTable {
            frames,
            stacks,
            by_stack,
            by_dict,
            dicts,
        } = self;
        drop((by_stack, by_dict, dicts));
        (frames, stacks.into_iter().map(|s| s.to_vec()).collect())
    }

    /// The stack index of an entry's `frames` value: a list converted now, or one
    /// converted before (a memo reference); `None` when the entry has none.
    pub(crate) fn stack_of(&mut self, frames: Option<&Value>) -> Result<Option<u32>, String> {
        match frames {
            Some(Value::List(l)) => self.add(l).map(Some).map_err(|e| format!("'frames' {e}")),
            Some(Value::Stack(k)) => Ok(Some(*k)),
            _ => Ok(None),
        }
    }

    fn add(&mut self, list: &List) -> Result<u32, String> {
        let items = list.items.borrow();
        let Items::Values(values) = &*items else {
            return Err("is not a list of frames".into());
        };
        let mut stack = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            let Value::Dict(d) = v else {
                return Err(format!("[{i}] is {}, expected a frame dict", v.kind()));
            };
            let key = Rc::as_ptr(d);
            let index = match self.by_dict.get(&key) {
                Some(&k) => k,
                None => {
                    let frame: Frame = from_value(v).map_err(|e| format!("[{i}] {}", e.0))?;
                    let k = self.frames.len() as u32;
                    self.frames.push(frame);
                    self.by_dict.insert(key, k);
                    self.dicts.push(d.clone());
                    k
                }
            };
            stack.push(index);
        }
        let stack: Rc<[u32]> = stack.into();
        Ok(match self.by_stack.get(&stack) {
            Some(&k) => k,
            None => {
                let k = self.stacks.len() as u32;
                self.stacks.push(stack.clone());
                self.by_stack.insert(stack, k);
                k
            }
        })
    }
}

/// The trace entries of one list of a snapshot, converted as they arrive; with what a
/// [`RecordedEntry`] has no room for kept beside it, sparsely.
#[derive(Default)]
pub(crate) struct EntryStore {
    pub entries: Vec<RecordedEntry>,
    /// `time_us` of each entry (0 when absent).
    pub times: Vec<u64>,
    /// Entries of a pool other than `(0, 0)`.
    pub pools: Vec<(u64, PoolId)>,
    /// How many entries carry a `pool_id` (PyTorch 2.15 on: all of them).
    pub pool_ids: u64,
    /// `device_free` of each `oom` entry.
    pub device_free: Vec<(u64, u64)>,
    /// The text of each `annotate` entry.
    pub annotations: Vec<(u64, String)>,
    /// (entry index, stack index in the frame table), when frames are kept.
    pub stacks: Vec<(u64, u32)>,
    /// The first entry that could not be read: its index and what is wrong.
    pub error: Option<(u64, String)>,
    /// How many entries the pickle machine's entry lane read from start to end (the
    /// others went, at least in part, through its general path): for tests.
    pub by_lane: u64,
    /// Where a streamed read sends each entry (index, record, `time_us`) instead of
    /// keeping it in `entries` and `times` (see `snapshot::stream`).
    pub sink: Option<EntrySink>,
    /// Which list of entries of the pickle this is, counted from 0 in the order the
    /// lists received their first entry (set where a sink is).
    pub serial: u32,
    len: u64,
}

/// Where a streamed read sends each entry of one list: (index in the list, record,
/// `time_us` or 0).
pub(crate) type EntrySink = Box<dyn FnMut(u64, RecordedEntry, u64)>;

impl EntryStore {
    /// Converts and keeps one entry; after a bad one, only counts.
    /// `stack` is the entry's stack frames, converted (or why they could not be).
    pub(crate) fn push(&mut self, v: &Value, stack: Result<Option<u32>, String>) {
        match v {
            Value::Dict(dict) => self.push_items(&dict.items.borrow(), stack),
            other => self.push_error(format!("a trace entry is a dict, found {}", other.kind())),
        }
    }

    /// As [`EntryStore::push`], from the entry dict's items (key, value, key, value...).
    #[inline]
    pub(crate) fn push_items(&mut self, items: &[Value], stack: Result<Option<u32>, String>) {
        let index = self.len;
        self.len += 1;
        if self.error.is_some() {
            return;
        }
        if let Err(message) = stack.and_then(|stack| self.convert(index, items, stack)) {
            self.error = Some((index, message));
        }
    }

    /// Counts an entry that is not a dict.
    fn push_error(&mut self, message: String) {
        let index = self.len;
        self.len += 1;
        if self.error.is_none() {
            self.error = Some((index, message));
        }
    }

    /// Keeps the entry the entry lane read (see [`RawEntry::set`]), when it is one the
    /// lane may make: not an error and not an `annotate` (whose text the lane does not
    /// read). Returns false, having changed nothing, for the others.
    #[inline]
    pub(crate) fn push_lane(&mut self, raw: &RawEntry) -> bool {
        if self.error.is_some() {
            self.len += 1;
            self.by_lane += 1;
            return true;
        }
        if raw.action == Some(Action::Annotate) {
            return false;
        }
        let index = self.len;
        if self.convert_raw(index, raw, &[], None).is_err() {
            return false;
        }
        self.len += 1;
        self.by_lane += 1;
        true
    }

    fn convert(&mut self, index: u64, items: &[Value], stack: Option<u32>) -> Result<(), String> {
        let raw = RawEntry::of(items)?;
        self.convert_raw(index, &raw, items, stack)
    }

    /// Keeps an entry read into `raw` (`items`: its dict's items, for an `annotate`'s
    /// `user_metadata`); changes nothing when it returns an error.
    #[inline]
    fn convert_raw(
        &mut self,
        index: u64,
        raw: &RawEntry,
        items: &[Value],
        stack: Option<u32>,
    ) -> Result<(), String> {
        let Some(action) = raw.action else {
            return Err("the entry has no 'action'".into());
        };
        // Entries without effect on memory need no fields; the others need theirs.
        let needs = !matches!(action, Action::Other | Action::Snapshot);
        let missing = |key: &str| format!("the {} entry has no '{key}'", action.name());
        let (addr, device_free) = if action == Action::Oom {
            let free = match raw.device_free {
                Some(f) => f,
                None if needs => return Err(missing("device_free")),
                None => 0,
            };
            (0, Some(free))
        } else {
            let addr = match raw.addr {
                Some(a) => a,
                None if needs => return Err(missing("addr")),
                None => 0,
            };
            (addr, None)
        };
        let needs_size = needs && action != Action::Annotate;
        let size = match raw.size {
            Some(s) => s,
            None if needs_size => return Err(missing("size")),
            None => 0,
        };
        let stream = match raw.stream {
            Some(s) => s,
            None if needs_size => return Err(missing("stream")),
            None => 0,
        };
        if let Some(free) = device_free {
            self.device_free.push((index, free));
        }
        if let Some(pool) = raw.pool_id {
            self.pool_ids += 1;
            if pool != PoolId(0, 0) {
                self.pools.push((index, pool));
            }
        }
        if action == Action::Annotate {
            let metadata = items
                .chunks_exact(2)
                .rev()
                .find(|kv| kv[0].as_str() == Some("user_metadata"))
                .map(|kv| &kv[1]);
            let text = match metadata {
                Some(m) => {
                    from_value::<Metadata>(m)
                        .map_err(|e| format!("'user_metadata' {e}"))?
                        .0
                }
                None => String::new(),
            };
            self.annotations.push((index, text));
        }
        if let Some(stack) = stack {
            self.stacks.push((index, stack));
        }
        let entry = RecordedEntry {
            action,
            addr,
            size,
            stream,
        };
        match &mut self.sink {
            Some(sink) => sink(index, entry, raw.time_us.unwrap_or(0)),
            None => {
                self.times.push(raw.time_us.unwrap_or(0));
                self.entries.push(entry);
            }
        }
        Ok(())
    }
}

/// A segment.
#[derive(Deserialize)]
struct RawSegment {
    address: Handle,
    total_size: Size,
    stream: Handle,
    allocated_size: Size,
    #[serde(default)]
    segment_type: Option<String>,
    #[serde(default)]
    segment_pool_id: Option<PoolId>,
    #[serde(default)]
    is_expandable: Option<bool>,
    #[serde(default)]
    blocks: Option<Vec<RawBlock>>,
}

/// A block of a segment.
#[derive(Deserialize)]
struct RawBlock {
    size: Size,
    state: String,
    #[serde(default)]
    address: Option<Handle>,
    #[serde(default)]
    requested_size: Option<Size>,
}

/// The segments of a snapshot, converted as they arrive, each with its device.
#[derive(Default)]
pub(crate) struct SegmentStore {
    pub segments: Vec<(u64, RecordedSegment)>,
    /// Segments that could not be read: index, device if known, what is wrong.
    pub errors: Vec<(u64, Option<u64>, String)>,
    len: u64,
}

const MAX_ERRORS: usize = 64;

impl SegmentStore {
    /// Converts and keeps one segment.
    pub(crate) fn push(&mut self, v: &Value) {
        let index = self.len;
        self.len += 1;
        let device = match v {
            Value::Dict(d) => match d.get("device") {
                None => Ok(0),
                Some(dev) => from_value::<Size>(&dev)
                    .map(|s| s.0)
                    .map_err(|e| format!("'device' {e}")),
            },
            other => Err(format!("a segment is a dict, found {}", other.kind())),
        };
        let error = match device {
            Err(message) => (None, message),
            Ok(device) => match convert_segment(v) {
                Ok(segment) => {
                    self.segments.push((device, segment));
                    return;
                }
                Err(message) => (Some(device), message),
            },
        };
        if self.errors.len() < MAX_ERRORS {
            self.errors.push((index, error.0, error.1));
        }
    }
}

fn convert_segment(v: &Value) -> Result<RecordedSegment, String> {
    let raw: RawSegment = from_value(v).map_err(|e| match e.0.strip_prefix("has no") {
        Some(rest) => format!("the segment has no{rest}"),
        None => e.0,
    })?;
    let mut address = raw.address.0;
    let blocks = raw
        .blocks
        .unwrap_or_default()
        .into_iter()
        .map(|b| {
            let block = RecordedBlock {
                address: b.address.map_or(address, |a| a.0),
                size: b.size.0,
                requested_size: b.requested_size.map(|r| r.0),
                state: BlockState::from_name(&b.state),
            };
            address = block.address.wrapping_add(block.size);
            block
        })
        .collect();
    let pool = raw.segment_pool_id.unwrap_or_default();
    Ok(RecordedSegment {
        address: raw.address.0,
        total_size: raw.total_size.0,
        stream: raw.stream.0,
        segment_type: raw.segment_type.unwrap_or_default(),
        allocated_size: raw.allocated_size.0,
        blocks,
        is_expandable: raw.is_expandable.unwrap_or(false),
        pool_id: (pool.0, pool.1),
    })
}

/// Reads a list of generic entry dicts (a trace whose first element was not an
/// entry, or an empty one) into a store.
pub(crate) fn entries_of(items: &[Value], frames: Option<&mut FrameTable>) -> EntryStore {
    let mut store = EntryStore::default();
    match frames {
        Some(table) => {
            for v in items {
                let stack = match v {
                    Value::Dict(d) => table.stack_of(d.get("frames").as_ref()),
                    _ => Ok(None),
                };
                store.push(v, stack);
            }
        }
        None => items.iter().for_each(|v| store.push(v, Ok(None))),
    }
    store
}

/// Reads a list of generic segment dicts into a store.
pub(crate) fn segments_of(items: &[Value]) -> SegmentStore {
    let mut store = SegmentStore::default();
    for v in items {
        store.push(v);
    }
    store
}

/// An `external_annotations` element: `device`, `time_us` and string fields (PyTorch
/// writes `stage` and `name`).
#[derive(Default)]
pub(crate) struct RawExternal {
    pub device: Option<u64>,
    pub time_us: Option<u64>,
    pub fields: Vec<(String, String)>,
}

impl<'de> Deserialize<'de> for RawExternal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawExternal, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawExternal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a dict")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<RawExternal, A::Error> {
                let mut out = RawExternal::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "device" => out.device = Some(map.next_value::<Size>()?.0),
                        "time_us" => out.time_us = Some(map.next_value::<Handle>()?.0),
                        _ => {
                            let v: super::SettingValue = map.next_value()?;
                            out.fields.push((key, v.to_string()));
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// Converts a value, naming what it is in errors.
pub(crate) fn convert<T: de::DeserializeOwned>(v: &Value, what: &str) -> Result<T, String> {
    from_value(v).map_err(|e: DeError| format!("{what} {}", escape(&e.0)))
}
