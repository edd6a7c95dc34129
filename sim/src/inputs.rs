//! Traces ready to replay: read (any format) or generated, validated, with the recorded
//! addresses of a recorded run, and named uniquely for reports.
//!
//! This is the one place that turns a trace source into a [`CompareInput`]: the CLI's
//! `replay`, `compare`, `fit` and `sweep` and the library's [`crate::sweep`] all load
//! through [`load`] and [`load_all`], and name their rows with [`report_names`].

use std::io::Read as _;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use workloads::generate::Generator;

use policies::{AsDynPolicy, Device, Policy};
use workloads::ahead::ReadAhead;
use workloads::csv::{CsvEvents, EventStream, Unstreamable};
use workloads::rmm::RmmEvents;
use workloads::validate::{validate, Severity};
use workloads::{Format, ReadError, RecordedRun, Trace};

use crate::compare::CompareInput;
use crate::device::{AddressHints, SimDeviceOptions};
use crate::observe::{Observer, Outcome};
use crate::recorded::HintError;
use crate::replay::{Replay, ReplayError, ReplayOptions};

/// Where a trace comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceSource {
    /// A trace file, in any format allocsim reads.
    File(PathBuf),
    /// A trace made by a seeded generator ([`workloads::generate::Generator`]), of at
    /// most [`MAX_GENERATED_EVENTS`] events.
    Generated(Box<Generator>),
}

/// The most events a generated trace may have when it is generated to be replayed (a
/// sweep's traces): a few lines of YAML must not ask for memory out of proportion to
/// them (write a bigger trace with `allocsim generate` and replay the file).
pub const MAX_GENERATED_EVENTS: u64 = 100_000_000;

impl TraceSource {
    /// The name a report gives this trace when no other trace claims it: a file's stem
    /// (`run` for `dir/run.pickle`), a generated trace's `<kind>-seed<seed>`.
    pub fn short_name(&self) -> String {
        match self {
            TraceSource::File(path) => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
            TraceSource::Generated(g) => g.name(),
        }
    }

    /// The longer name used when two traces share a short name: a file's path as given,
    /// a generated trace's [`Generator::long_name`] (`random-seed1-events1000-...`).
    pub fn long_name(&self) -> String {
        match self {
            TraceSource::File(path) => path.display().to_string(),
            TraceSource::Generated(g) => g.long_name(),
        }
    }
}

/// How traces are read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The format, instead of detecting it from the content (with the extension as a
    /// hint).
    pub format: Option<Format>,
    /// Which GPU's trace to read from a snapshot pickle that holds several.
    pub snapshot_device: usize,
    /// Replay traces that fail validation (unknown frees and zero-size requests are
    /// skipped) instead of refusing them.
    pub lenient: bool,
    /// Ignore a recorded run's segment addresses (no hints: the simulated device's
    /// address model places every segment).
    pub no_recorded_addresses: bool,
    /// Read a streamed RMM log on a second thread while the replay runs
    /// ([`workloads::ahead::ReadAhead`]), where the process may use two cores or more
    /// (its CPU affinity and quota): the same events and results. (A CSV trace is read
    /// on the replaying thread either way.)
    pub read_ahead: bool,
}

