//! `allocsim bench`: how fast each policy replays each trace, in events per second of
//! the replaying thread's CPU time (steadier than the wall clock on a shared machine):
//! one warm-up run, then `--runs` timed ones (each repeating the replay until it
//! lasts at least 0.2 s), their median and spread. What is timed is the replay alone
//! (the engine, the policy, the simulated device). Without traces, two generated ones.
//!
//! Measurement comes first: everything runs on one thread, through the batch pool
//! (`sim::compare::load_and_run` on one thread): a trace is read and checked, its
//! (trace, policy) jobs are timed one after another, it is freed, then the next trace
//! is read. No timed run overlaps a load or another replay of this process, and one
//! trace is held at a time.

use std::io::Write as _;

use anyhow::Context;
use sim::inputs::TraceSource;
use sim::SimDevice;
use workloads::generate::Generator;
use workloads::RandomOptions;

use crate::flags::BenchArgs;
use crate::table::{OutputFormat, Table};
use crate::{interrupt, load, output, Exit};

/// The generated traces measured when none is given: the random generator's
/// log-uniform sizes (512 B to 256 MiB), two streams, mean lifetime 50 events.
pub fn default_sources() -> Vec<TraceSource> {
    [100_000, 1_000_000]
        .into_iter()
        .map(|events| {
            TraceSource::Generated(Box::new(Generator::Random(RandomOptions {
                seed: 1,
                events,
                streams: 2,
                ..RandomOptions::default()
            })))
        })
        .collect()
}

/// CPU time of the calling thread in seconds (`/proc/thread-self/schedstat`, Linux),
/// or `None` where the system does not say.
fn thread_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// The clock the runs are timed with: the thread's CPU time where the system gives it,
/// else the wall clock.
struct Clock {
    cpu: bool,
    start: std::time::Instant,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            cpu: thread_cpu_seconds().is_some(),
            start: std::time::Instant::now(),
        }
    }

    fn now(&self) -> f64 {
        if self.cpu {
            thread_cpu_seconds().unwrap_or(0.0)
        } else {
            self.start.elapsed().as_secs_f64()
        }
    }
}

/// The shortest timed run: shorter replays are repeated within one run.
const MIN_RUN_SECONDS: f64 = 0.2;

/// One (trace, policy)'s timed runs.
struct Measured {
    trace: String,
    events: u64,
    policy: String,
    /// Seconds per run, sorted.
    seconds: Vec<f64>,
}

impl Measured {
    fn median(&self) -> f64 {
        let n = self.seconds.len();
        if n % 2 == 1 {
            self.seconds[n / 2]
        } else {
            (self.seconds[n / 2 - 1] + self.seconds[n / 2]) / 2.0
        }
    }

    fn rate(&self, seconds: f64) -> f64 {
        if seconds > 0.0 {
            self.events as f64 / seconds
        } else {
            f64::INFINITY
        }
    }
}

/// A trace of the batch, read, with its policies under its own settings (`None` when
/// they do not parse: the error is kept apart).
struct Loaded {
    input: sim::CompareInput,
    specs: Option<Vec<policies::spec::PolicySpec>>,
}

/// Times `spec` replaying `input`: one warm-up run, then `runs` timed ones, each
/// repeating the replay until it lasts at least [`MIN_RUN_SECONDS`].
fn measure(
    input: &sim::CompareInput,
    spec: &policies::spec::PolicySpec,
    setup: &load::DeviceSetup,
    clock: &Clock,
    runs: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Measured> {
    let replay = || -> anyhow::Result<()> {
        // The policy as its own type (the engine monomorphized per policy), as
        // `compare` replays it.
        let mut device =
            SimDevice::with_hints(setup.options.clone(), input.hints.for_policy(&spec.config));
        let r = spec
            .config
            .with_policy(sim::compare::ReplayUnder {
                trace: &input.trace,
                device: &mut device,
                options: &setup.replay,
                observer: &mut (),
            })?
            .with_context(|| format!("replaying {} under {}", input.trace.name, spec.label))?;
        std::hint::black_box(r);
        Ok(())
    };
    // The warm-up run (caches, the allocator) is not counted; its wall time says how
    // many replays make one timed run of at least MIN_RUN_SECONDS, so that the CPU
    // clock's granularity (a scheduler tick) stays small against it.
    let t = std::time::Instant::now();
    replay()?;
    let warm = t.elapsed().as_secs_f64();
    let repeat = (MIN_RUN_SECONDS / warm.max(1e-9)).ceil().clamp(1.0, 1e6) as u32;
    bar.inc(1);
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = clock.now();
        for _ in 0..repeat {
            replay()?;
        }
        seconds.push((clock.now() - t) / f64::from(repeat));
        bar.inc(1);
    }
    seconds.sort_by(f64::total_cmp);
    Ok(Measured {
        trace: input.trace.name.clone(),
        events: input.trace.events.len() as u64,
        policy: spec.label.clone(),
        seconds,
    })
}

