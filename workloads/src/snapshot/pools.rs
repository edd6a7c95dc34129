//! Private pools in a snapshot (CUDA graphs, `torch.cuda.MemPool`): the pool of each
//! request, and the trace events that route requests to it.
//!
//! A snapshot records no allocation-to-pool window. What it says about pools:
//!
//! - **By entry** (PyTorch 2.15 on): every trace entry carries `pool_id`, the pool of
//!   the block it concerns (for an `oom` entry, the pool the request was routed to).
//! - **By address** (before 2.15): only the segments alive when the snapshot was taken
//!   carry their pool (`segment_pool_id`). Blocks never leave their pool, so a request
//!   whose block lies in such a segment, allocated at that place (for an expandable
//!   segment: mapped there and never unmapped) since before the request, is that
//!   segment's pool's. A request in memory given back before the snapshot was taken has
//!   no pool the snapshot can say.
//! - A snapshot that shows no private pool (no entry, no segment of one): every request
//!   is the default pools'.
//!
//! **Routing.** Each run of consecutive requests of one private pool becomes a window:
//! `begin_allocate_to_pool` (routing the run's streams) before its first request,
//! `end_allocate_to_pool` and `release_pool` after its last. The pool is created
//! (`create_pool`, one use kept) before its first window. That use is dropped just
//! before the first release of the pool's memory after its last request: PyTorch gives
//! a private pool's segments back only once no use is left, or on the routed request's
//! own retry, which comes before the pool's last request. A run of releases of one
//! private pool's segments alone, outside a malloc, is that pool's `emptyCache` (a
//! MemPool destroyed: `release_pool`, `empty_cache` of the pool), not
//! `torch.cuda.empty_cache()`, which would have given back the default pools' free
//! segments too.
//!
//! **What stays unknown, said as caveats** (`TraceMeta::caveats`):
//! requests whose pool the snapshot does not say while it shows private pools (they
//! replay from the default pools); frees waiting for other streams inside or right after
//! a pool's requests, which a capture under way defers (the windows span the pool's
//! requests only); MemPools whose requests never shared a segment, for which the
//! snapshot cannot tell whether they were created with `no_split`.

use std::collections::{BTreeMap, HashMap};

use crate::recorded::{Action, RecordedEntry, RecordedSegment};
use crate::trace::{Event, PoolId, PoolStreams};

use super::empty_cache::{ends_inside_malloc, is_release, passed_over};

/// No pool known.
const UNKNOWN: u32 = u32::MAX;
/// The default pools' slot in the table.
const DEFAULT: u32 = 0;

fn names(pools: &[PoolId]) -> String {
    pools
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first five of a list of `total` entry indexes (`first` holds at least those).
fn some(first: &[u64], total: usize) -> String {
    let shown: Vec<String> = first.iter().take(5).map(u64::to_string).collect();
    format!(
        "{}{}",
        shown.join(", "),
        if total > 5 { ", ..." } else { "" }
    )
}

/// The caveat for the requests of no pool the snapshot says (`first`: the first of
/// them, `count` in all, of `requests`).
fn unattributed_caveat(shown: &[PoolId], first: &[u64], count: usize, requests: usize) -> String {
    format!(
        "the snapshot shows private pools {} (CUDA graphs or MemPools) but does not say the pool of \
         {count} of its {requests} requests (entries {}): their memory was given back before the snapshot \
         was taken, and PyTorch before 2.15 records no pool on trace entries; they replay from the \
         default pools",
        names(shown),
        some(first, count)
    )
}

/// The caveat for the frees waiting for other streams within or right after a pool's
/// requests (`first`: the first of them, `count` in all).
fn delayed_caveat(first: &[u64], count: usize) -> String {
    format!(
        "the snapshot does not record when allocation to its private pools began and ended: {count} free(s) \
         waiting for other streams (entries {}) come during or right after a pool's requests, where a \
         CUDA graph capture under way would have deferred them; the replay takes each pool's windows \
         to span its requests only",
        some(first, count)
    )
}

/// The caveat for MemPools whose requests never shared a segment.
fn no_split_caveat(unsure: &[PoolId]) -> String {
    format!(
        "the snapshot does not say whether MemPool(s) {} were created with no_split (their requests \
         never shared a segment): they replay splitting blocks, as a MemPool does by default",
        names(unsure)
    )
}

/// What a snapshot says about its private pools, per request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotPools {
    /// Private pools the snapshot shows (segments and entries), in order.
    pub shown: Vec<PoolId>,
    /// Requests (`alloc` and `oom` entries) of private pools: (entry index in the
    /// file, pool).
    pub request_pools: Vec<(u64, PoolId)>,
    /// Requests whose pool the snapshot does not say, while it shows private pools
    /// (entry indexes in the file); they replay from the default pools.
    pub unattributed: Vec<u64>,
    /// Requests whose pool came from their entry's `pool_id`.
    pub by_entry: u64,
    /// Requests whose pool came from a segment the snapshot lists.
    pub by_address: u64,
}

/// What a snapshot's stack frames say about its requests, when they were read (file
/// indexes of `alloc` entries, ascending).
#[derive(Debug, Default)]
pub(super) struct FromFrames {
    /// The allocations of checkpoint restores: each of a private pool's takes its block
    /// ([`Event::RestoreBlock`]).
    pub restores: Vec<usize>,
    /// Allocations made by `torch.compile`'s CUDA graph trees: their pool is a graph
    /// pool handle's (`torch.cuda.graph_pool_handle()`), never a `no_split` MemPool.
    pub trees: Vec<usize>,
    /// Segment releases `torch.cuda.empty_cache()` made: each starts or lies in a run
    /// of releases that is an `empty_cache()` wherever it falls (before a capture's
    /// first segment, too, which looks like the capture's malloc giving memory back).
    pub empty_caches: Vec<usize>,
}

/// What the reader adds to a snapshot's run for its private pools.
pub(super) struct Routing {
    /// The pool events, each after the entry it names ([`crate::RecordedRun::calls`]).
    pub calls: Vec<(Option<u64>, Event)>,
    /// What the snapshot cannot say.
    pub caveats: Vec<String>,
    /// The pool of each request.
    pub pools: SnapshotPools,
}

/// What a run of segment releases was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReleaseRun {
    /// Part of the malloc that follows it.
    Malloc,
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A private pool's own `emptyCache` (the pool's slot).
    PoolCache(u32),
}

/// Each entry's pool, as far as the snapshot says.
pub(super) struct Attribution {
    /// Pools by slot; slot 0 is the default pools.
    table: Vec<PoolId>,
    /// Per entry of the file: the slot of its pool, [`UNKNOWN`] where not said.
    of: Vec<u32>,
    /// Per slot, the last request of the pool (entry index), if any.
    last_request: Vec<Option<usize>>,
    /// Indexes of the requests (`alloc` and `oom` entries), in order.
    requests: Vec<usize>,
    /// Private pools shown, sorted.
    shown: Vec<PoolId>,
    by_entry: u64,
    by_address: u64,
}

/// A table of pool ids with the default pools at slot 0.
struct Table {
    ids: Vec<PoolId>,
    slots: HashMap<PoolId, u32>,
}

impl Table {
    fn new() -> Table {
        Table {
            ids: vec![PoolId::default()],
            slots: HashMap::new(),
        }
    }

    /// The listed segments' memory, each range with its pool's slot (a later listed
    /// segment over an earlier one's range replaces it); the private pools they show
    /// are added to `shown`.
    fn listed(
        &mut self,
        segments: &[RecordedSegment],
        shown: &mut Vec<PoolId>,
    ) -> BTreeMap<u64, (u64, u32)> {
        let mut live = BTreeMap::new();
        for s in segments {
            let pool = PoolId(s.pool_id.0, s.pool_id.1);
            if !pool.is_default() {
                shown.push(pool);
            }
            if s.total_size > 0 {
                let slot = self.slot(pool);
                let end = s.address.saturating_add(s.total_size);
                remove_range(&mut live, s.address, end);
                live.insert(s.address, (end, slot));
            }
        }
        live
    }

