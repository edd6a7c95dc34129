//! Sweeps: traces × grids of policy options × devices, from a YAML file, replayed on
//! all cores, with a ranking and a recommendation per trace (`docs/sweeps.md`).
//!
//! [`parse`] reads a sweep file into a [`Sweep`]: its traces (files, or the seeded
//! generator with a list of seeds), its policies with a grid of values for any option
//! their options type documents (names and values come from the registry,
//! [`policies::POLICIES`], so a new policy or option is sweepable without a change
//! here), and its devices (capacities on one device model, GPUs by name). Every
//! combination is checked when the file is read: a bad file is one line naming the key
//! and its line.
//!
//! The policies expand into [`Combination`]s in a fixed order: the policies as written,
//! each option's values as written, the last option varying fastest. The default
//! configuration (the first registered policy with its defaults: `caching`, PyTorch's
//! allocator as it comes, under the sweep's `alloc_conf`) is always among them, first
//! when the grids do not produce it, because the recommendation is measured against
//! it. Rows are traces × combinations × devices, the device varying fastest, each
//! numbered by its `combination` index.
//!
//! [`run`] replays them (a [`Shard`] of them, for spreading a sweep over machines) in
//! parallel, rows in order whatever the scheduling. Ranks, the recommendation and the
//! savings against the default ([`finish`]) and the summary ([`summarize`]) depend on
//! the rows alone, so shards joined by [`merge`] give the same CSV, byte for byte, as
//! one run. Only the least memory the recommended configuration runs in (a bisection,
//! [`crate::fit()`]) needs the traces: [`run`] adds it to a whole run's summary.

mod record;
mod summary;

use std::path::{Path, PathBuf};

use policies::caching::CachingDefaults;
use policies::options::{OptionKind, Setting};
use policies::registry::{self, PolicyEntry};
use policies::spec::{parse_policy, PolicySpec};
use rayon::prelude::*;

use crate::compare::{CompareError, CompareInput};
use crate::device::SimDeviceOptions;
use crate::inputs::{LoadError, LoadOptions, TraceSource};
use crate::profile::DeviceProfile;
use crate::replay::ReplayOptions;

pub use record::{finish, merge, merge_from, MergeError, SweepRecord};
pub use summary::{group_stats, summarize, GroupStats, Inert, Summary, TraceSummary};
use workloads::generate::Generator;
use workloads::nodes::{self as yaml, Node, Value};

pub use crate::inputs::MAX_GENERATED_EVENTS;

/// A sweep file that cannot be used: one line naming the file, the line and the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {}{message}", .line.map_or(String::new(), |l| format!("line {l}: ")))]
pub struct SweepError {
    /// The file.
    pub path: String,
    /// The line (1-based), when known.
    pub line: Option<usize>,
    /// What is wrong, starting with the key.
    pub message: String,
}

/// A parsed sweep file.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// The traces, in order (a generator with several seeds is one trace per seed).
    pub traces: Vec<TraceSource>,
    /// The policy grids, in order.
    pub policies: Vec<PolicyGrid>,
    /// The devices, in order: the capacities, then the GPUs.
    pub devices: Vec<SweepDevice>,
    /// Whether the file names its devices (`capacities`, `gpus`, `gpu_profile`); when it
    /// does not, a recorded run runs on the device it recorded, as `replay` runs it,
    /// and any other trace on the default device (`devices`' one).
    pub devices_named: bool,
    /// The caching policy's defaults (`alloc_conf`), applied before a combination's own
    /// options.
    pub caching: CachingDefaults,
    /// How the trace files are read.
    pub load: LoadOptions,
    combinations: Vec<Combination>,
}

/// A policy and the grid of its options, as the file gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyGrid {
    /// The registered policy.
    pub policy: &'static str,
    /// Its options' grids, in the order written.
    pub options: Vec<OptionGrid>,
}

/// One option of a policy grid: its key and the values to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionGrid {
    /// The option's key.
    pub key: String,
    /// Its values as specification text; `None` leaves the option at its default.
    pub values: Vec<Option<String>>,
}

