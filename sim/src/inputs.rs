//! Traces ready to replay: read (any format) or generated, validated, with the recorded
//! addresses of a recorded run, and named uniquely for reports.
//!
//! This is the one place that turns a trace source into a [`CompareInput`]: the CLI's
//! `replay`, `compare`, `fit` and `sweep` and the library's [`crate::sweep`] all load
//! through [`load`] and [`load_all`], and name their rows with [`report_names`].

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use workloads::generate::Generator;
use workloads::validate::{validate, Severity};
use workloads::{Format, ReadError, RecordedRun, Trace};

use crate::compare::CompareInput;
use crate::device::{AddressHints, SimDeviceOptions};
use crate::recorded::HintError;

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
            let hints = match &run {
                Some(run) => hints_of(run, options, model)?,
                None if options.no_recorded_addresses => AddressHints::default(),
                None => crate::recorded::trace_hints(&trace)?,
            };
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
    let hints = hints_of(&run, options, model)?;
    check(&trace, options)?;
    Ok((CompareInput { trace, hints }, run))
}

/// Recorded runs keep the segment addresses PyTorch got, for best-fit ties (none with
/// `no_recorded_addresses`).
fn hints_of(
    run: &RecordedRun,
    options: &LoadOptions,
    model: &SimDeviceOptions,
) -> Result<AddressHints, LoadError> {
    if options.no_recorded_addresses {
        return Ok(AddressHints::default());
    }
    Ok(crate::recorded::address_hints(run, model.total_bytes)?)
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
}
