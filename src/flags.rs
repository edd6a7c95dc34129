//! Command-line flags (clap). Values are typed here (sizes, formats, fractions parse in
//! clap, so a bad one is a usage error naming the flag); `load.rs` turns them into
//! validated inputs.

use std::path::PathBuf;
use std::sync::LazyLock;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use workloads::Format;

/// A size (`512`, `4KiB`, `1.5GiB`), exact.
fn size(text: &str) -> Result<u64, units::SizeError> {
    units::parse_size(text)
}

/// A size of device memory: as [`size`], but a small number without a unit (`16`) is
/// refused as a likely mistake for `16GiB`.
fn memory_size(text: &str) -> Result<u64, units::SizeError> {
    units::parse_memory_size(text)
}

/// A fraction within [0, 1].
#[derive(Debug, thiserror::Error)]
enum FractionError {
    /// Not a number.
    #[error("'{0}' is not a number")]
    NotANumber(String),
    /// Outside [0, 1].
    #[error("{0} is not within [0, 1]")]
    OutOfRange(f64),
}

/// A fraction within [0, 1] (`--memory-fraction`).
fn fraction(text: &str) -> Result<f64, FractionError> {
    let f: f64 = text
        .trim()
        .parse()
        .map_err(|_| FractionError::NotANumber(text.to_string()))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(FractionError::OutOfRange(f))
    }
}

/// A flag that was split into flags of one meaning each: always refused, naming them.
#[derive(Debug, thiserror::Error)]
#[error(
    "--device is gone, it meant two things: use --gpu-profile NAME|FILE for the simulated \
     GPU (built in: {builtin}), --snapshot-device N for which GPU's trace to read from a \
     snapshot, and --gpu N (probe, validate) for the CUDA device to run on"
)]
struct SplitFlag {
    builtin: String,
}

fn split_device_flag(_: &str) -> Result<String, SplitFlag> {
    Err(SplitFlag {
        builtin: sim::DeviceProfile::builtin_names().join(", "),
    })
}

/// An input file; `-` is standard input (a pipe is first copied to a temporary file:
/// `spool.rs`).
fn input(text: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(if text == "-" {
        PathBuf::from(STDIN)
    } else {
        PathBuf::from(text)
    })
}

/// What `-` stands for as an input.
pub const STDIN: &str = "/dev/stdin";

/// The formats allocsim writes, as `--to` / `--format` values of writing commands.
fn writable_format() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(
        Format::ALL
            .into_iter()
            .filter(|f| f.is_writable())
            .map(|f| PossibleValue::new(f.name()).help(f.spec().about)),
    )
    .map(|name| name.parse::<Format>().expect("a listed format name parses"))
}

/// Every registered policy, comma-separated: the default of `--policies`.
static ALL_POLICIES: LazyLock<String> = LazyLock::new(|| policies::registry::known_names(","));

/// Help of `--policy` and `--policies`, naming the registered policies.
fn policy_help(what: &str) -> String {
    format!(
        "{what}. Known: {}, each written NAME or NAME:KEY=VALUE,... (`allocsim policies` \
         lists their options and defaults)",
        policies::registry::known_names(", ")
    )
}

/// `--policies` of the commands that replay under several policies (all of them by
/// default): compare, bench, fit, validate, plot. `diff`'s, which takes exactly two
/// and has no default, is its own.
#[derive(Debug, Args)]
pub struct PoliciesArg {
    /// Comma-separated policies (generated help: see `policy_help`).
    #[arg(
        long,
        default_value = ALL_POLICIES.as_str(),
        help = policy_help("Comma-separated policies, e.g. `caching,caching:expandable_segments=True`")
    )]
    pub policies: Vec<String>,
}

impl std::ops::Deref for PoliciesArg {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.policies
    }
}

