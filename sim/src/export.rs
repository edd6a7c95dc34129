//! A replay written as a PyTorch memory snapshot (`allocsim export`): what policy X
//! would have done, in PyTorch's memory viewer (pytorch.org/memory_viz,
//! `python -m torch.cuda._memory_viz`).
//!
//! [`SnapshotExport`] is an observer of the one engine: per event it writes the trace
//! entries PyTorch's allocator would have recorded for that decision, with the
//! simulated device's addresses, and at the end of the window it takes the policy's
//! segments. The snapshot itself is written by `workloads::snapshot::write_snapshot`.
//!
//! Entries per event (PyTorch's order):
//!
//! - an `alloc` served: the device operations it caused (`segment_free` /
//!   `segment_unmap` of cache releases, then `segment_alloc` / `segment_map`), then
//!   `alloc` (address, requested bytes, stream);
//! - an `alloc` that ran out of memory: the releases it caused, then `oom` (the request
//!   rounded by the policy, the device's free bytes);
//! - `free_requested`: `free_requested`; a `free`: `free_requested` (unless requested
//!   before) and `free_completed`, with the requested bytes, then any device operation
//!   the free caused (the immediate policy's `segment_free`);
//! - `empty_cache` and allocator calls: the releases they caused (PyTorch records no
//!   entry for the call itself; the reader infers `empty_cache` from the releases);
//! - marks, skipped events: nothing.
//!
//! Segments (PyTorch's `segments`, the state after the window's last event) are the
//! device's: one per `cudaMalloc` (`segment_alloc`) with the policy's blocks inside it
//! in address order, and one per mapped run of an expandable segment, as PyTorch lists
//! them. Gaps the policy's snapshot leaves inside a segment are written as inactive
//! blocks, so that blocks tile their segment as PyTorch's do. `segment_type` is the
//! caching policy's pool (`small`, `large`; its private pools' segments are written
//! with their pool's kind and pool id `(0, 0)`, see `docs/trace-format.md`); other
//! policies write their own pool name (`immediate`, `buddy`, `arena-global`...).
//!
//! A window (`--from`, `--to`) holds the entries of its events only and the segments
//! after its last event: a consistent snapshot of a run that started earlier, as
//! PyTorch's ring buffer keeps one; reading it back rebuilds the state at its first
//! entry (`workloads::start`).

use std::collections::{BTreeMap, HashMap};

use policies::{BlockState, Policy, SegmentSnapshot};
use workloads::recorded::{Action, BlockState as FileState, RecordedBlock, RecordedSegment};
use workloads::snapshot::{Frames, SnapshotEntry, SnapshotOut};
use workloads::{Event, Trace};

use crate::observe::{DeviceOpKind, Observer, Outcome, Step};

/// A live allocation, as the snapshot describes it.
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    requested: u64,
    stream: u64,
    free_requested: bool,
}

/// Watches a replay and builds the PyTorch snapshot of events `from..=to` (see the
/// module docs). Call [`SnapshotExport::finish`] with the policy after the replay.
pub struct SnapshotExport<'t> {
    trace: &'t Trace,
    from: usize,
    to: usize,
    /// Stack of each source entry, when the trace's snapshot had frames (handed over
    /// to the snapshot written at the end).
    frames: Option<Frames>,
    entries: Vec<SnapshotEntry>,
    live: HashMap<u64, LiveBlock>,
    /// Live `cudaMalloc` segments: address → (bytes, stream).
    segments: BTreeMap<u64, (u64, u64)>,
    /// Stream of the request that mapped each span of an expandable segment, by address.
    mapped: BTreeMap<u64, u64>,
    started: bool,
    captured: Option<Vec<RecordedSegment>>,
}

impl<'t> SnapshotExport<'t> {
    /// An export of every event of `trace`.
    pub fn new(trace: &'t Trace) -> SnapshotExport<'t> {
        SnapshotExport {
            trace,
            from: 0,
            to: usize::MAX,
            frames: None,
            entries: Vec::new(),
            live: HashMap::new(),
            segments: BTreeMap::new(),
            mapped: BTreeMap::new(),
            started: false,
            captured: None,
        }
    }

    /// Only events `from..=to` (event indexes, from 0).
    pub fn window(mut self, from: usize, to: usize) -> SnapshotExport<'t> {
        self.from = from;
        self.to = to;
        self
    }

