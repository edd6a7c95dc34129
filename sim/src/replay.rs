//! The replay engine: one pass over a trace, one policy, one device, and an observer
//! that sees every event ([`replay_with`]).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};

use policies::AsDynPolicy;
use policies::{
    AdoptBlock, AdoptError, AdoptPool, AdoptPrivatePool, AdoptSegment, AllocError, Allocation,
    AllocatorCall, BlockState, CallError, CallOutcome, Device, DeviceAddr, DeviceError,
    DeviceStats, Policy, PolicyStats, PoolId, PoolStreams, Request, StreamId,
};
use workloads::feed::{EventSink, EventSource};
use workloads::id_map::IdMap;
use workloads::validate::Validator;
use workloads::{AllocId, Event, StartPool, StartState, Trace};

use crate::metrics::{Oom, Recorder, Summary};
use crate::observe::{Observer, OpLog, Outcome, Skip, Step};

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// After every event: the policy's own invariant walk, policy-reserved equal to
    /// device-reserved, every live allocation inside its own allocated block, and at an
    /// out-of-memory the reported state equal to the state after, with no reservation
    /// grown. Costly; always on in tests.
    pub check_invariants: bool,
    /// Keep going after an out-of-memory (the failed allocation is skipped, and so is its
    /// later free) instead of stopping at the first one.
    pub continue_after_oom: bool,
    /// Stop early when this becomes true (Ctrl-C on a GPU run).
    pub interrupt: Option<&'static AtomicBool>,
}

/// The result of a replay. An OOM is part of the result, not an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Peaks and totals.
    pub summary: Summary,
    /// The first request that failed, if any.
    pub oom: Option<Oom>,
    /// Requests that failed (more than one only with `continue_after_oom`).
    pub oom_count: u64,
    /// Events skipped: frees of allocations that failed, and (for traces replayed
    /// despite validation problems) frees of unknown ids and zero-size requests.
    pub skipped_event_count: u64,
    /// Allocations still live when the replay ended.
    pub live_allocation_count: u64,
    /// Allocator calls (private pools, settings, statistics resets, enabling) the
    /// policy does not model and ignored: its numbers do not reflect them.
    pub ignored_call_count: u64,
    /// Blocks of a private pool set back to a checkpoint (`restore_block`) that the
    /// policy did not place where the recording had them (a trace without the recorded
    /// segment addresses, or a pool that differs there: another configuration, a replay
    /// that went another way before): those requests were served as any other.
    pub missed_restore_count: u64,
    /// For a trace that starts mid-run under a policy that cannot take over PyTorch's
    /// state ([`Policy::adopt`]): the blocks live at the first entry, which it
    /// allocated in address order before the first event instead (0 otherwise).
    pub started_by_allocating: u64,
    /// Policy accounting at the end.
    pub final_policy: PolicyStats,
    /// Device accounting at the end.
    pub final_device: DeviceStats,
}

/// A replay that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A device failure other than out-of-memory.
    #[error("event {event_index}: {error}")]
    Device {
        /// Where it happened.
        event_index: u64,
        /// The driver's error.
        error: DeviceError,
    },
    /// The policy refused a request for a reason other than memory, a zero size or the
    /// device (an [`AllocError`] variant this engine does not know).
    #[error("event {event_index}: {error}")]
    Policy {
        /// Where it happened.
        event_index: u64,
        /// The policy's error (boxed: it is rare and large).
        error: Box<AllocError>,
    },
    /// The policy refused an allocator call as PyTorch would (a pool ended that was not
    /// begun, a settings string PyTorch rejects): the trace is bad input.
    #[error("event {event_index}: {message}")]
    Rejected {
        /// Where it happened.
        event_index: u64,
        /// What PyTorch would raise.
        message: String,
    },
    /// The trace starts mid-run and its starting state could not be taken over: the
    /// state contradicts the policy, or the device failed otherwise than by running out
    /// of memory (a device that cannot hold the state is a result: an out-of-memory
    /// before the first event, [`crate::Oom::event_index`] `None`).
    #[error("the trace starts mid-run, from a rebuilt allocator state: {error}")]
    Start {
        /// Why.
        error: AdoptError,
    },
    /// The interrupt flag was raised.
    #[error("interrupted at event {event_index}")]
    Interrupted {
        /// The first event not replayed.
        event_index: u64,
    },
}

impl ReplayError {
    /// Index of the event at which the replay stopped.
    pub fn event_index(&self) -> u64 {
        match *self {
            ReplayError::Device { event_index, .. }
            | ReplayError::Policy { event_index, .. }
            | ReplayError::Rejected { event_index, .. }
            | ReplayError::Interrupted { event_index } => event_index,
            ReplayError::Start { .. } => 0,
        }
    }
}

/// A live allocation and whether its free was requested.
struct Live {
    allocation: Allocation,
    free_requested: bool,
}

/// What the live table holds for an id: a live allocation, or an `alloc` that ran out
/// of memory (or was checked only, after the replay stopped), which validation counts
/// as live until its `free` (freeing it is no error) but the engine does not (its
/// frees are skipped).
enum Slot {
    Live(Live),
    Failed {
        /// Whether its free was requested.
        free_requested: bool,
    },
}

/// What a `free_requested` finds.
enum Requested<'a> {
    /// A live allocation whose free was not requested yet.
    Live(&'a mut Live),
    /// A live allocation whose free was requested already.
    Twice,
    /// No live allocation (never allocated, freed, or its alloc ran out of memory).
    NotLive,
}

/// Live allocations by id, in memory proportional to the allocations live at once
/// ([`IdMap`]: pages of consecutive ids, no hashing for dense ids). The same table
/// answers validation's questions about ids ([`workloads::validate()`]: a free of an id
/// not live, an id allocated twice, a second `free_requested`) for a replay that
/// checks its events as it goes ([`replay_checked`]): it keeps the ids whose alloc ran
/// out of memory too, so that their frees are no error.
#[derive(Default)]
struct LiveTable {
    live: IdMap<Slot>,
    /// Allocations whose id was reused while they were live (a trace problem that
    /// validation reports): the trace can never free them.
    orphans: Vec<Live>,
    /// `Slot::Failed` entries in `live`.
    failed: usize,
    /// Whether validation finds an error in the events seen so far (allocations of 0
    /// bytes and the id errors; pool calls are [`Checks::pools`]' part).
    problem: bool,
}

impl LiveTable {
    /// An `alloc` of `id` served: written into its slot where the slot's page exists
    /// and it holds nothing (one lookup, inline; the slot is found before the
    /// allocation is moved), else out of line.
    #[inline(always)]
    fn insert(&mut self, id: AllocId, allocation: Allocation) {
        if let Some(place) = self.live.place(id) {
            if place.get().is_none() {
                let live = Slot::Live(Live {
                    allocation,
                    free_requested: false,
                });
                if place.fill(live).is_err() {
                    unreachable!("the slot was just seen empty");
                }
                return;
            }
        }
        let live = Live {
            allocation,
            free_requested: false,
        };
        self.insert_elsewhere(id, Slot::Live(live));
    }

    /// [`LiveTable::insert`] where the slot's page is missing, the id is sparse or
    /// its slot holds something (a problem).
    #[cold]
    #[inline(never)]
    fn insert_elsewhere(&mut self, id: AllocId, live: Slot) {
        if let Err(slot) = self.live.insert_vacant(id, live) {
            self.replace(id, slot);
        }
    }

    /// A live allocation of `id`, its free requested or not (a trace that starts
    /// mid-run).
    fn insert_requested(&mut self, id: AllocId, allocation: Allocation, free_requested: bool) {
        let live = Live {
            allocation,
            free_requested,
        };
        self.replace(id, Slot::Live(live));
    }

    /// Sets `id`'s slot to the live allocation `slot`, whatever it held (an id
    /// allocated while live, or whose alloc ran out of memory, is a problem).
    #[cold]
    #[inline(never)]
    fn replace(&mut self, id: AllocId, slot: Slot) {
        match self.live.insert(id, slot) {
            None => {}
            Some(Slot::Live(old)) => {
                self.orphans.push(old);
                self.problem = true;
            }
            Some(Slot::Failed { .. }) => {
                self.failed -= 1;
                self.problem = true;
            }
        }
    }

    /// An `alloc` of `id` that ran out of memory: validation sees the id live. A live
    /// allocation of the same id (an error) stays the engine's.
    #[cold]
    fn insert_failed(&mut self, id: AllocId) {
        match self.live.get_mut(id) {
            None => {
                self.live.insert(
                    id,
                    Slot::Failed {
                        free_requested: false,
                    },
                );
                self.failed += 1;
            }
            Some(Slot::Live(_)) => self.problem = true,
            Some(Slot::Failed { free_requested }) => {
                *free_requested = false;
                self.problem = true;
            }
        }
    }

    /// A block live at a trace's first entry that the replay could not hold (its
    /// starting state did not fit): live for the check, as validation sees it, with
    /// its free requested or not, but not for the engine.
    #[cold]
    fn insert_unheld(&mut self, id: AllocId, free_requested: bool) {
        self.insert_failed(id);
        if let Some(Slot::Failed { free_requested: f }) = self.live.get_mut(id) {
            *f = free_requested;
        }
    }

