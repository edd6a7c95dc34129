//! Batch comparisons: every trace × policy × capacity, replayed in parallel, rows in a
//! fixed order.

use rayon::prelude::*;
use workloads::Trace;

use crate::device::{AddressHints, SimDevice, SimDeviceOptions};
use crate::metrics::{Oom, Summary};
use crate::observe::Observer;
use crate::replay::{replay_with, Replay, ReplayError, ReplayOptions};
use policies::registry::OptionsError;
use policies::spec::PolicySpec;
use policies::PolicyConfig;
use policies::{AsDynPolicy, Device, Policy, PolicyVisitor};

/// A comparison that could not finish: the first (trace, policy) pair, in input order,
/// whose policy did not build or whose replay failed for a reason other than running
/// out of memory.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The policy's options do not build a policy.
    #[error("{trace} under {policy}: {source}")]
    Build {
        /// Trace name.
        trace: String,
        /// Policy label.
        policy: String,
        /// Why.
        #[source]
        source: OptionsError,
    },
    /// The replay stopped: a device failure, an error of the policy, or interruption.
    #[error("{trace} under {policy}: {source}")]
    Replay {
        /// Trace name.
        trace: String,
        /// Policy label.
        policy: String,
        /// Why.
        #[source]
        source: ReplayError,
    },
}

/// A trace to compare, with the recorded addresses to reuse (from a recorded run), if
/// any.
#[derive(Clone, Debug)]
pub struct CompareInput {
    /// The trace.
    pub trace: Trace,
    /// Recorded segment addresses, for traces that came from a PyTorch recording (only
    /// the caching policy follows them: [`AddressHints::for_policy`]).
    pub hints: AddressHints,
}

/// One row of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Trace name.
    pub trace: String,
    /// Policy label as given.
    pub policy: String,
    /// Device capacity used (usable bytes).
    pub capacity_bytes: u64,
    /// The device's total memory (what `--capacity` names).
    pub total_bytes: u64,
    /// Events in the trace.
    pub events: u64,
    /// Peaks and counts.
    pub summary: Summary,
    /// The first OOM, if any.
    pub oom: Option<Oom>,
    /// Allocations live at the end of the replay.
    pub live_allocation_count: u64,
    /// Why the first OOM happened, with the setting that avoids it if one was found
    /// (checked by replaying).
    pub explanation: Option<crate::explain::OomExplanation>,
    /// Why its numbers are not exact ([`crate::caveats`]); empty when nothing is known
    /// to be off.
    pub caveats: Vec<String>,
    /// Whether the outcome (fits or runs out) could change within the device's
    /// variation between processes ([`crate::boundary::margin`]); always clear on a
    /// device without a spread.
    pub margin: crate::boundary::Margin,
}

/// Replays every (trace, policy, device) combination on fresh simulated devices, in
/// parallel on all cores. Rows come out in input order (trace, then policy, then
/// device), whatever the scheduling, so the output is deterministic.
///
/// With `options.interrupt` set, every replay stops at its next event and the
/// comparison returns [`ReplayError::Interrupted`] (inside [`CompareError::Replay`]).
///
/// # Errors
/// The first replay in input order that failed for a reason other than running out of
/// memory, with its trace and policy.
pub fn compare(
    inputs: &[CompareInput],
    policies: &[PolicySpec],
    devices: &[SimDeviceOptions],
    options: &ReplayOptions,
) -> Result<Vec<Row>, CompareError> {
    let runs: Vec<(&CompareInput, &[PolicySpec])> =
        inputs.iter().map(|input| (input, policies)).collect();
    compare_each(&runs, devices, options, None)
}

