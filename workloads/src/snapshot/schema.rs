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
    /// `frames`: the entry's stack frames (run through like [`LaneKey::Skip`]'s
    /// values unless frames are kept).
    Frames,
    /// A key whose container value is not kept ([`super::pickle::SKIP_KEYS`]).
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
            "frames" => LaneKey::Frames,
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
        Value::Frame(_) => return format!("'{key}' refers back to a stack frame already read"),
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
            LaneKey::Other | LaneKey::Skip | LaneKey::Frames => return true,
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

/// Stack frames, each distinct frame stored once and the stacks in one flat arena.
/// PyTorch shares a frame dict between all the stacks it appears in; a dict is
/// converted the first time it is seen (by the general machine: [`FrameTable::add`]),
/// or decoded on the spot by the pickle machine's entry lane, which then gives its memo
/// slot the frame's index ([`Value::Frame`]). Equal stacks are stored once while that
/// finds repeats ([`StackDedup`]): real snapshots repeat a few thousand call sites,
/// synthetic ones may repeat none, and a map of millions of distinct stacks would cost
/// more than it saves.
#[derive(Default)]
pub(crate) struct FrameTable {
    pub frames: Vec<Frame>,
    /// Frame index of each dict seen, by address; `dicts` keeps them alive so that
    /// an address stays theirs.
    by_dict: HashMap<*const Dict, u32, FnvBuild>,
    dicts: Vec<Rc<Dict>>,
    /// The stacks, one after the other (frame indexes).
    stack_frames: Vec<u32>,
    /// Where each stack ends in `stack_frames`.
    stack_ends: Vec<usize>,
    /// Equal stacks found by hash, while that finds repeats; `None` once it stopped.
    dedup: Option<StackDedup>,
    /// Whether deduplication stopped (it is not started again).
    dedup_stopped: bool,
}

/// Stacks by hash, for [`FrameTable`]'s deduplication.
#[derive(Default)]
struct StackDedup {
    by_hash: HashMap<u64, u32, std::hash::BuildHasherDefault<IdHash>>,
    /// Stacks interned in the current window, and how many of them were repeats.
    seen: u32,
    repeats: u32,
}

/// Stacks interned per window of [`StackDedup`]; it stops after a window in which
/// fewer than 1 in [`DEDUP_MIN_REPEATS`] stacks was a repeat.
const DEDUP_WINDOW: u32 = 1 << 16;
const DEDUP_MIN_REPEATS: u32 = 16;

/// A hasher for keys that are hashes already.
#[derive(Default)]
pub(crate) struct IdHash(u64);

