//! Predicted against observed: one trace, one policy, replayed by the same engine on the
//! simulated device and on real CUDA memory. This is the runner; agreement, the summary
//! line and the CSV are `sim::validation`'s.

use std::sync::atomic::AtomicBool;

use policies::spec::PolicySpec;
use policies::DeviceError;
use sim::validation::Validation;
use sim::{CompareInput, ReplayError, ReplayOptions, SimDeviceOptions};

use crate::device::CudaDevice;

/// A validation that could not run.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The policy specification does not build.
    #[error("{0}")]
    Policy(String),
    /// The simulated or the real replay failed (driver error, interruption).
    #[error("{trace} under {policy} ({side}): {error}")]
    Replay {
        /// Trace name.
        trace: String,
        /// Policy label.
        policy: String,
        /// `predicted` or `observed`.
        side: &'static str,
        /// What happened.
        error: ReplayError,
    },
    /// Setting up or cleaning the GPU failed.
    #[error("{0}")]
    Device(#[from] DeviceError),
}

/// Replays `input` under `spec` on the simulated device `model` (predicted) and on `gpu`
/// (observed). With `capacity`, a ballast first leaves that many bytes free on the GPU
/// (to within 2 MiB) and the predicted device gets exactly the free bytes the GPU then
/// has, so both run out at the same place if the model is right. Everything the observed
/// replay allocated is freed before this returns, errors included.
///
/// # Errors
/// See [`ValidateError`].
pub fn validate_one(
    gpu: &mut CudaDevice,
    input: &CompareInput,
    spec: &PolicySpec,
    capacity: Option<u64>,
    model: &SimDeviceOptions,
    interrupt: Option<&'static AtomicBool>,
) -> Result<Validation, ValidateError> {
    gpu.release_all()?;
    let capacity_bytes = match capacity {
        Some(c) => Some(gpu.set_ballast_for_free_bytes(c)?),
        None => None,
    };
    let mut model = model.clone();
    model.total_bytes = gpu.info().total_bytes;
    if let Some(free) = capacity_bytes {
        // The GPU shows `free` bytes free; the driver hands out all but a measured few.
        model = model.with_free_bytes(free);
    }
    let options = ReplayOptions {
        interrupt,
        ..ReplayOptions::default()
    };
    let fail = |side, error| ValidateError::Replay {
        trace: input.trace.name.clone(),
        policy: spec.label.clone(),
        side,
        error,
    };

    let mut policy = spec
        .config
        .build()
        .map_err(|e| ValidateError::Policy(e.to_string()))?;
    // A mid-run trace's state is adopted where the device puts it, on both sides.
    let predicted =
        sim::validation::predict(input, policy.as_mut(), &spec.config, &model, &options)
            .map_err(|e| fail("predicted", e))?;

    let mut policy = spec
        .config
        .build()
        .map_err(|e| ValidateError::Policy(e.to_string()))?;
    gpu.reset_timings();
    let before = policies::Device::stats(gpu);
    // A checkpoint restore names its blocks by their recorded addresses: translated to
    // where the GPU put those segments.
    let observed = {
        let mut placed = sim::Placed::new(&mut *gpu, input.hints.for_policy(&spec.config));
        sim::replay(&input.trace, policy.as_mut(), &mut placed, &options)
    };
    let after = policies::Device::stats(gpu);
    let usable_spread_bytes = model.usable_spread_bytes;
    let validation = observed.map(|observed| Validation {
        trace: input.trace.name.clone(),
        policy: spec.label.clone(),
        capacity_bytes,
        predicted,
        observed,
        segment_ops: (after.allocate_count - before.allocate_count)
            + (after.free_count - before.free_count),
        device_alloc_ns_mean: gpu.alloc_ns_mean(),
        device_free_ns_mean: gpu.free_ns_mean(),
        device_map_ns_mean: gpu.map_ns_mean(),
        device_unmap_ns_mean: gpu.unmap_ns_mean(),
        device: gpu.info().name.clone(),
        driver_version: gpu.info().driver_version,
        usable_spread_bytes,
        within_driver_variation: false,
    });
    // The policy's segments are plain data; the device frees the memory behind them.
    drop(policy);
    let cleanup = gpu.release_all();
    let mut validation = validation.map_err(|e| fail("observed", e))?;
    cleanup?;
    // A run that differs near the limit: does a prediction at some capacity within the
    // driver's variation between processes reproduce it? (Only with a capacity: without
    // one the GPU is nowhere near its limit.)
    if capacity_bytes.is_some() && !validation.agrees() {
        validation.within_driver_variation = sim::boundary::within_driver_variation(
            input,
            &spec.config,
            &model,
            &options,
            &validation.observed,
        )
        .map_err(|e| match e {
            sim::CompareError::Build { source, .. } => ValidateError::Policy(source.to_string()),
            sim::CompareError::Replay { source, .. } => fail("predicted", source),
        })?;
    }
    Ok(validation)
}