/// [`compare`] where each trace has its own policies (a recorded run's own settings):
/// every (trace, policy, device) job of every trace in one parallel pool, each trace
/// shared by its jobs, rows in input order. `progress` is called after each job.
///
/// # Errors
/// As [`compare`].
pub fn compare_each(
    runs: &[(&CompareInput, &[PolicySpec])],
    devices: &[SimDeviceOptions],
    options: &ReplayOptions,
    progress: Option<&(dyn Fn() + Sync)>,
) -> Result<Vec<Row>, CompareError> {
    let mut jobs = Vec::new();
    for &(input, policies) in runs {
        for spec in policies {
            for device in devices {
                jobs.push((input, spec, device));
            }
        }
    }
    let rows = longest_first(
        &jobs,
        |&(input, spec, _)| replay_cost(&input.trace, &spec.config),
        |&(input, spec, device)| {
            let row = run_one(input, spec, device, options);
            if let Some(p) = progress {
                p();
            }
            row
        },
    );
    // Every result first, then the first error in input order: which replay fails
    // first in time depends on the scheduling, the error reported must not.
    rows.into_iter().collect()
}

/// Runs every job on all cores, longest first, and returns the results in input
/// order. Each job is its own task: workers take the next job of the list sorted by
/// `cost` (highest first; ties in input order) as they come free (greedy list
/// scheduling), so the longest jobs do not start last and finish alone, as they may
/// when a parallel iterator hands each thread a run of consecutive jobs. The batches
/// of `compare` and `fit` run through it.
pub fn longest_first<J: Sync, R: Send>(
    jobs: &[J],
    cost: impl Fn(&J) -> f64,
    run: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    let costs: Vec<f64> = jobs.iter().map(cost).collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let workers = rayon::current_num_threads().min(jobs.len());
    (0..workers).into_par_iter().for_each(|_| loop {
        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(&i) = order.get(k) else { break };
        // Each index is taken once, so each slot is set once, by one thread.
        let r = run(&jobs[i]);
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every job ran")
        })
        .collect()
}

/// What a batch does with each source and job: [`load_and_run`]'s work.
pub struct Work<'f, T, J, R, E> {
    /// Reads source `i` (its index in the batch's sources) and makes it ready.
    pub load: &'f (dyn Fn(usize) -> Result<T, E> + Sync),
    /// A job's expected cost on its loaded source, only to order the jobs (highest
    /// first); a wrong guess costs balance, never output.
    pub cost: &'f (dyn Fn(&J, &T) -> f64 + Sync),
    /// Runs a job on its loaded source.
    pub run: &'f (dyn Fn(&J, &T) -> R + Sync),
}

/// What [`load_and_run`] gives: every job's result in input order, and the sources
/// when asked to keep them.
pub struct Ran<T, R> {
    /// One result per job, in the order the jobs were given.
    pub results: Vec<R>,
    /// With `keep`, each source that some job needed (`None` for the others); without,
    /// every one `None`: each source was freed once its last job ended.
    pub sources: Vec<Option<T>>,
}