/// One configuration of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Combination {
    /// The policy and its options; the label is `policy:key=value,...` with the
    /// options the grid sets (none: the policy's name).
    pub spec: PolicySpec,
    /// Whether this is the default configuration the recommendation is measured
    /// against.
    pub default: bool,
}

/// A device of a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepDevice {
    /// Its name in reports: a capacity (`40GiB`, or `h100@40GiB` on a `gpu_profile`), a
    /// GPU as named in the file (`a100-40gb`), or the device model's own size.
    pub label: String,
    /// The simulated device.
    pub options: SimDeviceOptions,
}

/// Which part of a sweep to run: the rows whose `combination` index is `index − 1`
/// modulo `of` (round robin, so each part gets a like share of every trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Which part, from 1.
    pub index: u64,
    /// How many parts.
    pub of: u64,
}

impl Shard {
    /// Parses `K/N` (1 ≤ K ≤ N).
    ///
    /// # Errors
    /// Text that is not `K/N` with 1 ≤ K ≤ N, as a message.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let bad = || format!("'{text}' is not K/N with 1 <= K <= N (e.g. 2/8)");
        let (k, n) = text.split_once('/').ok_or_else(bad)?;
        let k: u64 = k.trim().parse().map_err(|_| bad())?;
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        if k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { index: k, of: n })
    }

    /// Whether row `combination` belongs to this part.
    pub fn has(&self, combination: u64) -> bool {
        combination % self.of == self.index - 1
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        Shard::parse(s)
    }
}

/// One row to replay: its index and what it combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// The row's `combination` index.
    pub combination: u64,
    /// Index into [`Sweep::traces`].
    pub trace: usize,
    /// Index into [`Sweep::combinations`].
    pub policy: usize,
    /// Index into [`Sweep::devices`].
    pub device: usize,
}

/// The largest sweep file read (one lists traces, policies and grids: kilobytes).
pub const MAX_SWEEP_BYTES: u64 = 16 << 20;

impl Sweep {
    /// Reads and parses a sweep file.
    ///
    /// # Errors
    /// An unreadable file, or [`parse`]'s errors.
    pub fn read(path: &Path) -> Result<Sweep, SweepError> {
        let text = crate::read_small_text(path, MAX_SWEEP_BYTES, "a sweep file").map_err(|e| {
            SweepError {
                path: path.display().to_string(),
                line: None,
                message: e.to_string(),
            }
        })?;
        parse(&text, path)
    }

    /// Every configuration, in the sweep's order (see the module docs).
    pub fn combinations(&self) -> &[Combination] {
        &self.combinations
    }

    /// How many rows the whole sweep has.
    pub fn rows(&self) -> u64 {
        (self.traces.len() * self.combinations.len() * self.devices.len()) as u64
    }

    /// The rows to replay, in order: all of them, or a shard's.
    pub fn jobs(&self, shard: Option<Shard>) -> Vec<Job> {
        let (p, d) = (self.combinations.len(), self.devices.len());
        let mut jobs = Vec::new();
        for trace in 0..self.traces.len() {
            for policy in 0..p {
                for device in 0..d {
                    let combination = ((trace * p + policy) * d + device) as u64;
                    if shard.is_none_or(|s| s.has(combination)) {
                        jobs.push(Job {
                            combination,
                            trace,
                            policy,
                            device,
                        });
                    }
                }
            }
        }
        jobs
    }
}

/// How to run a sweep.
#[derive(Clone, Default)]
pub struct RunOptions<'a> {
    /// Replay options (invariant checks, the interrupt flag).
    pub replay: ReplayOptions,
    /// Only this part of the rows; `None` for all. A shard's records are unranked and
    /// get no summary: [`merge`] joins them.
    pub shard: Option<Shard>,
    /// Called after each step of work ([`steps`] of them: each replay, and each
    /// trace's bisection), from any thread: a progress bar's tick.
    pub progress: Option<&'a (dyn Fn() + Sync)>,
}

/// How many times [`run`] calls [`RunOptions::progress`].
pub fn steps(sweep: &Sweep, shard: Option<Shard>) -> u64 {
    let fits = if shard.is_some() {
        0
    } else {
        sweep.traces.len()
    };
    sweep.jobs(shard).len() as u64 + fits as u64
}