/// A trace that cannot be replayed. One line naming the file and the place.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file does not read.
    #[error("{}{}", .0, more_hint(.0))]
    Read(ReadError),
    /// The trace reads but fails validation (and `lenient` is off).
    #[error(
        "{first}{}; --lenient replays it anyway",
        more_problems(*.more, .path)
    )]
    Invalid {
        /// The trace's file.
        path: PathBuf,
        /// The first problem, with its place.
        first: String,
        /// How many more problems there are.
        more: usize,
    },
    /// The recorded addresses of a recorded run cannot be used.
    #[error(transparent)]
    Hints(#[from] HintError),
    /// The generator's options do not make a trace.
    #[error("{0}")]
    Generate(#[from] workloads::generate::InvalidOptions),
}

fn more_hint(e: &ReadError) -> String {
    if e.more.is_empty() {
        String::new()
    } else {
        format!("; `allocsim check {}` lists them all", e.path.display())
    }
}

fn more_problems(more: usize, path: &Path) -> String {
    match more {
        0 => String::new(),
        n => format!(
            " ({n} more problem{}; `allocsim check {}` lists them all)",
            if n == 1 { "" } else { "s" },
            path.display()
        ),
    }
}

/// Reads or generates one trace and validates it. A recorded run's segment addresses
/// become hints for a simulated device like `model` ([`crate::recorded::address_hints`]).
///
/// # Errors
/// See [`LoadError`].
pub fn load(
    source: &TraceSource,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<CompareInput, LoadError> {
    load_with_run(source, options, model).map(|(input, _)| input)
}

/// [`load`], also giving the recorded run a recorded format's trace came from (its
/// annotations, settings and frames, for pictures and exports).
///
/// # Errors
/// See [`LoadError`].
pub fn load_with_run(
    source: &TraceSource,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<(CompareInput, Option<RecordedRun>), LoadError> {
    let (trace, hints, run) = match source {
        TraceSource::File(path) => {
            let (trace, run) =
                workloads::read_source(path, options.format, options.snapshot_device)
                    .map_err(LoadError::Read)?;
            let hints = hints_of(run.as_ref(), &trace, options, model)?;
            (trace, hints, run)
        }
        TraceSource::Generated(g) => (
            g.generate_at_most(MAX_GENERATED_EVENTS)?,
            AddressHints::default(),
            None,
        ),
    };
    check(&trace, options)?;
    Ok((CompareInput { trace, hints }, run))
}

/// A recorded run already read (a snapshot handed over in memory, by the Python
/// package) made ready to replay as [`load_with_run`] makes a file's: turned into a
/// trace, validated, its recorded addresses as hints for a device like `model`.
///
/// # Errors
/// A run that cannot be replayed ([`workloads::RecordedRun::to_trace`]), and the rest
/// of [`LoadError`].
pub fn load_recorded(
    run: RecordedRun,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<(CompareInput, RecordedRun), LoadError> {
    let trace = run.to_trace().map_err(LoadError::Read)?;
    let hints = hints_of(Some(&run), &trace, options, model)?;
    check(&trace, options)?;
    Ok((CompareInput { trace, hints }, run))
}

/// The segment addresses PyTorch got, for best-fit ties: a recorded run's, else those
/// a trace converted from one carries (none with `no_recorded_addresses`).
fn hints_of(
    run: Option<&RecordedRun>,
    trace: &Trace,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<AddressHints, LoadError> {
    if options.no_recorded_addresses {
        return Ok(AddressHints::default());
    }
    Ok(match run {
        Some(run) => crate::recorded::address_hints(run, model.total_bytes)?,
        None => crate::recorded::trace_hints(trace)?,
    })
}

/// Refuses a trace with validation errors unless `lenient`.
fn check(trace: &Trace, options: &LoadOptions) -> Result<(), LoadError> {
    if options.lenient {
        return Ok(());
    }
    let issues = validate(trace);
    let mut errors = issues.iter().filter(|i| i.severity == Severity::Error);
    if let Some(first) = errors.next() {
        return Err(LoadError::Invalid {
            path: trace
                .path
                .clone()
                .unwrap_or_else(|| PathBuf::from(&trace.name)),
            first: first.display_with(trace).to_string(),
            more: errors.count(),
        });
    }
    Ok(())
}

/// Loads every source, in parallel on all cores, each named for reports by [`report_names`].
///
/// # Errors
/// The first source, in order, that does not load.
pub fn load_all(
    sources: &[TraceSource],
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<Vec<CompareInput>, LoadError> {
    // Read in parallel (each trace once, shared by every job that replays it); the
    // error reported is the first in input order, whichever failed first in time.
    let loaded: Vec<Result<CompareInput, LoadError>> = sources
        .par_iter()
        .map(|s| load(s, options, model))
        .collect();
    let mut inputs = loaded.into_iter().collect::<Result<Vec<_>, _>>()?;
    for (input, name) in inputs.iter_mut().zip(report_names(sources)) {
        input.trace.name = name;
    }
    Ok(inputs)
}

/// The name each source has in reports (the `trace` column of every CSV): its
/// [`TraceSource::short_name`], or where two sources share that, their
/// [`TraceSource::long_name`]s; a source given twice gets `#2`, `#3`... after its
/// second and later appearances. Never the name a file records inside it (two files
/// converted from one snapshot both record the snapshot's name).
pub fn report_names(sources: &[TraceSource]) -> Vec<String> {
    let short: Vec<String> = sources.iter().map(TraceSource::short_name).collect();
    let named: Vec<String> = sources
        .iter()
        .zip(&short)
        .map(|(s, n)| {
            if short.iter().filter(|&m| m == n).count() > 1 {
                s.long_name()
            } else {
                n.clone()
            }
        })
        .collect();
    named
        .iter()
        .enumerate()
        .map(
            |(i, n)| match named[..i].iter().filter(|&m| m == n).count() {
                0 => n.clone(),
                k => format!("{n}#{}", k + 1),
            },
        )
        .collect()
}

/// What [`stream_replay`] did.
#[derive(Debug)]
// Made once per replay and matched at once: boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Streamed {
    /// The file was replayed as it was read, and validated in the same pass.
    Replayed {
        /// The trace without its events (name, path, metadata), for reports; event
        /// `i` is on line `i + 2` ([`CsvEvents::line_of`], [`RmmEvents::line_of`]).
        shell: Trace,
        /// Events in the file.
        events: u64,
        /// `alloc` events in the file.
        allocs: u64,
        /// The replay.
        replay: Replay,
    },
    /// The replay needs the whole trace, or the file has problems: read it with
    /// [`load`], which replays the same events or reports every problem; the reason,
    /// `None` for a file that is neither CSV nor an RMM log. The policy, device and observer given were
    /// used, so make them afresh.
    NeedsWholeTrace(Option<Unstreamable>),
}

/// The format a replay of `path` streams ([`stream_replay`]): CSV traces and RMM
/// logs; `Err` gives what [`Streamed::NeedsWholeTrace`] says for the rest (`None`: a
/// format that is read whole; `Some(Problem)`: the format could not be told).
///
/// # Errors
/// The file does not open or read.
pub fn streamed_format(
    path: &Path,
    options: &LoadOptions,
) -> Result<Result<Format, Option<Unstreamable>>, ReadError> {
    let format = match options.format {
        Some(f) => f,
        None => {
            let mut prefix = Vec::with_capacity(workloads::SNIFF_BYTES);
            let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
            std::io::Read::take(file, workloads::SNIFF_BYTES as u64)
                .read_to_end(&mut prefix)
                .map_err(|e| ReadError::io(path, &e))?;
            match workloads::detect(path, &prefix) {
                Ok(f) => f,
                Err(_) => return Ok(Err(Some(Unstreamable::Problem))),
            }
        }
    };
    Ok(match format {
        Format::Csv | Format::Rmm => Ok(format),
        _ => Err(None),
    })
}

/// Replays the trace file at `path` as it is read, without holding it: memory
/// follows the live allocations, not the file's length. CSV traces and RMM logs
/// stream ([`streamed_format`]), and only those a line at a time tells everything
/// about ([`CsvEvents`], [`RmmEvents`]); validation runs in the same pass (the rest of
/// the file is still read and checked after an out-of-memory stops the replay).
/// Anything else answers [`Streamed::NeedsWholeTrace`].
///
/// The engine is generic over the policy's type: given a policy as its own type (from
/// [`policies::PolicyConfig::with_policy`]), a CSV trace's checked replay calls it
/// directly, not through `dyn Policy` (RMM logs and lenient replays go through
/// `dyn Policy`, one copy of the engine for every policy).
///
/// # Errors
/// The file does not open, or the replay failed (as [`crate::replay_with`]).
pub fn stream_replay<P: Policy + AsDynPolicy + ?Sized, O: Observer + ?Sized>(
    path: &Path,
    options: &LoadOptions,
    policy: &mut P,
    device: &mut dyn Device,
    replay_options: &ReplayOptions,
    observer: &mut O,
) -> Result<Streamed, StreamError> {
    match streamed_format(path, options).map_err(StreamError::Read)? {
        Ok(Format::Csv) => {
            // Read on this thread: its usual rows reach the engine from the branch that
            // read their op, and a second thread was no faster end to end
            // (docs/performance.md, "Reading ahead on a second thread").
            let events = CsvEvents::open(path).map_err(StreamError::Read)?;
            drive(events, options, policy, device, replay_options, observer)
        }
        Ok(Format::Rmm) => {
            let open = || RmmEvents::open(path).map_err(StreamError::Read);
            let policy = policy.as_dyn_mut();
            // Reading an RMM log costs more than replaying it: a second thread reads
            // ahead where asked, where there is a second core, and where it starts.
            let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
            if options.read_ahead && cores() > 1 {
                if let Ok(events) = ReadAhead::start(open()?) {
                    return drive(events, options, policy, device, replay_options, observer);
                }
            }
            drive(open()?, options, policy, device, replay_options, observer)
        }
        Ok(_) | Err(None) => Ok(Streamed::NeedsWholeTrace(None)),
        Err(Some(why)) => Ok(Streamed::NeedsWholeTrace(Some(why))),
    }
}

/// [`stream_replay`] of `events`, validated in the engine's pass unless lenient.
fn drive<S: EventStream, P: Policy + AsDynPolicy + ?Sized, O: Observer + ?Sized>(
    mut events: S,
    options: &LoadOptions,
    policy: &mut P,
    device: &mut dyn Device,
    replay_options: &ReplayOptions,
    observer: &mut O,
) -> Result<Streamed, StreamError> {
    // Validation runs in the engine's pass, on its live table.
    let (replay, problem) = if options.lenient {
        let replay = crate::replay::replay_events(
            None,
            &mut events,
            policy.as_dyn_mut(),
            device,
            replay_options,
            observer,
        );
        (replay, false)
    } else {
        // The reader's own source: a CSV trace's usual rows reach the engine's step
        // from the branch that read their op.
        let mut source = events.source();
        crate::replay::replay_checked(&mut source, policy, device, replay_options, observer)
    };
    // An out-of-memory (or a replay error) stops the replay, not the reading of the
    // rest of the file (checked above unless lenient), whose problems come first; an
    // interruption stops both.
    if !matches!(replay, Err(ReplayError::Interrupted { .. })) {
        events.by_ref().for_each(drop);
    }
    if let Some(why) = events.stopped() {
        return Ok(Streamed::NeedsWholeTrace(Some(why)));
    }
    if problem {
        return Ok(Streamed::NeedsWholeTrace(Some(Unstreamable::Problem)));
    }
    Ok(Streamed::Replayed {
        shell: events.shell(),
        events: events.events_read(),
        allocs: events.allocs_read(),
        replay: replay.map_err(StreamError::Replay)?,
    })
}

/// A snapshot pickle's replay as the file is read, in two passes (three with private
/// pools) that hold neither its entries nor its events (`workloads::snapshot::stream`):
/// memory follows the live blocks and segments, plus 40 bytes per segment operation
/// (the address hints) and, with private pools, about 50 bytes per run of one pool's
/// requests (their windows).
pub struct SnapshotStream {
    plan: workloads::snapshot::StreamPlan,
    shell: Trace,
    hints: AddressHints,
}

/// What [`SnapshotStream::replay`] did: the replay, with what a report needs of the
/// trace it did not hold.
#[derive(Debug)]
pub struct StreamedSnapshot {
    /// Events of the trace.
    pub events: u64,
    /// `alloc` events of the trace.
    pub allocs: u64,
    /// The replay.
    pub replay: Replay,
    /// The file's entry of the event where reserved bytes first reached their peak.
    pub reserved_peak_entry: Option<u64>,
}

impl SnapshotStream {
    /// The first pass over `path` when it is a snapshot pickle whose replay can
    /// stream (`workloads::snapshot::plan_stream`: from an empty allocator or from the
    /// state rebuilt at its first entry, with or without private pools, no problem), with its
    /// recorded addresses as hints for a device like
    /// `model`; `None` for anything else, which [`load`] reads whole (and reports).
    pub fn open(
        path: &Path,
        options: &LoadOptions,
        model: &SimDeviceOptions,
    ) -> Option<SnapshotStream> {
        let format = match options.format {
            Some(f) => f,
            None => {
                let mut prefix = Vec::with_capacity(workloads::SNIFF_BYTES);
                let file = std::fs::File::open(path).ok()?;
                std::io::Read::take(file, workloads::SNIFF_BYTES as u64)
                    .read_to_end(&mut prefix)
                    .ok()?;
                workloads::detect(path, &prefix).ok()?
            }
        };
        if format != Format::TorchPickle {
            return None;
        }
        let plan = workloads::snapshot::plan_stream(path, options.snapshot_device).ok()?;
        let shell = plan.shell();
        let hints = hints_of(Some(&plan.run), &shell, options, model).ok()?;
        Some(SnapshotStream { plan, shell, hints })
    }

    /// The trace without its events (name, path, metadata), for reports.
    pub fn shell(&self) -> &Trace {
        &self.shell
    }

    /// The recorded addresses, as [`load`] gives them.
    pub fn hints(&self) -> &AddressHints {
        &self.hints
    }

    /// The second pass: replays the trace as the file is read again, validated in the
    /// same pass unless `lenient` (as [`stream_replay`] does a CSV file); `None` when
    /// the events have a problem to report or the file changed since the first pass:
    /// read it whole with [`load`]. The policy, device and observer given were used
    /// then, so make them afresh.
    ///
    /// # Errors
    /// The replay failed (as [`crate::replay_with`]).
    pub fn replay<O: Observer + ?Sized>(
        &self,
        policy: &mut dyn Policy,
        device: &mut dyn Device,
        replay_options: &ReplayOptions,
        lenient: bool,
        observer: &mut O,
    ) -> Result<Option<StreamedSnapshot>, StreamError> {
        let mut stream = self.plan.events();
        let location = std::cell::Cell::new(0u64);
        let (mut events, mut allocs) = (0u64, 0u64);
        let mut peak = PeakEntry {
            location: &location,
            peak: 0,
            index: None,
            entry: None,
        };
        let (replay, problem) = {
            let mut items = stream.by_ref().map(|(event, at)| {
                location.set(at);
                events += 1;
                allocs += u64::from(matches!(event, workloads::Event::Alloc { .. }));
                event
            });
            let mut observers = (observer, &mut peak);
            let start = self.plan.start();
            let (replay, problem) = if lenient {
                let r = crate::replay::replay_events(
                    start,
                    &mut items,
                    policy,
                    device,
                    replay_options,
                    &mut observers,
                );
                (r, false)
            } else {
                crate::replay::replay_checked_from(
                    start,
                    &mut items,
                    policy,
                    device,
                    replay_options,
                    &mut observers,
                )
            };
            if matches!(replay, Err(ReplayError::Interrupted { .. })) {
                return replay.map(|_| None).map_err(StreamError::Replay);
            }
            items.for_each(drop);
            (replay, problem)
        };
        if stream.finish().is_err() || problem {
            return Ok(None);
        }
        let replay = replay.map_err(StreamError::Replay)?;
        if peak.index.map(|i| i as u64) != replay.summary.reserved_peak_event_index {
            return Ok(None);
        }
        Ok(Some(StreamedSnapshot {
            events,
            allocs,
            replay,
            reserved_peak_entry: peak.entry,
        }))
    }
}

/// Follows the reserved peak as the engine's summary does, to keep the entry of the
/// event where it was first reached (a streamed trace keeps no locations).
struct PeakEntry<'a> {
    location: &'a std::cell::Cell<u64>,
    peak: u64,
    index: Option<usize>,
    entry: Option<u64>,
}

impl Observer for PeakEntry<'_> {
    /// A trace that starts mid-run: the state it starts from counts for the peak, at
    /// no event (as the engine's summary counts it).
    #[inline]
    fn before_event(&mut self, index: usize, _event: &workloads::Event, policy: &dyn Policy) {
        if index == 0 {
            self.peak = policy.stats().reserved_bytes;
        }
    }

    #[inline]
    fn after_event(&mut self, step: &crate::observe::Step<'_>) {
        if step.policy_stats.reserved_bytes > self.peak {
            self.peak = step.policy_stats.reserved_bytes;
            self.index = Some(step.index);
            self.entry = Some(self.location.get());
        }
    }

    fn needs_stats_every_event(&self) -> bool {
        false
    }

    /// Reserved bytes rise only at an allocation (a streamed snapshot's trace has no
    /// other calls); [`SnapshotStream::replay`] checks the event found against the
    /// summary's.
    #[inline(always)]
    fn watches(&self, _index: usize, event: &workloads::Event, _outcome: &Outcome) -> bool {
        matches!(event, workloads::Event::Alloc { .. })
    }
}

/// A streamed replay that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The file does not read.
    #[error(transparent)]
    Read(ReadError),
    /// The replay stopped (as [`crate::replay_with`]'s errors).
    #[error(transparent)]
    Replay(ReplayError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &str) -> TraceSource {
        TraceSource::File(PathBuf::from(p))
    }

    /// Report names: file stems; paths where stems collide; generated traces by seed,
    /// with their options where two share a seed; `#2` for a source given twice.
    #[test]
    fn names_are_unique() {
        let random = |seed, events| {
            TraceSource::Generated(Box::new(Generator::Random(workloads::RandomOptions {
                seed,
                events,
                ..workloads::RandomOptions::default()
            })))
        };
        let names = report_names(&[
            file("a/run.yaml"),
            file("b/run.yaml"),
            file("other.pickle"),
            random(1, 100),
            random(1, 200),
            random(2, 100),
            file("a/run.yaml"),
        ]);
        assert_eq!(
            names,
            [
                "a/run.yaml",
                "b/run.yaml",
                "other",
                "random-seed1-events100-loguniform512-256MiB-lifetime50-streams1",
                "random-seed1-events200-loguniform512-256MiB-lifetime50-streams1",
                "random-seed2",
                "a/run.yaml#2",
            ]
        );
    }

    /// A trace with problems is refused with the first problem, the count of the others
    /// and how to replay it anyway; lenient loads it.
    #[test]
    fn invalid_traces_are_refused_unless_lenient() {
        let dir = std::env::temp_dir().join(format!("allocsim-inputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.yaml");
        std::fs::write(
            &path,
            "events:\n  - {op: free, id: 1}\n  - {op: free, id: 2}\n",
        )
        .unwrap();
        let source = TraceSource::File(path.clone());
        let e = load(
            &source,
            &LoadOptions::default(),
            &SimDeviceOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bad.yaml"), "{e}");
        assert!(e.contains("event 0"), "{e}");
        assert!(e.contains("(1 more problem;"), "{e}");
        assert!(e.ends_with("replays it anyway"), "{e}");
        let lenient = LoadOptions {
            lenient: true,
            ..LoadOptions::default()
        };
        assert!(load(&source, &lenient, &SimDeviceOptions::default()).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn temp_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("allocsim-stream-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The file at `path` replayed as it is read under `policy` on a device of
    /// `capacity` bytes, read on the replaying thread and on a second one (the same).
    fn stream(path: &Path, policy: &str, capacity: u64) -> Streamed {
        let [one, two] = [false, true].map(|read_ahead| {
            let spec = policies::spec::parse_policy(policy, &Default::default()).unwrap();
            let mut p = spec.config.build().unwrap();
            let mut d = crate::SimDevice::new(SimDeviceOptions::default().with_capacity(capacity));
            let options = LoadOptions {
                read_ahead,
                ..LoadOptions::default()
            };
            stream_replay(
                path,
                &options,
                p.as_mut(),
                &mut d,
                &ReplayOptions::default(),
                &mut (),
            )
            .unwrap()
        });
        assert_eq!(format!("{one:?}"), format!("{two:?}"), "read ahead");
        one
    }

    /// The file at `path` replayed as it is read gives the replay of `whole` (the same
    /// file read whole) under every policy, at a capacity that runs out and one that
    /// does not, with its event and alloc counts, its name and its format.
    fn assert_streams_as_whole(path: &Path, whole: &Trace) {
        for spec in policies::testing::every_policy() {
            let policy = spec.label.as_str();
            for capacity in [80 << 30, 2 << 30] {
                let mut p = spec.config.build().unwrap();
                let mut d =
                    crate::SimDevice::new(SimDeviceOptions::default().with_capacity(capacity));
                let expected =
                    crate::replay(whole, p.as_mut(), &mut d, &ReplayOptions::default()).unwrap();
                let Streamed::Replayed {
                    shell,
                    events,
                    allocs,
                    replay,
                } = stream(path, policy, capacity)
                else {
                    panic!("{policy} did not stream")
                };
                assert_eq!(replay, expected, "{policy} at {capacity}");
                assert_eq!(events, whole.events.len() as u64);
                assert_eq!(allocs, whole.alloc_count() as u64);
                assert_eq!(shell.name, whole.name);
                assert_eq!(shell.meta.format, whole.meta.format);
            }
        }
    }

    /// A CSV trace replayed as it is read gives the replay of the whole trace, under
    /// every policy, with its event and alloc counts, at a capacity that runs out and
    /// one that does not.
    #[test]
    fn streamed_equals_whole() {
        let trace = workloads::generate::random(&workloads::RandomOptions {
            seed: 5,
            events: 3000,
            streams: 2,
            mark_every: Some(500),
            ..workloads::RandomOptions::default()
        })
        .unwrap();
        let mut text = Vec::new();
        workloads::write_csv(&trace, &mut text).unwrap();
        let (dir, path) = temp_file("t.csv", std::str::from_utf8(&text).unwrap());
        let whole = load(
            &TraceSource::File(path.clone()),
            &LoadOptions::default(),
            &SimDeviceOptions::default(),
        )
        .unwrap();
        assert_eq!(whole.trace.name, "t");
        assert_streams_as_whole(&path, &whole.trace);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `trace`'s requests as an RMM log: each allocation at a pointer that a freed
    /// one had where there is one (the lowest), as RMM's pools hand them out again,
    /// else at a new one; frees with the size allocated; marks left out.
    fn rmm_log(trace: &Trace) -> String {
        use std::collections::{BTreeSet, HashMap};
        use workloads::Event;
        let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
        let (mut free, mut live) = (BTreeSet::new(), HashMap::new());
        let mut next = 0x7f00_0000_0000u64;
        for (i, e) in trace.events.iter().enumerate() {
            let time = format!(
                "10:{:02}:{:02}.{:06}",
                i / 60_000_000 % 60,
                i / 1_000_000 % 60,
                i % 1_000_000
            );
            match *e {
                Event::Alloc {
                    id,
                    size_bytes,
                    stream,
                } => {
                    let pointer = free.pop_first().unwrap_or_else(|| {
                        next += 1 << 12;
                        next
                    });
                    live.insert(id, (pointer, size_bytes));
                    text += &format!("7,{time},allocate,0x{pointer:x},{size_bytes},0x{stream:x}\n");
                }
                Event::Free { id } => {
                    let (pointer, size) = live.remove(&id).unwrap();
                    free.insert(pointer);
                    text += &format!("7,{time},free,0x{pointer:x},{size},0x0\n");
                }
                _ => {}
            }
        }
        text
    }

    /// An RMM log replayed as it is read (ids of freed pointers given again) gives
    /// the replay of the whole log (a pointer's id kept), under every policy, with its
    /// event and alloc counts, at a capacity that runs out and one that does not.
    #[test]
    fn a_streamed_rmm_log_equals_the_whole_log() {
        let trace = workloads::generate::random(&workloads::RandomOptions {
            seed: 9,
            events: 3000,
            streams: 2,
            ..workloads::RandomOptions::default()
        })
        .unwrap();
        let (dir, path) = temp_file("rmm-log.csv", &rmm_log(&trace));
        let whole = load(
            &TraceSource::File(path.clone()),
            &LoadOptions::default(),
            &SimDeviceOptions::default(),
        )
        .unwrap();
        assert_eq!(whole.trace.meta.format, Some(Format::Rmm));
        // Pointers come back (fewer than half as many as allocations): the streamed
        // reader gives freed ids again.
        assert!(whole.trace.id_names.len() < whole.trace.alloc_count() / 2);
        assert_streams_as_whole(&path, &whole.trace);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// What a line at a time of an RMM log cannot tell goes to the whole-trace reader:
    /// a blank line, a malformed line, a free with another size, a pointer freed twice,
    /// one freed that was never allocated, one allocated twice; a clean log streams,
    /// with a failed allocation, Windows line breaks and no final line break.
    #[test]
    fn what_of_an_rmm_log_needs_the_whole_trace() {
        let h = "Thread,Time,Action,Pointer,Size,Stream\n";
        let a = "1,10:00:00.000001,allocate,0x1000,512,0x0\n";
        let f = "1,10:00:00.000002,free,0x1000,512,0x0\n";
        let cases: [(&str, String, Option<Unstreamable>); 10] = [
            ("rmm-a.csv", format!("{h}{a}{f}"), None),
            (
                "rmm-b.csv",
                format!("{h}{a}1,10:00:00.000002,allocate failure,(nil),68719476736,0\n{f}"),
                None,
            ),
            (
                "rmm-c.csv",
                format!("{h}{a}{f}").replace('\n', "\r\n"),
                None,
            ),
            ("rmm-d.csv", format!("{h}{a}{}", f.trim_end()), None),
            (
                "rmm-e.csv",
                format!("{h}{a}\n{f}"),
                Some(Unstreamable::LineBreaks),
            ),
            (
                "rmm-f.csv",
                format!("{h}{}", a.replace("512", "5x2")),
                Some(Unstreamable::Problem),
            ),
            (
                "rmm-g.csv",
                format!("{h}{a}{}", f.replace("512", "256")),
                Some(Unstreamable::Problem),
            ),
            (
                "rmm-h.csv",
                format!("{h}{a}{f}{f}"),
                Some(Unstreamable::Problem),
            ),
            (
                "rmm-i.csv",
                format!("{h}{f}{a}"),
                Some(Unstreamable::Problem),
            ),
            (
                "rmm-j.csv",
                format!("{h}{a}{a}"),
                Some(Unstreamable::Problem),
            ),
        ];
        for (name, text, why) in &cases {
            let (dir, path) = temp_file(name, text);
            match (stream(&path, "caching", 2 << 30), why) {
                (Streamed::Replayed { .. }, None) => {}
                (Streamed::NeedsWholeTrace(Some(got)), Some(why)) => {
                    assert_eq!(got, *why, "{name}")
                }
                (other, _) => panic!("{name}: {other:?}"),
            }
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    /// What a row at a time cannot tell goes to the whole-trace reader: a YAML file,
    /// named ids, a blank line, an allocator call, a malformed row, a validation
    /// error (also one after an out-of-memory stopped the replay); a clean CSV streams.
    #[test]
    fn what_needs_the_whole_trace() {
        let cases: [(&str, &str, Option<Unstreamable>); 7] = [
            (
                "a.csv",
                "op,id,bytes,stream\nalloc,1,512,0\nfree,1,,\n",
                None,
            ),
            (
                "b.csv",
                "op,id,bytes,stream\nalloc,w,512,0\nfree,w,,\n",
                Some(Unstreamable::NamedId),
            ),
            (
                "c.csv",
                "op,id,bytes,stream\nalloc,1,512,0\n\nfree,1,,\n",
                Some(Unstreamable::LineBreaks),
            ),
            (
                "d.csv",
                "op,id,bytes,stream\nreset_peak_memory_stats,,,\n",
                Some(Unstreamable::AllocatorCall),
            ),
            (
                "e.csv",
                "op,id,bytes,stream\nalloc,1,x,0\n",
                Some(Unstreamable::Problem),
            ),
            (
                "f.csv",
                "op,id,bytes,stream\nalloc,1,512,0\nfree,2,,\n",
                Some(Unstreamable::Problem),
            ),
            (
                "g.csv",
                "op,id,bytes,stream\nalloc,1,4294967296,0\nfree,1,,\nfree,1,,\n",
                Some(Unstreamable::Problem),
            ),
        ];
        for (name, text, why) in cases {
            let (dir, path) = temp_file(name, text);
            match (stream(&path, "caching", 2 << 30), why) {
                (Streamed::Replayed { .. }, None) => {}
                (Streamed::NeedsWholeTrace(Some(got)), Some(why)) => assert_eq!(got, why, "{name}"),
                (other, _) => panic!("{name}: {other:?}"),
            }
            std::fs::remove_dir_all(dir).unwrap();
        }
        let (dir, path) = temp_file("t.yaml", "events:\n  - {op: alloc, id: 1, bytes: 512}\n");
        assert!(matches!(
            stream(&path, "caching", 2 << 30),
            Streamed::NeedsWholeTrace(None)
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
