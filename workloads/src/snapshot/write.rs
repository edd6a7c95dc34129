//! Writing PyTorch memory snapshots: the dict `torch.cuda.memory._snapshot()` returns,
//! for one device, as a pickle (what `_dump_snapshot` writes, read by
//! pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`) or as JSON (the same
//! dict; tuples become lists).
//!
//! The one writer of snapshots. What is written (the keys PyTorch 2.11 writes that the
//! viewers and this crate's reader use):
//!
//! - `segments`: each `{device, address, total_size, allocated_size, active_size,
//!   requested_size, stream, segment_type, segment_pool_id, is_expandable, frames,
//!   blocks}`, each block `{address, size, requested_size, state, frames}`; blocks tile
//!   their segment (`_memory_viz stats` checks it).
//! - `device_traces`: one list, device 0's entries, each `{action, addr, size, stream,
//!   frames}` with `time_us` where known; an `oom` entry has `device_free` instead of
//!   `addr` (as in PyTorch, where the trace entry keeps the free bytes in its address
//!   field).
//! - `allocator_settings`: `PYTORCH_CUDA_ALLOC_CONF` when there is one to record.
//!
//! The pickle is written as Python's pickler writes the dict (protocol 4, a memo:
//! each distinct string and stack frame dict once, then memo references, as PyTorch's
//! frames are shared); the JSON through `serde`. The output reads back through
//! [`super::read_snapshot_pickle_from`] (tested there).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::Write;

use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;

use super::pickle::Fnv;
use super::Frames;
use crate::recorded::{Action, BlockState, RecordedSegment};

/// A trace entry to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// What happened.
    pub action: Action,
    /// Block or segment address; for `oom`, the device's free bytes (`device_free`).
    pub addr: u64,
    /// Bytes: requested bytes of a block, bytes of a segment or mapping, the rounded
    /// request of an `oom`.
    pub size: u64,
    /// Raw stream handle.
    pub stream: u64,
    /// `time_us`, where known.
    pub time_us: Option<u64>,
    /// Stack frames: an index into [`SnapshotOut::frames`]' stacks.
    pub stack: Option<u32>,
}

/// A snapshot to write: one device's segments and trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotOut {
    /// The segments (the allocator's state when the snapshot is taken), in address
    /// order; `pool_id` becomes `segment_pool_id`.
    pub segments: Vec<RecordedSegment>,
    /// The trace, oldest first.
    pub entries: Vec<SnapshotEntry>,
    /// `PYTORCH_CUDA_ALLOC_CONF`, written into `allocator_settings` when `Some`.
    pub alloc_conf: Option<String>,
    /// The stacks [`SnapshotEntry::stack`] points into.
    pub frames: Option<Frames>,
}

/// How a snapshot is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotEncoding {
    /// A pickle, as `torch.cuda.memory._dump_snapshot` writes.
    Pickle,
    /// The same dict as JSON.
    Json,
}

impl SnapshotEncoding {
    /// The encoding a file name asks for: `.pickle` or `.pkl` (pickle), `.json` (JSON);
    /// `None` for anything else.
    pub fn from_path(path: &std::path::Path) -> Option<SnapshotEncoding> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "pickle" | "pkl" => Some(SnapshotEncoding::Pickle),
            "json" => Some(SnapshotEncoding::Json),
            _ => None,
        }
    }
}

/// Writes `snapshot` to `out`.
///
/// # Errors
/// I/O errors of `out`.
pub fn write_snapshot(
    snapshot: &SnapshotOut,
    encoding: SnapshotEncoding,
    out: impl Write,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(256 << 10, out);
    match encoding {
        SnapshotEncoding::Pickle => Pickler {
            out: &mut out,
            memo: 0,
            strings: HashMap::default(),
            keys: [None; KEYS.len()],
            actions: Vec::new(),
            frames: Vec::new(),
        }
        .snapshot(snapshot)?,
        // An I/O error comes back as it was (with what the writer attached to it).
        SnapshotEncoding::Json => {
            serde_json::to_writer(&mut out, snapshot).map_err(std::io::Error::from)?
        }
    }
    out.flush()
}

/// [`write_snapshot`] into bytes.
pub fn snapshot_bytes(snapshot: &SnapshotOut, encoding: SnapshotEncoding) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_snapshot(snapshot, encoding, &mut bytes).expect("writing to memory cannot fail");
    bytes
}

