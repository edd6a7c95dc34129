//! `allocsim replay`: one trace, one policy, a readable summary.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::{OomExplanation, OomWatch, Replay, SimDevice, TimelineWriter};
use workloads::size::format_size_human;
use workloads::Trace;

use crate::flags::ReplayArgs;
use crate::output::{self, Kind, Planned};
use crate::progress::{EventSpinner, Stage};
use crate::{interrupt, load, Exit};

pub fn run(args: ReplayArgs) -> anyhow::Result<Exit> {
    let mut planned = Vec::new();
    if let Some(path) = &args.timeline {
        planned.push(Planned {
            flag: "--timeline",
            path,
            kind: Kind::Csv,
        });
    }
    if let Some(path) = &args.iterations_csv {
        planned.push(Planned {
            flag: "--iterations-csv",
            path,
            kind: Kind::Csv,
        });
    }
    if !planned.is_empty() {
        let mut inputs: Vec<&Path> = vec![&args.trace];
        inputs.extend(load::profile_file(&args.device));
        output::check(&planned, &inputs)?;
    }
    let iterations = args.iterations || args.iterations_csv.is_some();
    let setup = load::device_setup(&args.device)?;
    if setup.capacities.len() > 1 {
        bail!("--capacity: replay takes one capacity; `allocsim compare` takes several");
    }
    // A CSV trace replays as it is read (memory independent of its length) when
    // nothing asks for the whole trace: no iteration windows, and no out-of-memory to
    // explain (its remedies are checked by replaying the whole trace again). A
    // timeline is written as it goes.
    if !iterations {
        if let Some(exit) = streamed(&args, &setup)? {
            return Ok(exit);
        }
    }
    let stage = Stage::start(format!("reading {}", args.trace.display()));
    let loaded = load::load_trace(&args.trace, &args.input, &setup.options)?;
    drop(stage);
    // A recorded run replays on the device it recorded unless a flag names another.
    let setup = setup.for_run(loaded.run.as_ref(), &args.device);
    let settings = load::settings(&loaded.trace.meta, &args.device);
    let specs = load::policies(std::slice::from_ref(&args.policy), &settings.caching)?;
    let [spec] = specs.as_slice() else {
        bail!("--policy takes one policy; `allocsim compare --policies` takes several");
    };
    let mut policy = spec.config.build()?;
    let mut device =
        SimDevice::with_hints(setup.options.clone(), loaded.hints.for_policy(&spec.config));
    let windows = iterations.then(|| {
        sim::iterations::IterationWatch::new(sim::iterations::boundaries(
            &loaded.trace,
            loaded.run.as_ref(),
            args.mark.as_deref(),
        ))
    });
    // The timeline is written as the replay makes it, never held: its output is
    // created now, and a failure to create it is reported where the file is finished
    // (after the replay, as every output is).
    let (timeline, timeline_unmade) = match args.timeline.as_ref().map(|p| output::create(Some(p)))
    {
        Some(Ok(out)) => (Some(TimelineWriter::new(out)), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let mut observer = (
        (timeline, windows),
        (OomWatch::default(), EventSpinner::on_terminal()),
    );
    // Ctrl-C stops the replay at its next event; nothing is written then.
    let in_order = interrupt::in_order();
    let r = sim::replay_with(
        &loaded.trace,
        policy.as_mut(),
        &mut device,
        &setup.replay,
        &mut observer,
    )
    .with_context(|| format!("replaying {}", args.trace.display()))?;
    let ((timeline, windows), (watch, spinner)) = observer;
    drop(spinner);
    let windows = windows.map(|w| w.finish(r.oom.as_ref().and_then(|o| o.event_index)));
    let mut why = watch.explanation;
    // The remedies and the margin replay the trace again, and the stack of the
    // out-of-memory reads a snapshot again.
    let stage = (why.is_some() || setup.options.usable_spread_bytes > 0)
        .then(|| Stage::start("replaying again for the explanation and the margin".to_string()))
        .flatten();
    if let Some(e) = &mut why {
        sim::explain::check_remedies(
            e,
            &loaded.trace,
            &loaded.hints,
            &spec.config,
            &setup.options,
            &setup.replay,
        )?;
    }
    // Fits (or runs out) with less than the driver's variation between processes to
    // spare: another process may see the other outcome.
    let margin = sim::boundary::margin(
        &loaded.trace,
        &loaded.hints,
        &spec.config,
        &setup.options,
        &setup.replay,
        r.oom.is_none(),
    )?;
    drop(in_order);
    let stack = match &why {
        Some(e) => frames_of(&args, &loaded.trace, e.event_index),
        None => Vec::new(),
    };
    drop(stage);
    let label = policy_label(spec);
    let caveats = sim::caveats(&loaded.trace, &spec.config, &r);
    warn_caveats(caveats.iter().cloned());
    // The timeline file is complete before the summary says the replay is done.
    if let Some(e) = timeline_unmade {
        return Err(e);
    }
    finish_timeline(args.timeline.as_deref(), timeline)?;
    if let (Some(path), Some(windows)) = (&args.iterations_csv, &windows) {
        let mut out = output::create(Some(path))?;
        sim::report::write_records(
            windows
                .iter()
                .map(|w| sim::iterations::IterationRecord::of(w, args.warmup)),
            &mut out,
        )
        .with_context(|| format!("writing {}", path.display()))?;
        out.finish()?;
        eprintln!("wrote {} ({} rows)", path.display(), windows.len());
    }
    let mut out = output::create(None)?;
    let mut text = summary(
        &loaded.trace,
        (
            loaded.trace.events.len() as u64,
            loaded.trace.alloc_count() as u64,
        ),
        &|i| loaded.trace.event_ref(i),
        &label,
        device.options(),
        &r,
    );
    // What the summary's policy line rests on, right after it: the recorded settings
    // in force, and where the trace starts.
    let mut extra = String::new();
    if let Some(note) = &settings.note {
        extra += &format!("settings            {note}\n");
    }
    if let Some(start) = start_line(&loaded.trace) {
        extra += &format!("starts mid-run      {start}\n");
    }
    if let Some(at) = text.find("\ndevice ") {
        text.insert_str(at + 1, &extra);
    }
    write!(out, "{text}")?;
    if margin.is_marginal() {
        writeln!(out, "marginal            {margin}")?;
    }
    for c in &caveats {
        writeln!(out, "not exact           {c}")?;
    }
    if let Some(e) = &why {
        write!(out, "{}", why_text(&loaded.trace, e, &stack))?;
    } else if let Some(o) = r.oom.as_ref().filter(|o| o.before_first_event()) {
        writeln!(
            out,
            "why it ran out      {}",
            sim::explain::starting_state_verdict(o)
        )?;
    }
    if let Some(windows) = &windows {
        write!(
            out,
            "{}",
            iterations_text(windows, args.warmup, args.mark.as_deref())
        )?;
    }
    if args.stats {
        writeln!(out)?;
        write!(out, "{}", stats_table(&policy.detailed_stats()))?;
    }
    out.finish()?;
    Ok(Exit::Ran)
}

/// The policy as the summary names it, with the settings that are not its defaults.
/// Completes the timeline written as the replay went (`--timeline`) and says so: the
/// file is complete before the summary says the replay is done.
fn finish_timeline(
    path: Option<&Path>,
    timeline: Option<TimelineWriter<output::Output>>,
) -> anyhow::Result<()> {
    if let (Some(path), Some(timeline)) = (path, timeline) {
        let (rows, out) = timeline
            .finish()
            .with_context(|| format!("writing {}", path.display()))?;
        out.finish()?;
        eprintln!("wrote {} ({rows} rows)", path.display());
    }
    Ok(())
}

fn policy_label(spec: &policies::spec::PolicySpec) -> String {
    match spec.config.options::<policies::caching::CachingConfig>() {
        Some(c) => {
            let conf = c.to_alloc_conf();
            let limit = match c.memory_limit {
                policies::caching::MemoryLimit::FromConfig => String::new(),
                limit => format!(", memory limit: {limit}"),
            };
            if conf.is_empty() && limit.is_empty() {
                spec.label.clone()
            } else {
                format!("{} (PYTORCH_CUDA_ALLOC_CONF={conf:?}{limit})", spec.label)
            }
        }
        None => spec.label.clone(),
    }
}

/// `replay` of a CSV trace or an RMM log as it is read (`sim::inputs::stream_replay`):
/// the same summary as from the whole trace, in memory that follows the live
/// allocations. `None` when the trace needs the whole-trace path instead: another
/// format, a problem to report (the whole-trace reader lists them all), named ids or
/// allocator calls, or an out-of-memory to explain. A policy that does not build is reported there too,
/// so errors come in the same order either way.
fn streamed(args: &ReplayArgs, setup: &load::DeviceSetup) -> anyhow::Result<Option<Exit>> {
    use sim::inputs::{StreamError, Streamed};
    // A device whose usable memory varies between processes needs the whole trace to
    // replay again within that band (the marginal check).
    if setup.capacities.len() > 1 || setup.options.usable_spread_bytes > 0 {
        return Ok(None);
    }
    // Streaming reads the file twice (its first bytes, then the whole, and again after
    // an out-of-memory): a pipe is read once, whole.
    if !load::rereadable(&args.trace) {
        return Ok(None);
    }
    let mut options = load::load_options(&args.input);
    // A second core, where the process may use one, reads an RMM log ahead of the
    // replay.
    options.read_ahead = !args.one_thread;
    // A timeline streams from a CSV trace only (below).
    if args.timeline.is_none() {
        let stage = Stage::start(format!("reading {} (first pass)", args.trace.display()));
        let stream = sim::inputs::SnapshotStream::open(&args.trace, &options, &setup.options);
        drop(stage);
        if let Some(stream) = stream {
            return streamed_snapshot(args, setup, &stream, options.lenient);
        }
    }
    // CSV traces and RMM logs stream; problems are reported by the whole-trace path.
    let Ok(Ok(format)) = sim::inputs::streamed_format(&args.trace, &options) else {
        return Ok(None);
    };
    let meta = workloads::TraceMeta::of_format(format);
    let Some((settings, spec)) = streamed_spec(args, &meta) else {
        return Ok(None);
    };
    // The timeline is written as the replay makes it, from a CSV trace only: its rows
    // show the ids as the engine numbers them, and an RMM log's stream gives a freed
    // pointer's id again where the whole log's reader gives each pointer one id. Where
    // its output cannot be made, the whole-trace path says so, at its place.
    if args.timeline.is_some() && format != workloads::Format::Csv {
        return Ok(None);
    }
    let timeline = match &args.timeline {
        Some(path) => match output::create(Some(path)) {
            Ok(out) => Some(TimelineWriter::new(out)),
            Err(_) => return Ok(None),
        },
        None => None,
    };
    // A CSV trace records no addresses: no hints.
    let mut device = SimDevice::new(setup.options.clone());
    let mut observer = ((OomWatch::default(), EventSpinner::on_terminal()), timeline);
    let in_order = interrupt::in_order();
    // The policy as its own type: the engine calls it directly.
    let run = StreamRun {
        trace: &args.trace,
        options: &options,
        device: &mut device,
        replay: &setup.replay,
        observer: &mut observer,
        stats: args.stats,
    };
    let Ok((streamed, stats)) = spec.config.with_policy(run) else {
        return Ok(None);
    };
    drop(in_order);
    let ((watch, spinner), timeline) = observer;
    drop(spinner);
    let (shell, counts, r) = match streamed {
        Ok(Streamed::Replayed {
            shell,
            events,
            allocs,
            replay,
        }) if watch.explanation.is_none() => (shell, (events, allocs), replay),
        Ok(_) | Err(StreamError::Read(_)) => return Ok(None),
        Err(StreamError::Replay(e)) => {
            return Err(e).with_context(|| format!("replaying {}", args.trace.display()))
        }
    };
    let label = policy_label(&spec);
    let caveats = sim::caveats(&shell, &spec.config, &r);
    warn_caveats(caveats.iter().cloned());
    // The timeline file is complete before the summary says the replay is done.
    finish_timeline(args.timeline.as_deref(), timeline)?;
    let line = match format {
        workloads::Format::Rmm => workloads::rmm::RmmEvents::<std::fs::File>::line_of,
        _ => workloads::csv::CsvEvents::<std::fs::File>::line_of,
    };
    let text = summary(
        &shell,
        counts,
        &|i| format!("event {i} (line {})", line(i)),
        &label,
        device.options(),
        &r,
    );
    print_streamed(text, settings.note.as_deref(), None, &caveats, stats)?;
    Ok(Some(Exit::Ran))
}

/// A streamed replay ([`sim::inputs::stream_replay`]) run on the policy as its own type
/// (`PolicyConfig::with_policy`), with the policy's own statistics after it where asked
/// (`--stats`).
struct StreamRun<'a, O> {
    trace: &'a std::path::Path,
    options: &'a sim::inputs::LoadOptions,
    device: &'a mut SimDevice,
    replay: &'a sim::ReplayOptions,
    observer: &'a mut O,
    stats: bool,
}

impl<O: sim::Observer> policies::PolicyVisitor for StreamRun<'_, O> {
    type Output = (
        Result<sim::inputs::Streamed, sim::inputs::StreamError>,
        Option<Vec<(String, i64)>>,
    );

    fn visit<P: policies::Policy + policies::AsDynPolicy + ?Sized>(
        self,
        policy: &mut P,
    ) -> Self::Output {
        let streamed = sim::inputs::stream_replay(
            self.trace,
            self.options,
            policy,
            self.device,
            self.replay,
            self.observer,
        );
        (streamed, self.stats.then(|| policy.detailed_stats()))
    }
}

