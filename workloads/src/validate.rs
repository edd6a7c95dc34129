//! Checks a trace before it is replayed and reports every problem, not just the
//! first, so a hand-written or converted trace can be fixed in one pass.
//!
//! Rules, in the order of the trace:
//!
//! | problem | severity | message |
//! | --- | --- | --- |
//! | `free` of an id that was never allocated | error | `free of unknown id 5` |
//! | `free` of an id whose allocation was already freed | error | `free of already-freed id 5 (freed at line 9)` |
//! | `free_requested` of an id that is not live | error | `free_requested of id 5, which is not live` |
//! | `free_requested` of an id whose free was already requested | error | `free_requested of id 5 twice (first at line 4)` |
//! | `alloc` of an id that is still live | error | `alloc of id 5, which is still live (allocated at line 3)` |
//! | `alloc` of 0 bytes | error | `alloc of id 5 asks for 0 bytes` |
//! | `alloc` of 2^60 bytes (1 EiB) or more | warning | `alloc of id 5 asks for 1152921504606846976 bytes: PyTorch refuses 1 EiB or more ("Tried to allocate more than 1EB memory")` |
//! | `begin_allocate_to_pool` of a pool being allocated to | error | `begin_allocate_to_pool of pool (1, 0), which is being allocated to already (since event 3)` |
//! | `end_allocate_to_pool` of a pool not being allocated to | error | `end_allocate_to_pool of pool (1, 0), which is not being allocated to` |
//! | `release_pool` or `empty_cache` of a pool that does not exist | error | `release_pool of pool (1, 0), which does not exist` |
//! | a pool used after its last use ended | error | `begin_allocate_to_pool of pool (1, 0), whose last use ended (at event 9)` |
//! | `create_pool` of a pool that exists | error | `create_pool of pool (0, 1), which exists already` |
//! | allocations never freed | warning | `3 allocations (2.00 GiB) are still live at the end of the trace: ids 1 (allocated here), 4, 7` |
//!
//! Allocations still live at the end are reported as **one** summarizing warning,
//! placed at the `alloc` of the earliest of them and listing the first
//! [`LIVE_AT_END_IDS_SHOWN`] ids: recorded training runs end with hundreds of live
//! weights, and one line per weight would bury the errors.
//!
//! Pools follow PyTorch's use counts: `create_pool` and `begin_allocate_to_pool` add a
//! use (creating the pool if new), `release_pool` takes one off; a pool whose last use
//! ended cannot be used again (PyTorch would fail an internal assertion).
//!
//! After an error the check goes on as the replay engine would: a duplicate live id
//! replaces the earlier allocation (which is then no longer tracked), and bad frees
//! change nothing. A `free_requested` allocation stays live until its `free`.

use std::collections::HashMap;
use std::fmt;

use crate::id_map::IdMap;
use crate::size::format_size_human;
use crate::start::StartState;
use crate::trace::{AllocId, Event, IdName, PoolId, Trace};

/// Requests of this many bytes or more are refused: PyTorch's caching allocator
/// rejects sizes of 1 EiB (2^60 bytes) and more as certainly wrong.
pub const ABSURD_SIZE_BYTES: u64 = 1 << 60;

/// How many ids the live-at-end warning lists.
pub const LIVE_AT_END_IDS_SHOWN: usize = 5;