impl Serialize for SnapshotOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("segments", &Seq(&self.segments, SegmentOut))?;
        let trace = Seq(&self.entries, |e| EntryOut {
            entry: e,
            frames: self.frames.as_ref(),
        });
        // A list of one trace per device (an array would be a tuple).
        map.serialize_entry("device_traces", &OneList(trace))?;
        let settings: Vec<(&str, &str)> = self
            .alloc_conf
            .as_deref()
            .map(|c| ("PYTORCH_CUDA_ALLOC_CONF", c))
            .into_iter()
            .collect();
        map.serialize_entry("allocator_settings", &Dict(&settings))?;
        map.end()
    }
}

/// A list serialized item by item through a view.
struct Seq<'a, T, F>(&'a [T], F);

impl<'a, T, V: Serialize, F: Fn(&'a T) -> V> Serialize for Seq<'a, T, F> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&(self.1)(item))?;
        }
        seq.end()
    }
}

/// A list of one element.
struct OneList<T>(T);

impl<T: Serialize> Serialize for OneList<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(1))?;
        seq.serialize_element(&self.0)?;
        seq.end()
    }
}

/// String pairs as a dict.
struct Dict<'a>(&'a [(&'a str, &'a str)]);

impl Serialize for Dict<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// An empty `frames` list.
const NO_FRAMES: [u8; 0] = [];

struct SegmentOut<'a>(&'a RecordedSegment);

impl Serialize for SegmentOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let seg = self.0;
        let (allocated, active, requested) = segment_sizes(seg);
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("device", &0u64)?;
        map.serialize_entry("address", &seg.address)?;
        map.serialize_entry("total_size", &seg.total_size)?;
        map.serialize_entry("allocated_size", &allocated)?;
        map.serialize_entry("active_size", &active)?;
        map.serialize_entry("requested_size", &requested)?;
        map.serialize_entry("stream", &seg.stream)?;
        map.serialize_entry("segment_type", &seg.segment_type)?;
        map.serialize_entry("segment_pool_id", &seg.pool_id)?;
        map.serialize_entry("is_expandable", &seg.is_expandable)?;
        map.serialize_entry("frames", &NO_FRAMES)?;
        map.serialize_entry("blocks", &Seq(&seg.blocks, BlockOut))?;
        map.end()
    }
}

struct BlockOut<'a>(&'a crate::recorded::RecordedBlock);

impl Serialize for BlockOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.0;
        let mut map = s.serialize_map(Some(5))?;
        map.serialize_entry("address", &b.address)?;
        map.serialize_entry("size", &b.size)?;
        map.serialize_entry("requested_size", &b.requested_size.unwrap_or(0))?;
        map.serialize_entry("state", b.state.name())?;
        map.serialize_entry("frames", &NO_FRAMES)?;
        map.end()
    }
}

struct EntryOut<'a> {
    entry: &'a SnapshotEntry,
    frames: Option<&'a Frames>,
}

impl Serialize for EntryOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.entry;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("action", e.action.name())?;
        if e.action == Action::Oom {
            map.serialize_entry("device_free", &e.addr)?;
        } else {
            map.serialize_entry("addr", &e.addr)?;
        }
        map.serialize_entry("size", &e.size)?;
        map.serialize_entry("stream", &e.stream)?;
        if let Some(t) = e.time_us {
            map.serialize_entry("time_us", &t)?;
        }
        match (e.stack, self.frames) {
            (Some(stack), Some(frames)) => {
                map.serialize_entry("frames", &StackOut { frames, stack })?
            }
            _ => map.serialize_entry("frames", &NO_FRAMES)?,
        }
        map.end()
    }
}

struct StackOut<'a> {
    frames: &'a Frames,
    stack: u32,
}

impl Serialize for StackOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        for f in self.frames.stack(self.stack) {
            seq.serialize_element(&FrameOut(f))?;
        }
        seq.end()
    }
}

struct FrameOut<'a>(&'a super::Frame);

impl Serialize for FrameOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("filename", &self.0.filename)?;
        map.serialize_entry("line", &self.0.line)?;
        map.serialize_entry("name", &self.0.name)?;
        map.end()
    }
}

