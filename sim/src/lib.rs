//! The replay engine, the simulated device, metrics and batch comparisons, and the
//! fidelity harness that checks the caching policy against recorded PyTorch runs.
//!
//! Design choices, and why:
//!
//! - **Determinism is a contract.** The same trace, policy configuration, device options
//!   and replay options give byte-identical output: no clock, no environment, no GPU, no
//!   randomness here (generators take explicit seeds in `workloads`). Parallel
//!   comparisons keep input order.
//! - **One engine, observed.** [`replay`] holds all control flow; policies and devices
//!   only react. Whoever needs more than the summary (fidelity, timelines, the model
//!   tests, plots) is an [`Observer`] of [`replay_with`], shown each event's
//!   [`Outcome`], the device operations it caused and the state after it; the engine is
//!   generic over the observer, so watching nothing costs nothing. An OOM ends up in
//!   the [`Replay`] result, never in `Err`.
//! - **Check the same fact twice.** With `check_invariants` the engine compares the
//!   policy's reserved bytes with the device's, and the live allocations with the
//!   policy's blocks, after every event.
//! - **The device is a measured model.** [`SimDevice`] charges bytes the way the CUDA
//!   driver did when measured on an H100 (2 MiB pages, packed small allocations) and can
//!   load other measured profiles ([`DeviceProfile`]).
//! - **Fidelity is measured, not assumed.** [`fidelity`] replays a recorded PyTorch run
//!   with its own configuration ([`recorded`]) through the same engine and compares
//!   every segment decision, peak, OOM point and checkpoint.
//! - **CSV columns are records.** Each CSV this crate writes is a `#[derive(Serialize)]`
//!   struct whose fields are its columns ([`report`], [`validation`]), so a column
//!   cannot be misaligned with its value; `serde` is also how device profiles are read.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod address;
pub mod boundary;
mod caveats;
pub mod compare;
mod device;
pub mod diff;
mod divergence;
pub mod explain;
pub mod export;
pub mod fault;
pub mod fidelity;
pub mod fit;
pub mod inputs;
pub mod iterations;
mod metrics;
mod observe;
mod packing;
mod placed;
mod profile;
pub mod recorded;
mod relocated;
mod replay;
pub mod report;
pub mod stats;
pub mod sweep;
pub mod validation;

/// The tests' pseudo-random numbers: xorshift64 from `state` (not 0), the same sequence
/// for the same start.
#[cfg(test)]
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

pub use caveats::caveats;
pub use compare::{
    compare, compare_each, longest_first, replay_cost, CompareError, CompareInput, Row,
};
pub use device::{AddressHints, AddressModel, SimDevice, SimDeviceOptions};
pub use explain::{OomExplanation, OomWatch};
pub use export::SnapshotExport;
pub use fault::{FaultKind, FaultOp, FaultPlan, FaultyDevice};
pub use fit::{fit, fits, Fit, FitOptions};
pub use metrics::{Oom, Recorder, Sample, Summary};
pub use observe::{
    DeviceOp, DeviceOpKind, Observer, Outcome, Skip, Step, Timeline, TimelineWriter,
};
pub use placed::Placed;
pub use profile::{
    DeviceProfile, ProfileError, ProfileProblem, MAX_PROFILE_BYTES, MAX_USABLE_SPREAD_BYTES,
};
pub use relocated::Relocated;
pub use replay::{
    replay, replay_checked, replay_events, replay_with, Replay, ReplayError, ReplayOptions,
};

/// Reads a small text file (a device profile, a sweep file) whole, refusing one of more
/// than `limit` bytes after reading at most `limit + 1` of it: `/dev/zero`, a FIFO that
/// never ends or a trace passed by mistake is an error, not all of memory.
pub(crate) fn read_small_text(
    path: &std::path::Path,
    limit: u64,
    what: &str,
) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes: not {what}"),
        ));
    }
    String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not valid UTF-8 text: not {what}"),
        )
    })
}
