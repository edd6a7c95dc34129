//! Turning flags into validated inputs: traces (checked), the simulated device, the
//! policies.

use std::path::Path;

use anyhow::bail;
use policies::caching::{CachingDefaults, MemoryLimit};
use policies::spec::{parse_policy_list, PolicySpec};
use sim::inputs::{LoadOptions, TraceSource};
use sim::recorded::{SettingFlags, Settings};
use sim::{AddressHints, CompareInput, DeviceProfile, ReplayOptions, SimDeviceOptions};
use workloads::{Trace, TraceMeta};

use crate::flags::{DeviceArgs, InputArgs};
use crate::interrupt;

/// A trace ready to replay.
pub struct Loaded {
    /// The trace.
    pub trace: Trace,
    /// Recorded segment addresses (recorded runs and snapshots only).
    pub hints: AddressHints,
    /// The recorded run the trace came from (recorded runs and snapshots only): its
    /// annotations, settings and frames, for pictures and exports.
    pub run: Option<workloads::RecordedRun>,
}

/// Whether the trace file at `path` can be read more than once: a plain file (or one
/// that does not open, whose reader then says why). A pipe, named or not (`/dev/stdin`,
/// `<(zcat t.csv.gz)`), gives its content once, and a device (`/dev/zero`) need not
/// give the same twice: a command that would read it twice (its first bytes to tell the
/// format, then the whole; again to explain an out-of-memory) reads it once, whole.
pub fn rereadable(path: &Path) -> bool {
    std::fs::metadata(path).map_or(true, |m| m.is_file())
}

/// How `input`'s flags read traces.
pub fn load_options(input: &InputArgs) -> LoadOptions {
    LoadOptions {
        format: input.read.trace_format,
        snapshot_device: input.read.snapshot_device,
        lenient: input.lenient,
        no_recorded_addresses: input.no_recorded_addresses,
        ..LoadOptions::default()
    }
}

/// Reads a trace in any format and validates it (`sim::inputs::load`, the one loader).
/// Problems refuse the trace (one line: the first problem and how many more) unless
/// `lenient`. A recorded run's addresses become hints for the simulated device `model`.
pub fn load_trace(
    path: &Path,
    input: &InputArgs,
    model: &SimDeviceOptions,
) -> anyhow::Result<Loaded> {
    let source = TraceSource::File(path.to_path_buf());
    let (loaded, run) = sim::inputs::load_with_run(&source, &load_options(input), model)?;
    Ok(Loaded {
        trace: loaded.trace,
        hints: loaded.hints,
        run,
    })
}

/// The traces of a batch (`compare`, `fit`, `bench`, `validate`), for
/// [`sim::compare::load_and_run`], which loads them while their jobs run: each named for reports by
/// `sim::inputs::report_names` (file stems, unique), loaded through `sim::inputs::load`
/// (the one loader), counted on the progress bar as it is read.
pub struct Batch<'a> {
    sources: Vec<TraceSource>,
    names: Vec<String>,
    options: LoadOptions,
    model: &'a SimDeviceOptions,
    bar: &'a indicatif::ProgressBar,
    read: std::sync::atomic::AtomicUsize,
}

impl<'a> Batch<'a> {
    /// The batch of the trace files `paths`, read as `input`'s flags say, with recorded
    /// addresses as hints for a device like `model`.
    pub fn new(
        paths: &[std::path::PathBuf],
        input: &InputArgs,
        model: &'a SimDeviceOptions,
        bar: &'a indicatif::ProgressBar,
    ) -> Batch<'a> {
        let sources: Vec<TraceSource> = paths.iter().cloned().map(TraceSource::File).collect();
        Batch::of_sources(sources, input, model, bar)
    }

    /// The batch of `sources`, files or generated traces (`bench`'s defaults).
    pub fn of_sources(
        sources: Vec<TraceSource>,
        input: &InputArgs,
        model: &'a SimDeviceOptions,
        bar: &'a indicatif::ProgressBar,
    ) -> Batch<'a> {
        Batch {
            names: sim::inputs::report_names(&sources),
            sources,
            options: load_options(input),
            model,
            bar,
            read: Default::default(),
        }
    }

    /// Each trace's name in reports, in input order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Each trace file's size (0 where it cannot be read: its load says why), so that
    /// the biggest is read first.
    pub fn sizes(&self) -> Vec<u64> {
        self.sources
            .iter()
            .map(|s| match s {
                TraceSource::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
                TraceSource::Generated(_) => 0,
            })
            .collect()
    }

    /// Reads and validates trace `i`, named for reports. After Ctrl-C, reads nothing
    /// more: [`interrupt::Interrupted`].
    pub fn load(&self, i: usize) -> anyhow::Result<CompareInput> {
        self.load_with_run(i).map(|(input, _)| input)
    }

    /// [`Batch::load`], also giving the recorded run trace `i` came from, if any.
    pub fn load_with_run(
        &self,
        i: usize,
    ) -> anyhow::Result<(CompareInput, Option<workloads::RecordedRun>)> {
        interrupt::check()?;
        let (mut input, run) =
            sim::inputs::load_with_run(&self.sources[i], &self.options, self.model)?;
        input.trace.name = self.names[i].clone();
        let read = self.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let total = self.sources.len();
        self.bar.set_message(if read < total {
            format!(", {read}/{total} traces read")
        } else {
            String::new()
        });
        Ok((input, run))
    }
}