/// How much GPU memory will this workload take under allocator X, where will it run
/// out, and which allocator or configuration would fit it?
#[derive(Debug, Parser)]
#[command(name = "allocsim", version, about, max_term_width = 100)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay one trace under one policy and print a summary.
    ///
    /// Streams a CSV trace, an RMM log or a snapshot pickle from a file, from standard
    /// input (`-`) or from a process substitution (`<(zcat t.csv.gz)`; a pipe is first
    /// copied to a temporary file in $TMPDIR): memory follows the live allocations, not
    /// the trace's length. Holds the whole trace in memory (about 40 bytes per event) for
    /// YAML, recorded JSON or a named pipe, with --iterations, with --timeline
    /// except from a CSV trace, or with a GPU profile whose usable memory varies, and reads it
    /// again, whole, to explain an out-of-memory or to report a problem.
    Replay(ReplayArgs),
    /// Replay traces × policies × capacities and write one CSV row each.
    ///
    /// Holds each trace in memory (about 40 bytes per event), at most twice as many at
    /// once as threads; `replay` streams CSV traces, RMM logs and snapshot pickles.
    Compare(CompareArgs),
    /// The smallest GPU memory each trace runs in under each policy, and which named
    /// GPUs it fits on.
    ///
    /// Holds each trace in memory for the bisection's replays (about 40 bytes per event),
    /// at most twice as many at once as threads.
    Fit(FitArgs),
    /// Sweep traces × grids of policy options × GPUs from a YAML file: one CSV row per
    /// combination, and per trace a ranking and the recommended configuration
    /// (docs/sweeps.md).
    ///
    /// Holds its traces in memory (about 40 bytes per event), every one until the end
    /// without --shard, for the recommendation's bisection.
    Sweep(SweepArgs),
    /// Join the CSVs of a sweep's shards (`sweep --shard K/N`) into the CSV one run
    /// gives, with its summary.
    Merge(MergeArgs),
    /// Two configurations on one trace side by side: where their reserved bytes part,
    /// the first differing decision, peaks, out-of-memory points, and which requests
    /// cost the difference.
    ///
    /// Holds the trace in memory with both replays' per-event series (about 70 bytes per
    /// event).
    Diff(DiffArgs),
    /// Write a synthetic trace.
    Generate(GenerateArgs),
    /// Validate traces and list every problem found.
    ///
    /// Reads a clean CSV trace or RMM log once, as it goes (standard input from a pipe,
    /// and a process substitution, through a temporary file in $TMPDIR). Holds the whole
    /// trace in memory (about 40 bytes per event) in other formats or from a named pipe,
    /// and reads a file with a
    /// problem again, whole, to list every problem.
    Check(CheckArgs),
    /// List every policy with its options, their defaults and what they mean.
    Policies(PoliciesArgs),
    /// Convert a trace (YAML, CSV, recorded JSON, snapshot pickle) to YAML or CSV.
    ///
    /// Holds the trace in memory (about 40 bytes per event).
    Convert(ConvertArgs),
    /// Replay recorded PyTorch runs under the caching policy and compare with what
    /// PyTorch did (CSV on stdout).
    ///
    /// Holds each recorded run in memory, one at a time, with everything it records.
    Fidelity(FidelityArgs),
    /// List the built-in GPU profiles (`--gpu-profile NAME`): measured and nominal.
    Gpus(GpusArgs),
    /// Measure the GPU this runs on and write a device profile (needs a CUDA driver).
    Probe(ProbeArgs),
    /// Replay traces in the simulator and on the GPU, side by side (needs a CUDA driver).
    ///
    /// Holds each trace in memory (about 40 bytes per event), one at a time.
    Validate(ValidateArgs),
    /// Draw a picture (SVG or PNG): memory over the run for each policy, or the
    /// segments at one moment.
    ///
    /// Holds every trace in memory at once (about 45 bytes per event).
    Plot(PlotArgs),
    /// Write what a policy would have done as a PyTorch memory snapshot (pickle), for
    /// pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`.
    ///
    /// Holds the trace and the snapshot's entries in memory (about 120 bytes per event).
    Export(ExportArgs),
    /// Measure replay speed: events per second of each policy on each trace (one
    /// core, the thread's CPU time; a warm-up run, then the median and spread of
    /// several), on two generated traces when none is given. Everything runs on one
    /// thread: a trace is read, its runs are timed one after another, it is freed, then
    /// the next is read, so no timed run overlaps a load or another replay.
    ///
    /// Holds each trace in memory while its runs are timed (about 40 bytes per event).
    Bench(BenchArgs),
}