pub fn run(args: BenchArgs) -> anyhow::Result<Exit> {
    let setup = load::device_setup(&args.device)?;
    // Flags are checked before any trace is read.
    let per_trace = load::policies(&args.policies, &setup.caching)?.len();
    let sources: Vec<TraceSource> = if args.traces.is_empty() {
        default_sources()
    } else {
        args.traces.iter().cloned().map(TraceSource::File).collect()
    };
    let clock = Clock::new();
    let runs = args.runs as usize;
    let bar = crate::progress::jobs_bar((sources.len() * per_trace * (runs + 1)) as u64);
    let _in_order = interrupt::in_order();
    let count = sources.len();
    let batch = load::Batch::of_sources(sources, &args.input, &setup.options, &bar);
    // Each trace's policies under its own recorded settings (or why they do not
    // parse), kept apart from the trace, which goes once its last job ends.
    let errors: Vec<std::sync::Mutex<Option<anyhow::Error>>> =
        (0..count).map(|_| Default::default()).collect();
    let load = |i: usize| -> anyhow::Result<Loaded> {
        let input = batch.load(i)?;
        let settings = load::settings(&input.trace.meta, &args.device);
        let specs = match load::policies(&args.policies, &settings.caching) {
            Ok(s) => Some(s),
            Err(e) => {
                *errors[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                None
            }
        };
        Ok(Loaded { input, specs })
    };
    // Every (trace, policy), in the rows' order; each runs once its trace is read.
    let jobs: Vec<(usize, (usize, usize))> = (0..count)
        .flat_map(|t| (0..per_trace).map(move |p| (t, (t, p))))
        .collect();
    // After a failed replay, or a trace whose policies do not parse, the jobs after it
    // in input order are not measured: the error is the first in input order, as when
    // they ran one after another.
    let failed = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let job_index = |t: usize, p: usize| t * per_trace + p;
    let cost = |_: &(usize, usize), _: &Loaded| 0.0;
    let run = |&(t, p): &(usize, usize), l: &Loaded| -> Option<anyhow::Result<Measured>> {
        let spec = &l.specs.as_ref()?[p];
        let k = job_index(t, p);
        let refused = |e: &std::sync::Mutex<Option<anyhow::Error>>| {
            e.lock().unwrap_or_else(|e| e.into_inner()).is_some()
        };
        if failed.load(std::sync::atomic::Ordering::Relaxed) < k || errors[..t].iter().any(refused)
        {
            return None;
        }
        let measured = measure(&l.input, spec, &setup, &clock, runs, &bar);
        if measured.is_err() {
            failed.fetch_min(k, std::sync::atomic::Ordering::Relaxed);
        }
        Some(measured)
    };
    let work = sim::compare::Work {
        load: &load,
        cost: &cost,
        run: &run,
    };
    // One thread: a trace is read, its jobs timed one after another with nothing else
    // running, and it is freed before the next is read (`load_and_run` on one thread),
    // so no timed run shares the machine with a load or another replay of this
    // process, and one trace is held at a time. Equal sizes: the traces in input
    // order.
    let sizes = vec![0; count];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("starting the benchmark's thread")?;
    let ran = pool.install(|| sim::compare::load_and_run(&sizes, &jobs, &work, false));
    bar.finish_and_clear();
    let ran = ran?;
    // The first trace whose policies do not parse, then the first failed replay, in
    // input order.
    for error in errors {
        if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
    }
    // A job not measured (after a failed one) comes after that one's error.
    let mut measured = Vec::with_capacity(jobs.len());
    for result in ran.results.into_iter().flatten() {
        measured.push(result?);
    }
    let clock_name = if clock.cpu {
        "CPU time of the replaying thread"
    } else {
        "wall clock"
    };
    let mut out = output::create(None)?;
    match OutputFormat::resolve(args.format, false) {
        OutputFormat::Csv => {
            writeln!(
                out,
                "trace,events,policy,runs,median_seconds,min_seconds,max_seconds,median_events_per_second,min_events_per_second,max_events_per_second"
            )?;
            for m in &measured {
                let (lo, hi) = (m.seconds[0], m.seconds[m.seconds.len() - 1]);
                writeln!(
                    out,
                    "{},{},{},{},{:.9},{:.9},{:.9},{:.0},{:.0},{:.0}",
                    csv_field(&m.trace),
                    m.events,
                    csv_field(&m.policy),
                    m.seconds.len(),
                    m.median(),
                    lo,
                    hi,
                    m.rate(m.median()),
                    m.rate(hi),
                    m.rate(lo)
                )?;
            }
        }
        OutputFormat::Table => {
            writeln!(
                out,
                "replay only (trace in memory), {clock_name}: 1 warm-up run, median of {runs}"
            )?;
            let mut t = Table::new(
                &[
                    "trace", "events", "policy", "median", "events/s", "slowest", "fastest",
                    "spread",
                ],
                &[false, true, false, true, true, true, true, true],
            );
            for m in &measured {
                let (lo, hi) = (m.seconds[0], m.seconds[m.seconds.len() - 1]);
                let median = m.median();
                t.row(vec![
                    m.trace.clone(),
                    m.events.to_string(),
                    m.policy.clone(),
                    format!("{:.2} ms", median * 1e3),
                    millions(m.rate(median)),
                    millions(m.rate(hi)),
                    millions(m.rate(lo)),
                    if median > 0.0 {
                        format!("±{:.1}%", (hi - lo) / median * 50.0)
                    } else {
                        "n/a".to_string()
                    },
                ]);
            }
            write!(out, "{}", t.render())?;
        }
    }
    out.finish()?;
    Ok(Exit::Ran)
}

fn millions(rate: f64) -> String {
    format!("{:.2} M", rate / 1e6)
}

/// A CSV field, quoted where it needs to be.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}