/// Loads a batch's sources and runs their jobs in one pool, with no barrier between the
/// two: a source's jobs start as soon as it is loaded, while other sources are still
/// loading and other jobs running. `sizes[i]` is source `i`'s expected load (its file's
/// bytes): the biggest load first, since its jobs are the longest. `jobs` are
/// `(source, job)`; a source no job names is not loaded.
///
/// Each step (a load or a job) is one task, and a task takes the best step there is
/// when it starts: a load while any remains (loads are short beside the jobs, and a
/// thread that replays while another loads ran slower on 2 cores) and fewer than twice
/// the pool's threads are held (loading, or loaded with jobs left), else the costliest
/// waiting job (longest first: the long jobs do not start last and finish alone). So a
/// batch holds at most twice as many sources as threads at once (with `keep`, those
/// with jobs left, besides the kept ones), not the whole batch: 16 traces of 10⁶
/// events took 633 MB on 2 threads, where one took 47 MB. A
/// thread whose load ends while others still load starts a job at once. In a pool of
/// one thread, where no load can run beside a job, a waiting job comes before a load:
/// a source is loaded, its jobs run, it is freed, then the next is loaded, so one
/// source is held at a time (`allocsim bench` and `validate` run so, one step at a
/// time). Without `keep`, a source is freed on the thread that ends its last job, while
/// others still run: freeing gigabytes of traces after the batch was a serial tail
/// (docs/performance.md, "compare on 16 cores").
///
/// Results come back in input order whatever ran first. A load that fails stops jobs
/// from starting (those running finish) and loads after it in input order; the error
/// is the first failing load in input order, whichever failed first in time.
///
/// # Errors
/// The first source, in input order, whose load failed.
pub fn load_and_run<T, J, R, E>(
    sizes: &[u64],
    jobs: &[(usize, J)],
    work: &Work<'_, T, J, R, E>,
    keep: bool,
) -> Result<Ran<T, R>, E>
where
    T: Send + Sync,
    J: Sync,
    R: Send,
    E: Send,
{
    use std::sync::{Arc, Mutex};
    let n = sizes.len();
    let mut remaining = vec![0usize; n];
    let mut by_source: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, &(source, _)) in jobs.iter().enumerate() {
        remaining[source] += 1;
        by_source[source].push(k);
    }
    // Loads, biggest last (popped first); ties in input order.
    let mut loads: Vec<usize> = (0..n).filter(|&i| remaining[i] > 0).collect();
    loads.sort_by(|&a, &b| sizes[a].cmp(&sizes[b]).then(b.cmp(&a)));
    struct State<T, E> {
        loads: Vec<usize>,
        /// Waiting jobs; the costliest, then the first, runs next (a heap: a batch of
        /// tens of thousands of jobs took quadratic time to pick them by a scan).
        ready: std::collections::BinaryHeap<Waiting>,
        remaining: Vec<usize>,
        loaded: Vec<Option<Arc<T>>>,
        kept: Vec<Option<Arc<T>>>,
        /// Sources loading, or loaded and not yet freed (with `keep`: not yet done), at
        /// most [`Ctx::most_held`] while a waiting job can run instead of a load.
        held: usize,
        /// The first failed load in input order, so far.
        failed: Option<(usize, E)>,
    }
    let load_count = loads.len();
    let state = Mutex::new(State {
        loads,
        ready: std::collections::BinaryHeap::new(),
        remaining,
        loaded: (0..n).map(|_| None).collect(),
        kept: (0..n).map(|_| None).collect(),
        held: 0,
        failed: None,
    });
    let results: Vec<Mutex<Option<R>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    enum Step<T> {
        Load(usize),
        Job(usize, Arc<T>),
    }
    // One task per step; each takes the best step available when it runs (a task is
    // spawned for each load at the start and for each job once its source is loaded,
    // so a task always finds one unless a failure dropped it).
    fn task<'s, T, J, R, E>(scope: &rayon::Scope<'s>, ctx: &'s Ctx<'s, T, J, R, E>)
    where
        T: Send + Sync,
        J: Sync,
        R: Send,
        E: Send,
    {
        let step = {
            let mut s = ctx.lock();
            let cut = s.failed.as_ref().map(|(i, _)| *i);
            if let Some(cut) = cut {
                s.ready.clear();
                s.loads.retain(|&i| i < cut);
            }
            // A load while any remains, unless a job is waiting and the sources held
            // are many (they would all be held at once: memory in proportion to the
            // whole batch), or on one thread.
            let load_now = !s.loads.is_empty()
                && (s.ready.is_empty() || (!ctx.alone && s.held < ctx.most_held));
            if load_now {
                s.held += 1;
                s.loads.pop().map(Step::Load)
            } else {
                // The costliest, ties to the first in input order.
                s.ready.pop().map(|Waiting(_, k)| {
                    let source = ctx.jobs[k].0;
                    let trace = Arc::clone(s.loaded[source].as_ref().expect("loaded"));
                    Step::Job(k, trace)
                })
            }
        };
        match step {
            None => {}
            Some(Step::Load(i)) => match (ctx.work.load)(i) {
                Ok(trace) => {
                    let trace = Arc::new(trace);
                    let costed: Vec<Waiting> = ctx.by_source[i]
                        .iter()
                        .map(|&k| Waiting((ctx.work.cost)(&ctx.jobs[k].1, &trace), k))
                        .collect();
                    let spawn = costed.len();
                    {
                        let mut s = ctx.lock();
                        if ctx.keep {
                            s.kept[i] = Some(Arc::clone(&trace));
                        }
                        s.loaded[i] = Some(trace);
                        s.ready.extend(costed);
                    }
                    for _ in 0..spawn {
                        scope.spawn(move |scope| task(scope, ctx));
                    }
                }
                Err(e) => {
                    let mut s = ctx.lock();
                    s.held -= 1;
                    if s.failed.as_ref().is_none_or(|(at, _)| i < *at) {
                        s.failed = Some((i, e));
                    }
                }
            },
            Some(Step::Job(k, trace)) => {
                let r = (ctx.work.run)(&ctx.jobs[k].1, &trace);
                *ctx.results[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                let source = ctx.jobs[k].0;
                // Each job lets its reference go before it counts itself done, so the
                // last job of its source takes the pool's, the last one (but `keep`'s):
                // the trace is freed here, on this thread, and only then no longer
                // counted as held.
                drop(trace);
                let last = {
                    let mut s = ctx.lock();
                    s.remaining[source] -= 1;
                    if s.remaining[source] == 0 {
                        s.loaded[source].take()
                    } else {
                        None
                    }
                };
                if let Some(last) = last {
                    drop(last);
                    ctx.lock().held -= 1;
                }
            }
        }
    }
    struct Ctx<'s, T, J, R, E> {
        state: &'s Mutex<State<T, E>>,
        jobs: &'s [(usize, J)],
        by_source: &'s [Vec<usize>],
        results: &'s [Mutex<Option<R>>],
        work: &'s Work<'s, T, J, R, E>,
        keep: bool,
        /// Whether the pool has one thread: a waiting job then comes before a load.
        alone: bool,
        /// Twice the pool's threads: the sources held at once, beyond which a waiting
        /// job comes before a load.
        most_held: usize,
    }
    impl<T, J, R, E> Ctx<'_, T, J, R, E> {
        fn lock(&self) -> std::sync::MutexGuard<'_, State<T, E>> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
    let ctx = Ctx {
        state: &state,
        jobs,
        by_source: &by_source,
        results: &results,
        work,
        keep,
        alone: rayon::current_num_threads() == 1,
        most_held: 2 * rayon::current_num_threads(),
    };
    rayon::scope(|scope| {
        for _ in 0..load_count {
            scope.spawn(|scope| task(scope, &ctx));
        }
    });
    let s = state.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some((_, e)) = s.failed {
        return Err(e);
    }
    let results = results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every job ran")
        })
        .collect();
    let sources = s
        .kept
        .into_iter()
        .map(|t| t.map(|t| Arc::into_inner(t).expect("every job's reference is gone")))
        .collect();
    Ok(Ran { results, sources })
}