impl Command {
    /// `-o -` where `-o` is optional: standard output, the same as leaving `-o` out (so
    /// that the command's report does not go to standard output beside it).
    pub fn dash_means_stdout(&mut self) {
        let output = match self {
            Command::Compare(a) => &mut a.output,
            Command::Fit(a) => &mut a.output,
            Command::Sweep(a) => &mut a.output,
            Command::Merge(a) => &mut a.output,
            Command::Diff(a) => &mut a.output,
            Command::Probe(a) => &mut a.output,
            Command::Validate(a) => &mut a.output,
            _ => return,
        };
        if output.as_deref().is_some_and(crate::output::is_stdout) {
            *output = None;
        }
    }

    /// The command's input files (traces, shards, recorded runs), to read or to replace
    /// by a copy (`spool.rs`).
    pub fn inputs_mut(&mut self) -> &mut [PathBuf] {
        match self {
            Command::Replay(a) => std::slice::from_mut(&mut a.trace),
            Command::Diff(a) => std::slice::from_mut(&mut a.trace),
            Command::Convert(a) => std::slice::from_mut(&mut a.input),
            Command::Export(a) => std::slice::from_mut(&mut a.trace),
            Command::Compare(a) => &mut a.traces,
            Command::Fit(a) => &mut a.traces,
            Command::Sweep(a) => &mut a.trace,
            Command::Merge(a) => &mut a.shards,
            Command::Check(a) => &mut a.traces,
            Command::Fidelity(a) => &mut a.files,
            Command::Validate(a) => &mut a.traces,
            Command::Plot(a) => &mut a.traces,
            Command::Bench(a) => &mut a.traces,
            Command::Generate(_) | Command::Policies(_) | Command::Gpus(_) | Command::Probe(_) => {
                &mut []
            }
        }
    }

    /// How many of the command's input files are standard input (`-`): more than one
    /// cannot be read (main refuses it), and one from a pipe is kept in a temporary
    /// file first (`spool.rs`).
    pub fn stdin_inputs(&mut self) -> usize {
        self.inputs_mut()
            .iter()
            .filter(|p| p.as_os_str() == STDIN)
            .count()
    }
}

/// How traces are read.
#[derive(Debug, Args, Clone)]
pub struct ReadArgs {
    /// Trace format, instead of detecting it from the content (with the extension as a
    /// hint).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub trace_format: Option<Format>,
    /// Which GPU's trace to read from a snapshot pickle that holds several.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub snapshot_device: usize,
    /// Removed: see --gpu-profile and --snapshot-device.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "", value_parser = split_device_flag)]
    pub device: Option<String>,
}

/// How traces are read, and whether one that fails validation is replayed.
#[derive(Debug, Args, Clone)]
pub struct InputArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// Replay traces that fail validation (unknown frees and zero-size requests are
    /// skipped) instead of refusing them.
    #[arg(long)]
    pub lenient: bool,
    /// Ignore the segment addresses a recorded run (JSON or snapshot, or a YAML trace
    /// converted from one) got: the simulated device's model of the driver places every
    /// segment (docs/fidelity.md, "Addresses").
    #[arg(long)]
    pub no_recorded_addresses: bool,
}