/// How serious a [`TraceIssue`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The trace cannot be replayed as written.
    Error,
    /// The trace can be replayed, but probably does not say what was meant.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// What is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssueKind {
    /// A free of an id that no earlier `alloc` used.
    FreeOfUnknownId {
        /// The id.
        id: AllocId,
    },
    /// A free of an id whose last allocation was already freed.
    FreeOfFreedId {
        /// The id.
        id: AllocId,
        /// Index of the event that freed it first.
        freed_at: usize,
    },
    /// A `free_requested` of an id with no live allocation.
    FreeRequestedNotLive {
        /// The id.
        id: AllocId,
    },
    /// A second `free_requested` of the same allocation.
    FreeRequestedTwice {
        /// The id.
        id: AllocId,
        /// Index of the first `free_requested`.
        requested_at: usize,
    },
    /// An alloc of an id that is still live.
    DuplicateLiveId {
        /// The id.
        id: AllocId,
        /// Index of the alloc event that made it live.
        allocated_at: usize,
    },
    /// An alloc of 0 bytes.
    ZeroSize {
        /// The id.
        id: AllocId,
    },
    /// An alloc of [`ABSURD_SIZE_BYTES`] or more.
    AbsurdSize {
        /// The id.
        id: AllocId,
        /// Bytes asked for.
        size_bytes: u64,
    },
    /// A private-pool call PyTorch would refuse in this state.
    Pool {
        /// The event's op name.
        op: &'static str,
        /// The pool.
        pool: PoolId,
        /// What is wrong.
        problem: PoolProblem,
    },
    /// Allocations that are never freed (one issue for all of them).
    LiveAtEnd {
        /// How many.
        count: u64,
        /// Their bytes in total.
        bytes: u64,
        /// The first few ids, in allocation order (at most [`LIVE_AT_END_IDS_SHOWN`]).
        first_ids: Vec<AllocId>,
    },
}

/// What is wrong with a private-pool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolProblem {
    /// Allocation to it is under way already (since the event at this index).
    AllocatingAlready {
        /// Index of the `begin_allocate_to_pool`.
        begun_at: usize,
    },
    /// No allocation to it is under way.
    NotAllocating,
    /// No event created it.
    Unknown,
    /// Its last use ended (at the event at this index).
    Released {
        /// Index of the `release_pool` that ended its last use.
        released_at: usize,
    },
    /// It exists already.
    Exists,
}

impl fmt::Display for IssueKind {
    /// The message without references to other events, ids as numbers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, &|id| IdName::Number(id.0))
    }
}

impl IssueKind {
    /// The message, each id shown by `name` (a trace's [`Trace::id_name`]).
    fn write<'n>(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &dyn Fn(AllocId) -> IdName<'n>,
    ) -> fmt::Result {
        match *self {
            IssueKind::FreeOfUnknownId { id } => write!(f, "free of unknown id {}", name(id)),
            IssueKind::FreeOfFreedId { id, .. } => {
                write!(f, "free of already-freed id {}", name(id))
            }
            IssueKind::FreeRequestedNotLive { id } => {
                write!(f, "free_requested of id {}, which is not live", name(id))
            }
            IssueKind::FreeRequestedTwice { id, .. } => {
                write!(f, "free_requested of id {} twice", name(id))
            }
            IssueKind::DuplicateLiveId { id, .. } => {
                write!(f, "alloc of id {}, which is still live", name(id))
            }
            IssueKind::ZeroSize { id } => write!(f, "alloc of id {} asks for 0 bytes", name(id)),
            IssueKind::AbsurdSize { id, size_bytes } => write!(
                f,
                "alloc of id {} asks for {size_bytes} bytes: PyTorch refuses 1 EiB or more (\"Tried to allocate more than 1EB memory\")",
                name(id)
            ),
            IssueKind::Pool {
                op,
                pool,
                ref problem,
            } => match problem {
                PoolProblem::AllocatingAlready { .. } => write!(
                    f,
                    "{op} of pool {pool}, which is being allocated to already"
                ),
                PoolProblem::NotAllocating => {
                    write!(f, "{op} of pool {pool}, which is not being allocated to")
                }
                PoolProblem::Unknown => write!(f, "{op} of pool {pool}, which does not exist"),
                PoolProblem::Released { .. } => {
                    write!(f, "{op} of pool {pool}, whose last use ended")
                }
                PoolProblem::Exists => write!(f, "{op} of pool {pool}, which exists already"),
            },
            IssueKind::LiveAtEnd {
                count,
                bytes,
                ref first_ids,
            } => {
                let plural = if count == 1 {
                    "allocation"
                } else {
                    "allocations"
                };
                let verb = if count == 1 { "is" } else { "are" };
                write!(
                    f,
                    "{count} {plural} ({}) {verb} still live at the end of the trace: id",
                    format_size_human(bytes)
                )?;
                if count > 1 {
                    f.write_str("s")?;
                }
                for (i, id) in first_ids.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    write!(f, "{sep}{}", name(*id))?;
                    if i == 0 {
                        f.write_str(" (allocated here)")?;
                    }
                }
                if count > first_ids.len() as u64 {
                    f.write_str(", ...")?;
                }
                Ok(())
            }
        }
    }
}

