//! Batch comparisons: every trace × policy × capacity, replayed in parallel, rows in a
//! fixed order.

use rayon::prelude::*;
use workloads::Trace;

use crate::device::{AddressHints, SimDevice, SimDeviceOptions};
use crate::metrics::{Oom, Summary};
use crate::replay::{replay, ReplayError, ReplayOptions};
use policies::spec::PolicySpec;

/// A trace to compare, with the recorded addresses to reuse (from a recorded run), if
/// any.
#[derive(Clone, Debug)]
pub struct CompareInput {
    /// The trace.
    pub trace: Trace,
    /// Recorded segment addresses, for traces that came from a PyTorch recording.
    pub hints: AddressHints,
}

/// One row of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Trace name.
    pub trace: String,
    /// Policy label as given.
    pub policy: String,
    /// Device capacity used.
    pub capacity_bytes: u64,
    /// Events in the trace.
    pub events: u64,
    /// Peaks and counts.
    pub summary: Summary,
    /// The first OOM, if any.
    pub oom: Option<Oom>,
    /// Allocations live at the end of the replay.
    pub live_allocation_count: u64,
}

/// Replays every (trace, policy, capacity) combination on fresh simulated devices, in
/// parallel on all cores. Rows come out in input order (trace, then policy, then
/// capacity), whatever the scheduling, so the output is deterministic.
///
/// # Errors
/// The first replay that failed for a reason other than running out of memory, with its
/// trace and policy.
pub fn compare(
    inputs: &[CompareInput],
    policies: &[PolicySpec],
    capacities: &[u64],
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<Vec<Row>, String> {
    let mut jobs = Vec::new();
    for input in inputs {
        for spec in policies {
            for &capacity in capacities {
                jobs.push((input, spec, capacity));
            }
        }
    }
    jobs.par_iter()
        .map(|&(input, spec, capacity)| run_one(input, spec, capacity, device, options))
        .collect()
}

fn run_one(
    input: &CompareInput,
    spec: &PolicySpec,
    capacity: u64,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<Row, String> {
    let mut policy = spec.config.build().map_err(|e| e.to_string())?;
    let mut dev =
        SimDevice::with_hints(device.clone().with_capacity(capacity), input.hints.clone());
    let r = replay(&input.trace, policy.as_mut(), &mut dev, options)
        .map_err(|e: ReplayError| format!("{} under {}: {e}", input.trace.name, spec.label))?;
    Ok(Row {
        trace: input.trace.name.clone(),
        policy: spec.label.clone(),
        capacity_bytes: capacity,
        events: input.trace.events.len() as u64,
        summary: r.summary,
        oom: r.oom,
        live_allocation_count: r.live_allocation_count,
    })
}