/// Why a sweep did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The sweep has no traces.
    #[error("the sweep names no traces: list them under `traces:` in the file (or give --trace)")]
    NoTraces,
    /// A trace did not load.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A replay stopped for a reason other than running out of memory (the first in
    /// row order), or was interrupted.
    #[error(transparent)]
    Replay(#[from] CompareError),
}

/// What a sweep gives: its rows, and for a whole run the summary.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// One record per row, in `combination` order: ranked for a whole run, unranked
    /// for a shard.
    pub records: Vec<SweepRecord>,
    /// Ranking, recommendations, warnings and statistics; `None` for a shard.
    pub summary: Option<Summary>,
    /// Why some numbers are not exact ([`crate::caveats`]), each once per trace.
    pub caveats: Vec<String>,
}

/// How a sweep's traces load: each named for reports among all the sweep's traces (so
/// that shards agree), read with the first device as the model of recorded addresses,
/// and the device each recorded run recorded, where the file names none.
struct Loader<'s> {
    sweep: &'s Sweep,
    names: Vec<String>,
    model: SimDeviceOptions,
    /// Each trace's recorded device, set as it loads (`None`: the sweep's devices).
    recorded: Vec<std::sync::OnceLock<Option<SweepDevice>>>,
}

impl<'s> Loader<'s> {
    fn of(sweep: &'s Sweep) -> Loader<'s> {
        Loader {
            sweep,
            names: crate::inputs::report_names(&sweep.traces),
            model: sweep
                .devices
                .first()
                .map_or_else(SimDeviceOptions::default, |d| d.options.clone()),
            recorded: sweep.traces.iter().map(|_| Default::default()).collect(),
        }
    }

    fn load(&self, i: usize) -> Result<CompareInput, LoadError> {
        let (mut input, run) =
            crate::inputs::load_with_run(&self.sweep.traces[i], &self.sweep.load, &self.model)?;
        input.trace.name = self.names[i].clone();
        let recorded = run
            .as_ref()
            .filter(|_| !self.sweep.devices_named)
            .and_then(|run| {
                let options = crate::recorded::recorded_device(run, &self.model)?;
                let card = run.meta.device.as_deref().unwrap_or("the GPU");
                Some(SweepDevice {
                    label: format!("{card} (recorded)"),
                    options,
                })
            });
        let _ = self.recorded[i].set(recorded);
        Ok(input)
    }

    /// The device trace `trace`'s row `device` runs on: its recorded one, where it has
    /// one and the file names none, else the sweep's.
    fn device(&self, trace: usize, device: usize) -> &SweepDevice {
        match self.recorded[trace].get() {
            Some(Some(d)) => d,
            _ => &self.sweep.devices[device],
        }
    }

    /// Each trace's expected load: a file's bytes (0 for a generated trace, or a file
    /// that cannot be read: its load says why), the biggest read first.
    fn sizes(&self) -> Vec<u64> {
        self.sweep
            .traces
            .iter()
            .map(|t| match t {
                TraceSource::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
                TraceSource::Generated(_) => 0,
            })
            .collect()
    }
}

/// Runs a sweep (or a shard of it) on all cores: loads the traces and replays every
/// row in one pool (a trace's rows start once it is loaded, longest first:
/// [`crate::compare::load_and_run`]), and for a whole run ranks the rows, summarizes
/// them and finds the least memory each recommended configuration runs in.
///
/// # Errors
/// See [`RunError`].
pub fn run(sweep: &Sweep, options: &RunOptions<'_>) -> Result<Outcome, RunError> {
    if sweep.traces.is_empty() {
        return Err(RunError::NoTraces);
    }
    let jobs = sweep.jobs(options.shard);
    let tick = || {
        if let Some(p) = options.progress {
            p();
        }
    };
    let loader = Loader::of(sweep);
    let load = |i: usize| loader.load(i);
    let cost = |job: &Job, input: &CompareInput| {
        crate::compare::replay_cost(&input.trace, &sweep.combinations[job.policy].spec.config)
    };
    let replay = |job: &Job, input: &CompareInput| {
        let combination = &sweep.combinations[job.policy];
        let device = loader.device(job.trace, job.device);
        let row =
            crate::compare::run_one(input, &combination.spec, &device.options, &options.replay);
        tick();
        row.map(|row| {
            let record = SweepRecord::of(job.combination, &row, &device.label, combination.default);
            (record, row.caveats)
        })
    };
    let work = crate::compare::Work {
        load: &load,
        cost: &cost,
        run: &replay,
    };
    let batch: Vec<(usize, Job)> = jobs.iter().map(|j| (j.trace, *j)).collect();
    // A whole run keeps its traces for the bisections after the ranking.
    let ran =
        crate::compare::load_and_run(&loader.sizes(), &batch, &work, options.shard.is_none())?;
    let inputs = ran.sources;
    let results = ran.results;
    // The first failure in row order, whichever failed first in time.
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let caveats = caveats(sweep, &results);
    let mut records: Vec<SweepRecord> = results.into_iter().map(|(r, _)| r).collect();
    if options.shard.is_some() {
        return Ok(Outcome {
            records,
            summary: None,
            caveats,
        });
    }
    finish(&mut records);
    let mut summary = summarize(&records);
    // Fewer bisections than threads: each replays ahead on its share of them.
    let bisections = summary
        .traces
        .iter()
        .filter(|t| t.recommended.is_some())
        .count();
    let fit_options = crate::FitOptions {
        speculate: crate::fit::speculation_for(bisections, rayon::current_num_threads()),
        ..crate::FitOptions::default()
    };
    let fits: Vec<Result<Option<crate::Fit>, CompareError>> = summary
        .traces
        .par_iter()
        .map(|t| {
            let fit = match t.recommended {
                Some(row) => {
                    let r = &records[row];
                    let input = inputs
                        .iter()
                        .flatten()
                        .find(|i| i.trace.name == r.trace)
                        .expect("every trace is loaded for a whole run");
                    let job = &jobs[row];
                    Some(crate::fit::fit(
                        &input.trace,
                        &input.hints,
                        &sweep.combinations[job.policy].spec.config,
                        &loader.device(job.trace, job.device).options,
                        &options.replay,
                        &fit_options,
                    )?)
                }
                None => None,
            };
            tick();
            Ok(fit)
        })
        .collect();
    for (t, fit) in summary.traces.iter_mut().zip(fits) {
        t.needs = fit?;
    }
    // The traces go on every core, not page by page on this one.
    inputs.into_par_iter().for_each(drop);
    Ok(Outcome {
        records,
        summary: Some(summary),
        caveats,
    })
}

/// Each (trace, caveat) once, in row order: `trace: caveat` when every configuration
/// has it, else `trace under p1, p2: caveat` (at most three named).
fn caveats(sweep: &Sweep, rows: &[(SweepRecord, Vec<String>)]) -> Vec<String> {
    let mut seen: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    for (r, cs) in rows {
        for c in cs {
            let key = (r.trace.as_str(), c.as_str());
            match seen.iter_mut().find(|(k, _)| *k == key) {
                Some((_, policies)) => {
                    if !policies.contains(&r.policy.as_str()) {
                        policies.push(&r.policy);
                    }
                }
                None => seen.push((key, vec![&r.policy])),
            }
        }
    }
    seen.into_iter()
        .map(|((trace, c), policies)| {
            if policies.len() == sweep.combinations.len() {
                format!("{trace}: {c}")
            } else {
                let more = match policies.len() {
                    n if n > 3 => format!(" and {} more", n - 3),
                    _ => String::new(),
                };
                let named: Vec<&str> = policies.into_iter().take(3).collect();
                format!("{trace} under {}{more}: {c}", named.join(", "))
            }
        })
        .collect()
}

/// Where a message is about: the file, and how to name its lines.
struct Ctx<'a> {
    path: String,
    dir: &'a Path,
    caching: CachingDefaults,
}