/// A job of [`load_and_run`] waiting for a thread: its cost and its index. The
/// greatest is the costliest, among equal costs the first in input order.
struct Waiting(f64, usize);

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(other.1.cmp(&self.1))
    }
}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Waiting {}

/// A replay's expected cost, only to order jobs (longest first): the trace's events
/// times the policy's relative cost per event, as `allocsim bench` measured it in the
/// night of 2026-11-26 (docs/performance.md, "Immediate, buddy and arena, night":
/// `immediate` 1.4 to 1.5× `caching`, `buddy` about 0.6, `arena` 0.7 to 0.75; in the
/// evening `immediate` was 1.3 and `buddy` 0.55, before it `immediate` 2.4× and
/// `arena` the same as `caching`). A wrong guess costs balance, never correctness.
pub fn replay_cost(trace: &Trace, config: &policies::registry::PolicyConfig) -> f64 {
    let per_event = match config.kind_name() {
        "immediate" => 1.45,
        "buddy" => 0.6,
        "arena" => 0.7,
        _ => 1.0,
    };
    trace.events.len() as f64 * per_event
}

/// Builds `config`'s policy and a fresh simulated device that follows `hints` as far as
/// they apply to that policy, and replays `trace` on them, showing each event to
/// `observer`. Errors name the trace and the policy as `label`.
pub(crate) fn replay_policy<O: Observer + ?Sized>(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    label: &str,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
    observer: &mut O,
) -> Result<Replay, CompareError> {
    let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(config));
    let replay = ReplayUnder {
        trace,
        device: &mut dev,
        options,
        observer,
    };
    config
        .with_policy(replay)
        .map_err(|source| CompareError::Build {
            trace: trace.name.clone(),
            policy: label.to_string(),
            source,
        })?
        .map_err(|source| CompareError::Replay {
            trace: trace.name.clone(),
            policy: label.to_string(),
            source,
        })
}

