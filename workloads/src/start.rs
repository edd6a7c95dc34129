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
//!
//! **Private pools** (CUDA graphs' pools, MemPools): a segment keeps the pool the
//! recording lists it in (`segment_pool_id`) through the undoing; a segment the trace
//! gives back, brought back by undoing its `segment_free`, is the default pools' (the
//! entry does not say its pool before PyTorch 2.15; the snapshot reader warns where that
//! may be wrong), and pages mapped again by undoing a `segment_unmap` are the pool of
//! the run beside them. Each private pool holding a segment at the first entry is live
//! then ([`StartState::pools`]); what the recording does not say about it (its uses,
//! whether allocation to it was under way) is assumed as [`StartState::pools_recorded`]
//! says, and the recorder's JSON, which records both, replaces the assumption
//! (`RecordedRun::to_trace`).

use std::collections::{BTreeMap, HashMap};

use crate::recorded::{Action, BlockState, RecordedEntry, RecordedRun, RecordedSegment};
use crate::size::format_size_human;
use crate::trace::{AllocId, Event, PoolId, PoolStreams};
use crate::ReadError;

/// PyTorch's `kSmallSize`: requests of at most this many bytes go to the small pool.
const SMALL_REQUEST_BYTES: u64 = 1 << 20;

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
    /// The private pool it belongs to (one of [`StartState::pools`]), or the default
    /// pools, `(0, 0)`.
    pub pool_id: PoolId,
    /// Its live blocks in address order; the rest of it is free.
    pub blocks: Vec<StartBlock>,
}

/// A private pool live at a trace's first entry (a CUDA graph's pool, a MemPool).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartPrivatePool {
    /// The pool.
    pub id: PoolId,
    /// Its live uses: captured graphs, `use_mem_pool` blocks, the `MemPool` object; 0:
    /// released, its free segments given back at the next cache release.
    pub uses: u64,
    /// A MemPool that may serve a default-pool request about to run out of memory.
    pub use_on_oom: bool,
    /// A MemPool that never splits a block.
    pub no_split: bool,
    /// Allocation to it under way at the first entry (a capture, a `use_mem_pool`
    /// block): the requests it routes. Pools with one come last in
    /// [`StartState::pools`], in the order their allocations began.
    pub routing: Option<PoolStreams>,
}