/// One problem of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceIssue {
    /// Index into [`Trace::events`] of the event at fault (for
    /// [`IssueKind::LiveAtEnd`], the alloc of the earliest live allocation).
    pub event_index: usize,
    /// How serious.
    pub severity: Severity,
    /// What is wrong.
    pub kind: IssueKind,
}

impl TraceIssue {
    /// The issue as one line that names the file and place, e.g.
    /// `trace.csv: line 17: free of unknown id 5`.
    pub fn display_with<'a>(&'a self, trace: &'a Trace) -> IssueDisplay<'a> {
        IssueDisplay { issue: self, trace }
    }
}

/// Displays a [`TraceIssue`] with the places of its trace; see
/// [`TraceIssue::display_with`].
pub struct IssueDisplay<'a> {
    issue: &'a TraceIssue,
    trace: &'a Trace,
}

impl fmt::Display for IssueDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (issue, trace) = (self.issue, self.trace);
        write!(f, "{}: ", trace.describe(issue.event_index))?;
        issue.kind.write(f, &|id| trace.id_name(id))?;
        match issue.kind {
            IssueKind::FreeOfFreedId { freed_at, .. } => {
                write!(f, " (freed at {})", trace.location(freed_at))
            }
            IssueKind::DuplicateLiveId { allocated_at, .. } => {
                write!(f, " (allocated at {})", trace.location(allocated_at))
            }
            IssueKind::FreeRequestedTwice { requested_at, .. } => {
                write!(f, " (first at {})", trace.location(requested_at))
            }
            IssueKind::Pool {
                problem: PoolProblem::AllocatingAlready { begun_at },
                ..
            } => write!(f, " (since {})", trace.location(begun_at)),
            IssueKind::Pool {
                problem: PoolProblem::Released { released_at },
                ..
            } => write!(f, " (at {})", trace.location(released_at)),
            _ => Ok(()),
        }
    }
}

/// Checks `trace` and returns every issue, in event order (the live-at-end warning
/// last). An empty list means the trace replays as written.
pub fn validate(trace: &Trace) -> Vec<TraceIssue> {
    let mut validator = Validator::new(trace.start.as_ref());
    for (index, event) in trace.events.iter().enumerate() {
        validator.step(index, event);
    }
    validator.finish().resolve(&trace.events)
}

/// A live id as validation follows it.
#[derive(Clone, Copy)]
struct LiveId {
    /// Index of the alloc that made it live.
    allocated_at: usize,
    bytes: u64,
    /// Index of its `free_requested`, if any.
    requested_at: Option<usize>,
}

/// [`validate`] one event at a time, for a reader or a replay that sees each event
/// once (the trace need not be held). Memory follows the live ids ([`IdMap`]) and the
/// issues found, never the ids freed: a free of an id that is not live is reported
/// unresolved, and [`Unresolved::resolve`] finds afterwards, from the events again,
/// whether the id was freed before (and where) or never allocated.
pub struct Validator {
    live: IdMap<LiveId>,
    pools: HashMap<PoolId, PoolState>,
    issues: Vec<TraceIssue>,
}

