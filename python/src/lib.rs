//! `allocsim._native`: the Python package's native module, thin glue over the library
//! crates (`sim::inputs` loads, `sim::replay_with` replays, `sim::compare`, `sim::fit`
//! and `sim::sweep` run the batch work, `sim::recorded::settings` decides which recorded
//! settings apply). The package around it (`python/allocsim/__init__.py`) turns the
//! keyword arguments into the JSON options read here and the answers into Python
//! objects, lists, numpy arrays and pandas frames.
//!
//! Answers cross as JSON text built from the same `#[derive(Serialize)]` records the
//! command line writes as CSV (`sim::report::CompareRecord`, `sim::fit::FitRecord`,
//! `sim::sweep::SweepRecord`), so a row's keys are the CSV's columns, in order; a
//! timeline's numeric columns cross as little-endian `u64` bytes (one copy, read by
//! `numpy.frombuffer` or `array.array`). The work runs with the GIL released.
//!
//! Errors are typed Python exceptions, one line each: `TraceError` (a trace that does
//! not read or replay, naming the file or the snapshot given in memory and the line,
//! event or entry), `ConfigError` (settings that do not make a run), `ReplayError` (a
//! replay stopped by something other than running out of memory). A panic would be a
//! bug; pyo3 turns it into `PanicException` rather than aborting the interpreter.

#![forbid(unsafe_code)]

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use policies::caching::{CachingConfig, MemoryLimit};
use policies::spec::PolicySpec;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use serde::{Deserialize, Serialize};
use sim::inputs::{LoadError, LoadOptions, TraceSource};
use sim::recorded::SettingFlags;
use sim::{CompareInput, DeviceProfile, Oom, OomWatch, ReplayOptions, SimDevice, SimDeviceOptions};
use workloads::{Format, RecordedRun};

create_exception!(
    allocsim,
    TraceError,
    PyValueError,
    "A trace that cannot be read or replayed: the message names the file (or the \
     snapshot given in memory) and the line, event or entry."
);
create_exception!(
    allocsim,
    ConfigError,
    PyValueError,
    "Settings that do not make a run: a policy, option, size, GPU profile, sweep file \
     or shard that does not parse, or arguments that do not go together."
);
create_exception!(
    allocsim,
    ReplayError,
    PyRuntimeError,
    "A replay that stopped for a reason other than running out of memory (an error of \
     the policy); running out of memory is a result, never an exception."
);

fn trace_err(e: impl std::fmt::Display) -> PyErr {
    TraceError::new_err(e.to_string())
}

fn config_err(e: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(e.to_string())
}

fn json_err(e: serde_json::Error) -> PyErr {
    PyRuntimeError::new_err(format!("allocsim: encoding the answer: {e}"))
}

/// A size as Python gives it: bytes as an integer, or text (`"24GiB"`); anything else
/// is kept to be refused by [`Size::bytes`], naming the argument.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
    Other(serde_json::Value),
}

impl Size {
    /// The bytes, read as the command line reads a capacity or a limit
    /// (`units::parse_memory_size`: a unitless number below 1 MiB is refused as a
    /// likely mistake); `key` names the argument in the message.
    fn bytes(&self, key: &str) -> PyResult<u64> {
        match self {
            Size::Bytes(b) => Ok(*b),
            Size::Text(t) => {
                units::parse_memory_size(t).map_err(|e| config_err(format!("{key}={t:?}: {e}")))
            }
            Size::Other(v) => Err(config_err(format!(
                "{key}={v}: not a size (bytes as an integer from 0 to 2^64 - 1, or text like \"24GiB\")"
            ))),
        }
    }
}

/// The keyword arguments of every call, as the package sends them (JSON).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    policies: Vec<String>,
    alloc_conf: Option<String>,
    capacity: Vec<Size>,
    cap: Option<Size>,
    memory_fraction: Option<f64>,
    gpu_profile: Option<String>,
    format: Option<String>,
    device: usize,
    lenient: bool,
    no_recorded_addresses: bool,
    check_invariants: bool,
    continue_after_oom: bool,
    timeline: bool,
    explain: bool,
    gpus: Vec<String>,
    shard: Option<String>,
}

impl Options {
    fn parse(text: &str) -> PyResult<Options> {
        serde_json::from_str(text).map_err(|e| config_err(format!("allocsim: options: {e}")))
    }