/// The settings and the one policy for a streamed replay of a trace of `meta`, whose
/// options make a policy; `None` where any of them fails, so that the whole-trace path
/// reports it (errors in the same order either way).
fn streamed_spec(
    args: &ReplayArgs,
    meta: &workloads::TraceMeta,
) -> Option<(sim::recorded::Settings, policies::spec::PolicySpec)> {
    let settings = load::settings(meta, &args.device);
    let specs = load::policies(std::slice::from_ref(&args.policy), &settings.caching).ok()?;
    let [spec] = <[_; 1]>::try_from(specs).ok()?;
    spec.config.validate().ok()?;
    Some((settings, spec))
}

/// [`streamed_spec`] with the policy built (as a `dyn Policy`).
fn streamed_policy(
    args: &ReplayArgs,
    meta: &workloads::TraceMeta,
) -> Option<(
    sim::recorded::Settings,
    policies::spec::PolicySpec,
    Box<dyn policies::Policy>,
)> {
    let (settings, spec) = streamed_spec(args, meta)?;
    let policy = spec.config.build().ok()?;
    Some((settings, spec, policy))
}

/// Prints a streamed replay's summary (`text`, from [`summary`]) as the whole-trace path
/// prints it: the recorded settings' `note` and where the trace starts (`start`, from
/// [`start_line`]) in it, each caveat, and `stats` (the policy's own statistics, with
/// `--stats`).
fn print_streamed(
    mut text: String,
    note: Option<&str>,
    start: Option<String>,
    caveats: &[String],
    stats: Option<Vec<(String, i64)>>,
) -> anyhow::Result<()> {
    let mut out = output::create(None)?;
    let mut extra = String::new();
    if let Some(note) = note {
        extra += &format!("settings            {note}\n");
    }
    if let Some(start) = start {
        extra += &format!("starts mid-run      {start}\n");
    }
    if let Some(at) = text.find("\ndevice ") {
        text.insert_str(at + 1, &extra);
    }
    write!(out, "{text}")?;
    for c in caveats {
        writeln!(out, "not exact           {c}")?;
    }
    if let Some(stats) = stats {
        writeln!(out)?;
        write!(out, "{}", stats_table(&stats))?;
    }
    out.finish()?;
    Ok(())
}