impl Ctx<'_> {
    fn at(&self, line: usize, message: impl Into<String>) -> SweepError {
        SweepError {
            path: self.path.clone(),
            line: Some(line),
            message: message.into(),
        }
    }
}

/// The keys of a sweep file, for messages.
const KEYS: &[&str] = &[
    "traces",
    "policies",
    "capacities",
    "gpus",
    "gpu_profile",
    "alloc_conf",
    "lenient",
    "snapshot_device",
];

/// Reads a sweep file's text. `path` names it in messages; trace files and GPU profile
/// files are taken relative to its directory, and each must exist (profiles are read).
///
/// # Errors
/// One line naming the key and the line: YAML that is not a sweep, an unknown key,
/// policy or option, a value an option, size or generator does not take, a
/// combination that does not make a valid policy, a trace file or GPU that does not
/// exist.
pub fn parse(text: &str, path: &Path) -> Result<Sweep, SweepError> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut ctx = Ctx {
        path: path.display().to_string(),
        dir,
        caching: CachingDefaults::default(),
    };
    let root = yaml::parse(text).map_err(|(line, m)| ctx.at(line, m))?;
    let Value::Map(entries) = &root.value else {
        return Err(ctx.at(
            root.line,
            "a sweep file is a mapping with `traces`, `policies` and optionally `capacities` \
             or `gpus` (docs/sweeps.md)",
        ));
    };
    let mut fields: Vec<(&str, &Node, &Node)> = Vec::new();
    for (k, v) in entries {
        let key = k.scalar().unwrap_or_default();
        if !KEYS.contains(&key) {
            return Err(ctx.at(
                k.line,
                format!("unknown key '{key}' (known: {})", KEYS.join(", ")),
            ));
        }
        fields.push((key, k, v));
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|f| (f.1, f.2))
    };

    if let Some((_, v)) = field("alloc_conf") {
        let conf = scalar(&ctx, "alloc_conf", v)?;
        ctx.caching.alloc_conf = Some(conf.to_string());
        parse_policy(registry::POLICIES[0].name, &ctx.caching)
            .map_err(|e| ctx.at(v.line, format!("alloc_conf: {e}")))?;
    }
    let mut load = LoadOptions::default();
    if let Some((_, v)) = field("lenient") {
        load.lenient = v.plain_bool().ok_or_else(|| {
            ctx.at(
                v.line,
                format!("lenient: {} is not true or false", v.describe()),
            )
        })?;
    }
    if let Some((_, v)) = field("snapshot_device") {
        load.snapshot_device = integer(&ctx, "snapshot_device", v)?
            .try_into()
            .map_err(|_| ctx.at(v.line, "snapshot_device: too large"))?;
    }

    // A file without traces is a grid to apply to traces given elsewhere (`allocsim
    // sweep FILE --trace T`); [`run`] refuses to run without any.
    let traces = match field("traces") {
        Some((key, node)) => parse_traces(&ctx, key, node)?,
        None => Vec::new(),
    };
    let Some((policies_key, policies_node)) = field("policies") else {
        return Err(ctx.at(
            root.line,
            "policies: missing (a list of policies with grids of options)",
        ));
    };
    let (policies, combinations) = parse_policies(&ctx, policies_key, policies_node)?;
    let devices_named = ["gpu_profile", "capacities", "gpus"]
        .iter()
        .any(|k| field(k).is_some());
    let devices = parse_devices(
        &ctx,
        field("gpu_profile"),
        field("capacities"),
        field("gpus"),
    )?;
    Ok(Sweep {
        traces,
        policies,
        devices,
        devices_named,
        caching: ctx.caching,
        load,
        combinations,
    })
}