/// The simulated device and the caching policy's memory limit.
#[derive(Debug, Args, Clone)]
pub struct DeviceArgs {
    /// The GPU's memory as you would name it (`16GiB`, `80GiB`): the total
    /// cudaMemGetInfo reports, of which a --gpu-profile's CUDA context and driver
    /// reserve are kept back (none without a profile); a number without a unit below
    /// 1 MiB is refused as a likely mistake; `compare` and `validate` take a
    /// comma-separated list. Default: 80 GiB, or the GPU profile's own memory; a
    /// recorded run (record_torch.py JSON) in `replay`, `compare`, `diff` and `export`
    /// runs on the device it recorded.
    #[arg(long, value_name = "SIZE", value_delimiter = ',', value_parser = memory_size)]
    pub capacity: Vec<u64>,
    /// The GPU to simulate: a built-in profile (`allocsim gpus` lists them: h100, h200,
    /// a100-40gb, l4, ...) or a profile file measured by `allocsim probe`. Default: an
    /// 80 GiB device, or for a recorded run (record_torch.py JSON) in `replay`,
    /// `compare`, `diff` and `export` the device it recorded (its card, total and free
    /// memory).
    #[arg(long, value_name = "NAME|FILE", alias = "device-profile")]
    pub gpu_profile: Option<String>,
    /// The device's total memory as cudaMemGetInfo reports it (memory fractions use it).
    #[arg(long, value_name = "SIZE", value_parser = memory_size)]
    pub total_bytes: Option<u64>,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string for every caching policy, parsed as PyTorch
    /// 2.11 parses it. A recorded run (JSON, or a snapshot that records its settings)
    /// runs with its own unless this is given (`--alloc-conf ''`: PyTorch's defaults).
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// Exact limit on the caching policy's reserved bytes. A recorded run that was
    /// capped keeps its cap unless this, --memory-fraction or --capacity is given.
    #[arg(long, value_name = "SIZE", value_parser = memory_size, conflicts_with = "memory_fraction")]
    pub cap: Option<u64>,
    /// `torch.cuda.set_per_process_memory_fraction(F)`: limit = floor(F × total bytes).
    #[arg(long, value_name = "F", value_parser = fraction)]
    pub memory_fraction: Option<f64>,
    /// Check every policy invariant after every event (slow).
    #[arg(long)]
    pub check_invariants: bool,
    /// Keep replaying after an out-of-memory instead of stopping at the first one.
    #[arg(long)]
    pub continue_after_oom: bool,
}