    /// Stack frames of the trace's source entries (a snapshot read with its frames):
    /// each entry gets the frames of the source entry its event came from.
    pub fn with_frames(mut self, frames: Frames) -> SnapshotExport<'t> {
        self.frames = Some(frames);
        self
    }

    /// The snapshot: the entries seen, and the segments after the window's last event
    /// (or, when the replay stopped before it, after the last event replayed: `policy`
    /// is the policy the replay ran).
    pub fn finish(mut self, policy: &dyn Policy, alloc_conf: Option<String>) -> SnapshotOut {
        if !self.started {
            self.start(policy);
        }
        let segments = match self.captured.take() {
            Some(s) => s,
            None => self.segments_of(policy),
        };
        SnapshotOut {
            segments,
            entries: self.entries,
            alloc_conf,
            frames: self.frames,
        }
    }

    /// Before the first event: the blocks and segments the policy starts with (a
    /// trace that starts mid-run).
    fn start(&mut self, policy: &dyn Policy) {
        self.started = true;
        let expandable: Vec<(u64, u64)> = self
            .trace
            .start
            .iter()
            .flat_map(|s| &s.segments)
            .filter(|s| s.expandable)
            .map(|s| (s.addr, s.size_bytes))
            .collect();
        for seg in policy.snapshot() {
            let a = seg.addr.0;
            if expandable.iter().any(|&(b, n)| a >= b && a < b + n) {
                self.mapped.insert(a, seg.stream.0);
            } else {
                self.segments.insert(a, (seg.size_bytes, seg.stream.0));
            }
            for b in &seg.blocks {
                if b.state != BlockState::Free {
                    self.live.insert(
                        b.addr.0,
                        LiveBlock {
                            requested: b.requested_bytes,
                            stream: seg.stream.0,
                            free_requested: b.state == BlockState::PendingFree,
                        },
                    );
                }
            }
        }
    }

    fn push(&mut self, step: &Step<'_>, action: Action, addr: u64, size: u64, stream: u64) {
        let index = step.index;
        let stack = self.frames.as_ref().and_then(|f| {
            let entry = *self.trace.locations.get(index)?;
            let i = f.entries.binary_search_by_key(&entry, |&(e, _)| e).ok()?;
            Some(f.entries[i].1)
        });
        self.entries.push(SnapshotEntry {
            action,
            addr,
            size,
            stream,
            time_us: self.trace.times_us.get(index).copied(),
            stack,
        });
    }

    /// The device operations of `step`, as entries (and in the segment bookkeeping).
    fn device_ops(&mut self, step: &Step<'_>, request_stream: u64, write: bool) {
        for op in step.device_ops {
            let (addr, bytes) = (op.addr.0, op.bytes);
            let (action, stream) = match op.kind {
                DeviceOpKind::SegmentAlloc => {
                    self.segments.insert(addr, (bytes, request_stream));
                    (Action::SegmentAlloc, request_stream)
                }
                DeviceOpKind::SegmentFree => {
                    let stream = self.segments.remove(&addr).map_or(0, |(_, s)| s);
                    (Action::SegmentFree, stream)
                }
                DeviceOpKind::Map => {
                    self.mapped.insert(addr, request_stream);
                    (Action::SegmentMap, request_stream)
                }
                DeviceOpKind::Unmap => {
                    let stream = self
                        .mapped
                        .range(..=addr)
                        .next_back()
                        .map_or(0, |(_, &s)| s);
                    (Action::SegmentUnmap, stream)
                }
            };
            if write {
                self.push(step, action, addr, bytes, stream);
            }
        }
    }

    /// The device's segments now, with the policy's blocks (see the module docs).
    fn segments_of(&self, policy: &dyn Policy) -> Vec<RecordedSegment> {
        let snapshot = policy.snapshot();
        let mut out: BTreeMap<u64, RecordedSegment> = BTreeMap::new();
        let new_segment =
            |addr: u64, size: u64, stream: u64, piece: &SegmentSnapshot| RecordedSegment {
                address: addr,
                total_size: size,
                stream,
                segment_type: segment_type(piece.pool).to_string(),
                allocated_size: 0,
                blocks: Vec::new(),
                is_expandable: false,
                pool_id: (0, 0),
            };
        for piece in &snapshot {
            let a = piece.addr.0;
            let owner = self
                .segments
                .range(..=a)
                .next_back()
                .filter(|(&s, &(n, _))| a < s + n);
            let seg = match owner {
                Some((&s, &(n, stream))) => out
                    .entry(s)
                    .or_insert_with(|| new_segment(s, n, stream, piece)),
                // A mapped run of an expandable segment: a segment of its own.
                None => out.entry(a).or_insert_with(|| RecordedSegment {
                    is_expandable: true,
                    ..new_segment(a, piece.size_bytes, piece.stream.0, piece)
                }),
            };
            seg.blocks
                .extend(piece.blocks.iter().map(|b| RecordedBlock {
                    address: b.addr.0,
                    size: b.size_bytes,
                    requested_size: Some(b.requested_bytes),
                    state: match b.state {
                        BlockState::Allocated => FileState::ActiveAllocated,
                        BlockState::PendingFree => FileState::ActivePendingFree,
                        BlockState::Free => FileState::Inactive,
                    },
                }));
        }
        // Segments the policy's snapshot does not show a piece of are wholly free.
        for (&s, &(n, stream)) in &self.segments {
            out.entry(s).or_insert_with(|| RecordedSegment {
                address: s,
                total_size: n,
                stream,
                segment_type: policy.name().to_string(),
                allocated_size: 0,
                blocks: Vec::new(),
                is_expandable: false,
                pool_id: (0, 0),
            });
        }
        out.into_values()
            .map(|mut seg| {
                seg.blocks.sort_by_key(|b| b.address);
                seg.blocks = tile(seg.address, seg.total_size, &seg.blocks);
                seg.allocated_size = seg
                    .blocks
                    .iter()
                    .filter(|b| b.state == FileState::ActiveAllocated)
                    .map(|b| b.size)
                    .sum();
                seg
            })
            .collect()
    }
}