impl Validator {
    /// A validator for a trace that starts from `start` (a mid-run trace's live blocks
    /// and private pools are live from event 0), or from an empty allocator.
    pub fn new(start: Option<&StartState>) -> Validator {
        let mut live = IdMap::new();
        for b in start
            .iter()
            .flat_map(|s| &s.segments)
            .flat_map(|s| &s.blocks)
        {
            live.insert(
                b.id,
                LiveId {
                    allocated_at: 0,
                    bytes: b.requested_bytes,
                    requested_at: b.pending_free.then_some(0),
                },
            );
        }
        // Its private pools are live from event 0 (with no use left: released then).
        let pools = start
            .iter()
            .flat_map(|s| &s.pools)
            .map(|p| {
                let state = PoolState {
                    uses: p.uses,
                    allocating_since: p.routing.as_ref().map(|_| 0),
                    released_at: (p.uses == 0).then_some(0),
                };
                (p.id, state)
            })
            .collect();
        Validator {
            live,
            pools,
            issues: Vec::new(),
        }
    }

    fn report(&mut self, event_index: usize, severity: Severity, kind: IssueKind) {
        self.issues.push(TraceIssue {
            event_index,
            severity,
            kind,
        });
    }

    /// Checks the event at `index` (events come in order).
    #[inline]
    pub fn step(&mut self, index: usize, event: &Event) {
        match *event {
            Event::Alloc { id, size_bytes, .. } => {
                if size_bytes == 0 {
                    self.report(index, Severity::Error, IssueKind::ZeroSize { id });
                } else if size_bytes >= ABSURD_SIZE_BYTES {
                    // PyTorch's result (an out-of-memory error), not a bad trace.
                    self.report(
                        index,
                        Severity::Warning,
                        IssueKind::AbsurdSize { id, size_bytes },
                    );
                }
                let new = LiveId {
                    allocated_at: index,
                    bytes: size_bytes,
                    requested_at: None,
                };
                if let Some(old) = self.live.insert(id, new) {
                    self.report(
                        index,
                        Severity::Error,
                        IssueKind::DuplicateLiveId {
                            id,
                            allocated_at: old.allocated_at,
                        },
                    );
                }
            }
            Event::Free { id } => {
                // Freed before, or never allocated: resolve tells (from the events).
                if self.live.remove(id).is_none() {
                    self.report(
                        index,
                        Severity::Error,
                        IssueKind::FreeOfFreedId {
                            id,
                            freed_at: UNRESOLVED,
                        },
                    );
                }
            }
            Event::FreeRequested { id } => match self.live.get_mut(id) {
                None => self.report(
                    index,
                    Severity::Error,
                    IssueKind::FreeRequestedNotLive { id },
                ),
                Some(LiveId {
                    requested_at: Some(requested_at),
                    ..
                }) => {
                    let requested_at = *requested_at;
                    self.report(
                        index,
                        Severity::Error,
                        IssueKind::FreeRequestedTwice { id, requested_at },
                    );
                }
                Some(live) => live.requested_at = Some(index),
            },
            Event::EmptyCache
            | Event::Mark { .. }
            | Event::SetAllocatorSettings { .. }
            | Event::ResetPeakStats
            | Event::ResetAccumulatedStats
            | Event::SetEnabled { .. } => {}
            Event::CreatePool { pool, .. }
            | Event::BeginAllocateToPool { pool, .. }
            | Event::EndAllocateToPool { pool }
            | Event::ReleasePool { pool }
            | Event::EmptyPoolCache { pool }
            | Event::RestoreBlock { pool, .. } => {
                if let Err(problem) = pool_step(&mut self.pools, event, pool, index) {
                    let op = event.op_name();
                    self.report(
                        index,
                        Severity::Error,
                        IssueKind::Pool { op, pool, problem },
                    );
                }
            }
        }
    }

    /// Whether an error was found so far.
    pub fn has_errors(&self) -> bool {
        has_errors(&self.issues)
    }