/// `allocsim replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace: YAML, CSV, a recorded run (.json) or a PyTorch snapshot (.pickle); `-`
    /// for standard input.
    #[arg(value_parser = input)]
    pub trace: PathBuf,
    /// The policy (generated help: see `policy_help`).
    #[arg(
        long,
        short,
        default_value = "caching",
        help = policy_help("The policy, e.g. `buddy:min_block=4KiB,segment=1GiB`")
    )]
    pub policy: String,
    /// Write requested, allocated, reserved and charged bytes after every event here.
    #[arg(long, value_name = "FILE.csv")]
    pub timeline: Option<PathBuf>,
    /// Also print the policy's own statistics at the end (for `caching`, every key of
    /// `torch.cuda.memory_stats()`).
    #[arg(long)]
    pub stats: bool,
    /// Cut the replay into iterations at the trace's marks (and a snapshot's
    /// annotations) and print each one's peaks, and the steady state after the warm-up.
    #[arg(long)]
    pub iterations: bool,
    /// Write one CSV row per iteration here (implies --iterations).
    #[arg(long, value_name = "FILE.csv")]
    pub iterations_csv: Option<PathBuf>,
    /// Cut only at marks and annotations whose label contains this text (e.g. `step`).
    #[arg(long, value_name = "TEXT")]
    pub mark: Option<String>,
    /// Iterations left out of the steady state at the start (the first fills the cache).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub warmup: usize,
    /// Read an RMM log on the replaying thread. By default an RMM log, whose reading
    /// costs more than its replay, is read on a second thread while it replays, where
    /// the process may use two cores or more (its CPU affinity and quota: `taskset -c
    /// 3` gives it one); the results are the same either way. Other formats are read
    /// on the replaying thread.
    #[arg(long)]
    pub one_thread: bool,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `allocsim compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Traces to replay (`-` for standard input).
    #[arg(required = true, value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: PoliciesArg,
    /// Write the CSV here instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// `table` (aligned, sizes in binary units; the default on a terminal) or `csv`
    /// (the default in a pipe or with -o).
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `allocsim bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Traces to replay (any format); without any, the random generator's traces of
    /// 100 000 and 1 000 000 events (seed 1, two streams). `-` for standard input.
    #[arg(value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: PoliciesArg,
    /// Timed runs of each (trace, policy), after one warm-up run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// `table` (the default on a terminal) or `csv` (the default in a pipe).
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `allocsim fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// Traces to fit (`-` for standard input).
    #[arg(required = true, value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: PoliciesArg,
    /// GPUs to check (built-in names, `allocsim gpus`, or profile files), one CSV
    /// column each; `all` (the default) for every built-in one, `none` for none.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all",
        value_name = "NAMES"
    )]
    pub gpus: Vec<String>,
    /// Write the CSV here instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// `table` (the default on a terminal) or `csv` (the default in a pipe or with -o).
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `allocsim sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The sweep file: traces, policies with grids of options, capacities or GPUs
    /// (YAML, docs/sweeps.md).
    pub sweep: PathBuf,
    /// Sweep these trace files instead of the file's `traces` (the file is then a grid
    /// to try on them, e.g. examples/sweeps/pytorch-knobs.yaml); `-` for standard input.
    #[arg(long, value_name = "FILE", value_parser = input)]
    pub trace: Vec<PathBuf>,
    /// Write the CSV (one row per combination) here; the summary then goes to stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Run only part K of N of the rows (round robin), to spread a sweep over machines;
    /// `allocsim merge` joins the parts' CSVs into the CSV of one run.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<sim::sweep::Shard>,
    /// `table` (the summary: recommendation, ranking, warnings; the default on a
    /// terminal) or `csv` (every row; the default in a pipe). With -o, the CSV goes to
    /// the file and the summary to stdout.
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
    /// Check every policy invariant after every event (slow).
    #[arg(long)]
    pub check_invariants: bool,
}

/// `allocsim merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' CSVs (`allocsim sweep --shard K/N -o FILE.csv`), in any order (`-`
    /// for standard input).
    #[arg(required = true, value_parser = input)]
    pub shards: Vec<PathBuf>,
    /// Write the joined CSV here; the summary then goes to stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// `table` (the summary; the default on a terminal) or `csv` (the default in a pipe).
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
}

/// `allocsim diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The trace (`-` for standard input).
    #[arg(value_parser = input)]
    pub trace: PathBuf,
    /// The two configurations, comma-separated (generated help: see `policy_help`).
    #[arg(
        long,
        required = true,
        help = policy_help("The two configurations to compare, e.g. `caching,caching:expandable_segments=True`")
    )]
    pub policies: Vec<String>,
    /// Write every event that changed the gap between the two reservations here (CSV);
    /// the report then goes to stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// `table` (the report; the default on a terminal) or `csv` (the events; the
    /// default in a pipe).
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `allocsim gpus`.
#[derive(Debug, Args)]
pub struct GpusArgs {
    /// `table` (the default on a terminal) or `csv`.
    #[arg(long, value_enum)]
    pub format: Option<crate::table::OutputFormat>,
}