    /// A `free_requested` of `id`.
    #[inline]
    fn request_free(&mut self, id: AllocId) -> Requested<'_> {
        match self.live.get_mut(id) {
            Some(Slot::Live(l)) if !l.free_requested => Requested::Live(l),
            Some(Slot::Live(_)) => {
                self.problem = true;
                Requested::Twice
            }
            Some(Slot::Failed { free_requested }) => {
                self.problem |= *free_requested;
                *free_requested = true;
                Requested::NotLive
            }
            None => {
                self.problem = true;
                Requested::NotLive
            }
        }
    }

    /// A `free` of `id`: its live allocation, if it has one.
    #[inline(always)]
    fn remove(&mut self, id: AllocId) -> Option<Live> {
        match self.live.remove(id) {
            Some(Slot::Live(l)) => Some(l),
            Some(Slot::Failed { .. }) => {
                self.failed -= 1;
                None
            }
            None => {
                self.problem = true;
                None
            }
        }
    }

    /// An event after the replay stopped, checked only (as validation does).
    fn check_only(&mut self, event: &Event) {
        match *event {
            Event::Alloc { id, size_bytes, .. } => {
                self.problem |= size_bytes == 0;
                let failed = Slot::Failed {
                    free_requested: false,
                };
                match self.live.insert(id, failed) {
                    None => self.failed += 1,
                    Some(Slot::Live(_)) => {
                        self.failed += 1;
                        self.problem = true;
                    }
                    Some(Slot::Failed { .. }) => self.problem = true,
                }
            }
            Event::Free { id } => {
                self.remove(id);
            }
            Event::FreeRequested { id } => {
                if let Requested::Live(l) = self.request_free(id) {
                    l.free_requested = true;
                }
            }
            _ => {}
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Live> {
        self.live
            .iter()
            .filter_map(|(_, s)| match s {
                Slot::Live(l) => Some(l),
                Slot::Failed { .. } => None,
            })
            .chain(self.orphans.iter())
    }

    fn len(&self) -> u64 {
        (self.live.len() - self.failed + self.orphans.len()) as u64
    }
}

/// Validation's checks run by the engine as it replays ([`replay_checked`]): the ids
/// and sizes by the live table, the private-pool calls by a [`Validator`] that sees
/// only those.
struct Checks {
    pools: Validator,
}

impl Checks {
    /// Sees an event that is neither an `alloc` nor a free.
    #[cold]
    fn other(&mut self, index: usize, event: &Event) {
        self.pools.step(index, event);
    }
}

/// Replays `trace` under `policy` on `device`.
///
/// # Errors
/// Device failures other than out-of-memory, policy errors other than out-of-memory
/// and zero sizes, and interruption.
///
/// # Panics
/// With `check_invariants`, at the first broken invariant (a policy bug).
///
/// Generic over the policy's type: a `dyn Policy` or a policy as its own type (as
/// [`policies::PolicyConfig::with_policy`] gives it), whose calls are then direct.
pub fn replay<P: Policy + AsDynPolicy + ?Sized>(
    trace: &Trace,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
) -> Result<Replay, ReplayError> {
    replay_with(trace, policy, device, options, &mut ())
}

/// [`replay`], showing every event to `observer`: before it, and after it with its
/// [`Outcome`], the device operations it caused and the state after it (see
/// [`Step`]). The engine is generic over the observer, so [`replay`]'s observer of
/// nothing costs nothing.
///
/// Events: `alloc` asks the policy; `free_requested` tells it the program dropped a
/// live allocation ([`Policy::free_requested`]; the allocation stays live until its
/// `free`); `free` returns the allocation; `empty_cache` releases the cache. An
/// out-of-memory ends the replay after its event unless `continue_after_oom`, which
/// skips the failed allocation and its later frees. A trace that starts mid-run whose
/// starting state the device cannot hold runs out before the first event, which ends
/// the replay whatever the options (no event can be replayed without that state).
///
/// # Errors
/// As [`replay`].
///
/// # Panics
/// As [`replay`].
pub fn replay_with<P, O: Observer + ?Sized>(
    trace: &Trace,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
    observer: &mut O,
) -> Result<Replay, ReplayError>
where
    P: Policy + AsDynPolicy + ?Sized,
{
    replay_events(
        trace.start.as_ref(),
        trace.events.iter(),
        policy,
        device,
        options,
        observer,
    )
}

/// [`replay_with`] over events as they come (a trace being read, which need not be
/// held: [`crate::inputs::stream_replay`]), from the allocator state `start` (a trace
/// that starts mid-run) or an empty one. Events are numbered from 0 in the order they
/// come; the engine keeps nothing per event, and its live table follows the live
/// allocations.
///
/// # Errors
/// As [`replay`].
///
/// # Panics
/// As [`replay`].
pub fn replay_events<P, O: Observer + ?Sized, E: std::borrow::Borrow<Event>>(
    start: Option<&StartState>,
    events: impl IntoIterator<Item = E>,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
    observer: &mut O,
) -> Result<Replay, ReplayError>
where
    P: Policy + AsDynPolicy + ?Sized,
{
    let mut live = LiveTable::default();
    let mut events = events.into_iter();
    run(
        start,
        &mut events,
        policy,
        device,
        options,
        observer,
        &mut live,
        None,
    )
}

/// [`replay_events`] from an empty allocator, checking the events as it goes as
/// [`workloads::validate()`] does: the `bool` is whether validation finds an error in
/// them (a warning is no error). The check shares the engine's live table (no second
/// table of live ids): an id whose `alloc` ran out of memory stays in it, so that its
/// free is no error. After a stop (an out-of-memory without `continue_after_oom`, a
/// replay error) the rest of the events are still checked; an interruption stops both.
///
/// `events` is any [`EventSource`]: an iterator (whose own `next` the engine calls in a
/// loop, so that a reader's row scan inlines there), or a reader that calls the
/// engine's step from the branch that read each row's op
/// ([`workloads::csv::CsvEvents::rows`]: the step inlined there has no op to decide).
///
/// # Errors
/// As [`replay`] (in the result; the check's answer comes either way).
///
/// # Panics
/// As [`replay`].
pub fn replay_checked<P, O, S>(
    events: &mut S,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
    observer: &mut O,
) -> (Result<Replay, ReplayError>, bool)
where
    P: Policy + AsDynPolicy + ?Sized,
    O: Observer + ?Sized,
    S: EventSource + ?Sized,
{
    replay_checked_from(None, events, policy, device, options, observer)
}

/// [`replay_checked`] from the allocator state `start` (a trace that starts mid-run,
/// whose live blocks the check sees live from the first event, as
/// [`workloads::validate()`] does) or an empty one (`None`: [`replay_checked`] is
/// this); errors and panics as [`replay_checked`].
#[inline]
pub fn replay_checked_from<P, O, S>(
    start: Option<&StartState>,
    events: &mut S,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
    observer: &mut O,
) -> (Result<Replay, ReplayError>, bool)
where
    P: Policy + AsDynPolicy + ?Sized,
    O: Observer + ?Sized,
    S: EventSource + ?Sized,
{
    let mut live = LiveTable::default();
    let mut checks = Checks {
        pools: Validator::new(start),
    };
    let result = run(
        start,
        events,
        policy,
        device,
        options,
        observer,
        &mut live,
        Some(&mut checks),
    );
    let first = match &result {
        Ok(r) => r.summary.event_count as usize,
        Err(ReplayError::Interrupted { .. }) => return (result, false),
        Err(e) => e.event_index() as usize + 1,
    };
    let mut rest = CheckOnly {
        index: first,
        live: &mut live,
        checks: &mut checks,
    };
    let ControlFlow::Continue(()) = events.feed(&mut rest);
    let problem = live.problem || checks.pools.has_errors();
    (result, problem)
}

/// The checks alone, on the events after a stop ([`replay_checked_from`]).
struct CheckOnly<'a> {
    /// The next event's index.
    index: usize,
    live: &'a mut LiveTable,
    checks: &'a mut Checks,
}

impl<E: std::borrow::Borrow<Event>> EventSink<E> for CheckOnly<'_> {
    type Stop = std::convert::Infallible;

    fn event(&mut self, event: E) -> ControlFlow<std::convert::Infallible> {
        let event = event.borrow();
        match event {
            Event::Alloc { .. } | Event::Free { .. } | Event::FreeRequested { .. } => {
                self.live.check_only(event);
            }
            _ => self.checks.other(self.index, event),
        }
        self.index += 1;
        ControlFlow::Continue(())
    }
}