/// `replay` of a snapshot pickle in two passes over the file
/// (`sim::inputs::SnapshotStream`): the same summary as from the whole trace, in memory
/// that follows the live blocks and segments. `None` when the trace needs the
/// whole-trace path instead (as [`streamed`]).
fn streamed_snapshot(
    args: &ReplayArgs,
    setup: &load::DeviceSetup,
    stream: &sim::inputs::SnapshotStream,
    lenient: bool,
) -> anyhow::Result<Option<Exit>> {
    let shell = stream.shell();
    let Some((settings, spec, mut policy)) = streamed_policy(args, &shell.meta) else {
        return Ok(None);
    };
    let mut device = SimDevice::with_hints(
        setup.options.clone(),
        stream.hints().for_policy(&spec.config),
    );
    let mut observer = (OomWatch::default(), EventSpinner::on_terminal());
    let in_order = interrupt::in_order();
    let streamed = stream.replay(
        policy.as_mut(),
        &mut device,
        &setup.replay,
        lenient,
        &mut observer,
    );
    drop(in_order);
    let (watch, spinner) = observer;
    drop(spinner);
    let s = match streamed {
        Ok(Some(s)) if watch.explanation.is_none() && s.replay.oom.is_none() => s,
        Ok(_) | Err(sim::inputs::StreamError::Read(_)) => return Ok(None),
        Err(sim::inputs::StreamError::Replay(e)) => {
            return Err(e).with_context(|| format!("replaying {}", args.trace.display()))
        }
    };
    let r = s.replay;
    let label = policy_label(&spec);
    let caveats = sim::caveats(shell, &spec.config, &r);
    warn_caveats(caveats.iter().cloned());
    let peak = (r.summary.reserved_peak_event_index, s.reserved_peak_entry);
    let text = summary(
        shell,
        (s.events, s.allocs),
        &|i| match peak {
            (Some(p), Some(entry)) if p == i as u64 => format!("event {i} (entry {entry})"),
            _ => format!("event {i}"),
        },
        &label,
        device.options(),
        &r,
    );
    let stats = args.stats.then(|| policy.detailed_stats());
    print_streamed(
        text,
        settings.note.as_deref(),
        start_line(shell),
        &caveats,
        stats,
    )?;
    Ok(Some(Exit::Ran))
}

