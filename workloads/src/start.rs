//! Traces that start mid-run: the allocator's state at the first entry, rebuilt from
//! what the recording ends with.
//!
//! A snapshot recorded into PyTorch's ring buffer (`_record_memory_history(max_entries=
//! N)`) keeps only the last N entries, and a recording started after the model was
//! loaded misses everything before; both end with the allocator's full state (the
//! snapshot's `segments`, every block with its address, size, requested size and
//! state). [`RecordedRun::rebuild_start`] undoes the trace on that state, last entry
//! first, as PyTorch's memory visualizer does to draw what was allocated before its
//! first entry: an `alloc` undone frees its block, a `free_completed` undone brings the
//! block back (pending until its `free_requested` is undone, which makes it allocated),
//! a `segment_alloc` undone drops the segment (which must then be empty), a
//! `segment_free` undone brings it back empty, and mappings of expandable segments are
//! undone likewise. What is left is the state before the first entry: segments,
//! mapped ranges and live blocks (the free ones are the gaps between them: PyTorch
//! merges adjacent free blocks).
//!
//! What the end state cannot tell is the size of a block that was allocated before
//! the first entry and freed inside the trace (only its requested size is recorded):
//! [`StartBlock::size_bytes`] is `None` then, and the policy that adopts the state
//! decides it (the caching policy: the size PyTorch would have rounded the request
//! to).

use std::collections::{BTreeMap, HashMap};

use crate::recorded::{Action, BlockState, RecordedEntry, RecordedRun, RecordedSegment};
use crate::size::format_size_human;
use crate::trace::AllocId;
use crate::ReadError;

/// A live block of the [`StartState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartBlock {
    /// First byte.
    pub addr: u64,
    /// The block's size; `None` when only its requested size is known (allocated before
    /// the trace and freed in it).
    pub size_bytes: Option<u64>,
    /// Bytes the program asked for.
    pub requested_bytes: u64,
    /// Whether the program already freed it (a delayed free waiting for other streams).
    pub pending_free: bool,
    /// The id the trace's events use for it.
    pub id: AllocId,
}

/// Which of PyTorch's pools a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPool {
    /// The small pool (2 MiB segments, blocks of at most 1 MiB).
    Small,
    /// The large pool.
    Large,
}

/// A segment of the [`StartState`]: one `cudaMalloc`, or one mapped run of an
/// expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    /// First byte.
    pub addr: u64,
    /// Bytes (mapped bytes, for an expandable segment's run).
    pub size_bytes: u64,
    /// The raw stream it belongs to.
    pub stream: u64,
    /// Its pool; `None` when the recording does not say (a segment freed inside the
    /// trace, whose pool the policy tells from its size).
    pub pool: Option<StartPool>,
    /// Whether it is a mapped run of an expandable segment.
    pub expandable: bool,
    /// Its live blocks in address order; the rest of it is free.
    pub blocks: Vec<StartBlock>,
}

/// The allocator's state before a trace's first entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments in address order.
    pub segments: Vec<StartSegment>,
}

impl StartState {
    /// Bytes held in segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// Live blocks.
    pub fn block_count(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }

    /// Live blocks whose size is not known (see [`StartBlock::size_bytes`]).
    pub fn unsized_block_count(&self) -> usize {
        self.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.size_bytes.is_none())
            .count()
    }

    /// One line for people: what the state holds.
    pub fn describe(&self) -> String {
        let pending = self
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.pending_free)
            .count();
        let requested: u64 = self
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .map(|b| b.requested_bytes)
            .sum();
        format!(
            "{} segment(s) of {} reserved, {} live block(s) ({} requested{})",
            self.segments.len(),
            format_size_human(self.reserved_bytes()),
            self.block_count(),
            format_size_human(requested),
            if pending > 0 {
                format!(", {pending} of them freed and waiting for other streams")
            } else {
                String::new()
            }
        )
    }
}