/// `allocsim generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The generator (or the spec's `generate` key).
    #[arg(value_enum, required_unless_present = "spec")]
    pub generator: Option<GeneratorArg>,
    /// The generator's options as a YAML spec (docs/generators.md).
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Set one of the generator's keys over the spec's, the value in YAML (repeatable):
    /// `--set steps=8`, `--set 'batch={uniform: [8, 32]}'`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Random seed (the spec's `seed`): the same seed and options give the same trace.
    #[arg(long)]
    pub seed: Option<u64>,
    /// random: number of alloc and free events before the final frees [default: 10000].
    #[arg(long)]
    pub events: Option<u64>,
    /// random: size distribution [default: log-uniform].
    #[arg(long, value_enum)]
    pub sizes: Option<SizesArg>,
    /// random: smallest request (log-uniform) [default: 512].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub min_bytes: Option<u64>,
    /// random: largest request (log-uniform) [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub max_bytes: Option<u64>,
    /// random: median request (log-normal) [default: 1MiB].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub median_bytes: Option<u64>,
    /// random: spread of ln(size) (log-normal) [default: 2].
    #[arg(long)]
    pub sigma: Option<f64>,
    /// random: mean lifetime of an allocation, in events (geometric) [default: 50].
    #[arg(long)]
    pub mean_lifetime: Option<f64>,
    /// random: number of streams (ids 0..N) [default: 1].
    #[arg(long)]
    pub streams: Option<u64>,
    /// random: insert a mark every N events.
    #[arg(long, value_name = "N")]
    pub mark_every: Option<u64>,
    /// Leave the allocations live at the end instead of freeing them.
    #[arg(long)]
    pub leave_live: bool,
    /// Output file (.yaml or .csv).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Output format, instead of taking it from the extension.
    #[arg(long, value_parser = writable_format())]
    pub format: Option<Format>,
}

/// Generators.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GeneratorArg {
    /// Random sizes and lifetimes.
    Random,
    /// A training loop: parameters, activations, gradients, optimizer state, per step.
    Training,
    /// A model serving batches: prefill, decode, a growing KV cache.
    Inference,
}

/// Size distributions.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SizesArg {
    /// Uniform in log(size) between --min-bytes and --max-bytes.
    LogUniform,
    /// Log-normal with --median-bytes and --sigma.
    LogNormal,
}

/// `allocsim check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Traces to validate (`-` for standard input).
    #[arg(required = true, value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub input: ReadArgs,
}

/// `allocsim policies`.
#[derive(Debug, Args)]
pub struct PoliciesArgs {
    /// Show only this policy.
    pub name: Option<String>,
}

/// `allocsim convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Input trace (`-` for standard input).
    #[arg(value_parser = input)]
    pub input: PathBuf,
    /// Output file (.yaml or .csv).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Input format, instead of detecting it from the content (with the extension as a
    /// hint).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Output format, instead of taking it from the extension.
    #[arg(long, value_parser = writable_format())]
    pub to: Option<Format>,
    /// Which GPU's trace to read from a snapshot pickle that holds several.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub snapshot_device: usize,
    /// Leave out the segment addresses a recorded run got (YAML keeps them in its
    /// `recorded` block by default, for replays to follow).
    #[arg(long)]
    pub no_recorded_addresses: bool,
    /// Removed: see --snapshot-device.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "", value_parser = split_device_flag)]
    pub device: Option<String>,
}

/// `allocsim fidelity`.
#[derive(Debug, Args)]
pub struct FidelityArgs {
    /// Recorded runs: record_torch.py JSON or PyTorch snapshot pickles (`-` for
    /// standard input).
    #[arg(required = true, value_parser = input)]
    pub files: Vec<PathBuf>,
    /// For each run that is not exact, print the first divergence (the entries before
    /// it and both sides' decisions) and any other disagreement, on stderr.
    #[arg(long)]
    pub explain: bool,
    /// Ignore the recorded segment addresses and use the simulated device's own address
    /// model (shows how much best-fit ties depend on the driver's placement).
    #[arg(long)]
    pub no_recorded_addresses: bool,
    /// What-if check: replay this recorded run's requests (the same program under
    /// another configuration or cap) under each run's recorded settings, with this
    /// run's addresses as hints, and compare with what PyTorch did in each run.
    #[arg(long, value_name = "RUN")]
    pub requests_from: Option<PathBuf>,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string in place of the one each run recorded.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// A cap (`set_per_process_memory_fraction`, as exact bytes) in place of the one each
    /// run recorded; for snapshot pickles, which do not record theirs.
    #[arg(long, value_name = "SIZE", value_parser = memory_size, conflicts_with = "memory_fraction")]
    pub cap: Option<u64>,
    /// `set_per_process_memory_fraction(F)` in place of each run's recorded cap.
    #[arg(long, value_name = "F", value_parser = fraction)]
    pub memory_fraction: Option<f64>,
    /// Which GPU's trace to read from a snapshot pickle that holds several.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub snapshot_device: usize,
    /// Removed: see --snapshot-device.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "", value_parser = split_device_flag)]
    pub device: Option<String>,
    /// Check every policy invariant after every request (slow).
    #[arg(long)]
    pub check_invariants: bool,
}