/// Iterations shown in the summary; the CSV has them all.
const ITERATIONS_SHOWN: usize = 20;

/// The per-iteration section: each window's peaks, then the steady state.
fn iterations_text(
    windows: &[sim::iterations::Window],
    warmup: usize,
    mark: Option<&str>,
) -> String {
    let h = format_size_human;
    let mut out = String::new();
    let cut = match mark {
        Some(m) => format!("marks and annotations containing {m:?}"),
        None => "marks and annotations".to_string(),
    };
    let cut_at = windows.iter().filter(|w| w.index > 0).count();
    if cut_at == 0 {
        let _ = writeln!(
            out,
            "iterations          none: the trace has no {cut} to cut it at"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "iterations          {cut_at} from {cut}; {} (--warmup {warmup})",
        match warmup {
            0 => "no warm-up".to_string(),
            1 => "the first is warm-up".to_string(),
            n => format!("the first {n} are warm-up"),
        }
    );
    let mut t = crate::table::Table::new(
        &[
            "iteration",
            "label",
            "events",
            "requested peak",
            "allocated peak",
            "reserved peak",
            "utilization",
            "segment allocs",
            "note",
        ],
        &[true, false, false, true, true, true, true, true, false],
    );
    for w in windows.iter().take(ITERATIONS_SHOWN) {
        t.row(vec![
            w.index.to_string(),
            w.label.clone(),
            format!("{}-{}", w.first_event, w.last_event),
            h(w.requested_bytes_peak),
            h(w.allocated_bytes_peak),
            h(w.reserved_bytes_peak),
            w.utilization()
                .map_or("n/a".to_string(), |u| format!("{:.1}%", u * 100.0)),
            w.device_allocs.to_string(),
            match (w.index, w.complete) {
                (_, false) => "ran out of memory".to_string(),
                (0, _) => "before the first".to_string(),
                (i, _) if i <= warmup => "warm-up".to_string(),
                _ => String::new(),
            },
        ]);
    }
    for line in t.render().lines() {
        let _ = writeln!(out, "  {}", line.trim_end());
    }
    if windows.len() > ITERATIONS_SHOWN {
        let _ = writeln!(
            out,
            "  ... and {} more (every one is in --iterations-csv FILE.csv)",
            windows.len() - ITERATIONS_SHOWN
        );
    }
    let s = sim::iterations::steady_state(windows, warmup);
    if s.iterations == 0 {
        let _ = writeln!(
            out,
            "steady state        none: no complete iteration after the warm-up (--warmup {warmup})"
        );
        return out;
    }
    // Every quantity here is a count, bytes or a utilization: none below 0.
    let spread = |sp: Option<sim::stats::Spread>, show: &dyn Fn(f64) -> String, top: f64| {
        use sim::stats::Shown;
        match sp {
            Some(sp) => format!(
                "mean {}, median {}, p95 {}{}",
                show(sp.mean),
                show(sp.median),
                show(sp.p95),
                match sp.shown_interval((0.0, top)) {
                    Shown::Nothing => String::new(),
                    Shown::Range(lo, hi) => format!(
                        ", range {} to {} (too few iterations for a 95% CI)",
                        show(lo),
                        show(hi)
                    ),
                    Shown::Interval(lo, hi) => format!(", 95% CI {} to {}", show(lo), show(hi)),
                }
            ),
            None => "n/a".to_string(),
        }
    };
    let bytes = |b: f64| {
        if b < 0.0 {
            format!("-{}", h((-b).round() as u64))
        } else {
            h(b.round() as u64)
        }
    };
    let _ = writeln!(
        out,
        "steady state        {} iterations after the warm-up",
        s.iterations
    );
    let _ = writeln!(
        out,
        "  reserved peak     {}",
        spread(s.reserved_bytes_peak, &bytes, f64::INFINITY)
    );
    let _ = writeln!(
        out,
        "  utilization       {}",
        spread(s.utilization, &|u| format!("{:.1}%", u * 100.0), 1.0)
    );
    let _ = writeln!(
        out,
        "  segment allocs    {} per iteration",
        spread(s.device_allocs, &|n| format!("{n:.1}"), f64::INFINITY)
    );
    out
}

/// Prints each reason a result is not exact as a `warning:` line on stderr, once.
pub fn warn_caveats(caveats: impl Iterator<Item = String>) {
    let mut seen = std::collections::BTreeSet::new();
    for c in caveats {
        if seen.insert(c.clone()) {
            eprintln!("warning: {c}");
        }
    }
}

fn bytes(b: u64) -> String {
    format!("{:>12}  ({b} bytes)", format_size_human(b))
}

/// The policy's own statistics, aligned: name, value, and for byte counts the size in
/// binary units.
fn stats_table(stats: &[(String, i64)]) -> String {
    let width = stats.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in stats {
        let human = match u64::try_from(*value) {
            Ok(v) if key.contains("bytes") => format!("  {}", format_size_human(v)),
            _ => String::new(),
        };
        let _ = writeln!(out, "{key:<width$}  {value:>15}{human}");
    }
    out
}

/// The stack frames PyTorch recorded for the entry of event `index`, innermost first,
/// when the trace is a snapshot pickle that has them (`workloads::snapshot::event_stack`);
/// empty otherwise (and for a snapshot read from a pipe).
fn frames_of(args: &ReplayArgs, trace: &Trace, index: u64) -> Vec<String> {
    // A pipe was read: its content is gone.
    if trace.meta.format != Some(workloads::Format::TorchPickle) || !load::rereadable(&args.trace) {
        return Vec::new();
    }
    match std::fs::File::open(&args.trace) {
        Ok(file) => workloads::snapshot::event_stack(
            trace,
            index,
            std::io::BufReader::new(file),
            args.input.read.snapshot_device,
        ),
        Err(_) => Vec::new(),
    }
}

/// The "why it ran out" section of the summary.
fn why_text(trace: &Trace, e: &OomExplanation, stack: &[String]) -> String {
    let h = format_size_human;
    let b = &e.breakdown;
    let mut out = String::new();
    let _ = writeln!(out, "why it ran out      {}", e.verdict());
    let mark = e.last_mark.as_ref().map_or(String::new(), |(i, label)| {
        format!(", after mark {label:?} ({})", trace.event_ref(*i as usize))
    });
    let _ = writeln!(
        out,
        "  request           {}: alloc id {} of {} (rounded {}) on stream {}{mark}",
        trace.event_ref(e.event_index as usize),
        e.id,
        h(e.requested_bytes),
        h(e.rounded_bytes),
        e.stream
    );
    let _ = writeln!(
        out,
        "  memory then       requested {}, allocated {}, reserved {}, cached {}; the allocator could hold {}",
        h(e.live_requested_bytes),
        h(e.allocated_bytes),
        h(e.reserved_bytes),
        h(e.cached_bytes),
        h(e.usable_bytes)
    );
    let _ = writeln!(
        out,
        "  largest free      {} (usable by this request: {}) against {} asked",
        h(e.largest_free_block_bytes),
        h(e.largest_usable_block_bytes),
        h(e.rounded_bytes)
    );
    let _ = writeln!(
        out,
        "  free by cause     rounding {}, unsplit remainders {}, too small {}, other pool {}, \
         unsplittable {}, other streams' caches {}, pending frees {}, device free {}, \
         shortage {}",
        h(b.rounding_bytes),
        h(b.unsplit_remainder_bytes),
        h(b.too_small_bytes),
        h(b.other_pool_bytes),
        h(b.unsplittable_bytes),
        h(b.other_stream_bytes),
        h(b.pending_free_bytes),
        h(b.device_free_bytes),
        h(b.shortage_bytes)
    );
    for (i, s) in e.top_segments.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {}segment {:#x} ({}, stream {}, {}): {} free, largest block {}",
            if i == 0 {
                "most free in      "
            } else {
                "                  "
            },
            s.addr,
            s.pool,
            s.stream,
            h(s.size_bytes),
            h(s.free_bytes),
            h(s.largest_free_block_bytes)
        );
    }
    for r in &e.remedies {
        let result = match r.oom_event_index {
            None => format!(
                "runs to the end, reserved peak {}",
                h(r.reserved_bytes_peak)
            ),
            Some(i) => format!("still runs out, at {}", trace.event_ref(i as usize)),
        };
        let _ = writeln!(out, "  tried             {}: {result}", r.spec);
    }
    for (i, f) in stack.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {}{f}",
            if i == 0 {
                "stack             "
            } else {
                "                  "
            }
        );
    }
    out
}