/// The items of a list (a single scalar is a list of one).
fn items(node: &Node) -> Vec<&Node> {
    match &node.value {
        Value::Seq(items) => items.iter().collect(),
        _ => vec![node],
    }
}

fn scalar<'n>(ctx: &Ctx<'_>, key: &str, node: &'n Node) -> Result<&'n str, SweepError> {
    node.scalar().ok_or_else(|| {
        ctx.at(
            node.line,
            format!("{key}: expected a single value, found {}", node.describe()),
        )
    })
}

fn integer(ctx: &Ctx<'_>, key: &str, node: &Node) -> Result<u64, SweepError> {
    scalar(ctx, key, node)?.parse().map_err(|_| {
        ctx.at(
            node.line,
            format!("{key}: {} is not a whole number", node.describe()),
        )
    })
}

fn parse_traces(ctx: &Ctx<'_>, key: &Node, node: &Node) -> Result<Vec<TraceSource>, SweepError> {
    let list = items(node);
    if list.is_empty() || node.is_null() {
        return Err(ctx.at(key.line, "traces: none given"));
    }
    let mut traces = Vec::new();
    for item in list {
        match &item.value {
            Value::Scalar { text, .. } => {
                let path = ctx.dir.join(text);
                if !path.exists() {
                    return Err(ctx.at(
                        item.line,
                        format!("traces: {}: no such file", path.display()),
                    ));
                }
                traces.push(TraceSource::File(path));
            }
            Value::Map(_) => traces.extend(parse_generator(ctx, item)?),
            Value::Seq(_) => {
                return Err(ctx.at(
                    item.line,
                    "traces: an item is a file name or a generator (`{generate: random, seed: [1, 2]}`), \
                     found a list",
                ))
            }
        }
    }
    Ok(traces)
}