/// [`replay_with`] of `trace` on `device`, as a [`PolicyVisitor`]: given to
/// [`PolicyConfig::with_policy`], it replays under the policy the configuration builds,
/// as the policy's own type, so the engine calls the policy directly (one copy of the
/// engine per registered policy) rather than through `dyn Policy`.
pub struct ReplayUnder<'a, O: ?Sized> {
    /// The trace to replay.
    pub trace: &'a Trace,
    /// The device to replay on.
    pub device: &'a mut dyn Device,
    /// How to replay.
    pub options: &'a ReplayOptions,
    /// What is shown every event.
    pub observer: &'a mut O,
}

impl<O: Observer + ?Sized> PolicyVisitor for ReplayUnder<'_, O> {
    type Output = Result<Replay, ReplayError>;

    fn visit<P: Policy + AsDynPolicy + ?Sized>(self, policy: &mut P) -> Self::Output {
        replay_with(self.trace, policy, self.device, self.options, self.observer)
    }
}

/// Replays one (trace, policy, device) row: the replay, then [`row_of`] it.
pub fn run_one(
    input: &CompareInput,
    spec: &PolicySpec,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<Row, CompareError> {
    let mut watch = crate::explain::OomWatch::default();
    let r = replay_policy(
        &input.trace,
        &input.hints,
        &spec.config,
        &spec.label,
        device,
        options,
        &mut watch,
    )?;
    row_of(input, spec, device, options, &r, watch.explanation, true)
}

/// The row of `replay`, a replay of `input` under `spec` on `device`: the explanation of
/// its first out-of-memory (`explanation`, an [`crate::OomWatch`]'s of that replay),
/// with the remedies checked (by replaying) where `check_remedies`; its caveats; and
/// its margin against the device's variation between processes (replays within that
/// band where the device has a spread). [`run_one`] is a replay and this; the Python
/// package's `replay` watches its replay with a timeline too, then asks this.
///
/// # Errors
/// A replay of the remedies or of the margin that failed for a reason other than
/// running out of memory.
pub fn row_of(
    input: &CompareInput,
    spec: &PolicySpec,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
    replay: &Replay,
    explanation: Option<crate::explain::OomExplanation>,
    check_remedies: bool,
) -> Result<Row, CompareError> {
    let mut explanation = explanation;
    if let (Some(e), true) = (&mut explanation, check_remedies) {
        crate::explain::check_remedies(
            e,
            &input.trace,
            &input.hints,
            &spec.config,
            device,
            options,
        )?;
    }
    let caveats = crate::caveats(&input.trace, &spec.config, replay);
    // Replays the band's capacities only where the device has a spread.
    let margin = crate::boundary::margin(
        &input.trace,
        &input.hints,
        &spec.config,
        device,
        options,
        replay.oom.is_none(),
    )?;
    Ok(Row {
        explanation,
        caveats,
        margin,
        trace: input.trace.name.clone(),
        policy: spec.label.clone(),
        capacity_bytes: device.capacity_bytes,
        total_bytes: device.total_bytes,
        events: input.trace.events.len() as u64,
        summary: replay.summary,
        oom: replay.oom.clone(),
        live_allocation_count: replay.live_allocation_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use workloads::{AllocId, Event};

    /// `replay_policy` (each policy as its own type, through `with_policy`) gives what
    /// the same replay through a `dyn Policy` gives, out-of-memory and every event's
    /// state included, for every registered policy and expandable segments.
    #[test]
    fn replay_policy_as_its_own_type_matches_the_dyn_replay() {
        let events = (0..40u64)
            .flat_map(|i| {
                let alloc = Event::Alloc {
                    id: AllocId(i),
                    size_bytes: (3 << 20) + (i % 7) * (5 << 20),
                    stream: i % 2,
                };
                let free = Event::Free { id: AllocId(i / 2) };
                if i % 3 == 2 {
                    vec![alloc, free]
                } else {
                    vec![alloc]
                }
            })
            .collect();
        let trace = Trace::new("t", events);
        let hints = AddressHints::default();
        let device = SimDeviceOptions {
            capacity_bytes: 96 << 20,
            total_bytes: 96 << 20,
            ..SimDeviceOptions::default()
        };
        let options = ReplayOptions::default();
        let mut configs = PolicyConfig::defaults();
        configs.extend(
            policies::spec::parse_policy_list(
                "caching:expandable_segments=True",
                &Default::default(),
            )
            .unwrap()
            .into_iter()
            .map(|s| s.config),
        );
        let mut ooms = 0;
        for config in &configs {
            let mut timeline = crate::Timeline::default();
            let r = replay_policy(
                &trace,
                &hints,
                config,
                "l",
                &device,
                &options,
                &mut timeline,
            )
            .unwrap();
            let mut policy = config.build().unwrap();
            let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(config));
            let mut dyn_timeline = crate::Timeline::default();
            let want = replay_with(
                &trace,
                policy.as_mut(),
                &mut dev,
                &options,
                &mut dyn_timeline,
            )
            .unwrap();
            assert_eq!(r, want, "{config}");
            assert_eq!(timeline, dyn_timeline, "{config}");
            ooms += usize::from(r.oom.is_some());
        }
        assert!(ooms > 0, "the trace runs out of memory under some policy");
    }

    /// A raised interrupt flag stops every replay of a comparison: the result is the
    /// typed interruption, naming the trace and policy, not rows.
    #[test]
    fn interrupt_stops_a_comparison() {
        static RAISED: AtomicBool = AtomicBool::new(true);
        let trace = Trace::new(
            "t",
            vec![Event::Alloc {
                id: AllocId(1),
                size_bytes: 512,
                stream: 0,
            }],
        );
        let inputs = [CompareInput {
            trace,
            hints: AddressHints::default(),
        }];
        let specs =
            policies::spec::parse_policy_list("caching,buddy", &Default::default()).unwrap();
        let options = ReplayOptions {
            interrupt: Some(&RAISED),
            ..ReplayOptions::default()
        };
        let e = compare(&inputs, &specs, &[SimDeviceOptions::default()], &options).unwrap_err();
        assert!(
            matches!(
                &e,
                CompareError::Replay {
                    source: ReplayError::Interrupted { event_index: 0 },
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "t under caching: interrupted at event 0");
    }

    /// Jobs run longest first (a longer trace, `immediate` before `buddy`), yet the
    /// rows come out in input order: trace, then policy, then device.
    #[test]
    fn rows_keep_input_order_whatever_runs_first() {
        let trace = |name: &str, n: u64| {
            let events = (0..n)
                .flat_map(|i| {
                    [
                        Event::Alloc {
                            id: AllocId(i),
                            size_bytes: 512 << (i % 8),
                            stream: 0,
                        },
                        Event::Free { id: AllocId(i) },
                    ]
                })
                .collect();
            CompareInput {
                trace: Trace::new(name, events),
                hints: AddressHints::default(),
            }
        };
        let inputs = [trace("short", 2), trace("long", 50)];
        let specs =
            policies::spec::parse_policy_list("buddy,caching,immediate", &Default::default())
                .unwrap();
        let devices = [
            SimDeviceOptions::default(),
            SimDeviceOptions {
                capacity_bytes: 1 << 30,
                total_bytes: 1 << 30,
                ..SimDeviceOptions::default()
            },
        ];
        let rows = compare(&inputs, &specs, &devices, &ReplayOptions::default()).unwrap();
        let got: Vec<(String, String, u64, u64)> = rows
            .iter()
            .map(|r| (r.trace.clone(), r.policy.clone(), r.total_bytes, r.events))
            .collect();
        let mut want = Vec::new();
        for (name, events) in [("short", 4), ("long", 100)] {
            for policy in ["buddy", "caching", "immediate"] {
                for total in [devices[0].total_bytes, 1 << 30] {
                    want.push((name.to_string(), policy.to_string(), total, events));
                }
            }
        }
        assert_eq!(got, want);
    }

    /// A source that counts the live ones of its kind, to see when sources are freed.
    struct Counted {
        source: usize,
        live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A pool of `threads` threads for a test of `load_and_run`.
    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    /// Runs `load_and_run` on `threads` threads over sources whose size is their index
    /// (the last loads first) and jobs `(source, k)`, each answering `source * 100 + k`;
    /// returns the results, how many sources were ever live at once, which sources
    /// loaded, and the kept sources' indices.
    fn batch(
        threads: usize,
        jobs: &[(usize, usize)],
        keep: bool,
    ) -> (Vec<usize>, usize, Vec<usize>, Vec<Option<usize>>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        let sizes: Vec<u64> = (0..5).collect();
        let live = Arc::new(AtomicUsize::new(0));
        let most = AtomicUsize::new(0);
        let loaded = Mutex::new(Vec::new());
        let load = |i: usize| -> Result<Counted, String> {
            let now = live.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            loaded.lock().unwrap().push(i);
            Ok(Counted {
                source: i,
                live: Arc::clone(&live),
            })
        };
        let cost = |&k: &usize, _: &Counted| k as f64;
        let run = |&k: &usize, t: &Counted| t.source * 100 + k;
        let work = Work {
            load: &load,
            cost: &cost,
            run: &run,
        };
        let pool = pool(threads);
        let ran = pool
            .install(|| load_and_run(&sizes, jobs, &work, keep))
            .unwrap();
        let kept = ran
            .sources
            .iter()
            .map(|t| t.as_ref().map(|t| t.source))
            .collect();
        drop(ran.sources);
        assert_eq!(live.load(Ordering::SeqCst), 0, "every source is freed");
        let mut loaded = loaded.into_inner().unwrap();
        loaded.sort();
        (ran.results, most.load(Ordering::SeqCst), loaded, kept)
    }

    /// On one thread the waiting jobs run costliest first, ties in input order (the
    /// order a scan of the waiting jobs gave before they were kept in a heap).
    #[test]
    fn load_and_run_runs_the_costliest_waiting_job_first() {
        let costs = [1.0, 3.0, 3.0, 2.0, 3.0, 0.5];
        let jobs: Vec<(usize, usize)> = (0..costs.len()).map(|k| (0, k)).collect();
        let order = std::sync::Mutex::new(Vec::new());
        let load = |_: usize| -> Result<(), String> { Ok(()) };
        let cost = |&k: &usize, _: &()| costs[k];
        let run = |&k: &usize, _: &()| order.lock().unwrap().push(k);
        let work = Work {
            load: &load,
            cost: &cost,
            run: &run,
        };
        let pool = pool(1);
        pool.install(|| load_and_run(&[0], &jobs, &work, false))
            .unwrap();
        assert_eq!(order.into_inner().unwrap(), [1, 2, 4, 3, 0, 5]);
    }

    /// Every job's result comes back in input order, whatever ran first; a source no
    /// job names is not loaded; with `keep` the needed sources come back, without they
    /// are all freed by the end.
    #[test]
    fn load_and_run_keeps_input_order_and_loads_what_jobs_need() {
        let jobs: Vec<(usize, usize)> = vec![(3, 0), (0, 1), (3, 2), (1, 0), (0, 7), (3, 1)];
        let want: Vec<usize> = jobs.iter().map(|&(s, k)| s * 100 + k).collect();
        for threads in [1, 2, 4] {
            let (results, most, loaded, kept) = batch(threads, &jobs, false);
            assert_eq!(results, want);
            if threads == 1 {
                assert_eq!(most, 1, "one thread holds one source at a time");
            }
            assert_eq!(loaded, vec![0, 1, 3]);
            assert_eq!(kept, vec![None; 5]);
            let (results, _, _, kept) = batch(threads, &jobs, true);
            assert_eq!(results, want);
            assert_eq!(kept, vec![Some(0), Some(1), None, Some(3), None]);
        }
    }

    /// A source is freed once its last job ends, before the next is loaded on one
    /// thread: each job sees its own source alone live (with `keep`, every source
    /// loaded so far: the sources load in input order, their sizes being equal), though
    /// the jobs of the last source are the costliest.
    #[test]
    fn load_and_run_frees_each_source_after_its_last_job() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let live = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<(usize, usize)> = (0..5).flat_map(|s| (0..3).map(move |k| (s, k))).collect();
        let load = |i: usize| -> Result<Counted, String> {
            live.fetch_add(1, Ordering::SeqCst);
            Ok(Counted {
                source: i,
                live: Arc::clone(&live),
            })
        };
        let cost = |&k: &usize, t: &Counted| (t.source * 10 + k) as f64;
        let run = |_: &usize, _: &Counted| live.load(Ordering::SeqCst);
        let work = Work {
            load: &load,
            cost: &cost,
            run: &run,
        };
        let pool = pool(1);
        for keep in [false, true] {
            let ran = pool
                .install(|| load_and_run(&[0; 5], &jobs, &work, keep))
                .unwrap();
            let want: Vec<usize> = jobs
                .iter()
                .map(|&(s, _)| if keep { s + 1 } else { 1 })
                .collect();
            assert_eq!(ran.results, want, "keep {keep}");
            drop(ran);
            assert_eq!(live.load(Ordering::SeqCst), 0);
        }
    }

    /// A batch of many sources holds at most twice as many as threads at once, with
    /// or without `keep` (counting those with jobs left): every load came first, so 24
    /// sources were all held at once on 2 threads.
    #[test]
    fn load_and_run_holds_at_most_twice_the_threads() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let sources = 24;
        let sizes: Vec<u64> = (0..sources as u64).collect();
        let jobs: Vec<(usize, usize)> = (0..sources).flat_map(|s| [(s, 0), (s, 1)]).collect();
        for threads in [2, 3] {
            for keep in [false, true] {
                let live = Arc::new(AtomicUsize::new(0));
                // Sources held with jobs left: loaded, not yet done by all their jobs.
                let open = AtomicUsize::new(0);
                let done = std::sync::Mutex::new(vec![0usize; sources]);
                let most = AtomicUsize::new(0);
                let load = |i: usize| -> Result<Counted, String> {
                    live.fetch_add(1, Ordering::SeqCst);
                    let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    // Loads take a while beside the jobs, as files do.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    Ok(Counted {
                        source: i,
                        live: Arc::clone(&live),
                    })
                };
                let cost = |&k: &usize, _: &Counted| k as f64;
                let run = |_: &usize, t: &Counted| {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    let mut done = done.lock().unwrap();
                    done[t.source] += 1;
                    if done[t.source] == 2 {
                        open.fetch_sub(1, Ordering::SeqCst);
                    }
                    // Without `keep`, the sources held are the live ones.
                    if !keep {
                        most.fetch_max(live.load(Ordering::SeqCst), Ordering::SeqCst);
                    }
                };
                let work = Work {
                    load: &load,
                    cost: &cost,
                    run: &run,
                };
                let pool = pool(threads);
                let ran = pool
                    .install(|| load_and_run(&sizes, &jobs, &work, keep))
                    .unwrap();
                assert_eq!(ran.results.len(), jobs.len());
                let most = most.load(Ordering::SeqCst);
                assert!(
                    most <= 2 * threads,
                    "{threads} threads, keep {keep}: {most} sources held at once"
                );
            }
        }
    }

    /// Two loads fail: the error is the first in input order, though the other (a
    /// bigger file, loaded first) failed first in time.
    #[test]
    fn load_and_run_reports_the_first_failed_load_in_input_order() {
        let sizes = [0u64, 5, 9];
        let jobs = [(0usize, ()), (1, ()), (2, ())];
        let load = |i: usize| -> Result<usize, String> {
            match i {
                0 => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    Err("zero".to_string())
                }
                2 => Err("two".to_string()),
                _ => Ok(i),
            }
        };
        let cost = |_: &(), _: &usize| 1.0;
        let run = |_: &(), &i: &usize| i;
        let work = Work {
            load: &load,
            cost: &cost,
            run: &run,
        };
        for threads in [1, 3] {
            let pool = pool(threads);
            let e = pool
                .install(|| load_and_run(&sizes, &jobs, &work, false))
                .err();
            assert_eq!(e.as_deref(), Some("zero"));
        }
    }
}