/// For a trace that starts mid-run, what its replay starts from and what that
/// assumes (one line); `None` for a trace that starts from an empty allocator.
pub fn start_line(trace: &Trace) -> Option<String> {
    let start = trace.start.as_ref()?;
    let unsized_blocks = start.unsized_block_count();
    let sizes = if unsized_blocks == 0 {
        String::new()
    } else {
        format!(
            "; {unsized_blocks} of the blocks were freed inside the trace without their size recorded, \
             and get the size PyTorch's splitting rules give their request"
        )
    };
    Some(format!(
        "the recording's ring buffer wrapped or it began late; its first entry finds {}, \
         rebuilt from the final segments by undoing the trace{sizes}",
        start.describe()
    ))
}

/// A size in binary units with its exact bytes: `1.50 GiB (1610612736 bytes)`.
fn human_exact(b: u64) -> String {
    format!("{} ({b} bytes)", format_size_human(b))
}

/// The readable summary of one replay.
///
/// `counts` are the trace's events and `alloc` events, and `event_ref` names an event
/// as [`Trace::event_ref`] does (a streamed trace holds neither).
pub fn summary(
    trace: &Trace,
    counts: (u64, u64),
    event_ref: &dyn Fn(usize) -> String,
    policy: &str,
    device: &sim::SimDeviceOptions,
    r: &Replay,
) -> String {
    let s = &r.summary;
    let mut out = String::new();
    let source = trace
        .path
        .as_ref()
        .map_or(trace.name.clone(), |p| p.display().to_string());
    let _ = writeln!(
        out,
        "trace               {source}: {} events, {} allocations",
        counts.0, counts.1
    );
    let _ = writeln!(out, "policy              {policy}");
    let kept = device.reserved_by_driver_bytes();
    let kept = if kept == 0 {
        String::new()
    } else {
        format!(
            " (the CUDA context and the driver keep {})",
            format_size_human(kept)
        )
    };
    let _ = writeln!(
        out,
        "device              {}: total {}, usable {}{kept}",
        device.name,
        format_size_human(device.total_bytes),
        format_size_human(device.capacity_bytes),
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "peak requested      {}", bytes(s.requested_bytes_peak));
    let _ = writeln!(out, "peak allocated      {}", bytes(s.allocated_bytes_peak));
    let at = s
        .reserved_peak_event_index
        .map(|i| format!(", first at {}", event_ref(i as usize)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "peak reserved       {}{at}",
        bytes(s.reserved_bytes_peak)
    );
    let _ = writeln!(
        out,
        "peak charged        {}  (driver pages)",
        bytes(s.charged_bytes_peak)
    );
    let util = s
        .utilization()
        .map_or("n/a".to_string(), |u| format!("{u:.6}"));
    let _ = writeln!(
        out,
        "utilization         {util:>12}  (allocated peak / reserved peak)"
    );
    let _ = writeln!(
        out,
        "cached at peak      {}",
        bytes(s.cached_bytes_at_reserved_peak())
    );
    let _ = writeln!(out, "segments (peak)     {:>12}", s.segment_count_peak);
    let _ = writeln!(
        out,
        "device allocs/frees {:>12}",
        format!("{} / {}", s.device_allocate_count, s.device_free_count)
    );
    match &r.oom {
        None => {
            let _ = writeln!(out, "out of memory       {:>12}", "none");
        }
        Some(o) => {
            match o.event_index {
                Some(i) => {
                    let _ = writeln!(
                        out,
                        "out of memory       at {}: request of {}, tried to get {} from the device",
                        trace.event_ref(i as usize),
                        human_exact(o.requested_bytes),
                        human_exact(o.tried_bytes)
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "out of memory       before the first event: {}",
                        o.what_did_not_fit()
                    );
                }
            }
            let _ = writeln!(
                out,
                "  state then        allocated {}, reserved {}, device free {}",
                human_exact(o.policy.allocated_bytes),
                human_exact(o.policy.reserved_bytes),
                human_exact(o.device.free_bytes())
            );
            if let Some(m) = o.message.as_ref().filter(|_| !o.before_first_event()) {
                let _ = writeln!(out, "  policy says       {m}");
            }
            if r.oom_count > 1 {
                let _ = writeln!(out, "  out-of-memory events in all: {}", r.oom_count);
            }
        }
    }
    let _ = writeln!(
        out,
        "events replayed     {:>12}  of {}",
        s.event_count, counts.0
    );
    let _ = writeln!(
        out,
        "live at end         {:>12}  allocations",
        r.live_allocation_count
    );
    if r.skipped_event_count > 0 {
        let _ = writeln!(out, "skipped events      {:>12}", r.skipped_event_count);
    }
    out
}