/// A block while the trace is undone.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) size: Option<u64>,
    pub(crate) requested: u64,
    pub(crate) pending: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Seg {
    size: u64,
    stream: u64,
    pool: Option<StartPool>,
    expandable: bool,
}

/// Segment changes: each key changed, with the bytes of the segment it held before
/// (`None`: none).
pub(crate) type Journal = Vec<(u64, Option<u64>)>;

/// The segments while the trace is undone, and where asked, a journal of what the
/// undoing changed: each key changed with the size it had before (`None`: no segment
/// there), so that a streamed replay can redo the segment operations forward
/// (`crate::snapshot::stream`).
#[derive(Default)]
pub(crate) struct Segs {
    map: BTreeMap<u64, Seg>,
    journal: Option<Journal>,
}

impl Segs {
    fn note(&mut self, key: u64) {
        if let Some(j) = &mut self.journal {
            j.push((key, self.map.get(&key).map(|s| s.size)));
        }
    }

    fn insert(&mut self, key: u64, seg: Seg) {
        self.note(key);
        self.map.insert(key, seg);
    }

    fn remove(&mut self, key: u64) -> Option<Seg> {
        self.note(key);
        self.map.remove(&key)
    }

    /// Whether a segment starting before `addr + size` reaches past `addr`: the one
    /// nearest below the range's end overlaps `[addr, addr + size)`.
    fn overlaps(&self, addr: u64, size: u64) -> bool {
        self.map
            .range(..addr + size)
            .next_back()
            .is_some_and(|(&a, s)| a + s.size > addr)
    }
}

/// Joins the expandable run at `addr` with the runs right after it (one stream): PyTorch
/// lists each mapped run of an expandable segment as a segment of its own, and undoing
/// an unmap joins them again.
fn merge_runs(segs: &mut Segs, addr: u64) {
    while let Some(s) = segs.map.get(&addr).cloned() {
        let Some(next) = segs.map.get(&(addr + s.size)).cloned() else {
            return;
        };
        if !(s.expandable && next.expandable && s.stream == next.stream) {
            return;
        }
        segs.remove(addr + s.size);
        segs.insert(
            addr,
            Seg {
                size: s.size + next.size,
                pool: s.pool.or(next.pool),
                ..s
            },
        );
    }
}

/// The first segment or block of `segments` whose bytes run past the end of the 64-bit
/// address space: where (a record for messages) and its bytes.
pub(crate) fn past_the_end(segments: &[RecordedSegment]) -> Option<(String, u64)> {
    for s in segments {
        let blocks = s.blocks.iter().map(|b| (b.address, b.size));
        if let Some((a, n)) = std::iter::once((s.address, s.total_size))
            .chain(blocks)
            .find(|&(a, n)| a.checked_add(n).is_none())
        {
            let record = if a == s.address && n == s.total_size {
                format!("segment at {a:#x}")
            } else {
                format!("segment at {:#x}, block at {a:#x}", s.address)
            };
            return Some((record, n));
        }
    }
    None
}

/// The allocator's state while a trace is undone, last entry first
/// ([`RecordedRun::rebuild_start`]).
pub(crate) struct Undo {
    pub(crate) segs: Segs,
    pub(crate) live: BTreeMap<u64, Live>,
}

impl Undo {
    /// The state the recording ends with: its segments (the mapped runs of an
    /// expandable segment joined) and their live blocks.
    pub(crate) fn at_end(segments: &[RecordedSegment]) -> Undo {
        let mut segs = Segs::default();
        let mut live: BTreeMap<u64, Live> = BTreeMap::new();
        for s in segments {
            let pool = match s.segment_type.as_str() {
                "small" => Some(StartPool::Small),
                "large" => Some(StartPool::Large),
                _ => None,
            };
            segs.map.insert(
                s.address,
                Seg {
                    size: s.total_size,
                    stream: s.stream,
                    pool,
                    expandable: s.is_expandable,
                },
            );
            for b in &s.blocks {
                let pending = match b.state {
                    BlockState::ActiveAllocated => false,
                    BlockState::ActivePendingFree => true,
                    _ => continue,
                };
                live.insert(
                    b.address,
                    Live {
                        size: Some(b.size),
                        requested: b.requested_size.unwrap_or(b.size),
                        pending,
                    },
                );
            }
        }
        let runs: Vec<u64> = segs.map.keys().copied().collect();
        for a in runs {
            merge_runs(&mut segs, a);
        }
        Undo { segs, live }
    }

