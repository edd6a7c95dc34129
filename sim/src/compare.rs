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
    let mut policy = config.build().map_err(|source| CompareError::Build {
        trace: trace.name.clone(),
        policy: label.to_string(),
        source,
    })?;
    let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(config));
    replay_with(trace, policy.as_mut(), &mut dev, options, observer).map_err(|source| {
        CompareError::Replay {
            trace: trace.name.clone(),
            policy: label.to_string(),
            source,
        }
    })
}

/// Replays one (trace, policy, device) row: the replay, the explanation of its first
/// out-of-memory with the remedies checked, its caveats, and its margin against the
/// device's variation between processes.
pub(crate) fn run_one(
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
    let mut explanation = watch.explanation;
    if let Some(e) = &mut explanation {
        crate::explain::check_remedies(
            e,
            &input.trace,
            &input.hints,
            &spec.config,
            device,
            options,
        )?;
    }
    let caveats = crate::caveats(&input.trace, &spec.config, &r);
    // Replays the band's capacities only where the device has a spread.
    let margin = crate::boundary::margin(
        &input.trace,
        &input.hints,
        &spec.config,
        device,
        options,
        r.oom.is_none(),
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
        summary: r.summary,
        oom: r.oom,
        live_allocation_count: r.live_allocation_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use workloads::{AllocId, Event};

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
}