/// A generated trace, one per seed: the generator spec is read by
/// [`workloads::generate::spec::from_node`], the one reader of generator options.
fn parse_generator(ctx: &Ctx<'_>, item: &Node) -> Result<Vec<TraceSource>, SweepError> {
    let (generator, seeds) = workloads::generate::spec::from_node(item)
        .map_err(|e| ctx.at(e.line, format!("traces: {}", e.message)))?;
    if let Generator::Random(o) = &generator {
        if o.events > MAX_GENERATED_EVENTS {
            let line = match &item.value {
                Value::Map(entries) => entries
                    .iter()
                    .find(|(k, _)| k.scalar() == Some("events"))
                    .map_or(item.line, |(_, v)| v.line),
                _ => item.line,
            };
            return Err(ctx.at(
                line,
                format!(
                    "traces: events: {} is more than a sweep generates ({MAX_GENERATED_EVENTS}); \
                     write the trace with `allocsim generate` and sweep the file",
                    o.events
                ),
            ));
        }
    }
    // A structured generator's length follows from its draws: each seed's trace is
    // counted as it is made (nothing kept), so a spec too long for a sweep is refused
    // here, with its line, rather than when the sweep runs.
    let traces: Vec<Generator> = seeds.into_iter().map(|s| generator.with_seed(s)).collect();
    if !matches!(generator, Generator::Random(_)) {
        for g in &traces {
            let fits = g
                .has_at_most(MAX_GENERATED_EVENTS)
                .map_err(|e| ctx.at(item.line, format!("traces: {e}")))?;
            if !fits {
                return Err(ctx.at(
                    item.line,
                    format!(
                        "traces: {} makes more than the {MAX_GENERATED_EVENTS} events a sweep \
                         generates; write the trace with `allocsim generate` and sweep the file",
                        g.name()
                    ),
                ));
            }
        }
    }
    Ok(traces
        .into_iter()
        .map(|g| TraceSource::Generated(Box::new(g)))
        .collect())
}

