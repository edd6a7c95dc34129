//! Predicted against observed: one trace, one policy, replayed by the same engine on the
//! simulated device and on real CUDA memory.

use std::io;
use std::sync::atomic::AtomicBool;

use policies::spec::PolicySpec;
use policies::DeviceError;
use sim::{CompareInput, Replay, ReplayError, ReplayOptions, SimDevice, SimDeviceOptions};

use crate::device::CudaDevice;

/// One validation: the same trace and policy, predicted and observed.
#[derive(Clone, Debug)]
pub struct Validation {
    /// Trace name.
    pub trace: String,
    /// Policy label.
    pub policy: String,
    /// Free bytes the GPU had for the replay (after the ballast, with `--capacity`), also
    /// the capacity of the predicted device; `None` without a capacity.
    pub capacity_bytes: Option<u64>,
    /// The replay on the simulated device.
    pub predicted: Replay,
    /// The replay on the GPU.
    pub observed: Replay,
    /// Segment operations on the GPU in the observed replay: allocations, frees, page
    /// mappings and unmappings.
    pub segment_ops: u64,
    /// Mean `cuMemAlloc_v2` time in the observed replay.
    pub device_alloc_ns_mean: Option<f64>,
    /// Mean `cuMemFree_v2` time in the observed replay.
    pub device_free_ns_mean: Option<f64>,
    /// Mean page-mapping call time (expandable segments) in the observed replay.
    pub device_map_ns_mean: Option<f64>,
    /// Mean page-unmapping call time in the observed replay.
    pub device_unmap_ns_mean: Option<f64>,
    /// Device name.
    pub device: String,
    /// Driver version (`cuDriverGetVersion`).
    pub driver_version: i32,
}

impl Validation {
    /// |charged predicted − charged observed| at the peaks.
    pub fn charged_difference_bytes(&self) -> u64 {
        self.predicted
            .summary
            .charged_bytes_peak
            .abs_diff(self.observed.summary.charged_bytes_peak)
    }

    /// Whether the charged peaks agree within one 2 MiB page per live segment at the peak.
    pub fn charged_within_tolerance(&self) -> bool {
        let segments = self
            .observed
            .summary
            .segment_count_peak
            .max(self.predicted.summary.segment_count_peak)
            .max(1);
        self.charged_difference_bytes() <= segments * (2 << 20)
    }

    /// Reserved peaks equal, OOM at the same event, charged peaks within tolerance.
    pub fn agrees(&self) -> bool {
        self.predicted.summary.reserved_bytes_peak == self.observed.summary.reserved_bytes_peak
            && self.predicted.oom.as_ref().map(|o| o.event_index)
                == self.observed.oom.as_ref().map(|o| o.event_index)
            && self.charged_within_tolerance()
    }
}

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
    let mut sim_device = SimDevice::with_hints(model, input.hints.clone());
    let predicted = sim::replay(&input.trace, policy.as_mut(), &mut sim_device, &options)
        .map_err(|e| fail("predicted", e))?;

    let mut policy = spec
        .config
        .build()
        .map_err(|e| ValidateError::Policy(e.to_string()))?;
    gpu.reset_timings();
    let before = policies::Device::stats(gpu);
    let observed = sim::replay(&input.trace, policy.as_mut(), gpu, &options);
    let after = policies::Device::stats(gpu);
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
    });
    // The policy's segments are plain data; the device frees the memory behind them.
    drop(policy);
    let cleanup = gpu.release_all();
    let validation = validation.map_err(|e| fail("observed", e))?;
    cleanup?;
    Ok(validation)
}

/// Columns of `allocsim validate`, in order.
pub const VALIDATE_COLUMNS: &[&str] = &[
    "trace",
    "policy",
    "capacity_bytes",
    "reserved_bytes_peak_predicted",
    "reserved_bytes_peak_observed",
    "charged_bytes_peak_predicted",
    "charged_bytes_peak_observed",
    "oom_event_predicted",
    "oom_event_observed",
    "segment_ops",
    "device_alloc_ns_mean",
    "device_free_ns_mean",
    "device",
    "driver",
    "allocated_bytes_peak_predicted",
    "allocated_bytes_peak_observed",
    "segment_count_peak_observed",
    "charged_difference_bytes",
    "charged_within_tolerance",
    "agrees",
    "device_map_ns_mean",
    "device_unmap_ns_mean",
];

/// Writes validations as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_validate_csv<W: io::Write>(rows: &[Validation], writer: W) -> io::Result<()> {
    let mut w = csv::Writer::from_writer(writer);
    w.write_record(VALIDATE_COLUMNS)?;
    for v in rows {
        let (p, o) = (&v.predicted.summary, &v.observed.summary);
        let oom = |r: &Replay| {
            r.oom
                .as_ref()
                .map(|x| x.event_index.to_string())
                .unwrap_or_default()
        };
        let ns = |x: Option<f64>| x.map(|v| format!("{v:.0}")).unwrap_or_default();
        w.write_record([
            v.trace.clone(),
            v.policy.clone(),
            v.capacity_bytes.map(|c| c.to_string()).unwrap_or_default(),
            p.reserved_bytes_peak.to_string(),
            o.reserved_bytes_peak.to_string(),
            p.charged_bytes_peak.to_string(),
            o.charged_bytes_peak.to_string(),
            oom(&v.predicted),
            oom(&v.observed),
            v.segment_ops.to_string(),
            ns(v.device_alloc_ns_mean),
            ns(v.device_free_ns_mean),
            v.device.clone(),
            v.driver_version.to_string(),
            p.allocated_bytes_peak.to_string(),
            o.allocated_bytes_peak.to_string(),
            o.segment_count_peak.to_string(),
            v.charged_difference_bytes().to_string(),
            v.charged_within_tolerance().to_string(),
            v.agrees().to_string(),
            ns(v.device_map_ns_mean),
            ns(v.device_unmap_ns_mean),
        ])?;
    }
    w.flush()
}

/// One line per validation saying where prediction and observation part, and by how much.
pub fn summary_line(v: &Validation) -> String {
    let (p, o) = (&v.predicted.summary, &v.observed.summary);
    let mut parts = Vec::new();
    if p.reserved_bytes_peak == o.reserved_bytes_peak {
        parts.push(format!(
            "reserved peak {} = observed",
            p.reserved_bytes_peak
        ));
    } else {
        parts.push(format!(
            "reserved peak predicted {} observed {} (off by {})",
            p.reserved_bytes_peak,
            o.reserved_bytes_peak,
            p.reserved_bytes_peak as i128 - o.reserved_bytes_peak as i128
        ));
    }
    parts.push(format!(
        "charged peak predicted {} observed {} (off by {}, {})",
        p.charged_bytes_peak,
        o.charged_bytes_peak,
        p.charged_bytes_peak as i128 - o.charged_bytes_peak as i128,
        if v.charged_within_tolerance() {
            "within a page per segment"
        } else {
            "outside a page per segment"
        }
    ));
    let ev = |r: &Replay| {
        r.oom
            .as_ref()
            .map_or("none".to_string(), |x| format!("event {}", x.event_index))
    };
    if v.predicted.oom == v.observed.oom || ev(&v.predicted) == ev(&v.observed) {
        parts.push(format!("OOM {} on both", ev(&v.predicted)));
    } else {
        parts.push(format!(
            "OOM predicted {} observed {}",
            ev(&v.predicted),
            ev(&v.observed)
        ));
    }
    format!(
        "{} / {}: {}{}",
        v.trace,
        v.policy,
        parts.join("; "),
        if v.agrees() { "" } else { "  <- differs" }
    )
}