    /// The device a recorded run recorded (`sim::recorded::recorded_device`), where no
    /// argument names a device (`gpu_profile`, `capacity`), as the command line decides.
    fn recorded_device(
        &self,
        run: Option<&RecordedRun>,
        base: &SimDeviceOptions,
    ) -> Option<SimDeviceOptions> {
        if self.gpu_profile.is_some() || !self.capacity.is_empty() {
            return None;
        }
        sim::recorded::recorded_device(run?, base)
    }

    fn load(&self) -> PyResult<LoadOptions> {
        let format = match &self.format {
            None => None,
            Some(name) => Some(
                Format::ALL
                    .into_iter()
                    .find(|f| f.name() == name)
                    .ok_or_else(|| {
                        config_err(format!(
                            "format={name:?}: unknown format (known: {})",
                            Format::ALL.map(Format::name).join(", ")
                        ))
                    })?,
            ),
        };
        Ok(LoadOptions {
            format,
            snapshot_device: self.device,
            lenient: self.lenient,
            no_recorded_addresses: self.no_recorded_addresses,
            ..LoadOptions::default()
        })
    }

    fn replay(&self) -> ReplayOptions {
        ReplayOptions {
            check_invariants: self.check_invariants,
            continue_after_oom: self.continue_after_oom,
            interrupt: Some(&STOP),
        }
    }

    fn memory_limit(&self) -> PyResult<Option<(MemoryLimit, &'static str)>> {
        Ok(match (&self.cap, self.memory_fraction) {
            (Some(cap), _) => Some((MemoryLimit::Bytes(cap.bytes("cap")?), "cap=")),
            (None, Some(f)) => Some((MemoryLimit::Fraction(f), "memory_fraction=")),
            (None, None) => None,
        })
    }

    /// The settings a trace with `meta` replays under: what it records unless the
    /// arguments replace it (`sim::recorded::settings`, as the command line).
    fn settings(&self, meta: &workloads::TraceMeta) -> PyResult<sim::recorded::Settings> {
        Ok(sim::recorded::settings(
            meta,
            &SettingFlags {
                alloc_conf: self.alloc_conf.clone(),
                memory_limit: self.memory_limit()?,
                capacity: (!self.capacity.is_empty()).then_some("capacity="),
                names: ("alloc_conf=", "cap="),
            },
        ))
    }

    /// The policies, under `meta`'s settings.
    fn specs(&self, meta: &workloads::TraceMeta) -> PyResult<(Vec<PolicySpec>, Option<String>)> {
        let settings = self.settings(meta)?;
        let mut out = Vec::new();
        for list in &self.policies {
            out.extend(
                policies::spec::parse_policy_list(list, &settings.caching).map_err(config_err)?,
            );
        }
        if out.is_empty() {
            return Err(config_err("policies: none given"));
        }
        Ok((out, settings.note))
    }
}

/// The simulated device model (a GPU profile's or the default) and the devices at each
/// capacity asked for (or the model itself).
fn devices(o: &Options) -> PyResult<(SimDeviceOptions, Vec<SimDeviceOptions>)> {
    let model = match &o.gpu_profile {
        None => SimDeviceOptions::default(),
        Some(name) => profile(name, "gpu_profile")?.to_options(),
    };
    if o.capacity.is_empty() {
        return Ok((model.clone(), vec![model]));
    }
    let mut out = Vec::new();
    for c in &o.capacity {
        let total = c.bytes("capacity")?;
        out.push(model.clone().with_total(total).ok_or_else(|| {
            config_err(format!(
                "capacity={}: not above the {} the CUDA context and the driver keep on {} \
                 ({} bytes)",
                units::format_size_exact(total),
                units::format_size_human(model.reserved_by_driver_bytes()),
                model.name,
                model.reserved_by_driver_bytes()
            ))
        })?);
    }
    Ok((out[0].clone(), out))
}

/// A built-in GPU profile by name, else a profile file.
fn profile(name: &str, key: &str) -> PyResult<DeviceProfile> {
    if let Some(p) = DeviceProfile::builtin(name) {
        return Ok(p);
    }
    if !Path::new(name).exists() {
        return Err(config_err(format!(
            "{key}={name:?}: unknown GPU profile (built in: {}), and no such file",
            DeviceProfile::builtin_names().join(", ")
        )));
    }
    DeviceProfile::read(Path::new(name)).map_err(config_err)
}