/// The engine: [`replay_events`] over `events` with the live table `live`, also
/// checking private-pool calls with `checks` where given (the live table checks the
/// ids). Events after a stop are left in `events`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn run<P, O, S>(
    start: Option<&StartState>,
    events: &mut S,
    policy: &mut P,
    device: &mut dyn Device,
    options: &ReplayOptions,
    observer: &mut O,
    live: &mut LiveTable,
    checks: Option<&mut Checks>,
) -> Result<Replay, ReplayError>
where
    P: Policy + AsDynPolicy + ?Sized,
    O: Observer + ?Sized,
    S: EventSource + ?Sized,
{
    let mut recorder = Recorder::new();
    let mut started_by_allocating = 0u64;
    if let Some(start) = start {
        let blocks = start
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter().map(move |b| (b, StreamId(s.stream))));
        match policy.adopt(device, &adopt_segments(start), &adopt_pools(start)) {
            Ok(allocations) => {
                for ((block, _), allocation) in blocks.zip(allocations) {
                    live.insert_requested(block.id, allocation, block.pending_free);
                }
            }
            // A policy that cannot take over PyTorch's state starts by allocating the
            // blocks live at the first entry, in address order (a caveat says so).
            Err(AdoptError::Unsupported { .. }) => {
                for (block, stream) in blocks {
                    let request = Request {
                        size_bytes: block.requested_bytes,
                        stream,
                    };
                    let allocation = match policy.allocate(device, request) {
                        Ok(a) => a,
                        Err(AllocError::OutOfMemory { tried_bytes, .. }) => {
                            let at = StartFailure::Allocating {
                                allocated: started_by_allocating,
                            };
                            return Ok(start_oom(
                                start,
                                at,
                                tried_bytes,
                                policy.as_dyn(),
                                device,
                                live,
                            ));
                        }
                        Err(AllocError::Device(error)) => {
                            return Err(ReplayError::Start {
                                error: AdoptError::Device(error),
                            })
                        }
                        Err(error) => {
                            return Err(ReplayError::Policy {
                                event_index: 0,
                                error: Box::new(error),
                            })
                        }
                    };
                    started_by_allocating += 1;
                    if block.pending_free {
                        policy
                            .free_requested(device, &allocation)
                            .map_err(|error| ReplayError::Start {
                                error: AdoptError::Device(error),
                            })?;
                    }
                    live.insert_requested(block.id, allocation, block.pending_free);
                }
            }
            // The device cannot hold the state: an out-of-memory before the first event.
            Err(AdoptError::Device(DeviceError::OutOfMemory { requested_bytes })) => {
                let at = StartFailure::Adopting;
                return Ok(start_oom(
                    start,
                    at,
                    requested_bytes,
                    policy.as_dyn(),
                    device,
                    live,
                ));
            }
            Err(error) => return Err(ReplayError::Start { error }),
        }
        let (stats, dstats) = (policy.stats(), device.stats());
        recorder.observe_start(&stats, &dstats);
        if options.check_invariants {
            check_state(policy.as_dyn(), &stats, &dstats, live, 0);
        }
    }
    let stats_every_event = options.check_invariants || observer.needs_stats_every_event();
    let period = observer.period();
    let device = OpLog::new(device, observer.wants_device_ops());
    let before = policy.stats();
    // The device's accounting changes only through its own calls (`OpLog::touched`),
    // which most events do not make: it is read again only after one. The policy's
    // is read after every event where the observer or the checks need it, else only
    // after events that may raise it (frees only lower it: the peaks stay exact; the
    // checks hold every policy to that).
    let dstats = device.stats();
    let mut engine = Engine {
        policy,
        device,
        options,
        observer,
        live,
        checks,
        recorder,
        oom: None,
        oom_count: 0,
        skipped: 0,
        ignored_calls: 0,
        before,
        dstats,
        stats: before,
        stats_every_event,
        period,
        next_tick: 0,
        next_special: 0,
        stop: false,
        next_index: 0,
        failed: None,
    };
    let _ = events.feed(&mut engine);
    if let Some(error) = engine.failed.take() {
        return Err(error);
    }
    let Engine {
        policy,
        device,
        live,
        mut recorder,
        oom,
        oom_count,
        skipped,
        ignored_calls,
        next_index,
        ..
    } = engine;
    // Every event taken was replayed (an out-of-memory that stops the replay
    // included).
    recorder.set_event_count(next_index as u64);
    Ok(Replay {
        summary: recorder.finish(),
        oom,
        oom_count,
        skipped_event_count: skipped,
        live_allocation_count: live.len(),
        ignored_call_count: ignored_calls,
        missed_restore_count: policy.restores_missed(),
        started_by_allocating,
        final_policy: policy.stats(),
        final_device: device.stats(),
    })
}

/// The engine's state between events ([`run`]): it takes the events one at a time
/// as their source hands them ([`EventSink`]). Its one step, [`Engine::event`], is
/// the loop's body for every source: inlined where an iterator's loop calls it, and
/// where a reader calls it from the branch that read the row's op
/// ([`workloads::csv::CsvEvents::rows`]), whose variant is then known and the
/// dispatch on it gone.
struct Engine<'r, 'd, P: ?Sized, O: ?Sized> {
    policy: &'r mut P,
    device: OpLog<'d>,
    options: &'r ReplayOptions,
    observer: &'r mut O,
    live: &'r mut LiveTable,
    checks: Option<&'r mut Checks>,
    recorder: Recorder,
    oom: Option<Oom>,
    oom_count: u64,
    skipped: u64,
    ignored_calls: u64,
    /// The policy's figures before this event, for the checks.
    before: PolicyStats,
    dstats: DeviceStats,
    stats: PolicyStats,
    stats_every_event: bool,
    period: usize,
    /// The next event with more to do than the rest (one test per event): the first
    /// (the recorder sees its figures, read or not), then every `period`-th (an
    /// observer's progress display, `Observer::period`), never again without one.
    next_tick: usize,
    /// The next event with more to do, further: where an out-of-memory stops the
    /// replay (that event), and every event with `check_invariants`.
    next_special: usize,
    stop: bool,
    next_index: usize,
    /// The replay's error, which ended it (the stop's result in a flag, not a value
    /// every event's step would hand back).
    failed: Option<ReplayError>,
}