/// The pickle encoding of [`SnapshotOut`], written as Python's pickler writes the dict
/// (protocol 4, lists in batches of 1000, a memo): each distinct string once, each
/// distinct stack frame dict once (PyTorch shares them between stacks), later uses
/// as memo references. Without the memo a snapshot's frames take a hundred times the
/// bytes (every entry's frames written in full).
struct Pickler<W: Write> {
    out: W,
    /// Memo slots used.
    memo: u32,
    /// Memo slot of each string written.
    strings: HashMap<String, u32, BuildHasherDefault<Fnv>>,
    /// Memo slot of each of [`KEYS`] once written (the keys of every entry: no
    /// hashing per entry).
    keys: [Option<u32>; KEYS.len()],
    /// Memo slot of each action's name once written.
    actions: Vec<(Action, u32)>,
    /// Memo slot of each frame dict written, by frame index.
    frames: Vec<Option<u32>>,
}

/// The strings every trace entry writes, by [`Pickler::key`]'s index.
const KEYS: [&str; 7] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "device_free",
];
const ACTION: usize = 0;
const ADDR: usize = 1;
const SIZE: usize = 2;
const STREAM: usize = 3;
const TIME_US: usize = 4;
const FRAMES: usize = 5;
const DEVICE_FREE: usize = 6;

/// Items per APPENDS or SETITEMS, as Python's pickler batches them.
const BATCH: usize = 1000;