/// The allocator's state before a trace's first entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments in address order.
    pub segments: Vec<StartSegment>,
    /// Private pools live at the first entry: each pool a segment belongs to, and pools
    /// that hold none yet.
    pub pools: Vec<StartPrivatePool>,
    /// Whether the pools' uses and the allocations to them under way were recorded
    /// (the recorder's JSON); otherwise (a snapshot) they are assumed: one use each
    /// (the graph or MemPool that holds it), kept until the pool's memory is first
    /// given back after its last request, and no allocation under way (a pool's
    /// window opens at its first request in the trace).
    pub pools_recorded: bool,
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

    /// The live blocks, segment by segment (in address order within each).
    pub fn blocks(&self) -> impl Iterator<Item = &StartBlock> {
        self.segments.iter().flat_map(|s| &s.blocks)
    }

    /// Bytes the live blocks' requests asked for.
    pub fn requested_bytes(&self) -> u64 {
        self.blocks().map(|b| b.requested_bytes).sum()
    }

    /// Live blocks whose size is not known (see [`StartBlock::size_bytes`]).
    pub fn unsized_block_count(&self) -> usize {
        self.blocks().filter(|b| b.size_bytes.is_none()).count()
    }

    /// One line for people: what the state holds.
    pub fn describe(&self) -> String {
        format!("{}{}", self.describe_blocks(), self.describe_pools())
    }

    /// What [`StartState::describe`] says of the private pools ("" without any).
    fn describe_pools(&self) -> String {
        if self.pools.is_empty() {
            return String::new();
        }
        let each: Vec<String> = self
            .pools
            .iter()
            .map(|p| {
                let (n, bytes) = self
                    .segments
                    .iter()
                    .filter(|s| s.pool_id == p.id)
                    .fold((0u64, 0u64), |(n, b), s| (n + 1, b + s.size_bytes));
                let mut what = format!(
                    "{} with {n} segment(s) of {}",
                    p.id,
                    format_size_human(bytes)
                );
                if self.pools_recorded {
                    what += &format!(", {} use(s)", p.uses);
                    if p.routing.is_some() {
                        what += ", allocation to it under way";
                    }
                }
                what
            })
            .collect();
        let assumed = if self.pools_recorded {
            ""
        } else {
            " (the snapshot does not record their uses or whether allocation to one was under way: \
             each is given one use, kept until its memory is first given back after its last request, \
             and its requests are routed to it from the first of them)"
        };
        format!("; private pools {}{assumed}", each.join(", "))
    }

    /// What [`StartState::describe`] says of the segments and blocks.
    fn describe_blocks(&self) -> String {
        let pending = self.blocks().filter(|b| b.pending_free).count();
        let requested = self.requested_bytes();
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

impl StartState {
    /// A snapshot's allocator calls for its trace replayed from this state: the first
    /// `create_pool` of each pool live at the first entry is left out (the pool exists,
    /// and the one use it starts with is the use that call would have kept).
    pub(crate) fn snapshot_calls(
        &self,
        calls: &[(Option<u64>, Event)],
    ) -> Vec<(Option<u64>, Event)> {
        let mut live: Vec<PoolId> = self.pools.iter().map(|p| p.id).collect();
        calls
            .iter()
            .filter(|(_, e)| match e {
                Event::CreatePool { pool, .. } => match live.iter().position(|p| p == pool) {
                    Some(k) => {
                        live.swap_remove(k);
                        false
                    }
                    None => true,
                },
                _ => true,
            })
            .cloned()
            .collect()
    }

    /// For a snapshot that shows private pools: the caveat for the segments live at the
    /// first entry that the trace gives back (brought back by undoing their
    /// `segment_free` or `segment_unmap`, with no pool said), adopted into the default
    /// pools; `None` without any.
    pub(crate) fn unknown_pool_caveat(&self) -> Option<String> {
        let unknown: Vec<&StartSegment> =
            self.segments.iter().filter(|s| s.pool.is_none()).collect();
        let first = unknown.first()?;
        let bytes: u64 = unknown.iter().map(|s| s.size_bytes).sum();
        Some(format!(
            "the trace starts mid-run and {} segment(s) of {} live at its first entry (the first at {:#x}) \
             are given back inside it: the snapshot does not say which pool they belonged to, and they are \
             adopted into the default pools (not a private pool's)",
            unknown.len(),
            format_size_human(bytes),
            first.addr
        ))
    }

    /// The recorder's allocator calls for its trace replayed from this state: the
    /// private-pool calls placed before the first entry (pools created, allocations to
    /// them begun and ended, uses released, before the trace or before its ring buffer
    /// kept it) are folded into the state's pools, which they decide exactly (uses,
    /// flags, allocations under way); the other calls are kept.
    pub(crate) fn fold_recorded_calls(
        &mut self,
        calls: &[(Option<u64>, Event)],
    ) -> Vec<(Option<u64>, Event)> {
        self.pools_recorded = true;
        for p in &mut self.pools {
            p.uses = 0;
        }
        // Allocations under way, in the order they began.
        let mut routing: Vec<PoolId> = Vec::new();
        let mut kept = Vec::with_capacity(calls.len());
        for (at, e) in calls {
            let (None, Some(id)) = (at, e.pool()) else {
                kept.push((*at, e.clone()));
                continue;
            };
            let k = match self.pools.iter().position(|p| p.id == id) {
                Some(k) => k,
                None => {
                    self.pools.push(StartPrivatePool {
                        id,
                        uses: 0,
                        use_on_oom: false,
                        no_split: false,
                        routing: None,
                    });
                    self.pools.len() - 1
                }
            };
            let pool = &mut self.pools[k];
            match e {
                Event::CreatePool {
                    use_on_oom,
                    no_split,
                    ..
                } => {
                    pool.uses += 1;
                    pool.use_on_oom = *use_on_oom;
                    pool.no_split = *no_split;
                }
                Event::BeginAllocateToPool { streams, .. } => {
                    pool.uses += 1;
                    pool.routing = Some(streams.clone());
                    routing.retain(|&p| p != id);
                    routing.push(id);
                }
                Event::EndAllocateToPool { .. } => {
                    pool.routing = None;
                    routing.retain(|&p| p != id);
                }
                Event::ReleasePool { .. } => pool.uses = pool.uses.saturating_sub(1),
                _ => {}
            }
        }
        // A pool with no use left and no segment is gone; those allocated to come last,
        // in the order their allocations began.
        let segments = &self.segments;
        self.pools
            .retain(|p| p.uses > 0 || segments.iter().any(|s| s.pool_id == p.id));
        self.pools.sort_by_key(|p| {
            routing
                .iter()
                .position(|&r| r == p.id && p.routing.is_some())
                .map_or(0, |k| k + 1)
        });
        kept
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
    pool_id: PoolId,
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
        if !(s.expandable
            && next.expandable
            && s.stream == next.stream
            && s.pool_id == next.pool_id)
        {
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
                    pool_id: PoolId(s.pool_id.0, s.pool_id.1),
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

    /// Before undoing a request of `pool` (the recording says which) whose block of
    /// `requested` bytes is at `addr`: a segment whose pool is not known (brought back
    /// by undoing its `segment_free` or `segment_unmap`) is that request's, its small
    /// or large pool the one PyTorch's `get_pool` picks for the request (blocks never
    /// leave their pool).
    pub(crate) fn note_request(&mut self, addr: u64, requested: u64, pool: PoolId) {
        if let Some((_, s)) = self.segs.map.range_mut(..=addr).next_back() {
            if s.pool.is_none() {
                s.pool = Some(if requested <= SMALL_REQUEST_BYTES {
                    StartPool::Small
                } else {
                    StartPool::Large
                });
                s.pool_id = pool;
            }
        }
    }

    /// After undoing: each segment whose pool is still not known and that overlaps one
    /// of `seen` (address, bytes, pool: private pools' segments the recording saw) is
    /// that pool's.
    pub(crate) fn seen_pools(&mut self, seen: &[(u64, u64, PoolId)]) {
        if seen.is_empty() {
            return;
        }
        for (&addr, s) in &mut self.segs.map {
            if s.pool.is_some() || !s.pool_id.is_default() {
                continue;
            }
            let end = addr + s.size;
            if let Some(&(_, _, pool)) = seen
                .iter()
                .find(|&&(a, n, _)| a < end && addr < a.saturating_add(n))
            {
                s.pool_id = pool;
            }
        }
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
                        pool_id: PoolId::default(),
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
                let below = segs
                    .map
                    .range(..e.addr)
                    .next_back()
                    .filter(|(&a, s)| s.expandable && a + s.size == e.addr)
                    .map(|(_, s)| s);
                let above = segs.map.get(&(e.addr + e.size)).filter(|s| s.expandable);
                let pool = below
                    .and_then(|s| s.pool)
                    .or_else(|| above.and_then(|s| s.pool));
                let pool_id = below
                    .or(above)
                    .filter(|s| s.stream == e.stream)
                    .map_or(PoolId::default(), |s| s.pool_id);
                segs.insert(
                    e.addr,
                    Seg {
                        size: e.size,
                        stream: e.stream,
                        pool,
                        expandable: true,
                        pool_id,
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
                pool_id: s.pool_id,
                blocks,
            });
        }
        // Each private pool a segment belongs to, one use each (`pools_recorded`).
        let mut ids: Vec<PoolId> = out
            .segments
            .iter()
            .map(|s| s.pool_id)
            .filter(|p| !p.is_default())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        out.pools = ids
            .into_iter()
            .map(|id| StartPrivatePool {
                id,
                uses: 1,
                use_on_oom: false,
                no_split: false,
                routing: None,
            })
            .collect();
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

    /// The pool of the request at `entries[index]`, where the recording shows private
    /// pools and says it: every request of the recorder's JSON (its `request_pools`,
    /// the others the default pools'); a snapshot's as its reader attributed them
    /// (`None` for those it could not). `None` for every request of a recording that
    /// shows no private pool (a segment's pool is then told from its size).
    fn request_pools(&self) -> impl Fn(usize) -> Option<PoolId> + '_ {
        let (shows, private, unknown): (bool, HashMap<u64, PoolId>, Vec<u64>) = match &self.snapshot
        {
            None => (
                !self.request_pools.is_empty()
                    || !self.segment_pools.is_empty()
                    || self.segments.iter().any(|s| s.pool_id != (0, 0)),
                self.request_pools.iter().copied().collect(),
                Vec::new(),
            ),
            Some(info) => (
                !info.pools.shown.is_empty(),
                info.pools.request_pools.iter().copied().collect(),
                info.pools.unattributed.clone(),
            ),
        };
        move |index| {
            if !shows {
                return None;
            }
            let at = self.source_index(index);
            match private.get(&at) {
                Some(&pool) => Some(pool),
                None if unknown.binary_search(&at).is_ok() => None,
                None => Some(PoolId::default()),
            }
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
        let request_pool = self.request_pools();
        for (index, e) in self.entries.iter().enumerate().rev() {
            if e.action == Action::Alloc {
                if let Some(pool) = request_pool(index) {
                    state.note_request(e.addr, e.size, pool);
                }
            }
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
        state.seen_pools(&self.segment_pools);
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