    /// Every issue found, with the live-at-end warning last; see [`Unresolved`].
    pub fn finish(mut self) -> Unresolved {
        if !self.live.is_empty() {
            let mut remaining: Vec<(usize, AllocId, u64)> = self
                .live
                .drain()
                .into_iter()
                .map(|(id, l)| (l.allocated_at, id, l.bytes))
                .collect();
            remaining.sort_unstable();
            let bytes = remaining
                .iter()
                .fold(0u64, |sum, &(_, _, b)| sum.saturating_add(b));
            self.issues.push(TraceIssue {
                event_index: remaining[0].0,
                severity: Severity::Warning,
                kind: IssueKind::LiveAtEnd {
                    count: remaining.len() as u64,
                    bytes,
                    first_ids: remaining
                        .iter()
                        .take(LIVE_AT_END_IDS_SHOWN)
                        .map(|&(_, id, _)| id)
                        .collect(),
                },
            });
        }
        Unresolved {
            issues: self.issues,
        }
    }
}

/// Stands for the index of an earlier free until [`Unresolved::resolve`] finds it (or
/// finds none: the id was never allocated).
const UNRESOLVED: usize = usize::MAX;

/// A [`Validator`]'s issues, but for whether and where each free of an id that was
/// not live had its id freed before, which takes a second look at the events (only
/// when there is such a free).
pub struct Unresolved {
    issues: Vec<TraceIssue>,
}

impl Unresolved {
    /// Whether [`Unresolved::resolve`] needs the events (a free of an id that was not
    /// live); if not, any (even empty) event list does.
    pub fn needs_events(&self) -> bool {
        self.issues.iter().any(|i| {
            matches!(
                i.kind,
                IssueKind::FreeOfFreedId {
                    freed_at: UNRESOLVED,
                    ..
                }
            )
        })
    }