/// A trace as Python hands it over: a path, or a pickled snapshot with a name. The
/// pickle is read where Python holds it (no copy): the caller's reference keeps the
/// immutable `bytes` alive for the call.
enum Source<'a> {
    File(PathBuf),
    Pickle { name: String, data: &'a [u8] },
}

impl<'a> Source<'a> {
    fn of(item: &'a Bound<'_, PyAny>) -> PyResult<Source<'a>> {
        if let Ok(t) = item.cast::<PyTuple>() {
            let name: String = t.get_item(0)?.extract()?;
            let data: &'a [u8] = t
                .get_borrowed_item(1)?
                .extract()
                .map_err(|_| PyValueError::new_err("allocsim: a snapshot's data must be bytes"))?;
            return Ok(Source::Pickle { name, data });
        }
        Ok(Source::File(item.extract()?))
    }

    /// What names it in reports and messages: the file, or the snapshot's name.
    fn as_path(&self) -> PathBuf {
        match self {
            Source::File(p) => p.clone(),
            Source::Pickle { name, .. } => PathBuf::from(name),
        }
    }
}

/// Each trace's name in reports, as the command line names them
/// (`sim::inputs::report_names`).
fn report_names(sources: &[Source<'_>]) -> Vec<String> {
    sim::inputs::report_names(
        &sources
            .iter()
            .map(|s| TraceSource::File(s.as_path()))
            .collect::<Vec<_>>(),
    )
}

/// Loads one trace (validated, with a recorded run's addresses as hints), named `name`.
fn load_one(
    source: &Source<'_>,
    name: &str,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<(CompareInput, Option<RecordedRun>), LoadError> {
    let (mut input, run) = match source {
        Source::File(p) => {
            sim::inputs::load_with_run(&TraceSource::File(p.clone()), options, model)?
        }
        Source::Pickle { name, data } => {
            let run = workloads::snapshot::read_snapshot_pickle_from(
                Cursor::new(data),
                Path::new(name),
                options.snapshot_device,
            )
            .map_err(LoadError::Read)?;
            let (input, run) = sim::inputs::load_recorded(run, options, model)?;
            (input, Some(run))
        }
    };
    input.trace.name = name.to_string();
    Ok((input, run))
}

/// Loads `sources` and runs `jobs` on them in one pool (`sim::compare::load_and_run`,
/// as `allocsim compare` and `fit` do): each source is read once, its jobs start once it
/// is read, and it is dropped after its last job; the biggest (a file's bytes, a
/// snapshot's) is read first.
fn pooled<T, J, R, E>(
    sources: &[Source<'_>],
    jobs: &[(usize, J)],
    load: &(dyn Fn(usize) -> Result<T, E> + Sync),
    cost: &(dyn Fn(&J, &T) -> f64 + Sync),
    run: &(dyn Fn(&J, &T) -> R + Sync),
) -> Result<sim::compare::Ran<T, R>, E>
where
    T: Send + Sync,
    J: Sync,
    R: Send,
    E: Send,
{
    let sizes: Vec<u64> = sources
        .iter()
        .map(|s| match s {
            Source::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
            Source::Pickle { data, .. } => data.len() as u64,
        })
        .collect();
    let work = sim::compare::Work { load, cost, run };
    sim::compare::load_and_run(&sizes, jobs, &work, false)
}

/// The traces of a list, each kept (`items`) for the sources that borrow from it.
fn items<'py>(traces: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    traces.try_iter()?.collect()
}

fn sources<'a>(items: &'a [Bound<'_, PyAny>]) -> PyResult<Vec<Source<'a>>> {
    let mut out = Vec::new();
    for item in items {
        out.push(Source::of(item)?);
    }
    if out.is_empty() {
        return Err(config_err("traces: none given"));
    }
    Ok(out)
}

/// Raised to stop every replay of this process at its next event: set when the main
/// thread's Python sees Ctrl-C (`KeyboardInterrupt`, a notebook's "interrupt kernel")
/// while a call runs; cleared when a call starts with none running.
static STOP: AtomicBool = AtomicBool::new(false);
/// How many calls are running.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` without the GIL on a thread of its own while this thread waits for it,
/// looking at Python's signals every 50 ms: on `KeyboardInterrupt` (or any exception a
/// signal handler raises) the replays stop at their next event ([`STOP`]) and the
/// exception is the call's, once the work has stopped.
fn work<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    if RUNNING.fetch_add(1, Ordering::SeqCst) == 0 {
        STOP.store(false, Ordering::SeqCst);
    }
    let _running = Running;
    std::thread::scope(|scope| {
        let (tx, mut rx) = std::sync::mpsc::channel();
        let worker = scope.spawn(move || {
            let out = f();
            // The receiver may be gone only if this thread's caller unwound.
            let _ = tx.send(());
            out
        });
        let mut signal = None;
        loop {
            // The receiver goes to the GIL-free side and back (it is not `Sync`).
            let (done, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
            rx = back;
            if !matches!(done, Err(RecvTimeoutError::Timeout)) {
                break;
            }
            if signal.is_none() {
                if let Err(e) = py.check_signals() {
                    STOP.store(true, Ordering::SeqCst);
                    signal = Some(e);
                }
            }
        }
        let out = match worker.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match signal {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}

/// Why a replay ran out, for Python.
#[derive(Serialize)]
struct Explanation {
    verdict: String,
    cause: &'static str,
    fix: Option<String>,
    rounded_bytes: u64,
    stream: u64,
    live_requested_bytes: u64,
    cached_bytes: u64,
    largest_free_block_bytes: u64,
    largest_usable_block_bytes: u64,
    rounding_bytes: u64,
    unsplit_remainder_bytes: u64,
    too_small_bytes: u64,
    other_pool_bytes: u64,
    unsplittable_bytes: u64,
    other_stream_bytes: u64,
    pending_free_bytes: u64,
    device_free_bytes: u64,
    shortage_bytes: u64,
    tried: Vec<(String, Option<u64>)>,
}

impl Explanation {
    fn of(e: &sim::OomExplanation) -> Explanation {
        let b = &e.breakdown;
        Explanation {
            verdict: e.verdict(),
            cause: e.cause.name(),
            fix: e.fix().map(|f| f.setting.clone()),
            rounded_bytes: e.rounded_bytes,
            stream: e.stream,
            live_requested_bytes: e.live_requested_bytes,
            cached_bytes: e.cached_bytes,
            largest_free_block_bytes: e.largest_free_block_bytes,
            largest_usable_block_bytes: e.largest_usable_block_bytes,
            rounding_bytes: b.rounding_bytes,
            unsplit_remainder_bytes: b.unsplit_remainder_bytes,
            too_small_bytes: b.too_small_bytes,
            other_pool_bytes: b.other_pool_bytes,
            unsplittable_bytes: b.unsplittable_bytes,
            other_stream_bytes: b.other_stream_bytes,
            pending_free_bytes: b.pending_free_bytes,
            device_free_bytes: b.device_free_bytes,
            shortage_bytes: b.shortage_bytes,
            tried: e
                .remedies
                .iter()
                .map(|r| (r.spec.clone(), r.oom_event_index))
                .collect(),
        }
    }
}

/// One replay, for Python: the compare CSV's columns, then what only a single replay
/// shows.
#[derive(Serialize)]
struct ReplayAnswer<'a> {
    #[serde(flatten)]
    record: sim::report::CompareRecord<'a>,
    path: Option<String>,
    alloc_conf: Option<String>,
    settings: Option<String>,
    device_name: &'a str,
    allocations: u64,
    reserved_peak_event_index: Option<u64>,
    oom_event: Option<String>,
    oom_message: Option<&'a str>,
    oom_verdict: Option<String>,
    oom_device_free_bytes: Option<u64>,
    oom_count: u64,
    oom_stack: Vec<String>,
    skipped_events: u64,
    explanation: Option<Explanation>,
    caveats: &'a [String],
    timeline_op: Option<Vec<&'static str>>,
    timeline_id: Option<Vec<Option<u64>>>,
    timeline_bytes: Option<Vec<Option<u64>>>,
}

/// The numeric timeline columns, in the order `TIMELINE_COLUMNS` in the package lists
/// them, each as little-endian `u64`s, one after the other.
fn timeline_bytes(samples: &[sim::Sample]) -> Vec<u8> {
    let columns: [fn(&sim::Sample) -> u64; 7] = [
        |s| s.event_index,
        |s| s.policy.requested_bytes,
        |s| s.policy.allocated_bytes,
        |s| s.policy.reserved_bytes,
        |s| s.charged_bytes,
        |s| s.policy.allocation_count,
        |s| s.policy.segment_count,
    ];
    let mut out = Vec::with_capacity(samples.len() * 8 * columns.len());
    for column in columns {
        for s in samples {
            out.extend_from_slice(&column(s).to_le_bytes());
        }
    }
    out
}

/// Replays one trace under one policy: the answer as JSON, and the timeline's numeric
/// columns (with `timeline`).
#[pyfunction]
fn replay<'py>(
    py: Python<'py>,
    trace: &Bound<'py, PyAny>,
    options: &str,
) -> PyResult<(String, Option<Bound<'py, PyBytes>>)> {
    let o = Options::parse(options)?;
    let source = Source::of(trace)?;
    let load = o.load()?;
    let (_, devices) = devices(&o)?;
    if devices.len() > 1 {
        return Err(config_err(
            "capacity: replay takes one capacity; compare() takes several",
        ));
    }
    let device = devices.into_iter().next().expect("one device");
    let replay_options = o.replay();
    let name = report_names(std::slice::from_ref(&source)).remove(0);
    let (input, run) = work(py, || load_one(&source, &name, &load, &device))?.map_err(trace_err)?;
    // A recorded run replays on the device it recorded unless an argument names one.
    let device = o.recorded_device(run.as_ref(), &device).unwrap_or(device);
    let (specs, note) = o.specs(&input.trace.meta)?;
    let [spec] = specs.as_slice() else {
        return Err(config_err(
            "policy: replay takes one policy; compare() takes several",
        ));
    };
    let explain = o.explain;
    let timeline = o.timeline;
    let o_device = o.device;
    let result = work(py, || -> Result<_, String> {
        let mut policy = spec.config.build().map_err(|e| e.to_string())?;
        let mut dev = SimDevice::with_hints(device.clone(), input.hints.for_policy(&spec.config));
        let mut observer = (timeline.then(sim::Timeline::default), OomWatch::default());
        let r = sim::replay_with(
            &input.trace,
            policy.as_mut(),
            &mut dev,
            &replay_options,
            &mut observer,
        )
        .map_err(|e| format!("{}: {e}", input.trace.name))?;
        let (timeline, watch) = observer;
        // The row as `compare` makes it (`sim::compare::row_of`), the remedies of an
        // out-of-memory checked only with `explain`.
        let row = sim::compare::row_of(
            &input,
            spec,
            &device,
            &replay_options,
            &r,
            watch.explanation,
            explain,
        )
        .map_err(|e| e.to_string())?;
        Ok((r, row, timeline.map(|t| t.samples)))
    })?;
    let (r, row, samples) = result.map_err(ReplayError::new_err)?;
    let oom = r.oom.as_ref();
    let answer = ReplayAnswer {
        record: sim::report::CompareRecord::from(&row),
        path: input.trace.path.as_ref().map(|p| p.display().to_string()),
        alloc_conf: spec
            .config
            .options::<CachingConfig>()
            .map(CachingConfig::to_alloc_conf),
        settings: note,
        device_name: &device.name,
        allocations: input.trace.alloc_count() as u64,
        reserved_peak_event_index: r.summary.reserved_peak_event_index,
        oom_event: oom.map(|o| match o.event_index {
            Some(i) => input.trace.event_ref(i as usize),
            None => "before the first event".to_string(),
        }),
        oom_message: oom.and_then(|o| o.message.as_deref()),
        oom_verdict: match (oom, &row.explanation) {
            (Some(o), _) if o.before_first_event() => Some(sim::explain::starting_state_verdict(o)),
            (_, Some(e)) => Some(e.verdict()),
            _ => None,
        },
        oom_device_free_bytes: oom.map(|o| o.device.free_bytes()),
        oom_count: r.oom_count,
        oom_stack: match oom {
            Some(Oom {
                event_index: Some(i),
                ..
            }) => stack(&source, &input.trace, *i, o_device),
            _ => Vec::new(),
        },
        skipped_events: r.skipped_event_count,
        explanation: row.explanation.as_ref().map(Explanation::of),
        caveats: &row.caveats,
        timeline_op: samples.as_ref().map(|s| s.iter().map(|s| s.op).collect()),
        timeline_id: samples.as_ref().map(|s| s.iter().map(|s| s.id).collect()),
        timeline_bytes: samples
            .as_ref()
            .map(|s| s.iter().map(|s| s.bytes).collect()),
    };
    let json = serde_json::to_string(&answer).map_err(json_err)?;
    let columns = samples.map(|s| PyBytes::new(py, &timeline_bytes(&s)));
    Ok((json, columns))
}

/// The stack PyTorch recorded for event `index` of a snapshot's trace, innermost first
/// (`workloads::snapshot::event_stack`, reading the pickle again with frames); empty
/// for other traces.
fn stack(source: &Source<'_>, trace: &workloads::Trace, index: u64, device: usize) -> Vec<String> {
    match source {
        Source::Pickle { data, .. } => {
            workloads::snapshot::event_stack(trace, index, Cursor::new(data), device)
        }
        Source::File(p) => match std::fs::File::open(p) {
            Ok(f) => {
                workloads::snapshot::event_stack(trace, index, std::io::BufReader::new(f), device)
            }
            Err(_) => Vec::new(),
        },
    }
}

/// Every trace × policy × capacity: the compare CSV's rows as JSON, and per trace the
/// line saying which recorded settings apply.
#[pyfunction]
fn compare(
    py: Python<'_>,
    traces: &Bound<'_, PyAny>,
    options: &str,
) -> PyResult<(String, Vec<(String, String)>)> {
    let o = Options::parse(options)?;
    let items = items(traces)?;
    let sources = sources(&items)?;
    let load = o.load()?;
    let (model, devices) = devices(&o)?;
    let names = report_names(&sources);
    let replay = o.replay();
    // Every (trace, policy, capacity) in one pool with the loads (as `allocsim
    // compare`): a trace's jobs start once it is read, and it goes after its last job.
    // Each trace's policies (under its recorded settings) and note are kept apart.
    // Every trace has as many policies as the arguments name (recorded settings change
    // their defaults, not their number); where they do not parse, every trace's fail.
    let per_trace = o
        .specs(&workloads::TraceMeta::default())
        .map_or(1, |(specs, _)| specs.len());
    let jobs: Vec<(usize, (usize, usize))> = (0..sources.len())
        .flat_map(|t| {
            let devices = devices.len();
            (0..per_trace).flat_map(move |p| (0..devices).map(move |d| (t, (p, d))))
        })
        .collect();
    let prepared: Vec<std::sync::Mutex<Option<PyResult<Option<String>>>>> =
        sources.iter().map(|_| Default::default()).collect();
    let ran = work(py, || {
        let load = |i: usize| -> Result<Loaded, LoadError> {
            let (input, run) = load_one(&sources[i], &names[i], &load, &model)?;
            let (specs, note) = match o.specs(&input.trace.meta) {
                Ok((specs, note)) => (Some(specs), Ok(note)),
                Err(e) => (None, Err(e)),
            };
            *prepared[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(note);
            let device = o.recorded_device(run.as_ref(), &model);
            Ok(Loaded {
                input,
                specs,
                device,
            })
        };
        let cost = |&(p, _): &(usize, usize), l: &Loaded| {
            l.specs
                .as_ref()
                .map_or(0.0, |s| sim::replay_cost(&l.input.trace, &s[p].config))
        };
        let run = |&(p, d): &(usize, usize), l: &Loaded| {
            let specs = l.specs.as_ref()?;
            Some(sim::compare::run_one(
                &l.input,
                &specs[p],
                l.device.as_ref().unwrap_or(&devices[d]),
                &replay,
            ))
        };
        pooled(&sources, &jobs, &load, &cost, &run)
    })?
    .map_err(trace_err)?;
    // The notes in input order, up to the first trace whose policies do not parse.
    let mut notes = Vec::new();
    for (name, prepared) in names.iter().zip(prepared) {
        let note = prepared
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .expect("every trace loaded")?;
        if let Some(note) = note {
            notes.push((name.clone(), note));
        }
    }
    // The first failed replay in input order, whichever failed first in time.
    let rows = ran
        .results
        .into_iter()
        .map(|r| r.expect("every trace's policies parse"))
        .collect::<Result<Vec<sim::Row>, sim::CompareError>>()
        .map_err(|e| ReplayError::new_err(e.to_string()))?;
    let records: Vec<sim::report::CompareRecord<'_>> =
        rows.iter().map(sim::report::CompareRecord::from).collect();
    Ok((serde_json::to_string(&records).map_err(json_err)?, notes))
}

/// A trace of a batch, loaded, with its policies under its own settings (`None` where
/// they do not parse: the error is kept apart).
struct Loaded {
    input: CompareInput,
    specs: Option<Vec<PolicySpec>>,
    /// The device of a recorded run, where no argument names one (`devices` then holds
    /// one, which it replaces).
    device: Option<SimDeviceOptions>,
}

/// The least memory each trace × policy runs in (`allocsim fit`): the fit CSV's rows as
/// JSON, with a column per GPU of `gpus` saying whether it fits there.
#[pyfunction]
fn fit(py: Python<'_>, traces: &Bound<'_, PyAny>, options: &str) -> PyResult<String> {
    let o = Options::parse(options)?;
    if !o.capacity.is_empty() {
        return Err(config_err(
            "capacity: fit searches the capacity itself; gpus= names GPUs to check",
        ));
    }
    if o.continue_after_oom {
        return Err(config_err(
            "continue_after_oom: fit looks for the memory that has no out-of-memory",
        ));
    }
    let items = items(traces)?;
    let sources = sources(&items)?;
    let load = o.load()?;
    let (model, _) = devices(&o)?;
    let mut gpus: Vec<(String, SimDeviceOptions)> = Vec::new();
    for name in &o.gpus {
        match name.as_str() {
            "none" => {}
            "all" => gpus.extend(
                DeviceProfile::builtins()
                    .into_iter()
                    .map(|(n, p)| (n.to_string(), p.to_options())),
            ),
            _ => gpus.push((name.clone(), profile(name, "gpus")?.to_options())),
        }
    }
    let names = report_names(&sources);
    // As `allocsim fit`: the policies under the arguments' settings; where they do not
    // parse, the traces are still read first (a trace that does not read is the error).
    let specs = o
        .specs(&workloads::TraceMeta::default())
        .map(|(specs, _)| specs);
    let per_trace = specs.as_ref().map_or(1, Vec::len);
    let jobs: Vec<(usize, usize)> = (0..sources.len())
        .flat_map(|t| (0..per_trace).map(move |p| (t, p)))
        .collect();
    let replay = o.replay();
    // Every (trace, policy) bisection in one pool with the loads (as `allocsim fit`).
    let ran = work(py, || {
        let load =
            |i: usize| load_one(&sources[i], &names[i], &load, &model).map(|(input, _)| input);
        let cost = |&p: &usize, input: &CompareInput| {
            specs
                .as_ref()
                .map_or(0.0, |s| sim::replay_cost(&input.trace, &s[p].config))
        };
        // Fewer bisections than threads: each replays ahead on its share of them (the
        // same fit).
        let fit_options = sim::FitOptions {
            speculate: sim::fit::speculation_for(jobs.len(), rayon::current_num_threads()),
            ..sim::FitOptions::default()
        };
        let run = |&p: &usize, input: &CompareInput| -> Option<Result<FitOn, sim::CompareError>> {
            let spec = &specs.as_ref().ok()?[p];
            let fit = (|| {
                let fit = sim::fit(
                    &input.trace,
                    &input.hints,
                    &spec.config,
                    &model,
                    &replay,
                    &fit_options,
                )?;
                // Each GPU: whether it fits, and whether that could change in another
                // process (as `allocsim fit`).
                let (t, h, c) = (&input.trace, &input.hints, &spec.config);
                let on = gpus
                    .iter()
                    .map(|(_, d)| {
                        let ok = sim::fits(t, h, c, d, &replay)?;
                        let m = sim::boundary::margin(t, h, c, d, &replay, ok)?;
                        Ok((ok, m.is_marginal()))
                    })
                    .collect::<Result<Vec<(bool, bool)>, sim::CompareError>>()?;
                Ok((fit, on))
            })();
            Some(fit)
        };
        pooled(&sources, &jobs, &load, &cost, &run)
    })?
    .map_err(trace_err)?;
    let specs = specs?;
    // The first failed fit in input order, whichever failed first in time.
    let results = ran
        .results
        .into_iter()
        .map(|r| r.expect("the policies parse"))
        .collect::<Result<Vec<FitOn>, sim::CompareError>>()
        .map_err(|e| ReplayError::new_err(e.to_string()))?;
    let mut rows = Vec::new();
    for (&(t, p), (fit, on)) in jobs.iter().zip(&results) {
        let marginal: Vec<&str> = gpus
            .iter()
            .zip(on)
            .filter(|(_, &(_, m))| m)
            .map(|((n, _), _)| n.as_str())
            .collect();
        let record =
            sim::fit::FitRecord::of(&names[t], &specs[p].label, fit).with_marginal_gpus(&marginal);
        let mut row = match serde_json::to_value(&record).map_err(json_err)? {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("a record is an object"),
        };
        for ((name, _), (fits, _)) in gpus.iter().zip(on) {
            row.insert(name.clone(), serde_json::Value::Bool(*fits));
        }
        rows.push(row);
    }
    let mut columns = sim::report::columns::<sim::fit::FitRecord<'_>>();
    columns.extend(gpus.iter().map(|(n, _)| n.clone()));
    serde_json::to_string(&(columns, rows)).map_err(json_err)
}

/// A fit, and per named GPU whether the trace fits there and whether that is marginal.
type FitOn = (sim::Fit, Vec<(bool, bool)>);

/// Each trace's least total memory for its recommended configuration.
type Needs = Vec<(String, Option<u64>)>;

/// A sweep (`allocsim sweep`), whole or one shard: its CSV as the command line writes
/// it, the rows as JSON, and for a whole run each trace's least memory for its
/// recommended configuration.
#[pyfunction]
#[pyo3(signature = (text, path, traces, options))]
fn sweep(
    py: Python<'_>,
    text: &str,
    path: PathBuf,
    traces: Vec<PathBuf>,
    options: &str,
) -> PyResult<(String, String, Needs)> {
    let o = Options::parse(options)?;
    let shard = o
        .shard
        .as_deref()
        .map(|s| sim::sweep::Shard::parse(s).map_err(|e| config_err(format!("shard: {e}"))))
        .transpose()?;
    let mut sweep = sim::sweep::parse(text, &path).map_err(config_err)?;
    if !traces.is_empty() {
        sweep.traces = traces.into_iter().map(TraceSource::File).collect();
    }
    let replay = o.replay();
    let outcome = work(py, || {
        sim::sweep::run(
            &sweep,
            &sim::sweep::RunOptions {
                replay,
                shard,
                progress: None,
            },
        )
    })?
    .map_err(|e| match e {
        sim::sweep::RunError::NoTraces => config_err(e),
        sim::sweep::RunError::Load(e) => trace_err(e),
        sim::sweep::RunError::Replay(e) => ReplayError::new_err(e.to_string()),
    })?;
    let needs = outcome.summary.as_ref().map_or(Vec::new(), |s| {
        s.traces
            .iter()
            .map(|t| {
                (
                    t.trace.clone(),
                    t.needs.as_ref().and_then(|f| f.min_capacity_bytes),
                )
            })
            .collect()
    });
    records_answer(&outcome.records).map(|(csv, json)| (csv, json, needs))
}

/// The CSV and the JSON rows of sweep records.
fn records_answer(records: &[sim::sweep::SweepRecord]) -> PyResult<(String, String)> {
    let mut csv = Vec::new();
    sim::report::write_records(records.iter().cloned(), &mut csv)
        .map_err(|e| PyRuntimeError::new_err(format!("allocsim: writing the CSV: {e}")))?;
    let csv = String::from_utf8(csv).expect("the CSV writer writes UTF-8 from UTF-8");
    Ok((csv, serde_json::to_string(records).map_err(json_err)?))
}

/// Joins shard CSVs (`allocsim merge`, in memory): the CSV of the whole sweep and its
/// rows as JSON.
#[pyfunction]
fn merge(shards: Vec<(String, String)>) -> PyResult<(String, String)> {
    let records = sim::sweep::merge_from(
        shards
            .into_iter()
            .map(|(name, csv)| (name, Cursor::new(csv.into_bytes())))
            .collect(),
    )
    .map_err(config_err)?;
    records_answer(&records)
}

/// How many shards' worth of rows a sweep has (to split it among a cluster's tasks).
#[pyfunction]
#[pyo3(signature = (text, path, traces))]
fn sweep_rows(text: &str, path: PathBuf, traces: Vec<PathBuf>) -> PyResult<u64> {
    let mut sweep = sim::sweep::parse(text, &path).map_err(config_err)?;
    if !traces.is_empty() {
        sweep.traces = traces.into_iter().map(TraceSource::File).collect();
    }
    Ok(sweep.rows())
}

/// The registered policies: name, one line of help, and each option's key, default and
/// meaning.
#[pyfunction]
fn policy_names() -> Vec<&'static str> {
    policies::POLICIES.iter().map(|p| p.name).collect()
}

/// The built-in GPU profiles' names.
#[pyfunction]
fn gpu_profiles() -> Vec<&'static str> {
    DeviceProfile::builtin_names()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ReplayError", py.get_type::<ReplayError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(fit, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_rows, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(policy_names, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_profiles, m)?)?;
    Ok(())
}