    /// Keeps a journal of the segments' changes from now on ([`Segs`]).
    pub(crate) fn journal(&mut self) {
        self.segs.journal = Some(Vec::new());
    }

    /// The journal's changes since it was last taken.
    pub(crate) fn take_journal(&mut self) -> Journal {
        self.segs
            .journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Undoes entry `e` (see the module docs); the error says what does not fit.
    pub(crate) fn undo(&mut self, e: &RecordedEntry) -> Result<(), String> {
        let Undo { segs, live } = self;
        match e.action {
            Action::Alloc => match live.get(&e.addr) {
                Some(b) if !b.pending => {
                    live.remove(&e.addr);
                }
                _ => {
                    return Err(format!(
                        "alloc at {:#x}, a block that is not allocated after it",
                        e.addr
                    ))
                }
            },
            Action::FreeRequested => match live.get_mut(&e.addr) {
                Some(b) if b.pending => b.pending = false,
                _ => {
                    return Err(format!(
                        "free_requested of {:#x}, a block that is not waiting after it",
                        e.addr
                    ))
                }
            },
            Action::FreeCompleted => {
                if live.contains_key(&e.addr) {
                    return Err(format!(
                        "free_completed of {:#x}, a block that is still live after it",
                        e.addr
                    ));
                }
                if segs
                    .map
                    .range(..=e.addr)
                    .next_back()
                    .is_none_or(|(&a, s)| e.addr >= a + s.size)
                {
                    return Err(format!(
                        "free_completed of {:#x}, outside every segment",
                        e.addr
                    ));
                }
                live.insert(
                    e.addr,
                    Live {
                        size: None,
                        requested: e.size,
                        pending: true,
                    },
                );
            }
            Action::SegmentAlloc => {
                let Some(s) = segs.map.get(&e.addr) else {
                    return Err(format!(
                        "segment_alloc at {:#x}, a segment that is not live after it",
                        e.addr
                    ));
                };
                if live.range(e.addr..e.addr + s.size).next().is_some() {
                    return Err(format!(
                        "segment_alloc at {:#x}, a segment that holds blocks right after it",
                        e.addr
                    ));
                }
                segs.remove(e.addr);
            }
            Action::SegmentFree => {
                if segs.overlaps(e.addr, e.size) {
                    return Err(format!(
                        "segment_free at {:#x}, a segment that overlaps a live one after it",
                        e.addr
                    ));
                }
                segs.insert(
                    e.addr,
                    Seg {
                        size: e.size,
                        stream: e.stream,
                        pool: None,
                        expandable: false,
                    },
                );
            }
            Action::SegmentMap => {
                // Undone: [addr, addr + size) is unmapped again, so the run holding
                // it is cut.
                let Some((&a, s)) = segs
                    .map
                    .range(..=e.addr)
                    .next_back()
                    .filter(|(&a, s)| s.expandable && a + s.size >= e.addr + e.size)
                else {
                    return Err(format!(
                        "segment_map at {:#x}, a range that is not mapped after it",
                        e.addr
                    ));
                };
                if live.range(e.addr..e.addr + e.size).next().is_some() {
                    return Err(format!(
                        "segment_map at {:#x}, pages that hold blocks right after it",
                        e.addr
                    ));
                }
                let s = s.clone();
                segs.remove(a);
                if e.addr > a {
                    segs.insert(
                        a,
                        Seg {
                            size: e.addr - a,
                            ..s.clone()
                        },
                    );
                }
                let end = e.addr + e.size;
                if a + s.size > end {
                    segs.insert(
                        end,
                        Seg {
                            size: a + s.size - end,
                            ..s
                        },
                    );
                }
            }
            Action::SegmentUnmap => {
                if segs.overlaps(e.addr, e.size) {
                    return Err(format!(
                        "segment_unmap at {:#x}, pages that are mapped after it",
                        e.addr
                    ));
                }
                // The pool of pages mapped again: that of a neighbouring run, if any.
                let pool = segs
                    .map
                    .range(..e.addr)
                    .next_back()
                    .filter(|(&a, s)| s.expandable && a + s.size == e.addr)
                    .and_then(|(_, s)| s.pool)
                    .or_else(|| segs.map.get(&(e.addr + e.size)).and_then(|s| s.pool));
                segs.insert(
                    e.addr,
                    Seg {
                        size: e.size,
                        stream: e.stream,
                        pool,
                        expandable: true,
                    },
                );
                merge_runs(segs, e.addr);
                if let Some((&a, _)) = segs.map.range(..e.addr).next_back() {
                    merge_runs(segs, a);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The state reached: segments in address order, each with its live blocks (ids
    /// `0..n` in address order). The error is the address of a live block outside
    /// every segment.
    pub(crate) fn into_start(self) -> Result<StartState, u64> {
        let Undo { segs, live } = self;
        let mut out = StartState::default();
        let mut next_id = 0u64;
        for (&addr, s) in &segs.map {
            let blocks: Vec<StartBlock> = live
                .range(addr..addr + s.size)
                .map(|(&a, b)| {
                    let id = AllocId(next_id);
                    next_id += 1;
                    StartBlock {
                        addr: a,
                        size_bytes: b.size,
                        requested_bytes: b.requested,
                        pending_free: b.pending,
                        id,
                    }
                })
                .collect();
            out.segments.push(StartSegment {
                addr,
                size_bytes: s.size,
                stream: s.stream,
                pool: s.pool,
                expandable: s.expandable,
                blocks,
            });
        }
        let placed: usize = out.block_count();
        if placed != live.len() {
            let stray = live
                .keys()
                .find(|&&a| !segs.map.iter().any(|(&s, g)| s <= a && a < s + g.size))
                .copied()
                .unwrap_or(0);
            return Err(stray);
        }
        Ok(out)
    }
}

impl RecordedRun {
    /// Whether the trace starts from an empty allocator: it never frees a block it did
    /// not allocate, never frees or unmaps a segment it did not allocate or map, and it
    /// leaves exactly the segments the recording ends with (when it lists them).
    pub fn starts_empty(&self) -> bool {
        self.trace_starts_empty() && self.leaves_listed_segments()
    }

    /// The state a replay of this run starts from: `None` (empty) when the trace
    /// starts from an empty allocator; otherwise the rebuilt state. A trace that frees
    /// nothing it did not allocate but ends with other segments than the recording
    /// lists, and whose state cannot be rebuilt from them, is taken as starting empty
    /// (the list, not the trace, is then what is wrong).
    ///
    /// # Errors
    /// When the trace frees what it never allocated and the state cannot be rebuilt.
    pub fn start_state(&self) -> Result<Option<StartState>, ReadError> {
        let from_empty = self.trace_starts_empty();
        if from_empty && self.leaves_listed_segments() {
            return Ok(None);
        }
        match self.rebuild_start() {
            Ok(state) => Ok(Some(state)),
            Err(_) if from_empty => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the trace never frees a block, segment or mapping it did not create.
    fn trace_starts_empty(&self) -> bool {
        let mut blocks: HashMap<u64, ()> = HashMap::new();
        let mut segments: HashMap<u64, u64> = HashMap::new();
        let mut mapped: u64 = 0;
        for e in &self.entries {
            match e.action {
                Action::Alloc => {
                    blocks.insert(e.addr, ());
                }
                Action::FreeRequested if !blocks.contains_key(&e.addr) => return false,
                Action::FreeCompleted if blocks.remove(&e.addr).is_none() => return false,
                Action::SegmentAlloc => {
                    segments.insert(e.addr, e.size);
                }
                Action::SegmentFree if segments.remove(&e.addr).is_none() => return false,
                Action::SegmentMap => mapped = mapped.saturating_add(e.size),
                Action::SegmentUnmap => match mapped.checked_sub(e.size) {
                    Some(m) => mapped = m,
                    None => return false,
                },
                _ => {}
            }
        }
        true
    }

    /// Whether the trace, replayed from nothing, leaves exactly the segments the
    /// recording lists (vacuously when it lists none).
    fn leaves_listed_segments(&self) -> bool {
        if self.segments.is_empty() {
            return true;
        }
        let mut segments: HashMap<u64, u64> = HashMap::new();
        let mut mapped: u64 = 0;
        for e in &self.entries {
            match e.action {
                Action::SegmentAlloc => {
                    segments.insert(e.addr, e.size);
                }
                Action::SegmentFree => {
                    segments.remove(&e.addr);
                }
                Action::SegmentMap => mapped = mapped.saturating_add(e.size),
                Action::SegmentUnmap => mapped = mapped.saturating_sub(e.size),
                _ => {}
            }
        }
        let listed: HashMap<u64, u64> = self
            .segments
            .iter()
            .filter(|s| !s.is_expandable)
            .map(|s| (s.address, s.total_size))
            .collect();
        let listed_mapped: u64 = self
            .segments
            .iter()
            .filter(|s| s.is_expandable)
            .map(|s| s.total_size)
            .sum();
        segments == listed && mapped == listed_mapped
    }

    /// The allocator's state before the first entry, rebuilt from the segments the
    /// recording ends with by undoing the trace (see the module docs). Block ids are
    /// `0..n` in address order; [`RecordedRun::to_trace`] numbers the trace's own
    /// allocations after them.
    ///
    /// # Errors
    /// When the trace does not fit the segments the recording ends with (an entry frees
    /// a block outside every segment, allocates over a live block, drops a segment
    /// that still holds blocks...): the message names the entry.
    pub fn rebuild_start(&self) -> Result<StartState, ReadError> {
        if let Some(s) = self.segments.iter().find(|s| s.pool_id != (0, 0)) {
            return Err(ReadError::invalid(
                &self.path,
                None,
                format!(
                    "the trace does not start from an empty allocator, and the segment at {:#x} \
                     belongs to the private memory pool {:?}: rebuilding the state of private \
                     pools at the first entry is not supported yet",
                    s.address, s.pool_id
                ),
            ));
        }
        // Undoing adds addresses and sizes: everything must end below 2^64 first.
        let past_end = |record: String, bytes: u64| {
            ReadError::invalid(
                &self.path,
                Some(record),
                format!("its {bytes} bytes run past the end of the 64-bit address space"),
            )
        };
        if let Some((record, bytes)) = past_the_end(&self.segments) {
            return Err(past_end(record, bytes));
        }
        if let Some((index, e)) =
            (self.entries.iter().enumerate()).find(|(_, e)| e.addr.checked_add(e.size).is_none())
        {
            let record = format!(
                "entry {}: {} of {:#x}",
                self.source_index(index),
                e.action.name(),
                e.addr
            );
            return Err(past_end(record, e.size));
        }
        let mut state = Undo::at_end(&self.segments);
        for (index, e) in self.entries.iter().enumerate().rev() {
            state.undo(e).map_err(|what| {
                ReadError::invalid(
                    &self.path,
                    Some(format!("entry {}", self.source_index(index))),
                    format!(
                        "{what}: the trace does not fit the segments the recording ends with, so \
                         the allocator's state at its first entry cannot be rebuilt"
                    ),
                )
            })?;
        }
        state.into_start().map_err(|stray| {
            ReadError::invalid(
                &self.path,
                None,
                format!(
                    "the rebuilt state has a live block at {stray:#x} outside every segment: the \
                     trace does not fit the segments the recording ends with"
                ),
            )
        })
    }
}
