//! Turning flags into validated inputs: traces (checked), the simulated device, the
//! policies.

use std::path::Path;

use anyhow::{bail, Context};
use policies::caching::{CachingDefaults, MemoryLimit};
use policies::spec::{parse_policy_list, PolicySpec};
use sim::{AddressHints, CompareInput, DeviceProfile, ReplayOptions, SimDeviceOptions};
use workloads::size::parse_size;
use workloads::validate::{validate, Severity};
use workloads::{Format, Trace};

use crate::flags::{DeviceArgs, FormatArg, InputArgs};

/// The workloads format for a flag value.
pub fn format(arg: Option<FormatArg>) -> Option<Format> {
    arg.map(|f| match f {
        FormatArg::Yaml => Format::Yaml,
        FormatArg::Csv => Format::Csv,
        FormatArg::Json => Format::RecordedJson,
        FormatArg::Pickle => Format::TorchPickle,
    })
}

/// A trace ready to replay.
pub struct Loaded {
    /// The trace.
    pub trace: Trace,
    /// Recorded segment addresses (recorded runs and snapshots only).
    pub hints: AddressHints,
}

impl Loaded {
    /// As an input of `sim::compare`.
    pub fn into_input(self) -> CompareInput {
        CompareInput {
            trace: self.trace,
            hints: self.hints,
        }
    }
}

/// Which GPU of a snapshot pickle to read: `--snapshot-device N`, or a numeric `--device N`.
pub fn snapshot_device(input: &InputArgs, device: Option<&DeviceArgs>) -> usize {
    input
        .snapshot_device
        .or_else(|| {
            device
                .and_then(|d| d.device.as_deref())
                .and_then(|d| d.parse().ok())
        })
        .unwrap_or(0)
}

/// Reads a trace in any format and validates it. Problems refuse the trace (one line:
/// the first problem and how many more) unless `lenient`. A recorded run's addresses
/// become hints for the simulated device `model` (see `sim::recorded::address_hints`).
pub fn load_trace(
    path: &Path,
    input: &InputArgs,
    device: Option<&DeviceArgs>,
    model: &SimDeviceOptions,
) -> anyhow::Result<Loaded> {
    let (trace, run) =
        workloads::read_source(path, format(input.format), snapshot_device(input, device))
            .map_err(|e| {
                let hint = if e.more.is_empty() {
                    String::new()
                } else {
                    format!("; `allocsim check {}` lists them all", path.display())
                };
                anyhow::anyhow!("{e}{hint}")
            })?;
    // Recorded runs keep the segment addresses PyTorch got, for best-fit ties.
    let hints = match &run {
        Some(run) => sim::recorded::address_hints(run, model.total_bytes)?,
        None => AddressHints::default(),
    };
    let issues = validate(&trace);
    let errors: Vec<_> = issues
        .iter()
        .filter(|i| i.severity == Severity::Error)
        .collect();
    if let Some(first) = errors.first() {
        if !input.lenient {
            let more = match errors.len() - 1 {
                0 => String::new(),
                n => format!(
                    " ({n} more problem{}; `allocsim check {}` lists them all)",
                    if n == 1 { "" } else { "s" },
                    path.display()
                ),
            };
            bail!(
                "{}{more}; --lenient replays it anyway",
                first.display_with(&trace)
            );
        }
    }
    Ok(Loaded { trace, hints })
}

/// Reads and validates every trace, as inputs of `sim::compare` on `model`.
pub fn load_inputs(
    paths: &[std::path::PathBuf],
    input: &InputArgs,
    device: &DeviceArgs,
    model: &SimDeviceOptions,
) -> anyhow::Result<Vec<CompareInput>> {
    paths
        .iter()
        .map(|p| load_trace(p, input, Some(device), model).map(Loaded::into_input))
        .collect()
}

/// The simulated device, the capacities to run at, and the caching defaults.
pub struct DeviceSetup {
    /// Device options (capacity = the first of `capacities`).
    pub options: SimDeviceOptions,
    /// Capacities to run at (`--capacity 40GiB,80GiB`).
    pub capacities: Vec<u64>,
    /// `--alloc-conf`, `--cap`, `--memory-fraction`.
    pub caching: CachingDefaults,
    /// Replay options.
    pub replay: ReplayOptions,
}

/// Builds the device setup from flags.
pub fn device_setup(args: &DeviceArgs) -> anyhow::Result<DeviceSetup> {
    let mut options = match (&args.device_profile, args.device.as_deref()) {
        (Some(path), _) => DeviceProfile::read(path)?.to_options(),
        (None, Some(name)) if name.parse::<usize>().is_err() => DeviceProfile::builtin(name)
            .with_context(|| {
                format!(
                    "unknown device profile '{name}' (built in: {}; or --device-profile FILE)",
                    DeviceProfile::builtin_names().join(", ")
                )
            })?
            .to_options(),
        _ => SimDeviceOptions::default(),
    };
    if let Some(total) = &args.total_bytes {
        options.total_bytes =
            parse_size(total).map_err(|e| anyhow::anyhow!("--total-bytes: {e}"))?;
    }
    let capacities = match &args.capacity {
        Some(list) => list
            .split(',')
            .map(|c| parse_size(c).map_err(|e| anyhow::anyhow!("--capacity: {e}")))
            .collect::<anyhow::Result<Vec<u64>>>()?,
        None => vec![options.capacity_bytes],
    };
    if capacities.is_empty() || capacities.contains(&0) {
        bail!("--capacity: capacities must be positive");
    }
    options = options.with_capacity(capacities[0]);
    let memory_limit = match (&args.cap, args.memory_fraction) {
        (Some(cap), _) => Some(MemoryLimit::Bytes(
            parse_size(cap).map_err(|e| anyhow::anyhow!("--cap: {e}"))?,
        )),
        (None, Some(f)) if (0.0..=1.0).contains(&f) => Some(MemoryLimit::Fraction(f)),
        (None, Some(f)) => bail!("--memory-fraction: invalid fraction {f}, set it within [0, 1]"),
        (None, None) => None,
    };
    Ok(DeviceSetup {
        options,
        capacities,
        caching: CachingDefaults {
            alloc_conf: args.alloc_conf.clone(),
            memory_limit,
        },
        replay: ReplayOptions {
            check_invariants: args.check_invariants,
            continue_after_oom: args.continue_after_oom,
            ..ReplayOptions::default()
        },
    })
}

/// Parses `--policies` (each flag may hold a comma-separated list).
pub fn policies(lists: &[String], caching: &CachingDefaults) -> anyhow::Result<Vec<PolicySpec>> {
    let mut out = Vec::new();
    for list in lists {
        out.extend(parse_policy_list(list, caching)?);
    }
    Ok(out)
}