impl std::hash::Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A stack's hash, for [`StackDedup`].
fn stack_hash(stack: &[u32]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ stack.len() as u64;
    for &f in stack {
        h = (h ^ u64::from(f))
            .wrapping_mul(0x0100_0000_01b3)
            .rotate_left(23);
    }
    h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Where [`FrameTable::find_stack`] found a stack, or would put it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StackSlot {
    pub index: u32,
    /// The stack is not in the table yet: its hash (for the map, when deduplicating).
    new: Option<u64>,
}

impl FrameTable {
    /// The frames and the stacks, as the public [`super::Frames`], with `entries`.
    pub(crate) fn into_frames(self, entries: Vec<(u64, u32)>) -> super::Frames {
        let FrameTable {
            frames,
            stack_frames,
            stack_ends,
            ..
        } = self;
        super::Frames {
            frames,
            stack_frames,
            stack_ends,
            entries,
        }
    }

    /// How many frames there are (a mark to go back to: [`FrameTable::truncate_frames`]).
    #[inline]
    pub(crate) fn frame_count(&self) -> usize {
        self.frames.len()
    }

    /// Forgets the frames from `len` on (the entry lane decoded them, then handed the
    /// entry over: the general machine converts them again).
    pub(crate) fn truncate_frames(&mut self, len: usize) {
        self.frames.truncate(len);
    }

    /// A frame decoded by the entry lane: its index.
    #[inline]
    pub(crate) fn push_frame(&mut self, frame: Frame) -> u32 {
        self.frames.push(frame);
        (self.frames.len() - 1) as u32
    }

    /// The frame index of a frame dict the general machine converted, if it did.
    #[inline]
    pub(crate) fn frame_of_dict(&self, dict: &Rc<Dict>) -> Option<u32> {
        self.by_dict.get(&Rc::as_ptr(dict)).copied()
    }

    /// Frame `index`, decoded by the entry lane, made a dict by the general machine
    /// (a memo reference to it outside the lane): the dict stands for the same frame.
    pub(crate) fn register_dict(&mut self, dict: Rc<Dict>, index: u32) {
        self.by_dict.insert(Rc::as_ptr(&dict), index);
        self.dicts.push(dict);
    }

    /// Frame `index`.
    pub(crate) fn frame(&self, index: u32) -> &Frame {
        &self.frames[index as usize]
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
            let index = match v {
                Value::Frame(k) => *k,
                Value::Dict(d) => match self.frame_of_dict(d) {
                    Some(k) => k,
                    None => {
                        let frame: Frame = from_value(v).map_err(|e| format!("[{i}] {}", e.0))?;
                        let k = self.push_frame(frame);
                        self.register_dict(d.clone(), k);
                        k
                    }
                },
                _ => return Err(format!("[{i}] is {}, expected a frame dict", v.kind())),
            };
            stack.push(index);
        }
        Ok(self.intern_stack(&stack))
    }

    /// The index of `stack`: an equal one's (while deduplicating), or a new one.
    pub(crate) fn intern_stack(&mut self, stack: &[u32]) -> u32 {
        let slot = self.find_stack(stack);
        self.commit_stack(stack, slot);
        slot.index
    }

    /// Where `stack` is (an equal stack, while deduplicating) or would go; changes
    /// nothing ([`FrameTable::commit_stack`] does).
    #[inline]
    pub(crate) fn find_stack(&self, stack: &[u32]) -> StackSlot {
        let next = self.stack_ends.len() as u32;
        if self.dedup_stopped {
            return StackSlot {
                index: next,
                new: Some(0),
            };
        }
        let hash = stack_hash(stack);
        if let Some(&k) = self.dedup.as_ref().and_then(|d| d.by_hash.get(&hash)) {
            if self.stack_indexes(k) == stack {
                return StackSlot {
                    index: k,
                    new: None,
                };
            }
        }
        StackSlot {
            index: next,
            new: Some(hash),
        }
    }

    /// Keeps `stack` where [`FrameTable::find_stack`] said (adding it if new), and
    /// stops deduplicating after a window that found few repeats.
    #[inline]
    pub(crate) fn commit_stack(&mut self, stack: &[u32], slot: StackSlot) {
        if slot.new.is_some() {
            self.stack_frames.extend_from_slice(stack);
            self.stack_ends.push(self.stack_frames.len());
        }
        if self.dedup_stopped {
            return;
        }
        let dedup = self.dedup.get_or_insert_with(StackDedup::default);
        match slot.new {
            Some(hash) => {
                dedup.by_hash.entry(hash).or_insert(slot.index);
            }
            None => dedup.repeats += 1,
        }
        dedup.seen += 1;
        if dedup.seen == DEDUP_WINDOW {
            if dedup.repeats < DEDUP_WINDOW / DEDUP_MIN_REPEATS {
                self.dedup = None;
                self.dedup_stopped = true;
            } else {
                dedup.seen = 0;
                dedup.repeats = 0;
            }
        }
    }

    /// Stack `index`'s frame indexes.
    #[inline]
    fn stack_indexes(&self, index: u32) -> &[u32] {
        let k = index as usize;
        let start = if k == 0 { 0 } else { self.stack_ends[k - 1] };
        &self.stack_frames[start..self.stack_ends[k]]
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
    /// Where a streamed read sends each entry (index, record, private pool) instead of
    /// keeping it in `entries`, `times` and `pools` (see `snapshot::stream`).
    pub sink: Option<EntrySink>,
    /// Which list of entries of the pickle this is, counted from 0 in the order the
    /// lists received their first entry (set where a sink is).
    pub serial: u32,
    len: u64,
}

/// Where a streamed read sends each entry of one list: (index in the list, record,
/// its `pool_id` where that is a private pool, not `(0, 0)`).
pub(crate) type EntrySink = Box<dyn FnMut(u64, RecordedEntry, Option<PoolId>)>;

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
    /// `stack`: the entry's stack frames, when kept.
    #[inline]
    pub(crate) fn push_lane(&mut self, raw: &RawEntry, stack: Option<u32>) -> bool {
        if self.error.is_some() {
            self.len += 1;
            self.by_lane += 1;
            return true;
        }
        if raw.action == Some(Action::Annotate) {
            return false;
        }
        let index = self.len;
        if self.convert_raw(index, raw, &[], stack).is_err() {
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
        let mut private = None;
        if let Some(pool) = raw.pool_id {
            self.pool_ids += 1;
            if pool != PoolId(0, 0) {
                private = Some(pool);
                // A streamed read's sink has them (a list of them would grow with the
                // trace).
                if self.sink.is_none() {
                    self.pools.push((index, pool));
                }
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
            Some(sink) => sink(index, entry, private),
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
    /// Segments are counted only ([`super::pickle::Limits::skip_segments`]).
    skip: bool,
}

const MAX_ERRORS: usize = 64;

impl SegmentStore {
    /// A store that keeps the segments, or only counts them (`skip`).
    pub(crate) fn new(skip: bool) -> SegmentStore {
        SegmentStore {
            skip,
            ..SegmentStore::default()
        }
    }

    /// Converts and keeps one segment (counts it, where skipping).
    pub(crate) fn push(&mut self, v: &Value) {
        let index = self.len;
        self.len += 1;
        if self.skip {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal stacks share one index while repeats are found; after a window of
    /// distinct stacks deduplication stops (new stacks are appended without a lookup),
    /// and every stack, before and after, reads back as it was given.
    #[test]
    fn stacks_dedup_while_they_repeat() {
        let mut t = FrameTable::default();
        let a = t.intern_stack(&[1, 2, 3]);
        assert_eq!(t.intern_stack(&[1, 2, 3]), a);
        let r = t.intern_stack(&[3, 2, 1]);
        assert_ne!(r, a);
        // Windows full of repeats keep it on.
        for i in 0..DEDUP_WINDOW {
            t.intern_stack(&[i % 2]);
        }
        assert!(!t.dedup_stopped);
        assert_eq!(t.intern_stack(&[3, 2, 1]), r);
        // A window of distinct stacks stops it.
        for i in 0..DEDUP_WINDOW {
            t.intern_stack(&[i, i + 1]);
        }
        assert!(t.dedup_stopped && t.dedup.is_none());
        let n = t.stack_ends.len();
        let again = t.intern_stack(&[1, 2, 3]);
        assert_eq!(again as usize, n);
        let frames = t.into_frames(Vec::new());
        assert_eq!(frames.stack_count(), n + 1);
        assert_eq!(frames.stack_indexes(a), &[1, 2, 3]);
        assert_eq!(frames.stack_indexes(again), &[1, 2, 3]);
        assert_eq!(frames.stack_indexes(r), &[3, 2, 1]);
        assert_eq!(
            frames.stack_indexes(n as u32 - 1),
            &[DEDUP_WINDOW - 1, DEDUP_WINDOW]
        );
        assert!(frames.stack_indexes(n as u32 + 1).is_empty());
    }
}