impl<W: Write> Pickler<W> {
    fn op(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)
    }

    fn memoize(&mut self) -> std::io::Result<u32> {
        self.op(&[0x94])?;
        self.memo += 1;
        Ok(self.memo - 1)
    }

    fn get(&mut self, slot: u32) -> std::io::Result<()> {
        match u8::try_from(slot) {
            Ok(s) => self.op(&[b'h', s]),
            Err(_) => {
                let b = slot.to_le_bytes();
                self.op(&[b'j', b[0], b[1], b[2], b[3]])
            }
        }
    }

    fn str(&mut self, s: &str) -> std::io::Result<()> {
        if let Some(&slot) = self.strings.get(s) {
            return self.get(slot);
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.op(&[0x8c, n])?,
            Err(_) => {
                let n = u32::try_from(s.len()).map_err(|_| {
                    std::io::Error::other("a string of 4 GiB or more cannot be pickled")
                })?;
                let b = n.to_le_bytes();
                self.op(&[b'X', b[0], b[1], b[2], b[3]])?;
            }
        }
        self.op(s.as_bytes())?;
        let slot = self.memoize()?;
        self.strings.insert(s.to_string(), slot);
        Ok(())
    }

    /// String `KEYS[k]`, as [`Pickler::str`] writes it (the same memo slots), its
    /// slot kept by index.
    #[inline]
    fn key(&mut self, k: usize) -> std::io::Result<()> {
        if let Some(slot) = self.keys[k] {
            return self.get(slot);
        }
        self.str(KEYS[k])?;
        self.keys[k] = self.strings.get(KEYS[k]).copied();
        Ok(())
    }

    /// An int, in the shortest form Python's pickler uses.
    fn int(&mut self, v: u64) -> std::io::Result<()> {
        if v < 1 << 8 {
            self.op(&[b'K', v as u8])
        } else if v < 1 << 16 {
            let b = (v as u16).to_le_bytes();
            self.op(&[b'M', b[0], b[1]])
        } else if v < 1 << 31 {
            let b = (v as u32).to_le_bytes();
            self.op(&[b'J', b[0], b[1], b[2], b[3]])
        } else {
            // LONG1: little-endian two's complement, a zero byte on top when the
            // highest bit is set (the value is positive).
            let b = v.to_le_bytes();
            let mut n = 8 - (v.leading_zeros() / 8) as usize;
            let mut bytes = [0u8; 9];
            bytes[..8].copy_from_slice(&b);
            if bytes[n - 1] & 0x80 != 0 {
                n += 1;
            }
            self.op(&[0x8a, n as u8])?;
            self.op(&bytes[..n])
        }
    }

    fn bool(&mut self, v: bool) -> std::io::Result<()> {
        self.op(&[if v { 0x88 } else { 0x89 }])
    }

    fn key_int(&mut self, key: &str, v: u64) -> std::io::Result<()> {
        self.str(key)?;
        self.int(v)
    }

    fn key_str(&mut self, key: &str, v: &str) -> std::io::Result<()> {
        self.str(key)?;
        self.str(v)
    }

    /// A new dict, memoized, its MARK opened (close with SETITEMS, `u`).
    fn dict(&mut self) -> std::io::Result<()> {
        self.op(b"}")?;
        self.memoize()?;
        self.op(b"(")
    }

    /// A list of `items`, written by `each`, in batches.
    fn list<T>(
        &mut self,
        items: impl ExactSizeIterator<Item = T>,
        mut each: impl FnMut(&mut Self, T) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.op(b"]")?;
        self.memoize()?;
        if items.len() == 0 {
            return Ok(());
        }
        let mut n = 0;
        self.op(b"(")?;
        for item in items {
            if n == BATCH {
                self.op(b"e(")?;
                n = 0;
            }
            each(self, item)?;
            n += 1;
        }
        self.op(b"e")
    }

    /// The empty `frames` of segments, blocks and entries without frames: an empty
    /// tuple, as this writer has always written it (a reader keeping frames then gives
    /// such an entry no stack).
    fn no_frames(&mut self) -> std::io::Result<()> {
        self.str("frames")?;
        self.op(b")")
    }

    fn segment(&mut self, seg: &RecordedSegment) -> std::io::Result<()> {
        let (allocated, active, requested) = segment_sizes(seg);
        self.dict()?;
        self.key_int("device", 0)?;
        self.key_int("address", seg.address)?;
        self.key_int("total_size", seg.total_size)?;
        self.key_int("allocated_size", allocated)?;
        self.key_int("active_size", active)?;
        self.key_int("requested_size", requested)?;
        self.key_int("stream", seg.stream)?;
        self.key_str("segment_type", &seg.segment_type)?;
        self.str("segment_pool_id")?;
        self.int(seg.pool_id.0)?;
        self.int(seg.pool_id.1)?;
        self.op(&[0x86])?; // TUPLE2
        self.memoize()?;
        self.str("is_expandable")?;
        self.bool(seg.is_expandable)?;
        self.no_frames()?;
        self.str("blocks")?;
        self.list(seg.blocks.iter(), |p, b| {
            p.dict()?;
            p.key_int("address", b.address)?;
            p.key_int("size", b.size)?;
            p.key_int("requested_size", b.requested_size.unwrap_or(0))?;
            p.key_str("state", b.state.name())?;
            p.no_frames()?;
            p.op(b"u")
        })?;
        self.op(b"u")
    }

    fn entry(&mut self, e: &SnapshotEntry, frames: Option<&Frames>) -> std::io::Result<()> {
        self.dict()?;
        self.key(ACTION)?;
        match self.actions.iter().find(|(a, _)| *a == e.action) {
            Some(&(_, slot)) => self.get(slot)?,
            None => {
                let name = e.action.name();
                self.str(name)?;
                if let Some(&slot) = self.strings.get(name) {
                    self.actions.push((e.action, slot));
                }
            }
        }
        if e.action == Action::Oom {
            self.key(DEVICE_FREE)?;
        } else {
            self.key(ADDR)?;
        }
        self.int(e.addr)?;
        self.key(SIZE)?;
        self.int(e.size)?;
        self.key(STREAM)?;
        self.int(e.stream)?;
        if let Some(t) = e.time_us {
            self.key(TIME_US)?;
            self.int(t)?;
        }
        match (e.stack, frames) {
            (Some(stack), Some(frames)) => {
                self.key(FRAMES)?;
                let stack = frames.stack_indexes(stack);
                self.list(stack.iter(), |p, &f| p.frame(frames, f))?;
            }
            _ => self.no_frames()?,
        }
        self.op(b"u")
    }

    /// Frame `index` of `frames`: its dict the first time, a memo reference after.
    fn frame(&mut self, frames: &Frames, index: u32) -> std::io::Result<()> {
        let i = index as usize;
        if self.frames.len() <= i {
            self.frames.resize(i + 1, None);
        }
        if let Some(slot) = self.frames[i] {
            return self.get(slot);
        }
        let Some(f) = frames.frames.get(i) else {
            return Err(std::io::Error::other(format!(
                "stack frame {index} is not in the snapshot's frames"
            )));
        };
        self.op(b"}")?;
        let slot = self.memoize()?;
        self.op(b"(")?;
        self.key_str("filename", &f.filename)?;
        self.key_int("line", f.line)?;
        self.key_str("name", &f.name)?;
        self.op(b"u")?;
        self.frames[i] = Some(slot);
        Ok(())
    }

    fn snapshot(&mut self, s: &SnapshotOut) -> std::io::Result<()> {
        self.op(&[0x80, 4])?; // PROTO 4
        self.dict()?;
        self.str("segments")?;
        self.list(s.segments.iter(), |p, seg| p.segment(seg))?;
        self.str("device_traces")?;
        self.list(std::iter::once(()), |p, ()| {
            p.list(s.entries.iter(), |p, e| p.entry(e, s.frames.as_ref()))
        })?;
        self.str("allocator_settings")?;
        self.dict()?;
        if let Some(conf) = &s.alloc_conf {
            self.key_str("PYTORCH_CUDA_ALLOC_CONF", conf)?;
        }
        self.op(b"u")?;
        self.op(b"u.")
    }
}