    fn slot(&mut self, pool: PoolId) -> u32 {
        if pool.is_default() {
            return DEFAULT;
        }
        *self.slots.entry(pool).or_insert_with(|| {
            self.ids.push(pool);
            (self.ids.len() - 1) as u32
        })
    }
}

fn is_request(a: Action) -> bool {
    matches!(a, Action::Alloc | Action::Oom)
}

/// Removes `[start, end)` from a set of disjoint intervals (start → (end, slot)) and
/// gives back the pieces removed, each clipped to `[start, end)` with its slot.
fn remove_range(
    live: &mut BTreeMap<u64, (u64, u32)>,
    start: u64,
    end: u64,
) -> Vec<(u64, u64, u32)> {
    let mut hit: Vec<(u64, u64, u32)> = live
        .range(..end)
        .rev()
        .take_while(|(_, &(e, _))| e > start)
        .map(|(&s, &(e, p))| (s, e, p))
        .collect();
    for piece in &mut hit {
        let (s, e, p) = *piece;
        live.remove(&s);
        if s < start {
            live.insert(s, (start, p));
        }
        if e > end {
            live.insert(end, (e, p));
        }
        *piece = (s.max(start), e.min(end), p);
    }
    hit
}

/// The pool of every entry the snapshot says: `entry_pools` are the entries whose
/// `pool_id` is a private pool (entry index, pool), `every_entry` whether every entry
/// carries a `pool_id` (so the others are the default pools'); `segments` are the
/// segments listed.
pub(super) fn attribute(
    entries: &[RecordedEntry],
    entry_pools: &[(u64, PoolId)],
    every_entry: bool,
    segments: &[RecordedSegment],
) -> Attribution {
    let mut table = Table::new();
    let n = entries.len();
    let mut of = vec![if every_entry { DEFAULT } else { UNKNOWN }; n];
    for &(i, pool) in entry_pools {
        if let Some(slot) = of.get_mut(i as usize) {
            *slot = table.slot(pool);
        }
    }
    let mut shown: Vec<PoolId> = entry_pools.iter().map(|&(_, p)| p).collect();
    let mut by_entry = 0;
    let mut by_address = 0;
    // The listed segments' memory, walked back from the end: an entry that allocates
    // or unmaps memory ends what is known to be the listed segment's before it.
    let mut live = table.listed(segments, &mut shown);
    for i in (0..n).rev() {
        let e = &entries[i];
        match e.action {
            Action::SegmentAlloc | Action::SegmentUnmap => {
                remove_range(&mut live, e.addr, e.addr.saturating_add(e.size));
            }
            a if is_request(a) => {
                if of[i] != UNKNOWN {
                    by_entry += 1;
                } else if a == Action::Alloc {
                    if let Some((_, &(end, slot))) = live.range(..=e.addr).next_back() {
                        if end > e.addr {
                            of[i] = slot;
                            by_address += 1;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    shown.sort_unstable();
    shown.dedup();
    let mut last_request = vec![None; table.ids.len()];
    let mut requests = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if is_request(e.action) {
            requests.push(i);
            if of[i] != UNKNOWN {
                last_request[of[i] as usize] = Some(i);
            }
        }
    }
    Attribution {
        table: table.ids,
        of,
        last_request,
        requests,
        shown,
        by_entry,
        by_address,
    }
}

impl Attribution {
    /// What the run of releases `entries[start..end]` was, given what the rule of
    /// [`super::infer_empty_cache`] says (`inside_malloc`: the run is followed by a
    /// malloc's segment allocation or `oom`): a malloc routed to a private pool (a
    /// capture or a MemPool block under way) gives back only that pool's free segments
    /// (and, with garbage collection on, the default large pool's), never with a full
    /// cache release, so a run before it with other pools' segments was an
    /// `empty_cache()` (`torch.cuda.graph` empties the cache just before capturing).
    /// Outside a malloc, the run is a private pool's own `emptyCache`
    /// ([`Attribution::pool_empty_cache`]) or `empty_cache()`.
    pub(super) fn release_run(
        &self,
        start: usize,
        end: usize,
        inside_malloc: bool,
        gc_possible: bool,
    ) -> ReleaseRun {
        if inside_malloc {
            let request = self
                .requests
                .get(self.requests.partition_point(|&r| r < end));
            let Some(slot) = request
                .map(|&r| self.of[r])
                .filter(|&s| s != UNKNOWN && s != DEFAULT)
            else {
                return ReleaseRun::Malloc;
            };
            let foreign = self.of[start..end]
                .iter()
                .any(|&s| s != UNKNOWN && s != slot && !(gc_possible && s == DEFAULT));
            if !foreign {
                return ReleaseRun::Malloc;
            }
        }
        match self.pool_empty_cache(start, end) {
            Some(slot) => ReleaseRun::PoolCache(slot),
            None => ReleaseRun::EmptyCache,
        }
    }

    /// Whether the run of releases `entries[start..end]` (outside a malloc) is one
    /// private pool's own `emptyCache`: every release is of that pool, after its last
    /// request; the pool's slot.
    pub(super) fn pool_empty_cache(&self, start: usize, end: usize) -> Option<u32> {
        let slot = *self.of.get(start)?;
        if slot == UNKNOWN || slot == DEFAULT {
            return None;
        }
        let all = self.of.get(start..end)?.iter().all(|&s| s == slot);
        let after = self.last_request[slot as usize].is_some_and(|last| start > last);
        (all && after).then_some(slot)
    }

    /// The events that route the requests to their pools, at their positions (after
    /// the entry they name, counted with the inferred `empty_cache` entries), the
    /// caveats, and what the snapshot says per request. `entries` are the file's
    /// entries; with the inferred `empty_cache` entries there are `final_len`, and
    /// `source_indexes` gives the file index of each; `pool_caches` are the release
    /// runs taken as a pool's `emptyCache` (file index of the run's first entry, slot);
    /// `frames` what the stack frames say, when read; `empty_caches` the file indexes
    /// of the entries an inferred `empty_cache()` goes before, in order: one ends a
    /// pool's run of requests ([`Attribution::events`]'s runs).
    pub(super) fn events(
        &self,
        entries: &[RecordedEntry],
        final_len: usize,
        source_indexes: &[u64],
        pool_caches: &[(usize, u32)],
        frames: &FromFrames,
        empty_caches: &[usize],
    ) -> Routing {
        let mut summary = SnapshotPools {
            shown: self.shown.clone(),
            by_entry: self.by_entry,
            by_address: self.by_address,
            ..SnapshotPools::default()
        };
        if self.shown.is_empty() {
            return Routing {
                calls: Vec::new(),
                caveats: Vec::new(),
                pools: summary,
            };
        }
        // Where each file entry landed, and where the first entry made of it (an
        // inferred empty_cache before it) landed.
        let mut first_of = vec![usize::MAX; entries.len()];
        let mut last_of = vec![usize::MAX; entries.len()];
        for (k, &s) in source_indexes.iter().enumerate().take(final_len) {
            if let Some(slot) = first_of.get_mut(s as usize) {
                if *slot == usize::MAX {
                    *slot = k;
                }
                last_of[s as usize] = k;
            }
        }
        let before = |raw: usize| -> Option<u64> {
            let k = first_of[raw];
            (k > 0).then(|| (k - 1) as u64)
        };
        let after = |raw: usize| -> Option<u64> { Some(last_of[raw] as u64) };
        // (position, rank, event); ranks order events at one position.
        let mut calls: Vec<(Option<u64>, u8, Event)> = Vec::new();
        let pool = |slot: u32| self.table[slot as usize];
        let mut alive = vec![false; self.table.len()];
        // Runs of consecutive requests of one private pool, each ended by an inferred
        // `empty_cache()` too: one that gives memory back comes while no allocation to
        // a pool is under way (PyTorch then gives back no default-pool memory, and none
        // of a pool in use), as where `torch.cuda.graph` empties the cache between the
        // CUDA graph trees' warm-up in their pool and the capture.
        let mut run: Option<(u32, usize, usize, Vec<u64>)> = None;
        let mut runs: Vec<(u32, usize, usize, Vec<u64>)> = Vec::new();
        let mut next_empty_cache = empty_caches.iter().peekable();
        for (i, e) in entries.iter().enumerate() {
            if next_empty_cache.next_if(|&&p| p <= i).is_some() {
                runs.extend(run.take());
            }
            if !is_request(e.action) {
                continue;
            }
            let slot = self.of[i];
            if slot == UNKNOWN {
                summary.unattributed.push(i as u64);
            } else if slot != DEFAULT {
                summary.request_pools.push((i as u64, pool(slot)));
            }
            let private = slot != UNKNOWN && slot != DEFAULT;
            match &mut run {
                Some((s, _, last, streams)) if private && *s == slot => {
                    *last = i;
                    if !streams.contains(&e.stream) {
                        streams.push(e.stream);
                    }
                }
                _ => {
                    runs.extend(run.take());
                    if private {
                        run = Some((slot, i, i, vec![e.stream]));
                    }
                }
            }
        }
        runs.extend(run.take());
        for (slot, first, last, mut streams) in runs.iter().cloned() {
            let id = pool(slot);
            if !alive[slot as usize] {
                alive[slot as usize] = true;
                calls.push((
                    before(first),
                    4,
                    Event::CreatePool {
                        pool: id,
                        use_on_oom: false,
                        no_split: false,
                    },
                ));
            }
            streams.sort_unstable();
            calls.push((
                before(first),
                5,
                Event::BeginAllocateToPool {
                    pool: id,
                    streams: PoolStreams::only(streams),
                },
            ));
            calls.push((after(last), 0, Event::EndAllocateToPool { pool: id }));
            calls.push((after(last), 1, Event::ReleasePool { pool: id }));
        }
        // The kept use ends before the run of releases holding the pool's first release
        // after its last request (found in one pass back over the entries: the earliest
        // release of each pool seen so far, taken when its last request is reached).
        let mut run_start = vec![0usize; entries.len()];
        for i in 0..entries.len() {
            run_start[i] = if i > 0 && is_release(entries[i - 1].action) {
                run_start[i - 1]
            } else {
                i
            };
        }
        let mut earliest = vec![usize::MAX; self.table.len()];
        let mut drops = Vec::new();
        for i in (0..entries.len()).rev() {
            let slot = self.of[i];
            if slot == UNKNOWN || slot == DEFAULT {
                continue;
            }
            if is_release(entries[i].action) {
                earliest[slot as usize] = i;
            } else if self.last_request[slot as usize] == Some(i)
                && earliest[slot as usize] != usize::MAX
            {
                // Not before the pool's last request, whose run cannot hold it.
                let r = earliest[slot as usize];
                drops.push((run_start[r].max(i + 1), slot));
            }
        }
        for (r, slot) in drops {
            calls.push((before(r), 2, Event::ReleasePool { pool: pool(slot) }));
        }
        for &(start, slot) in pool_caches {
            calls.push((before(start), 3, Event::EmptyPoolCache { pool: pool(slot) }));
        }
        for &i in &frames.restores {
            let slot = self.of.get(i).copied().unwrap_or(UNKNOWN);
            if slot != UNKNOWN && slot != DEFAULT {
                let (pool, addr) = (pool(slot), entries[i].addr);
                calls.push((before(i), 6, Event::RestoreBlock { pool, addr }));
            }
        }
        calls.sort_by_key(|(at, rank, _)| (at.map_or(0, |a| a + 1), *rank));

        let mut caveats = Vec::new();
        if !summary.unattributed.is_empty() {
            caveats.push(unattributed_caveat(
                &self.shown,
                &summary.unattributed,
                summary.unattributed.len(),
                self.requests.len(),
            ));
        }
        // Frees that wait for other streams inside a pool's run of requests or right
        // after it (before the next request): a capture under way defers them.
        let requests = &self.requests;
        let spans: Vec<(usize, usize)> = runs
            .iter()
            .map(|&(_, first, last, _)| {
                let next = requests.partition_point(|&j| j <= last);
                (first, requests.get(next).copied().unwrap_or(entries.len()))
            })
            .collect();
        let mut delayed = Vec::new();
        let mut r = 0;
        for (i, e) in entries.iter().enumerate() {
            while r < spans.len() && spans[r].1 <= i {
                r += 1;
            }
            let inside = spans.get(r).is_some_and(|&(first, _)| first < i);
            if inside
                && e.action == Action::FreeRequested
                && !entries
                    .get(i + 1)
                    .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr)
            {
                delayed.push(i as u64);
            }
        }
        if !delayed.is_empty() {
            caveats.push(delayed_caveat(&delayed, delayed.len()));
        }
        let mut unsure = self.unsure_no_split(entries);
        // The CUDA graph trees' pool is a graph pool handle's, not a MemPool.
        unsure.retain(|p| {
            !frames.trees.iter().any(|&i| {
                self.of
                    .get(i)
                    .is_some_and(|&s| s != UNKNOWN && self.table[s as usize] == *p)
            })
        });
        if !unsure.is_empty() {
            caveats.push(no_split_caveat(&unsure));
        }
        Routing {
            calls: calls.into_iter().map(|(at, _, e)| (at, e)).collect(),
            caveats,
            pools: summary,
        }
    }

    /// MemPool-style pools `(0, N)` with requests of which no two were ever live in
    /// one (non-expandable) segment at once: nothing shows whether they split blocks.
    fn unsure_no_split(&self, entries: &[RecordedEntry]) -> Vec<PoolId> {
        let mut used = vec![false; self.table.len()];
        let mut splits = vec![false; self.table.len()];
        // Live segments: start → (end, live requests in it).
        let mut segments: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        // Live requests of private pools: address → segment start.
        let mut blocks: HashMap<u64, u64> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            match e.action {
                Action::SegmentAlloc => {
                    segments.insert(e.addr, (e.addr.saturating_add(e.size), 0));
                }
                Action::SegmentFree => {
                    segments.remove(&e.addr);
                }
                Action::Alloc => {
                    let slot = self.of[i];
                    if slot == UNKNOWN || slot == DEFAULT {
                        continue;
                    }
                    used[slot as usize] = true;
                    if let Some((&start, (end, count))) = segments.range_mut(..=e.addr).next_back()
                    {
                        if *end > e.addr {
                            *count += 1;
                            if *count >= 2 {
                                splits[slot as usize] = true;
                            }
                            blocks.insert(e.addr, start);
                        }
                    }
                }
                Action::FreeCompleted => {
                    if let Some(start) = blocks.remove(&e.addr) {
                        if let Some((_, count)) = segments.get_mut(&start) {
                            *count = count.saturating_sub(1);
                        }
                    }
                }
                _ => {}
            }
        }
        (1..self.table.len())
            .filter(|&s| used[s] && !splits[s] && self.table[s].0 == 0)
            .map(|s| self.table[s])
            .collect()
    }
}

/// The listed segments' memory for the attribution by address, forward: start →
/// (end, slot, the last entry before the snapshot that allocated or unmapped it, if
/// any). A request at an address in it is the slot's when it comes after that entry:
/// what [`attribute`] finds walking the trace back.
type AddressPools = BTreeMap<u64, (u64, u32, Option<u64>)>;

/// A run of consecutive segment releases, as [`PoolStream`] follows it.
struct Releases {
    start: u64,
    /// The slot of its first entry, and whether all its entries have it.
    first: u32,
    uniform: bool,
    /// The distinct slots of its entries.
    slots: Vec<u32>,
}

/// What was made of a run of releases (before the pools' last requests are known).
#[derive(Clone, Copy)]
enum Decided {
    EmptyCache,
    /// A private pool's own `emptyCache` if none of its requests comes after the run,
    /// else `empty_cache()`.
    PoolCacheIfLast(u32),
}

/// A run of consecutive requests of one private pool.
struct RequestRun {
    slot: u32,
    first: u64,
    last: u64,
    streams: Vec<u64>,
}

/// A run of one private pool's requests, closed: its streams are
/// `streams[previous run's streams_end..streams_end]`, sorted.
#[derive(Debug)]
struct ClosedRun {
    first: u64,
    last: u64,
    streams_end: u64,
    slot: u32,
}

/// A run's window as the second pass places it: `begin` the position of its
/// `create_pool` (if `create`) and `begin_allocate_to_pool`, `end` that of its
/// `end_allocate_to_pool` and `release_pool` (positions as [`crate::RecordedRun::calls`]
/// counts them).
#[derive(Debug)]
struct Window {
    begin: Option<u64>,
    end: u64,
    streams_end: u64,
    slot: u32,
    create: bool,
}

/// What [`PoolStream::finish`] gives the second pass: the allocator calls at their
/// positions, the entries before which an `empty_cache` entry is inferred, and the
/// caveats, each exactly as the held reader has them. The windows' calls are made as
/// they are taken ([`PoolPlan::next_call`]): a run of requests is kept in 40 bytes
/// and its streams.
#[derive(Debug)]
pub(super) struct PoolPlan {
    table: Vec<PoolId>,
    windows: Vec<Window>,
    streams: Vec<u64>,
    /// The other calls (kept uses dropped, pools' own `emptyCache`) with their ranks
    /// among the calls at one position, in order.
    others: Vec<(Option<u64>, u8, Event)>,
    /// File indexes of the entries an inferred `empty_cache` goes before, ascending.
    pub points: Vec<u64>,
    /// As [`crate::TraceMeta::caveats`].
    pub caveats: Vec<String>,
}

/// Where the second pass is in a [`PoolPlan`]'s calls.
#[derive(Debug, Default)]
pub(super) struct CallCursor {
    window: usize,
    /// The window's next call: 0 `create_pool`, 1 `begin_allocate_to_pool`, 2
    /// `end_allocate_to_pool`, 3 `release_pool`.
    step: u8,
    other: usize,
}

/// The order of calls: after the entry at the position (`None`: before the first), by
/// rank at one position, as `Attribution::events` sorts them.
fn order(at: Option<u64>, rank: u8) -> (u64, u8) {
    (at.map_or(0, |a| a + 1), rank)
}

impl PoolPlan {
    /// The window call at `cursor`, if any: its order and position.
    fn window_call(&self, cursor: &mut CallCursor) -> Option<((u64, u8), Option<u64>)> {
        loop {
            let w = self.windows.get(cursor.window)?;
            let at = match cursor.step {
                0 if !w.create => {
                    cursor.step = 1;
                    continue;
                }
                0 => return Some((order(w.begin, 4), w.begin)),
                1 => return Some((order(w.begin, 5), w.begin)),
                2 => Some(w.end),
                _ => Some(w.end),
            };
            return Some((order(at, cursor.step - 2), at));
        }
    }

    /// The next call at or before `position` (counted with the inferred `empty_cache`
    /// entries; `u64::MAX`: any), with the position it was placed at, in the held
    /// trace's order: the windows' calls (made here) merged with the others (no two
    /// calls of the two kinds share a rank).
    pub(super) fn next_call(
        &self,
        cursor: &mut CallCursor,
        position: u64,
    ) -> Option<(Option<u64>, Event)> {
        let window = self.window_call(cursor);
        let other = self
            .others
            .get(cursor.other)
            .map(|(at, rank, _)| (order(*at, *rank), *at));
        let take_window = match (window, other) {
            (Some((w, _)), Some((o, _))) => w < o,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        if take_window {
            let ((key, _), at) = window?;
            if key > position {
                return None;
            }
            let w = &self.windows[cursor.window];
            let pool = self.table[w.slot as usize];
            let event = match cursor.step {
                0 => Event::CreatePool {
                    pool,
                    use_on_oom: false,
                    no_split: false,
                },
                1 => {
                    let start = match cursor.window {
                        0 => 0,
                        i => self.windows[i - 1].streams_end,
                    };
                    Event::BeginAllocateToPool {
                        pool,
                        streams: PoolStreams::only(
                            self.streams[start as usize..w.streams_end as usize].to_vec(),
                        ),
                    }
                }
                2 => Event::EndAllocateToPool { pool },
                _ => Event::ReleasePool { pool },
            };
            cursor.step += 1;
            if cursor.step == 4 {
                cursor.step = 0;
                cursor.window += 1;
            }
            Some((at, event))
        } else {
            let ((key, _), at) = other?;
            if key > position {
                return None;
            }
            let event = self.others[cursor.other].2.clone();
            cursor.other += 1;
            Some((at, event))
        }
    }

    /// A trace replayed from a state in which the private pools `live` exist: the
    /// first `create_pool` of each is left out, as `StartState::snapshot_calls` leaves
    /// it out of the held run's calls (the first window of a pool is the one that
    /// creates it).
    pub(super) fn started_with(&mut self, live: &[PoolId]) {
        for w in &mut self.windows {
            if w.create && live.contains(&self.table[w.slot as usize]) {
                w.create = false;
            }
        }
    }

    /// The pools the calls name, in the order they first come.
    pub(super) fn pools(&self) -> Vec<PoolId> {
        let mut out: Vec<PoolId> = Vec::new();
        let mut cursor = CallCursor::default();
        while let Some((_, e)) = self.next_call(&mut cursor, u64::MAX) {
            if let Some(p) = e.pool().filter(|p| !out.contains(p)) {
                out.push(p);
            }
        }
        out
    }
}

/// A list of entry indexes of which only the first few are shown.
#[derive(Default)]
struct Some5 {
    first: Vec<u64>,
    count: usize,
}

impl Some5 {
    fn push(&mut self, i: u64) {
        if self.first.len() < 6 {
            self.first.push(i);
        }
        self.count += 1;
    }
}

/// The private pools of a snapshot's trace followed forward, one entry at a time, in
/// memory that follows the segments, the live blocks of private pools and the runs of
/// requests rather than the entries: the same pool of each request as [`attribute`]
/// (by entry, or by address from the final segments and the last entry that allocated
/// or unmapped each of their bytes, which the first pass of a streamed read keeps), the
/// same release runs as [`Attribution::release_run`] (decided as the entries that
/// settle them come: the next entry, the next request, the pools' last requests at the
/// end) and the same calls and caveats as [`Attribution::events`]. The streamed replay
/// (`snapshot::stream`) reads the file once with it, then splices its calls in.
pub(super) struct PoolStream {
    table: Vec<PoolId>,
    slots: HashMap<PoolId, u32>,
    shown: Vec<PoolId>,
    every_entry: bool,
    gc_possible: bool,
    /// `alloc` and `oom` entries of the trace (the first pass counted them).
    requests: u64,
    addresses: AddressPools,
    len: u64,
    /// An entry names a pool the first pass did not see (the file changed).
    pub failed: bool,
    unattributed: Some5,
    run: Option<RequestRun>,
    /// The slot of the run closed at a run of releases, which the next request may
    /// go on ([`Attribution::events`]' runs end at an inferred `empty_cache()`, decided
    /// later): the starts of the runs of releases since its last request.
    cut: Option<(u32, Vec<u64>)>,
    /// Runs that go on one closed at runs of releases: (index in `runs`, the releases'
    /// starts); merged back at the end unless one of those was an `empty_cache()`.
    cuts: Vec<(usize, Vec<u64>)>,
    runs: Vec<ClosedRun>,
    /// The streams of the closed runs, one run after the other.
    run_streams: Vec<u64>,
    last_request: Vec<Option<u64>>,
    /// The latest request is a private pool's: a free waiting for other streams now is
    /// within or right after its run.
    in_span: bool,
    /// Per slot, the start of the run of releases holding its first release since its
    /// latest request.
    first_release: Vec<Option<u64>>,
    /// The run of releases open.
    open: Option<Releases>,
    /// Runs of releases waiting for the next entry that is not a `snapshot` or
    /// `annotate` (inside a malloc or not).
    awaiting_next: Vec<Releases>,
    /// Runs of releases inside a malloc waiting for the next request's pool.
    awaiting_request: Vec<Releases>,
    decided: Vec<(u64, Decided)>,
    // `Attribution::unsure_no_split`, forward.
    used: Vec<bool>,
    splits: Vec<bool>,
    segments: BTreeMap<u64, (u64, u32)>,
    blocks: HashMap<u64, u64>,
    /// A `free_requested` within a pool's span waiting for the next entry.
    pending_free: Option<(u64, u64)>,
    delayed: Some5,
}

impl PoolStream {
    /// Before the trace: `entry_pools` are the private pools the entries name, in the
    /// order they first come; `every_entry` whether every entry carries a `pool_id`;
    /// `segments` the segments listed; `segment_ops` the trace's segment operations
    /// with their indexes; `requests` its `alloc` and `oom` entries.
    pub(super) fn new(
        entry_pools: &[PoolId],
        every_entry: bool,
        segments: &[RecordedSegment],
        segment_ops: &[(u64, RecordedEntry)],
        gc_possible: bool,
        requests: u64,
    ) -> PoolStream {
        let mut table = Table::new();
        for &pool in entry_pools {
            table.slot(pool);
        }
        let mut shown: Vec<PoolId> = entry_pools.to_vec();
        let mut live = table.listed(segments, &mut shown);
        shown.sort_unstable();
        shown.dedup();
        // Walked back as `attribute` walks the entries: each piece taken away by an
        // allocation or unmapping is the slot's for the requests after that entry.
        let mut addresses: AddressPools = BTreeMap::new();
        for &(index, e) in segment_ops.iter().rev() {
            if !matches!(e.action, Action::SegmentAlloc | Action::SegmentUnmap) {
                continue;
            }
            let (start, end) = (e.addr, e.addr.saturating_add(e.size));
            for (s, e, p) in remove_range(&mut live, start, end) {
                addresses.insert(s, (e, p, Some(index)));
            }
        }
        for (s, (e, p)) in live {
            addresses.insert(s, (e, p, None));
        }
        let n = table.ids.len();
        PoolStream {
            slots: table.slots,
            table: table.ids,
            shown,
            every_entry,
            gc_possible,
            requests,
            addresses,
            len: 0,
            failed: false,
            unattributed: Some5::default(),
            run: None,
            cut: None,
            cuts: Vec::new(),
            runs: Vec::new(),
            run_streams: Vec::new(),
            last_request: vec![None; n],
            in_span: false,
            first_release: vec![None; n],
            open: None,
            awaiting_next: Vec::new(),
            awaiting_request: Vec::new(),
            decided: Vec::new(),
            used: vec![false; n],
            splits: vec![false; n],
            segments: BTreeMap::new(),
            blocks: HashMap::new(),
            pending_free: None,
            delayed: Some5::default(),
        }
    }

    /// Entries seen.
    pub(super) fn entries(&self) -> u64 {
        self.len
    }

    /// Whether the snapshot shows private pools (otherwise the default rules hold and
    /// nothing is routed).
    pub(super) fn shows_pools(&self) -> bool {
        !self.shown.is_empty()
    }

    fn private(slot: u32) -> bool {
        slot != UNKNOWN && slot != DEFAULT
    }

    /// A run of releases whose next entry is no malloc's (or ends the trace):
    /// [`Attribution::pool_empty_cache`], the pool's last request still to come.
    fn outside_malloc(&mut self, run: Releases) {
        let decided = if run.uniform && Self::private(run.first) {
            Decided::PoolCacheIfLast(run.first)
        } else {
            Decided::EmptyCache
        };
        self.decided.push((run.start, decided));
    }

    /// A run of releases inside a malloc whose request is of `slot` (`None`: no request
    /// follows): [`Attribution::release_run`].
    fn inside_malloc(&mut self, run: Releases, slot: Option<u32>) {
        let Some(slot) = slot.filter(|&s| Self::private(s)) else {
            return;
        };
        let gc = self.gc_possible;
        let foreign = run
            .slots
            .iter()
            .any(|&s| s != UNKNOWN && s != slot && !(gc && s == DEFAULT));
        if foreign {
            self.outside_malloc(run);
        }
    }

    /// Entry `index` of the trace, with the private pool its `pool_id` names.
    pub(super) fn entry(&mut self, index: u64, e: &RecordedEntry, pool: Option<PoolId>) {
        self.len = index + 1;
        let mut slot = match pool {
            Some(p) => match self.slots.get(&p) {
                Some(&s) => s,
                None => {
                    self.failed = true;
                    return;
                }
            },
            None if self.every_entry => DEFAULT,
            None => UNKNOWN,
        };
        if let Some((at, addr)) = self.pending_free.take() {
            if !(e.action == Action::FreeCompleted && e.addr == addr) {
                self.delayed.push(at);
            }
        }
        // `empty_cache_points`' runs of releases, and what settles them.
        let release = is_release(e.action);
        if !release {
            if let Some(run) = self.open.take() {
                self.awaiting_next.push(run);
            }
        }
        if !passed_over(e.action) && !self.awaiting_next.is_empty() {
            let inside = ends_inside_malloc(e.action);
            for run in std::mem::take(&mut self.awaiting_next) {
                if inside {
                    self.awaiting_request.push(run);
                } else {
                    self.outside_malloc(run);
                }
            }
        }
        match e.action {
            a if is_release(a) => {
                if self.open.is_none() {
                    if let Some(r) = &self.run {
                        let slot = r.slot;
                        self.close_run();
                        self.cut = Some((slot, Vec::new()));
                    }
                    if let Some((_, starts)) = &mut self.cut {
                        starts.push(index);
                    }
                }
                let run = self.open.get_or_insert_with(|| Releases {
                    start: index,
                    first: slot,
                    uniform: true,
                    slots: Vec::new(),
                });
                run.uniform &= run.first == slot;
                if !run.slots.contains(&slot) {
                    run.slots.push(slot);
                }
                let start = run.start;
                if Self::private(slot) && self.first_release[slot as usize].is_none() {
                    self.first_release[slot as usize] = Some(start);
                }
            }
            a if is_request(a) => {
                // By address: the listed segment's, if nothing allocated or unmapped
                // that memory after the request.
                if slot == UNKNOWN && a == Action::Alloc {
                    if let Some((_, &(end, s, after))) = self.addresses.range(..=e.addr).next_back()
                    {
                        if end > e.addr && after.is_none_or(|j| index > j) {
                            slot = s;
                        }
                    }
                }
                if slot == UNKNOWN {
                    self.unattributed.push(index);
                }
                for run in std::mem::take(&mut self.awaiting_request) {
                    self.inside_malloc(run, Some(slot));
                }
                let private = Self::private(slot);
                if slot != UNKNOWN {
                    self.last_request[slot as usize] = Some(index);
                    self.first_release[slot as usize] = None;
                }
                let cut = self.cut.take();
                match &mut self.run {
                    Some(r) if private && r.slot == slot => {
                        r.last = index;
                        if !r.streams.contains(&e.stream) {
                            r.streams.push(e.stream);
                        }
                    }
                    _ => {
                        self.close_run();
                        if private {
                            if let Some((_, starts)) = cut.filter(|(s, _)| *s == slot) {
                                self.cuts.push((self.runs.len(), starts));
                            }
                            self.run = Some(RequestRun {
                                slot,
                                first: index,
                                last: index,
                                streams: vec![e.stream],
                            });
                        }
                    }
                }
                self.in_span = private;
                if a == Action::Alloc && private {
                    self.used[slot as usize] = true;
                    if let Some((&start, (end, count))) =
                        self.segments.range_mut(..=e.addr).next_back()
                    {
                        if *end > e.addr {
                            *count += 1;
                            if *count >= 2 {
                                self.splits[slot as usize] = true;
                            }
                            self.blocks.insert(e.addr, start);
                        }
                    }
                }
            }
            _ => {}
        }
        match e.action {
            Action::SegmentAlloc => {
                self.segments
                    .insert(e.addr, (e.addr.saturating_add(e.size), 0));
            }
            Action::SegmentFree => {
                self.segments.remove(&e.addr);
            }
            Action::FreeCompleted => {
                if let Some(start) = self.blocks.remove(&e.addr) {
                    if let Some((_, count)) = self.segments.get_mut(&start) {
                        *count = count.saturating_sub(1);
                    }
                }
            }
            Action::FreeRequested if self.in_span => self.pending_free = Some((index, e.addr)),
            _ => {}
        }
    }

    /// Joins each run closed at runs of releases to the one it goes on when none of
    /// those releases was an inferred `empty_cache()` (`points`, ascending): the runs
    /// [`Attribution::events`] makes.
    fn merge_uncut(&mut self, points: &[u64]) {
        if self.cuts.is_empty() {
            return;
        }
        let joined: std::collections::HashSet<usize> = std::mem::take(&mut self.cuts)
            .into_iter()
            .filter(|(_, starts)| !starts.iter().any(|s| points.binary_search(s).is_ok()))
            .map(|(k, _)| k)
            .collect();
        if joined.is_empty() {
            return;
        }
        let mut runs: Vec<ClosedRun> = Vec::with_capacity(self.runs.len());
        let mut streams: Vec<u64> = Vec::with_capacity(self.run_streams.len());
        let mut start = 0usize;
        for (k, run) in std::mem::take(&mut self.runs).into_iter().enumerate() {
            let own = &self.run_streams[start..run.streams_end as usize];
            start = run.streams_end as usize;
            if joined.contains(&k) && !runs.is_empty() {
                // The previous run's streams are the last ones kept.
                let from = match runs.len() {
                    1 => 0,
                    n => runs[n - 2].streams_end as usize,
                };
                let mut union: Vec<u64> = streams[from..].to_vec();
                union.extend_from_slice(own);
                union.sort_unstable();
                union.dedup();
                streams.truncate(from);
                streams.extend_from_slice(&union);
                let prev = runs.last_mut().expect("a run before");
                prev.last = run.last;
                prev.streams_end = streams.len() as u64;
            } else {
                streams.extend_from_slice(own);
                runs.push(ClosedRun {
                    streams_end: streams.len() as u64,
                    ..run
                });
            }
        }
        self.runs = runs;
        self.run_streams = streams;
    }

    /// Keeps the run of requests open, if any, in a few bytes.
    fn close_run(&mut self) {
        if let Some(mut run) = self.run.take() {
            run.streams.sort_unstable();
            self.run_streams.extend_from_slice(&run.streams);
            self.runs.push(ClosedRun {
                first: run.first,
                last: run.last,
                streams_end: self.run_streams.len() as u64,
                slot: run.slot,
            });
        }
    }

    /// After the last entry: the calls, the inferred `empty_cache` points and the
    /// caveats ([`PoolPlan`]).
    pub(super) fn finish(mut self) -> PoolPlan {
        if let Some((at, _)) = self.pending_free.take() {
            self.delayed.push(at);
        }
        self.awaiting_next.extend(self.open.take());
        for run in std::mem::take(&mut self.awaiting_next) {
            self.outside_malloc(run);
        }
        for run in std::mem::take(&mut self.awaiting_request) {
            self.inside_malloc(run, None);
        }
        self.close_run();
        self.decided.sort_by_key(|&(start, _)| start);
        let mut points = Vec::new();
        let mut pool_caches = Vec::new();
        for &(start, d) in &self.decided {
            match d {
                Decided::EmptyCache => points.push(start),
                Decided::PoolCacheIfLast(slot) => {
                    if self.last_request[slot as usize].is_some_and(|last| start > last) {
                        pool_caches.push((start, slot));
                    } else {
                        points.push(start);
                    }
                }
            }
        }
        self.merge_uncut(&points);
        // Positions counted with the inferred entries: raw entry `x` lands at
        // `x + (points before or at it)`, its inferred entry (if any) just before.
        let before = |x: u64| -> Option<u64> {
            let k = x + points.partition_point(|&p| p < x) as u64;
            k.checked_sub(1)
        };
        let after =
            |x: u64| -> Option<u64> { Some(x + points.partition_point(|&p| p <= x) as u64) };
        let pool = |slot: u32| self.table[slot as usize];
        // The windows' calls come in the held order as the runs do: a run's
        // `create_pool` and `begin_allocate_to_pool` go before its first request, its
        // `end_allocate_to_pool` and `release_pool` after its last, and the next
        // run's first position is at or after that (ranked after it there).
        let mut alive = vec![false; self.table.len()];
        let windows: Vec<Window> = std::mem::take(&mut self.runs)
            .into_iter()
            .map(|run| {
                let create = !std::mem::replace(&mut alive[run.slot as usize], true);
                Window {
                    begin: before(run.first),
                    end: after(run.last).unwrap_or(0),
                    streams_end: run.streams_end,
                    slot: run.slot,
                    create,
                }
            })
            .collect();
        let mut calls: Vec<(Option<u64>, u8, Event)> = Vec::new();
        // The kept use ends before the run of releases holding the pool's first release
        // after its last request; in the held order (latest last request first).
        let mut drops: Vec<(u64, u64, u32)> = (1..self.table.len())
            .filter_map(|s| {
                let last = self.last_request[s]?;
                let run = self.first_release[s]?;
                Some((last, run.max(last + 1), s as u32))
            })
            .collect();
        drops.sort_by_key(|&(last, _, _)| std::cmp::Reverse(last));
        for (_, at, slot) in drops {
            calls.push((before(at), 2, Event::ReleasePool { pool: pool(slot) }));
        }
        for &(start, slot) in &pool_caches {
            calls.push((before(start), 3, Event::EmptyPoolCache { pool: pool(slot) }));
        }
        calls.sort_by_key(|(at, rank, _)| order(*at, *rank));
        let mut caveats = Vec::new();
        if self.unattributed.count > 0 {
            caveats.push(unattributed_caveat(
                &self.shown,
                &self.unattributed.first,
                self.unattributed.count,
                self.requests as usize,
            ));
        }
        if self.delayed.count > 0 {
            caveats.push(delayed_caveat(&self.delayed.first, self.delayed.count));
        }
        let unsure: Vec<PoolId> = (1..self.table.len())
            .filter(|&s| self.used[s] && !self.splits[s] && self.table[s].0 == 0)
            .map(|s| self.table[s])
            .collect();
        if !unsure.is_empty() {
            caveats.push(no_split_caveat(&unsure));
        }
        PoolPlan {
            table: self.table,
            windows,
            streams: self.run_streams,
            others: calls,
            points,
            caveats,
        }
    }
}

/// The file index of the entry at `at` among the entries with `points`' inferred
/// `empty_cache` entries (each at the index of the entry it goes before), as
/// [`crate::RecordedRun::source_index`] gives it from the held run.
pub(super) fn source_of(points: &[u64], at: u64) -> u64 {
    // The first raw entry whose position (counted with the insertions) is `at` or
    // after: the entry itself, or the one its inferred entry goes before.
    let (mut lo, mut hi) = (0u64, at);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if mid + points.partition_point(|&p| p <= mid) as u64 >= at {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorded::{BlockState, RecordedBlock};

    const MIB: u64 = 1 << 20;
    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f10_0000_0000;

    fn e(action: Action, addr: u64, size: u64, stream: u64) -> RecordedEntry {
        RecordedEntry {
            action,
            addr,
            size,
            stream,
        }
    }

    fn segment(
        address: u64,
        total_size: u64,
        pool: (u64, u64),
        expandable: bool,
    ) -> RecordedSegment {
        RecordedSegment {
            address,
            total_size,
            stream: 0,
            segment_type: "large".into(),
            allocated_size: 0,
            blocks: vec![RecordedBlock {
                address,
                size: total_size,
                requested_size: Some(0),
                state: BlockState::Inactive,
            }],
            is_expandable: expandable,
            pool_id: pool,
        }
    }

    fn pools_of(a: &Attribution, entries: &[RecordedEntry]) -> Vec<Option<PoolId>> {
        (0..entries.len())
            .filter(|&i| is_request(entries[i].action))
            .map(|i| (a.of[i] != UNKNOWN).then(|| a.table[a.of[i] as usize]))
            .collect()
    }

    /// By address (2.11): a request is the pool of the listed segment it lies in only if
    /// that segment was allocated at that place before the request (a segment freed and
    /// allocated again at the same address hides the earlier one's pool), and, for
    /// expandable segments, only if its pages were never unmapped after it.
    #[test]
    fn addresses_say_the_pool_of_memory_kept_to_the_end() {
        let entries = vec![
            e(Action::SegmentAlloc, A, 2 * MIB, 0),
            e(Action::Alloc, A, 512, 0), // in a segment freed later: unknown
            e(Action::FreeCompleted, A, 512, 0),
            e(Action::SegmentFree, A, 2 * MIB, 0),
            e(Action::SegmentAlloc, A, 2 * MIB, 7),
            e(Action::Alloc, A + 512, 512, 7), // in the listed segment of (1, 0)
            e(Action::SegmentMap, B, 4 * MIB, 0),
            e(Action::Alloc, B + 2 * MIB, MIB, 0), // its page is unmapped later: unknown
            e(Action::FreeCompleted, B + 2 * MIB, MIB, 0),
            e(Action::SegmentUnmap, B + 2 * MIB, 2 * MIB, 0),
            e(Action::Alloc, B, MIB, 0), // in the mapped run listed for (0, 1)
            e(Action::Oom, 0, 64 * MIB, 0), // no address: unknown
        ];
        let segments = [
            segment(A, 2 * MIB, (1, 0), false),
            segment(B, 2 * MIB, (0, 1), true),
        ];
        let a = attribute(&entries, &[], false, &segments);
        assert_eq!(
            pools_of(&a, &entries),
            vec![None, Some(PoolId(1, 0)), None, Some(PoolId(0, 1)), None]
        );
        assert_eq!((a.by_entry, a.by_address), (0, 2));
        assert_eq!(a.shown, vec![PoolId(0, 1), PoolId(1, 0)]);
        // With every entry's pool_id (2.15), the entries decide, default included.
        let b = attribute(&entries, &[(11, PoolId(0, 1))], true, &segments);
        assert_eq!(
            pools_of(&b, &entries),
            vec![
                Some(PoolId(0, 0)),
                Some(PoolId(0, 0)),
                Some(PoolId(0, 0)),
                Some(PoolId(0, 0)),
                Some(PoolId(0, 1))
            ]
        );
        assert_eq!((b.by_entry, b.by_address), (5, 0));
    }

    /// The events of a 2.15 snapshot: a graph's pool created before its first window,
    /// one window per run of its requests (on the run's streams), and its kept use
    /// dropped just before its memory is given back after its last request; a MemPool
    /// destroyed (its segments alone given back) is its own `empty_cache`, not a
    /// `torch.cuda.empty_cache()`; a default segment given back just before a
    /// capture's first segment was an `empty_cache()` (the capture's malloc cannot give
    /// it back), unless garbage collection is on.
    #[test]
    fn runs_of_requests_become_windows() {
        let g = PoolId(1, 0);
        let m = PoolId(0, 1);
        let h = PoolId(2, 0);
        let c = 0x7f20_0000_0000;
        let entries = vec![
            e(Action::SegmentAlloc, A, 2 * MIB, 5), // 0
            e(Action::Alloc, A, 512, 5),            // 1: g
            e(Action::Alloc, A + 512, 512, 6),      // 2: g, another stream of the capture
            e(Action::Alloc, B, 512, 0),            // 3: default
            e(Action::Alloc, A + 1024, 512, 5),     // 4: g
            e(Action::FreeCompleted, A, 512, 5),    // 5
            e(Action::FreeCompleted, A + 512, 512, 6),
            e(Action::FreeCompleted, A + 1024, 512, 5),
            e(Action::SegmentAlloc, B + 4 * MIB, 2 * MIB, 0), // 8
            e(Action::Alloc, B + 4 * MIB, 512, 0),            // 9: m
            e(Action::FreeCompleted, B + 4 * MIB, 512, 0),    // 10
            e(Action::SegmentFree, B + 4 * MIB, 2 * MIB, 0),  // 11: m's emptyCache
            e(Action::Snapshot, 0, 0, 0),                     // 12
            e(Action::SegmentFree, A, 2 * MIB, 5),            // 13: g's, after its reset, and
            e(Action::SegmentFree, B + 8 * MIB, 2 * MIB, 0),  // 14: default: empty_cache()
            e(Action::SegmentAlloc, c, 2 * MIB, 5),           // 15: h's capture
            e(Action::Alloc, c, 512, 5),                      // 16: h
        ];
        let pools = [
            (0, g),
            (1, g),
            (2, g),
            (4, g),
            (5, g),
            (6, g),
            (7, g),
            (8, m),
            (9, m),
            (10, m),
            (11, m),
            (13, g),
            (15, h),
            (16, h),
        ];
        let a = attribute(&entries, &pools, true, &[]);
        let (gs, ms) = (a.of[1], a.of[9]);
        assert_eq!(
            a.release_run(11, 12, false, false),
            ReleaseRun::PoolCache(ms)
        );
        assert_eq!(
            a.release_run(13, 14, false, false),
            ReleaseRun::PoolCache(gs)
        );
        assert_eq!(a.release_run(14, 15, true, false), ReleaseRun::EmptyCache);
        assert_eq!(a.release_run(14, 15, true, true), ReleaseRun::Malloc);
        assert_eq!(a.pool_empty_cache(3, 4), None);
        // As the reader does.
        let mut caches = Vec::new();
        let (out, indexes) =
            super::super::empty_cache::infer_empty_cache_with(&entries, |s, e, inside| {
                match a.release_run(s, e, inside, false) {
                    ReleaseRun::Malloc => false,
                    ReleaseRun::EmptyCache => true,
                    ReleaseRun::PoolCache(slot) => {
                        caches.push((s, slot));
                        false
                    }
                }
            });
        // The graph's segment and the default one go in one run: an empty_cache().
        assert_eq!(caches, vec![(11, ms)]);
        assert_eq!(out.len(), entries.len() + 1);
        assert_eq!(out[13].action, Action::EmptyCache);
        let Routing {
            calls,
            caveats,
            pools: summary,
        } = a.events(
            &entries,
            out.len(),
            &indexes,
            &caches,
            &FromFrames::default(),
            &inferred(&out, &indexes),
        );
        // The MemPool's one request says nothing of no_split.
        assert_eq!(caveats.len(), 1, "{caveats:?}");
        assert!(caveats[0].contains("MemPool(s) (0, 1) were created with no_split"));
        assert_eq!(
            summary.request_pools,
            vec![(1, g), (2, g), (4, g), (9, m), (16, h)]
        );
        assert_eq!(summary.by_entry, 6);
        let begin = |pool, streams: Vec<u64>| Event::BeginAllocateToPool {
            pool,
            streams: PoolStreams::only(streams),
        };
        let create = |pool| Event::CreatePool {
            pool,
            use_on_oom: false,
            no_split: false,
        };
        assert_eq!(
            calls,
            vec![
                (Some(0), create(g)),
                (Some(0), begin(g, vec![5, 6])),
                (Some(2), Event::EndAllocateToPool { pool: g }),
                (Some(2), Event::ReleasePool { pool: g }),
                (Some(3), begin(g, vec![5])),
                (Some(4), Event::EndAllocateToPool { pool: g }),
                (Some(4), Event::ReleasePool { pool: g }),
                (Some(8), create(m)),
                (Some(8), begin(m, vec![0])),
                (Some(9), Event::EndAllocateToPool { pool: m }),
                (Some(9), Event::ReleasePool { pool: m }),
                (Some(10), Event::ReleasePool { pool: m }),
                (Some(10), Event::EmptyPoolCache { pool: m }),
                (Some(12), Event::ReleasePool { pool: g }),
                (Some(16), create(h)),
                (Some(16), begin(h, vec![5])),
                (Some(17), Event::EndAllocateToPool { pool: h }),
                (Some(17), Event::ReleasePool { pool: h }),
            ]
        );
    }

    /// What the windows cannot say is named: a free waiting for other streams right
    /// after a pool's requests (a capture may still have been under way), and a MemPool
    /// whose requests never shared a segment (no_split or not); a MemPool whose
    /// requests shared a segment is not.
    /// An `empty_cache()` that gives back default-pool memory between two requests of
    /// one pool ends the pool's window there (PyTorch gives back no default-pool
    /// memory while allocation to a pool is under way): the CUDA graph trees' warm-up
    /// in their pool, `torch.cuda.graph`'s `empty_cache()`, then the capture.
    #[test]
    fn an_empty_cache_ends_a_pools_window() {
        let t = PoolId(0, 1);
        let entries = vec![
            e(Action::SegmentAlloc, B, 2 * MIB, 0), // 0: default
            e(Action::Alloc, B, 512, 0),            // 1
            e(Action::FreeRequested, B, 512, 0),    // 2
            e(Action::FreeCompleted, B, 512, 0),    // 3
            e(Action::SegmentAlloc, A, 2 * MIB, 0), // 4: the trees' pool
            e(Action::Alloc, A, 512, 0),            // 5: warm-up
            e(Action::SegmentFree, B, 2 * MIB, 0),  // 6: empty_cache()
            e(Action::Alloc, A + 512, 512, 7),      // 7: capture
        ];
        let pools: Vec<(u64, PoolId)> = [(4, t), (5, t), (7, t)]
            .into_iter()
            .map(|(i, p)| (i as u64, p))
            .collect();
        // Every entry says its pool (2.15): the others are the default pools'.
        let a = attribute(&entries, &pools, true, &[]);
        let (out, indexes) =
            super::super::empty_cache::infer_empty_cache_with(&entries, |s, e, inside| {
                a.release_run(s, e, inside, false) == ReleaseRun::EmptyCache
            });
        let points = inferred(&out, &indexes);
        assert_eq!(points, vec![6]);
        let windows = |points: &[usize]| {
            a.events(
                &entries,
                out.len(),
                &indexes,
                &[],
                &FromFrames::default(),
                points,
            )
            .calls
            .into_iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    Event::BeginAllocateToPool { .. } | Event::EndAllocateToPool { .. }
                )
            })
            .map(|(at, e)| (at, matches!(e, Event::BeginAllocateToPool { .. })))
            .collect::<Vec<_>>()
        };
        // Positions count the inferred entry (before entry 6, at 6).
        assert_eq!(
            windows(&points),
            vec![
                (Some(4), true),
                (Some(5), false),
                (Some(7), true),
                (Some(8), false)
            ]
        );
        // Without the empty_cache() one window spans both requests.
        assert_eq!(windows(&[]), vec![(Some(4), true), (Some(8), false)]);
    }

    /// What `a` makes of `entries`, with the `empty_cache` calls the rule by position
    /// infers and nothing from frames.
    fn routing(a: &Attribution, entries: &[RecordedEntry]) -> Routing {
        let (out, indexes) = super::super::empty_cache::infer_empty_cache(entries);
        a.events(
            entries,
            out.len(),
            &indexes,
            &[],
            &FromFrames::default(),
            &inferred(&out, &indexes),
        )
    }

    /// The file indexes the inferred `empty_cache` entries of `out` go before.
    fn inferred(out: &[RecordedEntry], indexes: &[u64]) -> Vec<usize> {
        out.iter()
            .zip(indexes)
            .filter(|(e, _)| e.action == Action::EmptyCache)
            .map(|(_, &i)| i as usize)
            .collect()
    }

    #[test]
    fn what_the_windows_cannot_say_is_named() {
        let entries = vec![
            e(Action::SegmentAlloc, A, 2 * MIB, 0),
            e(Action::Alloc, A, 512, 0),         // (0, 1), by address
            e(Action::FreeRequested, A, 512, 0), // waits for another stream
            e(Action::Alloc, B, 512, 0),         // in memory not listed: unknown
            e(Action::FreeCompleted, A, 512, 0),
        ];
        let segments = [segment(A, 2 * MIB, (0, 1), false)];
        let a = attribute(&entries, &[], false, &segments);
        let Routing {
            caveats,
            pools: summary,
            ..
        } = routing(&a, &entries);
        assert_eq!(summary.unattributed, vec![3]);
        assert_eq!(caveats.len(), 3, "{caveats:?}");
        assert!(caveats[0].starts_with("the snapshot shows private pools (0, 1) (CUDA graphs or MemPools) but does not say the pool of 1 of its 2 requests (entries 3)"), "{}", caveats[0]);
        assert!(
            caveats[1].contains("1 free(s) waiting for other streams (entries 2)"),
            "{}",
            caveats[1]
        );
        assert!(
            caveats[2].contains("MemPool(s) (0, 1) were created with no_split"),
            "{}",
            caveats[2]
        );
        // Two requests of the pool live in one segment at once: it splits.
        let mut entries = entries;
        entries[3] = e(Action::Alloc, A + 512, 512, 0);
        entries.insert(4, e(Action::FreeCompleted, A + 512, 512, 0));
        let a = attribute(&entries, &[], false, &segments);
        let caveats = routing(&a, &entries).caveats;
        assert_eq!(caveats.len(), 1, "{caveats:?}");
        assert!(caveats[0].contains("waiting for other streams"));
    }
}