impl<P, O, E> EventSink<E> for Engine<'_, '_, P, O>
where
    P: Policy + AsDynPolicy + ?Sized,
    O: Observer + ?Sized,
    E: std::borrow::Borrow<Event>,
{
    /// The replay stopped: an out-of-memory without `continue_after_oom`, or a
    /// replay error (in `failed`).
    type Stop = ();

    #[inline(always)]
    fn event(&mut self, next: E) -> ControlFlow<()> {
        if self.step(next) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

impl<P, O> Engine<'_, '_, P, O>
where
    P: Policy + AsDynPolicy + ?Sized,
    O: Observer + ?Sized,
{
    /// Replays the next event: whether it stops the replay (an out-of-memory
    /// without `continue_after_oom`, or a replay error, kept in `failed`).
    #[inline(always)]
    fn step<E: std::borrow::Borrow<Event>>(&mut self, next: E) -> bool {
        let Engine {
            policy,
            device,
            options,
            observer,
            live,
            checks,
            recorder,
            oom,
            oom_count,
            skipped,
            ignored_calls,
            before,
            dstats,
            stats,
            stats_every_event,
            period,
            next_tick,
            next_special,
            stop,
            next_index,
            failed,
        } = self;
        // A replay error ends the replay: kept for `run`, and the source stopped.
        macro_rules! fail {
            ($error:expr) => {{
                *failed = Some($error);
                return true;
            }};
        }
        let (policy, options, observer, live) =
            (&mut **policy, *options, &mut **observer, &mut **live);
        // The event is used where the source left it (not moved into a binding of
        // its own).
        let event: &Event = next.borrow();
        let index = *next_index;
        *next_index += 1;
        let event_index = index as u64;
        if let Some(flag) = options.interrupt {
            if flag.load(Ordering::Relaxed) {
                fail!(ReplayError::Interrupted { event_index });
            }
        }
        observer.before_event(index, event, policy.as_dyn());
        device.ops.clear();
        let device_error = |error| ReplayError::Device { event_index, error };
        let outcome = match *event {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => {
                let request = Request {
                    size_bytes,
                    stream: StreamId(stream),
                };
                live.problem |= size_bytes == 0;
                match policy.allocate(&mut *device, request) {
                    Ok(a) => {
                        let outcome = Outcome::Allocated {
                            addr: a.addr,
                            requested_bytes: a.requested_bytes,
                            block_bytes: a.block_bytes,
                        };
                        live.insert(id, a);
                        outcome
                    }
                    Err(AllocError::OutOfMemory {
                        requested_bytes,
                        tried_bytes,
                        stats,
                    }) => {
                        *oom_count += 1;
                        live.insert_failed(id);
                        if options.check_invariants {
                            check_oom(&stats, &policy.stats(), before, event_index);
                        }
                        if oom.is_none() {
                            *oom = Some(Oom {
                                event_index: Some(event_index),
                                requested_bytes,
                                tried_bytes,
                                policy: stats,
                                device: device.stats(),
                                message: policy.describe_oom(tried_bytes, &*device),
                            });
                        }
                        if !options.continue_after_oom {
                            *stop = true;
                            *next_special = index;
                        }
                        Outcome::OutOfMemory {
                            requested_bytes,
                            tried_bytes,
                        }
                    }
                    Err(AllocError::ZeroSize) => {
                        *skipped += 1;
                        Outcome::Skipped(Skip::ZeroSize)
                    }
                    Err(AllocError::Device(e)) => {
                        live.insert_failed(id);
                        fail!(device_error(e));
                    }
                    Err(error) => {
                        live.insert_failed(id);
                        fail!(ReplayError::Policy {
                            event_index,
                            error: Box::new(error),
                        });
                    }
                }
            }
            Event::FreeRequested { id } => match live.request_free(id) {
                Requested::NotLive => {
                    *skipped += 1;
                    Outcome::Skipped(Skip::NotLive)
                }
                Requested::Twice => {
                    *skipped += 1;
                    Outcome::Skipped(Skip::AlreadyRequested)
                }
                Requested::Live(l) => {
                    if let Err(e) = policy.free_requested(&mut *device, &l.allocation) {
                        fail!(device_error(e));
                    }
                    l.free_requested = true;
                    Outcome::FreeRequested {
                        addr: l.allocation.addr,
                        block_bytes: l.allocation.block_bytes,
                    }
                }
            },
            Event::Free { id } => 'free: {
                // The policy frees the allocation where the table holds it; the slot
                // is emptied after, whatever the result. The slot is found once where
                // its page exists (the usual case), else out of line.
                if let Some(place) = live.live.place(id) {
                    if let Some(Slot::Live(l)) = place.get() {
                        let a = &l.allocation;
                        let (addr, block_bytes) = (a.addr, a.block_bytes);
                        let result = policy.free(&mut *device, a);
                        if place.discard() {
                            live.live.release_if_empty(id);
                        }
                        if let Err(e) = result {
                            fail!(device_error(e));
                        }
                        break 'free Outcome::Freed { addr, block_bytes };
                    }
                }
                match free_elsewhere(live, policy, &mut *device, id) {
                    Some((result, addr, block_bytes)) => {
                        if let Err(e) = result {
                            fail!(device_error(e));
                        }
                        Outcome::Freed { addr, block_bytes }
                    }
                    None => {
                        *skipped += 1;
                        Outcome::Skipped(Skip::NotLive)
                    }
                }
            }
            Event::EmptyCache => {
                if let Err(e) = policy.empty_cache(&mut *device) {
                    fail!(device_error(e));
                }
                Outcome::CacheEmptied
            }
            Event::Mark { .. } => Outcome::Marked,
            _ => {
                if let Some(c) = checks.as_deref_mut() {
                    c.other(index, event);
                }
                let streams;
                let call = match *event {
                    Event::CreatePool {
                        pool,
                        use_on_oom,
                        no_split,
                    } => AllocatorCall::CreatePool {
                        pool: pool_id(pool),
                        use_on_oom,
                        no_split,
                    },
                    Event::BeginAllocateToPool {
                        pool,
                        streams: ref trace_streams,
                    } => {
                        streams = match trace_streams {
                            workloads::PoolStreams::All => PoolStreams::All,
                            workloads::PoolStreams::Only(list) => {
                                PoolStreams::Only(list.iter().map(|&s| StreamId(s)).collect())
                            }
                        };
                        AllocatorCall::BeginAllocateToPool {
                            pool: pool_id(pool),
                            streams: &streams,
                        }
                    }
                    Event::EndAllocateToPool { pool } => AllocatorCall::EndAllocateToPool {
                        pool: pool_id(pool),
                    },
                    Event::ReleasePool { pool } => AllocatorCall::ReleasePool {
                        pool: pool_id(pool),
                    },
                    Event::EmptyPoolCache { pool } => AllocatorCall::EmptyPoolCache {
                        pool: pool_id(pool),
                    },
                    Event::SetAllocatorSettings { ref conf } => {
                        AllocatorCall::SetAllocatorSettings { conf }
                    }
                    Event::ResetPeakStats => AllocatorCall::ResetPeakStats,
                    Event::ResetAccumulatedStats => AllocatorCall::ResetAccumulatedStats,
                    Event::SetEnabled { enabled } => AllocatorCall::SetEnabled(enabled),
                    Event::RestoreBlock { pool, addr } => AllocatorCall::RestoreBlock {
                        pool: pool_id(pool),
                        addr: device.recorded_address(addr),
                    },
                    Event::Alloc { .. }
                    | Event::FreeRequested { .. }
                    | Event::Free { .. }
                    | Event::EmptyCache
                    | Event::Mark { .. } => unreachable!("handled above"),
                };
                match policy.call(&mut *device, &call) {
                    Ok(CallOutcome::Applied) => Outcome::Called { applied: true },
                    Ok(CallOutcome::Ignored) => {
                        *ignored_calls += 1;
                        Outcome::Called { applied: false }
                    }
                    Err(CallError::Device(e)) => fail!(device_error(e)),
                    Err(CallError::Rejected { message }) => {
                        fail!(ReplayError::Rejected {
                            event_index,
                            message,
                        })
                    }
                }
            }
        };
        let touched = std::mem::take(&mut device.touched);
        // The recorder sees the figures read after this event, and the first
        // event's either way (below; a figure not read again is the one it saw: its
        // peaks would not move).
        if touched {
            *dstats = device.stats();
            recorder.observe_device(dstats);
        }
        let lowers_only = !touched
            && matches!(
                outcome,
                Outcome::Freed { .. }
                    | Outcome::FreeRequested { .. }
                    | Outcome::Skipped(_)
                    | Outcome::Marked
            );
        if *stats_every_event || !lowers_only {
            // Written in place: see `Policy::stats_into`.
            policy.stats_into(stats);
            recorder.observe_policy(event_index, stats);
        }
        let special = index == *next_special;
        let mut ticks = false;
        if special {
            // Seeing the same figures twice at the same event changes nothing.
            if index == 0 {
                recorder.observe_device(dstats);
                recorder.observe_policy(event_index, stats);
            }
            if index == *next_tick {
                ticks = *period != 0;
                *next_tick = if ticks {
                    index.saturating_add(*period)
                } else {
                    usize::MAX
                };
            }
        }
        if ticks || observer.watches(index, event, &outcome) {
            observer.after_event(&Step {
                index,
                event,
                outcome,
                device_ops: &device.ops,
                policy_stats: stats,
                device_stats: dstats,
                policy: policy.as_dyn(),
            });
        }
        // Only a mark or an allocator call owns memory (a label, settings, streams),
        // and the outcome, in a register, tells them apart: the usual events are
        // forgotten, which frees nothing as they own nothing, where their drop
        // would find the event's variant again from memory after the policy's
        // calls. (An early return above drops the event as usual.)
        debug_assert_eq!(
            matches!(outcome, Outcome::Marked | Outcome::Called { .. }),
            !matches!(
                event,
                Event::Alloc { .. }
                    | Event::Free { .. }
                    | Event::FreeRequested { .. }
                    | Event::EmptyCache
            )
        );
        if matches!(outcome, Outcome::Marked | Outcome::Called { .. }) {
            drop(next);
        } else {
            std::mem::forget(next);
        }
        if special {
            if *stop {
                return true;
            }
            if options.check_invariants {
                if lowers_only {
                    check_lowered(before, stats, event_index);
                }
                check_state(policy.as_dyn(), stats, dstats, live, event_index);
                *before = *stats;
            }
            *next_special = if options.check_invariants {
                index + 1
            } else {
                *next_tick
            };
        }
        false
    }
}

/// How the device came to refuse a trace's starting state.
#[derive(Clone, Copy)]
enum StartFailure {
    /// Taking the state over ([`Policy::adopt`]).
    Adopting,
    /// Allocating its live blocks, `allocated` of them served (a policy that cannot
    /// take a state over).
    Allocating { allocated: u64 },
}

/// The result of a replay whose device could not hold the trace's starting state
/// `start`: an out-of-memory before the first event (no event replayed), `tried_bytes`
/// the device request that failed, the state as it was then. The state's blocks not
/// held go into `live` as not held, so that a check of the events still sees them live.
#[cold]
fn start_oom(
    start: &StartState,
    at: StartFailure,
    tried_bytes: u64,
    policy: &dyn Policy,
    device: &dyn Device,
    live: &mut LiveTable,
) -> Replay {
    let held = match at {
        StartFailure::Adopting => 0,
        StartFailure::Allocating { allocated } => allocated as usize,
    };
    for b in start.blocks().skip(held) {
        live.insert_unheld(b.id, b.pending_free);
    }
    let h = workloads::size::format_size_human;
    let (stats, dstats) = (policy.stats(), device.stats());
    let usable = format!(
        "a device with {} ({} bytes) usable",
        h(dstats.capacity_bytes),
        dstats.capacity_bytes
    );
    let (requested_bytes, message, started_by_allocating) = match at {
        StartFailure::Adopting => {
            let bytes = start.reserved_bytes();
            let message = format!(
                "the starting state of {} segment(s) / {} ({bytes} bytes) does not fit {usable}: \
                 {} of it was taken over when a further {} did not fit",
                start.segments.len(),
                h(bytes),
                h(stats.reserved_bytes),
                h(tried_bytes)
            );
            (bytes, message, 0)
        }
        StartFailure::Allocating { allocated } => {
            let bytes = start.requested_bytes();
            let message = format!(
                "the {} block(s) live at the first entry ({} ({bytes} bytes) requested) do not \
                 fit {usable} under this policy: {allocated} of them were allocated ({} \
                 reserved) when a device request of {} did not fit",
                start.block_count(),
                h(bytes),
                h(stats.reserved_bytes),
                h(tried_bytes)
            );
            (bytes, message, allocated)
        }
    };
    let mut recorder = Recorder::new();
    recorder.observe_start(&stats, &dstats);
    Replay {
        summary: recorder.finish(),
        oom: Some(Oom {
            event_index: None,
            requested_bytes,
            tried_bytes,
            policy: stats,
            device: dstats,
            message: Some(message),
        }),
        oom_count: 1,
        skipped_event_count: 0,
        live_allocation_count: live.len(),
        ignored_call_count: 0,
        missed_restore_count: 0,
        started_by_allocating,
        final_policy: stats,
        final_device: dstats,
    }
}

/// A `free` of `id` whose slot was not found in an existing page or holds no live
/// allocation (a sparse id, an alloc that ran out of memory, an unknown id): the
/// policy's result and the freed allocation's address and block bytes, if it had one.
#[cold]
#[inline(never)]
fn free_elsewhere<P: Policy + ?Sized>(
    live: &mut LiveTable,
    policy: &mut P,
    device: &mut dyn Device,
    id: AllocId,
) -> Option<(Result<(), DeviceError>, DeviceAddr, u64)> {
    // Taken out with one lookup (a sparse id's is a hash map's), then freed: the
    // table is not the policy's to read, so the order changes nothing.
    let l = live.remove(id)?;
    let a = &l.allocation;
    let (addr, block_bytes) = (a.addr, a.block_bytes);
    Some((policy.free(device, a), addr, block_bytes))
}

/// A trace's pool id as the policies know it.
fn pool_id(pool: workloads::PoolId) -> PoolId {
    PoolId(pool.0, pool.1)
}

/// A rebuilt starting state in the policy boundary's terms.
fn adopt_segments(start: &StartState) -> Vec<AdoptSegment> {
    start
        .segments
        .iter()
        .map(|s| AdoptSegment {
            addr: DeviceAddr(s.addr),
            size_bytes: s.size_bytes,
            stream: StreamId(s.stream),
            pool: s.pool.map(|p| match p {
                StartPool::Small => AdoptPool::Small,
                StartPool::Large => AdoptPool::Large,
            }),
            expandable: s.expandable,
            pool_id: pool_id(s.pool_id),
            blocks: s
                .blocks
                .iter()
                .map(|b| AdoptBlock {
                    addr: DeviceAddr(b.addr),
                    size_bytes: b.size_bytes,
                    requested_bytes: b.requested_bytes,
                    pending_free: b.pending_free,
                })
                .collect(),
        })
        .collect()
}

/// A trace's routing of requests to a pool as the policies know it.
fn pool_streams(streams: &workloads::PoolStreams) -> PoolStreams {
    match streams {
        workloads::PoolStreams::All => PoolStreams::All,
        workloads::PoolStreams::Only(list) => {
            PoolStreams::Only(list.iter().map(|&s| StreamId(s)).collect())
        }
    }
}

/// The private pools of a rebuilt starting state in the policy boundary's terms.
fn adopt_pools(start: &StartState) -> Vec<AdoptPrivatePool> {
    start
        .pools
        .iter()
        .map(|p| AdoptPrivatePool {
            id: pool_id(p.id),
            uses: p.uses,
            use_on_oom: p.use_on_oom,
            no_split: p.no_split,
            routing: p.routing.as_ref().map(pool_streams),
        })
        .collect()
}

/// After a free, a `free_requested`, a skipped event or a mark that made no device
/// call: no figure a peak is taken of went up (the engine reads the policy's figures
/// after such events only when an observer or these checks ask).
fn check_lowered(before: &PolicyStats, after: &PolicyStats, event_index: u64) {
    let raised = [
        ("requested", before.requested_bytes, after.requested_bytes),
        ("allocated", before.allocated_bytes, after.allocated_bytes),
        ("reserved", before.reserved_bytes, after.reserved_bytes),
        ("segment count", before.segment_count, after.segment_count),
    ]
    .into_iter()
    .find(|&(_, b, a)| a > b);
    if let Some((what, b, a)) = raised {
        panic!("{what} went up from {b} to {a} at event {event_index}, which only frees");
    }
}

/// At an out-of-memory: the state the policy reported is the state after, and the
/// failed attempt grew no reservation (it may have released cached memory).
fn check_oom(reported: &PolicyStats, after: &PolicyStats, before: &PolicyStats, event_index: u64) {
    let at = format!("at the out-of-memory of event {event_index}");
    assert_eq!(
        reported, after,
        "the reported state is not the state after {at}"
    );
    assert!(
        after.reserved_bytes <= before.reserved_bytes,
        "the reservation grew {at}"
    );
}

/// The engine's own checks, on two paths: the policy's view against the device's, and
/// the live allocations against the policy's blocks. Each live allocation whose free
/// was not requested is an allocated block of its own; one whose free was requested
/// may still be one (a policy without streams keeps it allocated) or not; every
/// allocated block belongs to a live allocation, and the policy's count and bytes are
/// those of its allocated blocks.
fn check_state(
    policy: &dyn Policy,
    stats: &PolicyStats,
    device: &DeviceStats,
    live: &LiveTable,
    event_index: u64,
) {
    policy.check_invariants();
    let at = format!("after event {event_index}");
    assert_eq!(
        stats.reserved_bytes, device.reserved_bytes,
        "policy and device disagree on reserved bytes {at}"
    );
    assert!(
        stats.allocated_bytes <= stats.reserved_bytes,
        "allocated exceeds reserved {at}"
    );
    let snapshot = policy.snapshot();
    // Blocks whose free is pending still count as requested: those of live allocations,
    // and those whose completed free the policy holds back (a capture under way).
    let held: u64 = snapshot
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::PendingFree)
        .map(|b| b.requested_bytes)
        .sum();
    assert!(
        stats.requested_bytes <= stats.allocated_bytes + pending_bytes(live).max(held),
        "requested exceeds allocated {at}"
    );
    let mut blocks: Vec<(u64, u64, BlockState)> = Vec::new();
    let mut last_end = 0u64;
    for seg in &snapshot {
        assert!(
            seg.addr.0 >= last_end,
            "segments overlap at {} {at}",
            seg.addr
        );
        let mut cursor = seg.addr.0;
        for b in &seg.blocks {
            assert_eq!(
                b.addr.0, cursor,
                "blocks do not tile segment {} {at}",
                seg.addr
            );
            cursor += b.size_bytes;
            blocks.push((b.addr.0, b.size_bytes, b.state));
        }
        assert_eq!(
            cursor,
            seg.addr.0 + seg.size_bytes,
            "segment {} size {at}",
            seg.addr
        );
        last_end = cursor;
    }
    let mut claimed = vec![false; blocks.len()];
    let block_of = |a: &Allocation| {
        let i = blocks.partition_point(|&(addr, _, _)| addr < a.addr.0);
        blocks
            .get(i)
            .filter(|&&(addr, size, state)| {
                addr == a.addr.0 && size == a.block_bytes && state == BlockState::Allocated
            })
            .map(|_| i)
    };
    let mut count = 0u64;
    let mut bytes = 0u64;
    for l in live.iter().filter(|l| !l.free_requested) {
        let a = &l.allocation;
        assert!(
            a.requested_bytes <= a.block_bytes,
            "allocation at {} has a block smaller than its request {at}",
            a.addr
        );
        let i = block_of(a).unwrap_or_else(|| {
            panic!(
                "live allocation at {} ({} bytes) is not an allocated block {at}",
                a.addr, a.block_bytes
            )
        });
        assert!(
            !claimed[i],
            "two live allocations share the block at {} {at}",
            a.addr
        );
        claimed[i] = true;
        count += 1;
        bytes += a.block_bytes;
    }
    for l in live.iter().filter(|l| l.free_requested) {
        if let Some(i) = block_of(&l.allocation).filter(|&i| !claimed[i]) {
            claimed[i] = true;
            count += 1;
            bytes += l.allocation.block_bytes;
        }
    }
    if let Some(i) =
        (0..blocks.len()).find(|&i| blocks[i].2 == BlockState::Allocated && !claimed[i])
    {
        panic!(
            "the allocated block at {:#x} belongs to no live allocation {at}",
            blocks[i].0
        );
    }
    assert_eq!(count, stats.allocation_count, "live allocation count {at}");
    assert_eq!(
        bytes, stats.allocated_bytes,
        "allocated bytes are not conserved {at}"
    );
}