/// `allocsim probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Write the device profile here (YAML) instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// The CUDA device to measure (its index).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: usize,
    /// Measure the usable memory in N processes (this one and N − 1 more, one after
    /// the other) and write their spread as `usable_spread_bytes`: on some GPUs the
    /// driver holds back a different amount in each process (4 MiB on the H200).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// Only fill the device and print "FREE_AT_START USABLE" (one process of
    /// --processes).
    #[arg(long, hide = true, conflicts_with_all = ["output", "processes"])]
    pub fill_only: bool,
}

/// `allocsim validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Traces to replay (`-` for standard input).
    #[arg(required = true, value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: PoliciesArg,
    /// Write the CSV here instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// The CUDA device to run on (its index).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: usize,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `--segments`: a moment of a replay.
#[derive(Debug, thiserror::Error)]
#[error("'{0}' is not a moment: expected peak, oom or an event number (from 0)")]
pub struct MomentError(String);

fn moment(text: &str) -> Result<plot::Moment, MomentError> {
    match text {
        "peak" => Ok(plot::Moment::Peak),
        "oom" => Ok(plot::Moment::Oom),
        n if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n
            .parse()
            .map(plot::Moment::Event)
            .map_err(|_| MomentError(text.to_string())),
        _ => Err(MomentError(text.to_string())),
    }
}

/// `allocsim plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Traces to replay (`-` for standard input).
    #[arg(required = true, value_parser = input)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: PoliciesArg,
    /// The picture: FILE.svg or FILE.png.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Draw the segments at one moment instead of memory over the run: `peak` (when
    /// reserved bytes first reach their peak), `oom` (the first out-of-memory) or an
    /// event number (after that event; events count from 0). One trace.
    #[arg(long, value_name = "peak|oom|EVENT", value_parser = moment)]
    pub segments: Option<plot::Moment>,
    /// What the x axis counts: events, or time (for traces that record when each event
    /// happened: snapshots, recorded runs, RMM logs). Default: time when every trace
    /// records it.
    #[arg(long, value_enum)]
    pub x_axis: Option<XAxisArg>,
    /// Width in pixels (200 to 10000).
    #[arg(long, default_value_t = 1400, value_parser = clap::value_parser!(u32).range(200..=10_000))]
    pub width: u32,
    /// Height in pixels (200 to 10000; a segment map's height follows from its segments).
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u32).range(200..=10_000))]
    pub height: u32,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `--x-axis`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum XAxisArg {
    /// Event numbers, from 0.
    Events,
    /// Seconds since the first event.
    Time,
}

/// `allocsim export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The trace: YAML, CSV, a recorded run (.json), a PyTorch snapshot (.pickle) or an
    /// RMM log; `-` for standard input.
    #[arg(value_parser = input)]
    pub trace: PathBuf,
    /// The policy (generated help: see `policy_help`).
    #[arg(
        long,
        short,
        default_value = "caching",
        help = policy_help("The policy whose decisions the snapshot shows")
    )]
    pub policy: String,
    /// The snapshot: FILE.pickle (as torch.cuda.memory._dump_snapshot writes it) or
    /// FILE.json (the same dict as JSON).
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// Write only the events from this one on (events count from 0): a smaller
    /// snapshot, as PyTorch's ring buffer keeps one.
    #[arg(long, value_name = "EVENT")]
    pub from: Option<usize>,
    /// Write only the events up to this one (included); the segments are the state
    /// after it.
    #[arg(long, value_name = "EVENT")]
    pub to: Option<usize>,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}