    /// The issues, each free of an id that was not live either a repeated free, with
    /// the index of the free that ended its id's last allocation, or a free of an
    /// unknown id where no free of that id succeeded before; found in `events` (the
    /// trace's events again, in order).
    pub fn resolve<'a>(mut self, events: impl IntoIterator<Item = &'a Event>) -> Vec<TraceIssue> {
        if !self.needs_events() {
            return self.issues;
        }
        // A free succeeded unless it was reported as a bad free.
        let failed: std::collections::HashSet<usize> = self
            .issues
            .iter()
            .filter(|i| {
                matches!(
                    i.kind,
                    IssueKind::FreeOfFreedId { .. } | IssueKind::FreeOfUnknownId { .. }
                )
            })
            .map(|i| i.event_index)
            .collect();
        let asked: std::collections::HashSet<AllocId> = self
            .issues
            .iter()
            .filter_map(|i| match i.kind {
                IssueKind::FreeOfFreedId { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        let mut last_free: HashMap<AllocId, usize> = HashMap::new();
        // The issues needing an answer, in event order (issues are in event order but
        // for the live-at-end warning, which is never one of them).
        let mut pending = self
            .issues
            .iter_mut()
            .filter(|i| matches!(i.kind, IssueKind::FreeOfFreedId { .. }))
            .peekable();
        for (index, event) in events.into_iter().enumerate() {
            let Some(next) = pending.peek_mut() else {
                break;
            };
            if next.event_index == index {
                if let IssueKind::FreeOfFreedId { id, .. } = next.kind {
                    next.kind = match last_free.get(&id) {
                        Some(&freed_at) => IssueKind::FreeOfFreedId { id, freed_at },
                        None => IssueKind::FreeOfUnknownId { id },
                    };
                }
                pending.next();
                continue;
            }
            if let Event::Free { id } = *event {
                if asked.contains(&id) && !failed.contains(&index) {
                    last_free.insert(id, index);
                }
            }
        }
        self.issues
    }
}

/// A private pool as validation follows it.
#[derive(Default)]
struct PoolState {
    uses: u64,
    allocating_since: Option<usize>,
    released_at: Option<usize>,
}

/// Applies one pool event to the pools' states, or says what PyTorch would refuse.
fn pool_step(
    pools: &mut HashMap<PoolId, PoolState>,
    event: &Event,
    pool: PoolId,
    index: usize,
) -> Result<(), PoolProblem> {
    let existing = pools.get(&pool);
    if let Some(released_at) = existing.and_then(|p| p.released_at) {
        if !matches!(event, Event::EmptyPoolCache { .. }) {
            return Err(PoolProblem::Released { released_at });
        }
    }
    match event {
        Event::CreatePool { .. } => {
            if existing.is_some() {
                return Err(PoolProblem::Exists);
            }
            pools.insert(
                pool,
                PoolState {
                    uses: 1,
                    ..PoolState::default()
                },
            );
        }
        Event::BeginAllocateToPool { .. } => {
            let state = pools.entry(pool).or_default();
            if let Some(begun_at) = state.allocating_since {
                return Err(PoolProblem::AllocatingAlready { begun_at });
            }
            state.uses += 1;
            state.allocating_since = Some(index);
        }
        Event::EndAllocateToPool { .. } => match pools.get_mut(&pool) {
            Some(state) if state.allocating_since.is_some() => state.allocating_since = None,
            _ => return Err(PoolProblem::NotAllocating),
        },
        Event::ReleasePool { .. } => {
            let state = pools.get_mut(&pool).ok_or(PoolProblem::Unknown)?;
            state.uses -= 1;
            if state.uses == 0 {
                state.released_at = Some(index);
            }
        }
        _ => {
            if existing.is_none() {
                return Err(PoolProblem::Unknown);
            }
        }
    }
    Ok(())
}

/// Whether any issue is an [`Severity::Error`].
pub fn has_errors(issues: &[TraceIssue]) -> bool {
    issues.iter().any(|i| i.severity == Severity::Error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::LocationKind;

    fn alloc(id: u64, size_bytes: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        }
    }

    fn free(id: u64) -> Event {
        Event::Free { id: AllocId(id) }
    }

    fn csv_trace(events: Vec<Event>) -> Trace {
        let locations = (2..2 + events.len() as u64).collect();
        Trace {
            name: "trace".into(),
            path: Some("trace.csv".into()),
            events,
            locations,
            location_kind: LocationKind::Line,
            meta: Default::default(),
            id_names: Vec::new(),
            times_us: Vec::new(),
            start: None,
        }
    }

    fn lines(trace: &Trace) -> Vec<String> {
        validate(trace)
            .iter()
            .map(|i| i.display_with(trace).to_string())
            .collect()
    }

    /// A clean trace has no issues.
    #[test]
    fn clean_trace_has_no_issues() {
        let t = csv_trace(vec![
            alloc(1, 10),
            alloc(2, 20),
            free(1),
            alloc(1, 5),
            free(1),
            free(2),
        ]);
        assert!(validate(&t).is_empty());
    }

    /// Every problem of a trace is reported, each with its file and line, and unknown
    /// and already-freed ids get different messages.
    #[test]
    fn reports_every_problem_with_place() {
        let t = csv_trace(vec![
            alloc(1, 10),      // line 2
            free(5),           // line 3
            free(1),           // line 4
            free(1),           // line 5
            alloc(2, 0),       // line 6
            alloc(2, 1 << 60), // line 7
            alloc(3, 7),       // line 8
        ]);
        assert_eq!(
            lines(&t),
            vec![
                "trace.csv: line 3: free of unknown id 5",
                "trace.csv: line 5: free of already-freed id 1 (freed at line 4)",
                "trace.csv: line 6: alloc of id 2 asks for 0 bytes",
                "trace.csv: line 7: alloc of id 2 asks for 1152921504606846976 bytes: PyTorch refuses 1 EiB or more (\"Tried to allocate more than 1EB memory\")",
                "trace.csv: line 7: alloc of id 2, which is still live (allocated at line 6)",
                &format!(
                    "trace.csv: line 7: 2 allocations ({}) are still live at the end of the trace: ids 2 (allocated here), 3",
                    format_size_human((1 << 60) + 7)
                )
                .as_str(),
            ]
        );
        let issues = validate(&t);
        assert!(has_errors(&issues));
        assert_eq!(issues.last().unwrap().severity, Severity::Warning);
    }

    /// Allocations live at the end make one warning listing the first few ids, and a
    /// trace with only that warning has no errors.
    #[test]
    fn live_at_end_is_one_summarizing_warning() {
        let mut events: Vec<Event> = (0..8).map(|i| alloc(i, 1 << 20)).collect();
        events.push(free(0));
        let t = Trace::new("gen", events);
        let issues = validate(&t);
        assert_eq!(issues.len(), 1);
        assert!(!has_errors(&issues));
        assert_eq!(issues[0].event_index, 1);
        assert_eq!(
            issues[0].display_with(&t).to_string(),
            "gen: event 1: 7 allocations (7.00 MiB) are still live at the end of the trace: ids 1 (allocated here), 2, 3, 4, 5, ..."
        );
        let one = Trace::new("one", vec![alloc(9, 512)]);
        assert_eq!(
            validate(&one)[0].display_with(&one).to_string(),
            "one: event 0: 1 allocation (512 B) is still live at the end of the trace: id 9 (allocated here)"
        );
    }

    /// A `free_requested` then `free` is clean; a `free_requested` of an id that is not
    /// live, or a second one, is an error naming the first; the allocation stays live
    /// until its `free`.
    #[test]
    fn free_requested_rules() {
        let req = |id| Event::FreeRequested { id: AllocId(id) };
        let clean = csv_trace(vec![alloc(1, 10), req(1), alloc(2, 5), free(1), free(2)]);
        assert!(validate(&clean).is_empty());
        let t = csv_trace(vec![
            req(4),      // line 2
            alloc(1, 8), // line 3
            req(1),      // line 4
            req(1),      // line 5
            free(1),     // line 6
            req(1),      // line 7
            alloc(2, 8), // line 8
            req(2),      // line 9
        ]);
        assert_eq!(
            lines(&t),
            vec![
                "trace.csv: line 2: free_requested of id 4, which is not live",
                "trace.csv: line 5: free_requested of id 1 twice (first at line 4)",
                "trace.csv: line 7: free_requested of id 1, which is not live",
                "trace.csv: line 8: 1 allocation (8 B) is still live at the end of the trace: id 2 (allocated here)",
            ]
        );
    }

    /// Re-allocating a freed id is fine; freeing it twice after that is a double free
    /// pointing at the latest free.
    #[test]
    fn reused_ids_are_tracked_per_allocation() {
        let t = Trace::new(
            "r",
            vec![alloc(1, 1), free(1), alloc(1, 1), free(1), free(1)],
        );
        assert_eq!(
            lines(&t),
            vec!["r: event 4: free of already-freed id 1 (freed at event 3)"]
        );
    }

    /// Repeated frees of several ids, dense and beyond the dense table, each point at
    /// the free that ended the id's last allocation (a failed free in between is not
    /// that free), as the one-pass validator resolves them afterwards.
    #[test]
    fn repeated_frees_point_at_the_last_good_free() {
        let big = crate::id_map::DENSE_LIMIT + 7;
        let t = Trace::new(
            "r",
            vec![
                alloc(1, 1),   // 0
                alloc(big, 1), // 1
                free(1),       // 2
                free(big),     // 3
                free(1),       // 4: freed at 2
                alloc(1, 1),   // 5
                free(1),       // 6
                free(big),     // 7: freed at 3
                free(1),       // 8: freed at 6
                free(3),       // 9: unknown
            ],
        );
        assert_eq!(
            lines(&t),
            vec![
                "r: event 4: free of already-freed id 1 (freed at event 2)",
                format!("r: event 7: free of already-freed id {big} (freed at event 3)").as_str(),
                "r: event 8: free of already-freed id 1 (freed at event 6)",
                "r: event 9: free of unknown id 3",
            ]
        );
        let mut v = Validator::new(None);
        for (i, e) in t.events.iter().enumerate() {
            v.step(i, e);
        }
        assert!(v.has_errors());
        let unresolved = v.finish();
        assert!(unresolved.needs_events());
        assert_eq!(unresolved.resolve(&t.events), validate(&t));
    }
}