/// The simulated device, the capacities to run at, and the caching defaults.
pub struct DeviceSetup {
    /// Device options (the first of `devices`).
    pub options: SimDeviceOptions,
    /// `--capacity` as given (`--capacity 40GiB,80GiB`), or the device's own total.
    pub capacities: Vec<u64>,
    /// The simulated device at each capacity: the profile's (or the default) device
    /// with that total memory ([`SimDeviceOptions::with_total`]).
    pub devices: Vec<SimDeviceOptions>,
    /// `--alloc-conf`, `--cap`, `--memory-fraction`.
    pub caching: CachingDefaults,
    /// Replay options.
    pub replay: ReplayOptions,
}

/// The file `--gpu-profile` names, when it names a file rather than a built-in
/// profile (an input: no output may overwrite it).
pub fn profile_file(args: &DeviceArgs) -> Option<&Path> {
    args.gpu_profile
        .as_deref()
        .filter(|name| DeviceProfile::builtin(name).is_none())
        .map(Path::new)
}

/// The device profile `--gpu-profile` names: a built-in one by name, else a file.
///
/// # Errors
/// A name that is neither (listing the built-in names), or a profile file that cannot
/// be used (naming the file and the field).
pub fn gpu_profile(name: &str) -> anyhow::Result<DeviceProfile> {
    if let Some(p) = DeviceProfile::builtin(name) {
        return Ok(p);
    }
    let path = Path::new(name);
    let looks_like_a_file = path.components().count() > 1 || path.extension().is_some();
    if !path.exists() && !looks_like_a_file {
        bail!(
            "--gpu-profile {name}: unknown GPU profile '{name}' (built in: {}), and no such \
             file (`allocsim probe -o FILE` measures one)",
            DeviceProfile::builtin_names().join(", ")
        );
    }
    Ok(DeviceProfile::read(path)?)
}

/// Builds the device setup from flags.
pub fn device_setup(args: &DeviceArgs) -> anyhow::Result<DeviceSetup> {
    let mut options = match &args.gpu_profile {
        Some(name) => gpu_profile(name)?.to_options(),
        None => SimDeviceOptions::default(),
    };
    if let Some(total) = args.total_bytes {
        options.total_bytes = total;
    }
    let (capacities, devices) = match args.capacity.as_slice() {
        [] => (vec![options.total_bytes], vec![options.clone()]),
        list => {
            let devices = list
                .iter()
                .map(|&total| {
                    options.clone().with_total(total).ok_or_else(|| {
                        anyhow::anyhow!(
                            "--capacity {}: not above the {} the CUDA context and the driver \
                             keep on {} ({} bytes)",
                            units::format_size_exact(total),
                            units::format_size_human(options.reserved_by_driver_bytes()),
                            options.name,
                            options.reserved_by_driver_bytes()
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            (list.to_vec(), devices)
        }
    };
    options = devices[0].clone();
    let memory_limit = match (args.cap, args.memory_fraction) {
        (Some(cap), _) => Some(MemoryLimit::Bytes(cap)),
        (None, Some(f)) => Some(MemoryLimit::Fraction(f)),
        (None, None) => None,
    };
    Ok(DeviceSetup {
        options,
        capacities,
        devices,
        caching: CachingDefaults {
            alloc_conf: args.alloc_conf.clone(),
            memory_limit,
        },
        replay: ReplayOptions {
            check_invariants: args.check_invariants,
            continue_after_oom: args.continue_after_oom,
            interrupt: Some(interrupt::flag()),
        },
    })
}

/// The device a recorded run recorded (`sim::recorded::recorded_device`: the run's
/// card, total and capacity, as `fidelity` replays it), where no flag names a device
/// (`--gpu-profile`, `--capacity`, `--total-bytes`); `None` otherwise, and for traces
/// that record no device: those run on the flags' device.
pub fn recorded_device(
    run: Option<&workloads::RecordedRun>,
    args: &DeviceArgs,
    base: &SimDeviceOptions,
) -> Option<SimDeviceOptions> {
    let named =
        args.gpu_profile.is_some() || !args.capacity.is_empty() || args.total_bytes.is_some();
    if named {
        return None;
    }
    sim::recorded::recorded_device(run?, base)
}

impl DeviceSetup {
    /// This setup for a replay of `run` (`replay`, `diff`, `export`: one trace): on the
    /// device the run recorded where no flag names a device ([`recorded_device`]), else
    /// as it is. `compare` asks [`recorded_device`] for each trace.
    pub fn for_run(
        mut self,
        run: Option<&workloads::RecordedRun>,
        args: &DeviceArgs,
    ) -> DeviceSetup {
        if let Some(device) = recorded_device(run, args, &self.options) {
            self.capacities = vec![device.total_bytes];
            self.devices = vec![device.clone()];
            self.options = device;
        }
        self
    }
}

/// Parses `--policies` (each flag may hold a comma-separated list).
pub fn policies(lists: &[String], caching: &CachingDefaults) -> anyhow::Result<Vec<PolicySpec>> {
    let mut out = Vec::new();
    for list in lists {
        out.extend(parse_policy_list(list, caching)?);
    }
    Ok(out)
}

/// The caching settings a replay of a trace with `meta` runs with, and the line saying
/// so: what the recording says unless flags replace it ([`sim::recorded::settings`],
/// shared with the Python package).
pub fn settings(meta: &TraceMeta, args: &DeviceArgs) -> Settings {
    sim::recorded::settings(
        meta,
        &SettingFlags {
            alloc_conf: args.alloc_conf.clone(),
            memory_limit: match (args.cap, args.memory_fraction) {
                (Some(cap), _) => Some((MemoryLimit::Bytes(cap), "--cap")),
                (None, Some(f)) => Some((MemoryLimit::Fraction(f), "--memory-fraction")),
                (None, None) => None,
            },
            capacity: (!args.capacity.is_empty()).then_some("--capacity"),
            names: ("--alloc-conf", "--cap"),
        },
    )
}