/// PyTorch's `segment_type` for a policy's pool name.
fn segment_type(pool: &str) -> &str {
    match pool {
        "small" | "private small" => "small",
        "large" | "private large" | "uncached" => "large",
        other => other,
    }
}

/// `blocks` (sorted) with inactive blocks in the gaps, so that they tile the segment.
fn tile(addr: u64, size: u64, blocks: &[RecordedBlock]) -> Vec<RecordedBlock> {
    let gap = |address: u64, size: u64| RecordedBlock {
        address,
        size,
        requested_size: Some(0),
        state: FileState::Inactive,
    };
    let mut out = Vec::with_capacity(blocks.len());
    let mut cursor = addr;
    for b in blocks {
        if b.address > cursor {
            out.push(gap(cursor, b.address - cursor));
        }
        out.push(b.clone());
        cursor = b.address + b.size;
    }
    if cursor < addr + size {
        out.push(gap(cursor, addr + size - cursor));
    }
    out
}

impl Observer for SnapshotExport<'_> {
    fn before_event(&mut self, _index: usize, _event: &Event, policy: &dyn Policy) {
        if !self.started {
            self.start(policy);
        }
    }

    fn after_event(&mut self, step: &Step<'_>) {
        let index = step.index;
        if index > self.to {
            return;
        }
        let write = index >= self.from;
        let stream = match *step.event {
            Event::Alloc { stream, .. } => stream,
            _ => 0,
        };
        match step.outcome {
            Outcome::Allocated {
                addr,
                requested_bytes,
                ..
            } => {
                self.device_ops(step, stream, write);
                self.live.insert(
                    addr.0,
                    LiveBlock {
                        requested: requested_bytes,
                        stream,
                        free_requested: false,
                    },
                );
                if write {
                    self.push(step, Action::Alloc, addr.0, requested_bytes, stream);
                }
            }
            Outcome::OutOfMemory {
                requested_bytes, ..
            } => {
                self.device_ops(step, stream, write);
                if write {
                    let rounded = step.policy.rounded_bytes(requested_bytes);
                    let free = step.device_stats.free_bytes();
                    self.push(step, Action::Oom, free, rounded, stream);
                }
            }
            Outcome::FreeRequested { addr, .. } => {
                let block = self.live.get_mut(&addr.0).map(|b| {
                    b.free_requested = true;
                    *b
                });
                if let (true, Some(b)) = (write, block) {
                    self.push(step, Action::FreeRequested, addr.0, b.requested, b.stream);
                }
            }
            Outcome::Freed { addr, .. } => {
                if let Some(b) = self.live.remove(&addr.0) {
                    if write {
                        if !b.free_requested {
                            self.push(step, Action::FreeRequested, addr.0, b.requested, b.stream);
                        }
                        self.push(step, Action::FreeCompleted, addr.0, b.requested, b.stream);
                    }
                }
                self.device_ops(step, stream, write);
            }
            Outcome::CacheEmptied | Outcome::Called { .. } | Outcome::Marked => {
                self.device_ops(step, stream, write);
            }
            Outcome::Skipped(_) => {}
        }
        if index == self.to {
            self.captured = Some(self.segments_of(step.policy));
        }
    }
}