/// Requested bytes of allocations whose free was requested (a policy with streams no
/// longer counts them as allocated, but still as requested until the free completes).
fn pending_bytes(live: &LiveTable) -> u64 {
    live.iter()
        .filter(|l| l.free_requested)
        .map(|l| l.allocation.block_bytes)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceOptions};
    use crate::observe::{DeviceOp, DeviceOpKind, Timeline};
    use policies::caching::CachingPolicy;
    use policies::immediate::ImmediatePolicy;
    use workloads::validate::validate;

    const GIB: u64 = 1 << 30;

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

    fn checked() -> ReplayOptions {
        ReplayOptions {
            check_invariants: true,
            ..ReplayOptions::default()
        }
    }

    /// The seed000 scenario peaks at 3 GiB reserved under the caching policy.
    #[test]
    fn seed000_reserved_peak() {
        let t = Trace::new(
            "seed000",
            vec![
                alloc(0, GIB),
                alloc(1, GIB),
                free(1),
                alloc(2, GIB),
                alloc(3, GIB),
                free(2),
                alloc(4, GIB),
                free(4),
                alloc(5, GIB),
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r = replay(&t, &mut CachingPolicy::default(), &mut d, &checked()).unwrap();
        assert_eq!(r.summary.reserved_bytes_peak, 3 * GIB);
        assert_eq!(r.summary.allocated_bytes_peak, 3 * GIB);
        assert_eq!(r.live_allocation_count, 3);
        assert_eq!(r.oom, None);
    }

    /// An observer is shown only the steps it watches, each with its own index and
    /// outcome.
    #[test]
    fn observers_see_the_steps_they_watch() {
        struct Frees(Vec<(usize, Outcome)>);
        impl Observer for Frees {
            fn after_event(&mut self, step: &Step<'_>) {
                self.0.push((step.index, step.outcome));
            }
            fn watches(&self, _index: usize, event: &Event, _outcome: &Outcome) -> bool {
                matches!(event, Event::Free { .. })
            }
        }
        let t = Trace::new("t", vec![alloc(0, 512), alloc(1, 512), free(1), free(0)]);
        let mut frees = Frees(Vec::new());
        let mut d = SimDevice::new(SimDeviceOptions::default());
        replay_with(
            &t,
            &mut CachingPolicy::default(),
            &mut d,
            &checked(),
            &mut frees,
        )
        .unwrap();
        let seen: Vec<usize> = frees.0.iter().map(|&(i, _)| i).collect();
        assert_eq!(seen, [2, 3]);
        assert!(frees
            .0
            .iter()
            .all(|(_, o)| matches!(o, Outcome::Freed { .. })));
    }

    /// An observer with a period is shown the steps at its multiples (event 0
    /// included) besides those it watches, each once; two observers with periods are
    /// shown the multiples of their greatest common divisor; the summary is the same
    /// as without them.
    #[test]
    fn observers_see_their_periods() {
        struct Ticks {
            period: usize,
            marks: bool,
            seen: Vec<usize>,
        }
        impl Observer for Ticks {
            fn after_event(&mut self, step: &Step<'_>) {
                self.seen.push(step.index);
            }
            fn needs_stats_every_event(&self) -> bool {
                false
            }
            fn watches(&self, _index: usize, event: &Event, _outcome: &Outcome) -> bool {
                self.marks && matches!(event, Event::Mark { .. })
            }
            fn period(&self) -> usize {
                self.period
            }
        }
        let ticks = |period, marks| Ticks {
            period,
            marks,
            seen: Vec::new(),
        };
        let mut events = Vec::new();
        for i in 0..10 {
            events.push(alloc(i, 512 << i));
            if i == 4 {
                events.push(Event::Mark { label: "m".into() });
            }
            events.push(free(i));
        }
        let t = Trace::new("t", events);
        let run = |observer: &mut dyn FnMut(&mut SimDevice) -> Replay| {
            observer(&mut SimDevice::new(SimDeviceOptions::default()))
        };
        let lean = run(&mut |d| replay(&t, &mut CachingPolicy::default(), d, &checked()).unwrap());
        let mut one = ticks(4, true);
        let r = run(&mut |d| {
            replay_with(&t, &mut CachingPolicy::default(), d, &checked(), &mut one).unwrap()
        });
        assert_eq!(r, lean);
        assert_eq!(one.seen, [0, 4, 8, 9, 12, 16, 20]);
        let mut two = (ticks(4, false), Some(ticks(6, false)));
        let r = run(&mut |d| {
            replay_with(&t, &mut CachingPolicy::default(), d, &checked(), &mut two).unwrap()
        });
        assert_eq!(r, lean);
        assert_eq!(two.0.seen, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]);
        assert_eq!(two.0.seen, two.1.unwrap().seen);
        let mut none = (ticks(0, false), None::<Ticks>);
        let r = run(&mut |d| {
            replay_with(&t, &mut CachingPolicy::default(), d, &checked(), &mut none).unwrap()
        });
        assert_eq!(r, lean);
        assert!(none.0.seen.is_empty());
    }

    /// The summary is the same whether the engine reads every event's figures (an
    /// observer that needs them) or only those that may raise a peak (the recorder
    /// then sees only the figures read again), under every policy, at a capacity that
    /// runs out (going on after it) and one that does not.
    #[test]
    fn summary_does_not_depend_on_the_figures_read() {
        let t = workloads::generate::random(&workloads::RandomOptions {
            seed: 9,
            events: 4000,
            streams: 2,
            ..workloads::RandomOptions::default()
        })
        .unwrap();
        for spec in policies::testing::every_policy() {
            let policy = &spec.label;
            for capacity in [80 * GIB, 2 * GIB] {
                let options = ReplayOptions {
                    continue_after_oom: true,
                    ..ReplayOptions::default()
                };
                let run = |observer: &mut dyn FnMut(&mut dyn Policy, &mut SimDevice) -> Replay| {
                    let mut p = spec.config.build().unwrap();
                    let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(capacity));
                    observer(p.as_mut(), &mut d)
                };
                let lean = run(&mut |p, d| replay(&t, p, d, &options).unwrap());
                let mut timeline = Timeline::default();
                let every =
                    run(&mut |p, d| replay_with(&t, p, d, &options, &mut timeline).unwrap());
                assert_eq!(lean, every, "{policy} at {capacity}");
            }
        }
    }

    /// An OOM stops the replay and records the event, its bytes and the state then.
    #[test]
    fn oom_is_a_result() {
        let t = Trace::new("t", vec![alloc(0, 3 * GIB), alloc(1, 2 * GIB), free(0)]);
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let r = replay(&t, &mut ImmediatePolicy::default(), &mut d, &checked()).unwrap();
        let oom = r.oom.unwrap();
        assert_eq!((oom.event_index, oom.requested_bytes), (Some(1), 2 * GIB));
        assert_eq!(oom.policy.allocated_bytes, 3 * GIB);
        assert_eq!(r.summary.event_count, 2, "stopped at the OOM");
    }

    /// A CSV trace replayed from the reader's own source (`CsvEvents::rows`, the
    /// engine's step called from the branch that read each row's op) gives what the
    /// reader's iterator gives through the same engine: the replay or its error, the
    /// check's answer, the timeline and where the reader is left, with and without
    /// `continue_after_oom` and the checks, an out-of-memory that stops the replay
    /// with problems after it, and an interruption.
    #[test]
    fn a_csv_traces_rows_replay_as_its_iterator_does() {
        use workloads::csv::CsvEvents;
        static RAISED: AtomicBool = AtomicBool::new(true);
        let mut text = String::from("op,id,bytes,stream\nalloc,1,512,0\nmark,m,,\n");
        text += "free_requested,1,,\nfree_completed,1,,\nfree,1,,\nalloc,2,0,1\n";
        text += "empty_cache,,,\nalloc,3,3221225472,0\nalloc,4,2147483648,0\n";
        text += "free,3,,\nfree,4,,\nfree,4,,\nalloc,5,1024,0\nfree,9,,\n";
        let plain = ReplayOptions::default();
        let go_on = ReplayOptions {
            continue_after_oom: true,
            ..checked()
        };
        let interrupted = ReplayOptions {
            interrupt: Some(&RAISED),
            ..ReplayOptions::default()
        };
        let path = std::path::Path::new("t.csv");
        for options in [plain, checked(), go_on, interrupted] {
            let run = |rows: bool| {
                let mut reader = CsvEvents::new(text.as_bytes(), path);
                let mut device = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
                let mut policy = CachingPolicy::default();
                let mut timeline = Timeline::default();
                let (result, problem) = if rows {
                    let mut source = reader.rows();
                    replay_checked(
                        &mut source,
                        &mut policy,
                        &mut device,
                        &options,
                        &mut timeline,
                    )
                } else {
                    replay_checked(
                        &mut reader,
                        &mut policy,
                        &mut device,
                        &options,
                        &mut timeline,
                    )
                };
                let rest: Vec<Event> = reader.by_ref().collect();
                format!("{result:?} {problem} {timeline:?} {rest:?}")
            };
            assert_eq!(run(true), run(false), "{options:?}");
        }
    }

    /// With continue_after_oom the failed allocation's free is skipped.
    #[test]
    fn continue_after_oom_skips_the_failed_free() {
        let t = Trace::new(
            "t",
            vec![alloc(0, 3 * GIB), alloc(1, 2 * GIB), free(1), free(0)],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let o = ReplayOptions {
            continue_after_oom: true,
            ..checked()
        };
        let r = replay(&t, &mut ImmediatePolicy::default(), &mut d, &o).unwrap();
        assert_eq!(
            (r.oom_count, r.skipped_event_count, r.live_allocation_count),
            (1, 1, 0)
        );
        assert_eq!(r.summary.event_count, 4);
    }

    /// A timeline observer gets one sample per event with the policy's figures.
    #[test]
    fn timeline_samples_every_event() {
        let t = Trace::new(
            "t",
            vec![
                alloc(0, 100),
                Event::Mark { label: "x".into() },
                free(0),
                Event::EmptyCache,
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let mut timeline = crate::Timeline::default();
        replay_with(
            &t,
            &mut CachingPolicy::default(),
            &mut d,
            &checked(),
            &mut timeline,
        )
        .unwrap();
        let reserved: Vec<u64> = timeline
            .samples
            .iter()
            .map(|s| s.policy.reserved_bytes)
            .collect();
        assert_eq!(reserved, vec![2 << 20, 2 << 20, 2 << 20, 0]);
        assert_eq!(timeline.samples[0].policy.requested_bytes, 100);
    }

    /// What an observer is shown, per event.
    #[derive(Default)]
    struct Log {
        before: Vec<(usize, u64)>,
        steps: Vec<(usize, Outcome, Vec<DeviceOp>, u64, usize)>,
    }

    impl Observer for Log {
        fn before_event(&mut self, index: usize, _event: &Event, policy: &dyn Policy) {
            self.before.push((index, policy.stats().allocated_bytes));
        }

        fn after_event(&mut self, step: &Step<'_>) {
            self.steps.push((
                step.index,
                step.outcome,
                step.device_ops.to_vec(),
                step.device_stats.reserved_bytes,
                step.policy.snapshot().len(),
            ));
        }
    }

    /// The observer sees each event before and after, with its outcome, the device
    /// operations it caused (addresses and bytes), the stats and the policy; the OOM
    /// that stops a replay is shown too.
    #[test]
    fn observer_sees_outcomes_and_device_ops() {
        let t = Trace::new(
            "t",
            vec![
                alloc(0, 3 * GIB),
                free(0),
                Event::EmptyCache,
                free(0),
                alloc(1, 5 * GIB),
                alloc(2, 1),
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let mut log = Log::default();
        let r = replay_with(
            &t,
            &mut CachingPolicy::default(),
            &mut d,
            &checked(),
            &mut log,
        )
        .unwrap();
        assert_eq!(
            log.before,
            vec![(0, 0), (1, 3 * GIB), (2, 0), (3, 0), (4, 0)]
        );
        let (_, outcome, ops, reserved, segments) = &log.steps[0];
        let Outcome::Allocated {
            addr, block_bytes, ..
        } = *outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!(block_bytes, 3 * GIB);
        assert_eq!(
            ops,
            &vec![DeviceOp {
                kind: DeviceOpKind::SegmentAlloc,
                addr,
                bytes: 3 * GIB
            }]
        );
        assert_eq!((*reserved, *segments), (3 * GIB, 1));
        assert_eq!(
            log.steps[1].1,
            Outcome::Freed {
                addr,
                block_bytes: 3 * GIB
            }
        );
        assert!(log.steps[1].2.is_empty(), "a free keeps the segment cached");
        assert_eq!(log.steps[2].1, Outcome::CacheEmptied);
        assert_eq!(
            log.steps[2].2,
            vec![DeviceOp {
                kind: DeviceOpKind::SegmentFree,
                addr,
                bytes: 3 * GIB
            }]
        );
        assert_eq!(log.steps[3].1, Outcome::Skipped(Skip::NotLive));
        assert_eq!(
            log.steps[4].1,
            Outcome::OutOfMemory {
                requested_bytes: 5 * GIB,
                tried_bytes: 5 * GIB
            }
        );
        assert_eq!(log.steps.len(), 5, "the replay stops after the OOM");
        assert_eq!(r.oom.unwrap().event_index, Some(4));
    }

    /// Expandable segments show their page mappings as device operations, at the
    /// address they map.
    #[test]
    fn observer_sees_page_mappings() {
        let t = Trace::new("t", vec![alloc(0, 30 << 20), free(0), Event::EmptyCache]);
        let config =
            policies::caching::CachingConfig::from_alloc_conf("expandable_segments:True").unwrap();
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let mut log = Log::default();
        replay_with(
            &t,
            &mut CachingPolicy::new(config),
            &mut d,
            &checked(),
            &mut log,
        )
        .unwrap();
        let maps = &log.steps[0].2;
        assert!(
            !maps.is_empty() && maps.iter().all(|op| op.kind == DeviceOpKind::Map),
            "{maps:?}"
        );
        let Outcome::Allocated { addr, .. } = log.steps[0].1 else {
            panic!()
        };
        assert_eq!(
            maps[0].addr, addr,
            "the block starts at the first mapped page"
        );
        let unmapped: u64 = log.steps[2].2.iter().map(|op| op.bytes).sum();
        assert_eq!(unmapped, maps.iter().map(|op| op.bytes).sum::<u64>());
        assert!(log.steps[2]
            .2
            .iter()
            .all(|op| op.kind == DeviceOpKind::Unmap));
    }

    /// A delayed free (`free_requested`) stops the caching policy counting the block as
    /// allocated, keeps its memory from reuse until the `free`, and passes the engine's
    /// checks; a policy without streams ignores it; a second one, or one of an id that
    /// is not live, is skipped.
    #[test]
    fn free_requested_is_a_delayed_free() {
        let req = |id| Event::FreeRequested { id: AllocId(id) };
        let t = Trace::new(
            "t",
            vec![
                alloc(0, 64 << 20),
                req(0),
                alloc(1, 64 << 20),
                req(0),
                req(7),
                free(0),
                alloc(2, 64 << 20),
            ],
        );
        let mut log = Log::default();
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r = replay_with(
            &t,
            &mut CachingPolicy::default(),
            &mut d,
            &checked(),
            &mut log,
        )
        .unwrap();
        let Outcome::Allocated { addr, .. } = log.steps[0].1 else {
            panic!()
        };
        assert_eq!(
            log.steps[1].1,
            Outcome::FreeRequested {
                addr,
                block_bytes: 64 << 20
            }
        );
        assert_eq!(log.before[2].1, 0, "no longer counted as allocated");
        assert_eq!(
            log.steps[2].4, 2,
            "not reused before its free: a second segment"
        );
        assert_eq!(log.steps[3].1, Outcome::Skipped(Skip::AlreadyRequested));
        assert_eq!(log.steps[4].1, Outcome::Skipped(Skip::NotLive));
        let Outcome::Allocated { addr: reused, .. } = log.steps[6].1 else {
            panic!()
        };
        assert_eq!(reused, addr, "reused after its free");
        assert_eq!((r.skipped_event_count, r.live_allocation_count), (2, 2));
        assert_eq!(log.before[3].1, 64 << 20, "after the second alloc");

        let mut log = Log::default();
        let mut d = SimDevice::new(SimDeviceOptions::default());
        replay_with(
            &t,
            &mut ImmediatePolicy::default(),
            &mut d,
            &checked(),
            &mut log,
        )
        .unwrap();
        assert_eq!(
            log.before[3].1,
            128 << 20,
            "without streams the block stays allocated until its free"
        );
    }

    /// A policy that misreports, to show the engine's checks catch it.
    struct Lying {
        inner: ImmediatePolicy,
        /// Leave the first block out of snapshots.
        hide_block: bool,
        /// Report stale stats with an out-of-memory.
        stale_oom: bool,
    }

    impl Policy for Lying {
        fn name(&self) -> &str {
            "lying"
        }

        fn allocate(
            &mut self,
            device: &mut dyn Device,
            request: Request,
        ) -> Result<Allocation, AllocError> {
            match self.inner.allocate(device, request) {
                Err(AllocError::OutOfMemory {
                    requested_bytes,
                    tried_bytes,
                    mut stats,
                }) if self.stale_oom => {
                    stats.allocated_bytes += 1;
                    Err(AllocError::OutOfMemory {
                        requested_bytes,
                        tried_bytes,
                        stats,
                    })
                }
                other => other,
            }
        }

        fn free(
            &mut self,
            device: &mut dyn Device,
            allocation: &Allocation,
        ) -> Result<(), DeviceError> {
            self.inner.free(device, allocation)
        }

        fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
            self.inner.empty_cache(device)
        }

        fn stats(&self) -> PolicyStats {
            self.inner.stats()
        }

        fn snapshot(&self) -> Vec<policies::SegmentSnapshot> {
            let mut s = self.inner.snapshot();
            if self.hide_block {
                for seg in &mut s {
                    for b in &mut seg.blocks {
                        b.state = BlockState::Free;
                    }
                }
            }
            s
        }

        fn check_invariants(&self) {
            self.inner.check_invariants();
        }
    }

    fn lying(hide_block: bool, stale_oom: bool) -> Lying {
        Lying {
            inner: ImmediatePolicy::default(),
            hide_block,
            stale_oom,
        }
    }

    /// The engine's checks catch a live allocation the policy's blocks do not show.
    #[test]
    #[should_panic(expected = "is not an allocated block after event 0")]
    fn checks_catch_a_missing_block() {
        let t = Trace::new("t", vec![alloc(0, 100)]);
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let _ = replay(&t, &mut lying(true, false), &mut d, &checked());
    }

    /// The engine's checks catch an out-of-memory that reports a state other than the
    /// state after it.
    #[test]
    #[should_panic(
        expected = "the reported state is not the state after at the out-of-memory of event 1"
    )]
    fn checks_catch_a_stale_oom_state() {
        let t = Trace::new("t", vec![alloc(0, GIB), alloc(1, 8 * GIB)]);
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let _ = replay(&t, &mut lying(false, true), &mut d, &checked());
    }

    /// A policy whose figures go up at a free that makes no device call.
    #[derive(Default)]
    struct RaisesOnFree {
        inner: CachingPolicy,
        frees: u64,
    }

    impl Policy for RaisesOnFree {
        fn name(&self) -> &str {
            "raises-on-free"
        }

        fn allocate(
            &mut self,
            device: &mut dyn Device,
            request: Request,
        ) -> Result<Allocation, AllocError> {
            self.inner.allocate(device, request)
        }

        fn free(
            &mut self,
            device: &mut dyn Device,
            allocation: &Allocation,
        ) -> Result<(), DeviceError> {
            self.frees += 1;
            self.inner.free(device, allocation)
        }

        fn empty_cache(&mut self, device: &mut dyn Device) -> Result<(), DeviceError> {
            self.inner.empty_cache(device)
        }

        fn stats(&self) -> PolicyStats {
            let mut s = self.inner.stats();
            s.segment_count += self.frees;
            s
        }

        fn snapshot(&self) -> Vec<policies::SegmentSnapshot> {
            self.inner.snapshot()
        }

        fn check_invariants(&self) {
            self.inner.check_invariants();
        }
    }

    /// The engine's checks catch a free that raises a figure (the engine reads the
    /// figures after frees only where an observer or the checks ask, so a peak would
    /// be missed).
    #[test]
    #[should_panic(expected = "segment count went up from 1 to 2 at event 1, which only frees")]
    fn checks_catch_a_free_that_raises_a_figure() {
        let t = Trace::new("t", vec![alloc(0, 100), free(0)]);
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let _ = replay(&t, &mut RaisesOnFree::default(), &mut d, &checked());
    }

    /// Unchecked and unobserved, the engine reads the figures after a free only where
    /// the free called the device: a figure raised at a free is not seen, so the
    /// contract the checks hold policies to is what keeps the peaks exact; an observer
    /// that needs every event's figures sees them.
    #[test]
    fn figures_after_frees_are_read_where_needed() {
        let t = Trace::new("t", vec![alloc(0, 100), free(0), alloc(1, 100)]);
        let unobserved = replay(
            &t,
            &mut RaisesOnFree::default(),
            &mut SimDevice::new(SimDeviceOptions::default()),
            &ReplayOptions::default(),
        )
        .unwrap();
        assert_eq!(unobserved.summary.segment_count_peak, 2, "read at event 2");
        let mut timeline = Timeline::default();
        replay_with(
            &t,
            &mut RaisesOnFree::default(),
            &mut SimDevice::new(SimDeviceOptions::default()),
            &ReplayOptions::default(),
            &mut timeline,
        )
        .unwrap();
        let counts: Vec<u64> = timeline
            .samples
            .iter()
            .map(|s| s.policy.segment_count)
            .collect();
        assert_eq!(counts, [1, 2, 2]);
        let mut oom_watch = crate::OomWatch::default();
        let mut seen = Vec::new();
        struct Seen<'a>(&'a mut Vec<u64>);
        impl Observer for Seen<'_> {
            fn after_event(&mut self, step: &Step<'_>) {
                self.0.push(step.policy_stats.segment_count);
            }
            fn needs_stats_every_event(&self) -> bool {
                false
            }
        }
        replay_with(
            &t,
            &mut RaisesOnFree::default(),
            &mut SimDevice::new(SimDeviceOptions::default()),
            &ReplayOptions::default(),
            &mut (&mut oom_watch, Seen(&mut seen)),
        )
        .unwrap();
        assert_eq!(
            seen,
            [1, 1, 2],
            "the free's step shows the figures read before it"
        );
    }

    /// Without checks the same lying policy replays (the checks are what caught it).
    #[test]
    fn lying_policy_replays_unchecked() {
        let t = Trace::new("t", vec![alloc(0, GIB), alloc(1, 8 * GIB)]);
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let r = replay(
            &t,
            &mut lying(true, true),
            &mut d,
            &ReplayOptions::default(),
        )
        .unwrap();
        assert_eq!(r.oom.unwrap().event_index, Some(1));
    }

    /// Large ids and reused ids work.
    #[test]
    fn sparse_and_reused_ids() {
        let t = Trace::new(
            "t",
            vec![
                alloc(u64::MAX - 3, 10),
                free(u64::MAX - 3),
                alloc(7, 10),
                free(7),
                alloc(7, 20),
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r = replay(&t, &mut CachingPolicy::default(), &mut d, &checked()).unwrap();
        assert_eq!(r.live_allocation_count, 1);
        assert_eq!(r.skipped_event_count, 0);
    }

    /// The trace `events` with the event `at` changed by `mutation` (0: none; 1: the
    /// alloc removed; 2: a free repeated; 3: a `free_requested` before each third free;
    /// 4: a `free_requested` repeated; 5: a `free_requested` of an id never allocated;
    /// 6: an alloc of 0 bytes; 7: an alloc of an id live then; 8: a free of an id
    /// never allocated).
    fn mutated(events: &[Event], mutation: usize, at: usize) -> Vec<Event> {
        let mut out = Vec::new();
        let mut frees = 0;
        let mut live = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let here = i == at;
            match (e, mutation) {
                (&Event::Alloc { .. }, 1) if here => continue,
                (&Event::Alloc { id, stream, .. }, 6) if here => {
                    out.push(Event::Alloc {
                        id,
                        size_bytes: 0,
                        stream,
                    });
                    continue;
                }
                (
                    &Event::Alloc {
                        size_bytes, stream, ..
                    },
                    7,
                ) if here && !live.is_empty() => {
                    out.push(Event::Alloc {
                        id: live[0],
                        size_bytes,
                        stream,
                    });
                    continue;
                }
                (&Event::Free { id }, 2) if here => out.push(Event::Free { id }),
                (&Event::Free { id }, 3 | 4) => {
                    frees += 1;
                    if frees % 3 == 0 || (mutation == 4 && here) {
                        out.push(Event::FreeRequested { id });
                        if mutation == 4 && here {
                            out.push(Event::FreeRequested { id });
                        }
                    }
                }
                (_, 5) if here => out.push(Event::FreeRequested {
                    id: AllocId(u64::MAX - 1),
                }),
                (_, 8) if here => out.push(free(1 << 40)),
                _ => {}
            }
            match *e {
                Event::Alloc { id, .. } => live.push(id),
                Event::Free { id } => live.retain(|&l| l != id),
                _ => {}
            }
            out.push(e.clone());
        }
        out
    }

    /// A replay that checks its events on the engine's live table finds an error
    /// exactly where validation does (bad frees and `free_requested`s, zero sizes, an
    /// id allocated twice; frees of allocations that ran out of memory are none),
    /// before and after an out-of-memory, stopping there or going on, and replays as
    /// the unchecked engine does.
    #[test]
    fn checked_replay_agrees_with_validation() {
        let trace = workloads::generate::random(&workloads::RandomOptions {
            seed: 11,
            events: 600,
            streams: 2,
            ..workloads::RandomOptions::default()
        })
        .unwrap();
        let mut found = [false; 2];
        let mut ooms = 0;
        for mutation in 0..9 {
            for at in [3, 100, 290, 450, 590] {
                let events = mutated(&trace.events, mutation, at);
                let expected = validate(&Trace::new("t", events.clone()))
                    .iter()
                    .any(|i| i.severity == workloads::validate::Severity::Error);
                found[usize::from(expected)] = true;
                for capacity in [80 * GIB, GIB / 2, GIB / 4] {
                    for continue_after_oom in [false, true] {
                        let options = ReplayOptions {
                            continue_after_oom,
                            ..ReplayOptions::default()
                        };
                        let device =
                            || SimDevice::new(SimDeviceOptions::default().with_capacity(capacity));
                        let unchecked = replay_events(
                            None,
                            &events,
                            &mut CachingPolicy::default(),
                            &mut device(),
                            &options,
                            &mut (),
                        )
                        .unwrap();
                        let (checked, problem) = replay_checked(
                            &mut events.iter(),
                            &mut CachingPolicy::default(),
                            &mut device(),
                            &options,
                            &mut (),
                        );
                        let case = format!("mutation {mutation} at {at}, {capacity} bytes, continue {continue_after_oom}");
                        assert_eq!(problem, expected, "{case}");
                        ooms += u64::from(unchecked.oom.is_some());
                        assert_eq!(checked.unwrap(), unchecked, "{case}");
                    }
                }
            }
        }
        assert_eq!(found, [true, true]);
        assert!(ooms > 0);
    }
}