/// A segment's allocated, active and requested bytes, from its blocks.
fn segment_sizes(seg: &RecordedSegment) -> (u64, u64, u64) {
    let sum = |f: &dyn Fn(&crate::recorded::RecordedBlock) -> Option<u64>| -> u64 {
        seg.blocks.iter().filter_map(f).sum()
    };
    let allocated = sum(&|b| (b.state == BlockState::ActiveAllocated).then_some(b.size));
    let active = sum(&|b| {
        matches!(
            b.state,
            BlockState::ActiveAllocated | BlockState::ActivePendingFree
        )
        .then_some(b.size)
    });
    let requested = sum(&|b| {
        (b.state == BlockState::ActiveAllocated).then_some(b.requested_size.unwrap_or(b.size))
    });
    (allocated, active, requested)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::recorded::RecordedBlock;
    use crate::snapshot::{read_snapshot_pickle_from_with, Frame, SnapshotOptions};

    fn entry(action: Action, addr: u64, size: u64) -> SnapshotEntry {
        SnapshotEntry {
            action,
            addr,
            size,
            stream: 7,
            time_us: Some(10),
            stack: None,
        }
    }

    fn sample() -> SnapshotOut {
        let seg = 0x7f00_0000_0000u64;
        SnapshotOut {
            segments: vec![RecordedSegment {
                address: seg,
                total_size: 2 << 20,
                stream: 7,
                segment_type: "small".into(),
                allocated_size: 512,
                blocks: vec![
                    RecordedBlock {
                        address: seg,
                        size: 512,
                        requested_size: Some(100),
                        state: BlockState::ActiveAllocated,
                    },
                    RecordedBlock {
                        address: seg + 512,
                        size: (2 << 20) - 512,
                        requested_size: Some(0),
                        state: BlockState::Inactive,
                    },
                ],
                is_expandable: false,
                pool_id: (0, 0),
            }],
            entries: vec![
                entry(Action::SegmentAlloc, seg, 2 << 20),
                SnapshotEntry {
                    stack: Some(0),
                    ..entry(Action::Alloc, seg, 100)
                },
                entry(Action::Oom, 12345, 1 << 40),
            ],
            alloc_conf: Some("max_split_size_mb:64".into()),
            frames: Some(Frames {
                frames: vec![Frame {
                    filename: "train.py".into(),
                    line: 3,
                    name: "step".into(),
                }],
                stack_frames: vec![0],
                stack_ends: vec![1],
                entries: Vec::new(),
            }),
        }
    }

    /// A written snapshot reads back through the snapshot reader: entries (an oom's
    /// free bytes included), segments, settings, times and frames.
    #[test]
    fn pickle_reads_back() {
        let out = sample();
        let bytes = snapshot_bytes(&out, SnapshotEncoding::Pickle);
        let run = read_snapshot_pickle_from_with(
            &bytes[..],
            Path::new("x.pickle"),
            0,
            &SnapshotOptions { keep_frames: true },
        )
        .unwrap();
        let actions: Vec<Action> = run.entries.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            vec![Action::SegmentAlloc, Action::Alloc, Action::Oom]
        );
        assert_eq!(run.entries[1].addr, 0x7f00_0000_0000);
        assert_eq!(run.entries[1].size, 100);
        assert_eq!(run.entries[1].stream, 7);
        assert_eq!(run.times_us, vec![10, 10, 10]);
        let message = &run.oom.as_ref().unwrap().message;
        assert!(message.contains("with 12.06 KiB free"), "{message}");
        assert_eq!(run.segments, out.segments);
        assert_eq!(run.meta.alloc_conf.as_deref(), Some("max_split_size_mb:64"));
        let info = run.snapshot.unwrap();
        let frames = info.frames.unwrap();
        assert_eq!(frames.entries, vec![(1, 0)]);
        assert_eq!(frames.stack(0).next().unwrap().name, "step");
    }

    /// The pickle writes each stack frame dict and string once and refers back to
    /// them (a snapshot whose entries share frames stays small, as PyTorch's does),
    /// batches long lists, and keeps every integer exact (2^31, 2^63 and 2^64 - 1 among
    /// them); it reads back the same.
    #[test]
    fn pickle_shares_frames_and_keeps_integers() {
        let mut out = sample();
        let frames = out.frames.as_mut().unwrap();
        frames.frames.push(Frame {
            filename: "/a/long/path/to/the/model/definition.py".into(),
            line: 77,
            name: "forward".into(),
        });
        frames.stack_frames.clear();
        frames.stack_ends.clear();
        frames.push_stack(&[0, 1]);
        frames.push_stack(&[1, 0]);
        let odd = [1u64 << 31, 1 << 63, u64::MAX, 255, 256, 65535, 65536];
        out.entries = (0..2500u64)
            .map(|i| SnapshotEntry {
                action: if i % 2 == 0 {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                },
                addr: 0x1000 + (i / 2) * 4096,
                size: odd[(i / 2) as usize % odd.len()],
                stream: odd[(i / 3) as usize % odd.len()],
                time_us: Some(i),
                stack: Some((i % 2) as u32),
            })
            .collect();
        let bytes = snapshot_bytes(&out, SnapshotEncoding::Pickle);
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(text.matches("definition.py").count(), 1);
        assert_eq!(text.matches("forward").count(), 1);
        assert!(bytes.len() < 2500 * 80, "{} bytes", bytes.len());
        let run = read_snapshot_pickle_from_with(
            &bytes[..],
            Path::new("x.pickle"),
            0,
            &SnapshotOptions { keep_frames: true },
        )
        .unwrap();
        let got: Vec<(u64, u64, u64)> = run
            .entries
            .iter()
            .map(|e| (e.addr, e.size, e.stream))
            .collect();
        let want: Vec<(u64, u64, u64)> = out
            .entries
            .iter()
            .map(|e| (e.addr, e.size, e.stream))
            .collect();
        assert_eq!(got, want);
        assert_eq!(run.times_us, (0..2500).collect::<Vec<u64>>());
        let frames = run.snapshot.unwrap().frames.unwrap();
        assert_eq!(frames.entries.len(), 2500);
        let names = |k: usize| -> Vec<String> {
            frames
                .stack(frames.entries[k].1)
                .map(|f| f.name.clone())
                .collect()
        };
        assert_eq!(names(0), vec!["step", "forward"]);
        assert_eq!(names(2499), vec!["forward", "step"]);
    }

    /// JSON holds the same dict: the keys PyTorch writes, tuples as lists.
    #[test]
    fn json_is_the_same_dict() {
        let text = String::from_utf8(snapshot_bytes(&sample(), SnapshotEncoding::Json)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["device_traces"][0][2]["device_free"], 12345);
        assert!(v["device_traces"][0][2].get("addr").is_none());
        assert_eq!(
            v["device_traces"][0][1]["frames"][0]["filename"],
            "train.py"
        );
        assert_eq!(
            v["segments"][0]["segment_pool_id"],
            serde_json::json!([0, 0])
        );
        assert_eq!(v["segments"][0]["allocated_size"], 512);
        assert_eq!(v["segments"][0]["requested_size"], 100);
        assert_eq!(v["segments"][0]["blocks"][1]["state"], "inactive");
        assert_eq!(
            v["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
            "max_split_size_mb:64"
        );
    }

    /// Extensions choose the encoding; others are refused.
    #[test]
    fn encoding_from_extension() {
        let e = |p: &str| SnapshotEncoding::from_path(Path::new(p));
        assert_eq!(e("a.pickle"), Some(SnapshotEncoding::Pickle));
        assert_eq!(e("a.PKL"), Some(SnapshotEncoding::Pickle));
        assert_eq!(e("a.json"), Some(SnapshotEncoding::Json));
        assert_eq!(e("a.yaml"), None);
        assert_eq!(e("a"), None);
    }
}