fn parse_policies(
    ctx: &Ctx<'_>,
    key: &Node,
    node: &Node,
) -> Result<(Vec<PolicyGrid>, Vec<Combination>), SweepError> {
    // A list of `name` or `name: {options}` items, or one mapping of name: {options}.
    let pairs: Vec<(&Node, Option<&Node>)> = match &node.value {
        Value::Map(entries) => entries.iter().map(|(k, v)| (k, Some(v))).collect(),
        _ => items(node)
            .into_iter()
            .map(|item| match &item.value {
                Value::Map(entries) if entries.len() == 1 => {
                    Ok((&entries[0].0, Some(&entries[0].1)))
                }
                Value::Scalar { .. } => Ok((item, None)),
                _ => Err(ctx.at(
                    item.line,
                    format!(
                        "policies: each item is a policy ({}) or `name: {{option: [values]}}`, \
                         found {}",
                        registry::known_names(", "),
                        item.describe()
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
    };
    if pairs.is_empty() || node.is_null() {
        return Err(ctx.at(key.line, "policies: none given"));
    }
    let known = || registry::known_names(", ");
    let mut grids = Vec::new();
    let mut combinations = Vec::new();
    for (name_node, value) in pairs {
        let grid = match value.map(|v| (v, &v.value)) {
            None => None,
            Some((v, _)) if v.is_null() => None,
            Some((_, Value::Map(options))) => Some(options.as_slice()),
            Some((v, _)) => {
                return Err(ctx.at(
                    v.line,
                    format!(
                        "policies: {}: the options are a mapping of option: [values], found {}",
                        name_node.scalar().unwrap_or_default(),
                        v.describe()
                    ),
                ))
            }
        };
        let name = name_node.scalar().unwrap_or_default();
        let entry: &PolicyEntry = registry::find(name).ok_or_else(|| {
            ctx.at(
                name_node.line,
                format!("policies: unknown policy '{name}' (known: {})", known()),
            )
        })?;
        let docs = entry.docs();
        let mut options: Vec<OptionGrid> = Vec::new();
        // (key, value) -> its line, to name a value that fails alone.
        let mut lines: Vec<(&str, String, usize)> = Vec::new();
        for (k, v) in grid.unwrap_or_default() {
            let key = k.scalar().unwrap_or_default();
            let doc = docs.iter().find(|d| d.name == key).ok_or_else(|| {
                let names: Vec<&str> = docs.iter().map(|d| d.name).collect();
                ctx.at(
                    k.line,
                    if names.is_empty() {
                        format!("policies: {name}: unknown option '{key}' ({name} has no options)")
                    } else {
                        format!(
                            "policies: {name}: unknown option '{key}' (known: {})",
                            names.join(", ")
                        )
                    },
                )
            })?;
            let values = items(v);
            if values.is_empty() {
                return Err(ctx.at(v.line, format!("policies: {name}: {key}: no values")));
            }
            let mut texts = Vec::new();
            for value in values {
                let text = option_value(value, doc.kind).ok_or_else(|| {
                    ctx.at(
                        value.line,
                        format!(
                            "policies: {name}: {key}: values are single values (or none for the \
                             default), found {}",
                            value.describe()
                        ),
                    )
                })?;
                // Each value on its own, so a value that does not read is named at its
                // line; combinations are checked as wholes below.
                if let Some(text) = &text {
                    entry
                        .parse(&[Setting { key, value: text }], &ctx.caching)
                        .map_err(|e| {
                            // `0` for an option off by default: PyTorch refuses some
                            // such values; `none` is the default.
                            let hint = if doc.default.split_whitespace().next() == Some(text) {
                                format!(" (write none for the default, {})", doc.default)
                            } else {
                                String::new()
                            };
                            ctx.at(value.line, format!("policies: {name}: {key}: {e}{hint}"))
                        })?;
                    lines.push((key, text.clone(), value.line));
                }
                texts.push(text);
            }
            options.push(OptionGrid {
                key: key.to_string(),
                values: texts,
            });
        }
        for settings in expand(&options) {
            let set: Vec<String> = settings
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
                .collect();
            let label = if set.is_empty() {
                entry.name.to_string()
            } else {
                format!("{}:{}", entry.name, set.join(","))
            };
            let spec = parse_policy(&label, &ctx.caching).map_err(|e| {
                // A value that is wrong on its own is named at its line; else the
                // combination is, at its policy.
                let alone = lines.iter().find_map(|(k, v, line)| {
                    parse_policy(&format!("{}:{k}={v}", entry.name), &ctx.caching)
                        .err()
                        .map(|e| (*k, *line, e))
                });
                match alone {
                    Some((k, line, e)) => {
                        let why = match e {
                            policies::spec::SpecError::Options { message, .. } => message,
                            other => other.to_string(),
                        };
                        ctx.at(line, format!("policies: {name}: {k}: {why}"))
                    }
                    None => ctx.at(name_node.line, format!("policies: the combination {e}")),
                }
            })?;
            combinations.push(Combination {
                spec,
                default: false,
            });
        }
        grids.push(PolicyGrid {
            policy: entry.name,
            options,
        });
    }
    let default = parse_policy(registry::POLICIES[0].name, &ctx.caching)
        .map_err(|e| ctx.at(key.line, format!("policies: the default: {e}")))?;
    match combinations
        .iter_mut()
        .find(|c| c.spec.config == default.config)
    {
        Some(c) => c.default = true,
        None => combinations.insert(
            0,
            Combination {
                spec: default,
                default: true,
            },
        ),
    }
    Ok((grids, combinations))
}

/// Every combination of the grids' values, the last option varying fastest.
fn expand(options: &[OptionGrid]) -> Vec<Vec<(String, Option<String>)>> {
    let mut combos: Vec<Vec<(String, Option<String>)>> = vec![Vec::new()];
    for o in options {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                o.values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((o.key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    combos
}

/// An option's value as specification text for its kind: `Some(None)` for the
/// default (`none`, `null`, `~`), booleans spelled as the option spells them (`True`
/// for PyTorch's keys); `None` when the node is not a single value.
fn option_value(v: &Node, kind: OptionKind) -> Option<Option<String>> {
    if v.is_null() {
        return Some(None);
    }
    let text = v.scalar()?;
    if text == "none" {
        return Some(None);
    }
    Some(Some(match (v.plain_bool(), kind) {
        (Some(b), OptionKind::Text(placeholder)) if placeholder.contains("True") => {
            if b { "True" } else { "False" }.to_string()
        }
        (Some(b), OptionKind::Bool) => b.to_string(),
        _ => text.to_string(),
    }))
}

fn parse_devices(
    ctx: &Ctx<'_>,
    profile: Option<(&Node, &Node)>,
    capacities: Option<(&Node, &Node)>,
    gpus: Option<(&Node, &Node)>,
) -> Result<Vec<SweepDevice>, SweepError> {
    let (model, model_name) = match profile {
        Some((_, v)) => {
            let name = scalar(ctx, "gpu_profile", v)?;
            (gpu(ctx, "gpu_profile", name, v.line)?, Some(name))
        }
        None => (SimDeviceOptions::default(), None),
    };
    let mut devices = Vec::new();
    if let Some((_, v)) = capacities {
        for item in items(v) {
            let text = scalar(ctx, "capacities", item)?;
            let total =
                units_size(text).map_err(|e| ctx.at(item.line, format!("capacities: {e}")))?;
            let options = model.clone().with_total(total).ok_or_else(|| {
                ctx.at(
                    item.line,
                    format!(
                        "capacities: {text} is not above the {} bytes the CUDA context and the \
                         driver keep on {}",
                        model.reserved_by_driver_bytes(),
                        model.name
                    ),
                )
            })?;
            let size = workloads::size::format_size_exact(total);
            devices.push(SweepDevice {
                label: model_name.map_or(size.clone(), |m| format!("{m}@{size}")),
                options,
            });
        }
    }
    if let Some((_, v)) = gpus {
        for item in items(v) {
            let name = scalar(ctx, "gpus", item)?;
            devices.push(SweepDevice {
                label: name.to_string(),
                options: gpu(ctx, "gpus", name, item.line)?,
            });
        }
    }
    if devices.is_empty() {
        devices.push(SweepDevice {
            label: model_name.map_or_else(
                || workloads::size::format_size_exact(model.total_bytes),
                str::to_string,
            ),
            options: model,
        });
    }
    Ok(devices)
}

fn units_size(text: &str) -> Result<u64, units::SizeError> {
    units::parse_memory_size(text)
}

/// A GPU by built-in name, else a profile file relative to the sweep file.
fn gpu(ctx: &Ctx<'_>, key: &str, name: &str, line: usize) -> Result<SimDeviceOptions, SweepError> {
    if let Some(p) = DeviceProfile::builtin(name) {
        return Ok(p.to_options());
    }
    let path: PathBuf = ctx.dir.join(name);
    if !path.exists() {
        return Err(ctx.at(
            line,
            format!(
                "{key}: unknown GPU '{name}' (built in: {}), and no such profile file",
                DeviceProfile::builtin_names().join(", ")
            ),
        ));
    }
    DeviceProfile::read(&path)
        .map(|p| p.to_options())
        .map_err(|e| ctx.at(line, format!("{key}: {e}")))
}

#[cfg(test)]
mod tests;
