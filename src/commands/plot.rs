//! `allocsim plot`: pictures of replays (memory over the run, or a segment map).

use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use plot::{
    Capture, ImageFormat, Moment, Run, SegmentMap, SegmentPanel, SeriesRecorder, Tick,
    TimelineChart, XAxis,
};
use policies::spec::PolicySpec;
use sim::{SimDevice, SimDeviceOptions};
use units::format_size_human;
use workloads::Trace;

use crate::flags::{PlotArgs, XAxisArg};
use crate::load::{self, DeviceSetup, Loaded};
use crate::output::{self, Kind, Planned};
use crate::{interrupt, Exit};

pub fn run(args: PlotArgs) -> anyhow::Result<Exit> {
    // The picture's format and path are settled before anything is read.
    let format = ImageFormat::from_path(&args.output)?;
    let mut inputs: Vec<&Path> = args.traces.iter().map(|p| p.as_path()).collect();
    inputs.extend(load::profile_file(&args.device));
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Image,
        }],
        &inputs,
    )?;
    if args.segments.is_some() && args.traces.len() > 1 {
        bail!("--segments draws the segments of one trace; give one trace (or draw each in turn)");
    }
    let setup = load::device_setup(&args.device)?;
    if setup.capacities.len() > 1 {
        bail!("--capacity: plot takes one capacity; `allocsim compare` takes several");
    }
    let loaded = args
        .traces
        .iter()
        .map(|p| {
            let _stage = crate::progress::Stage::start(format!("reading {}", p.display()));
            load::load_trace(p, &args.input, &setup.options)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Each recorded run as `replay` replays it: under the settings it recorded, on the
    // device it recorded, unless flags name others.
    let drawn = args
        .traces
        .iter()
        .zip(&loaded)
        .map(|(path, l)| {
            let settings = load::settings(&l.trace.meta, &args.device);
            if let Some(note) = &settings.note {
                eprintln!("note: {}: {note}", path.display());
            }
            Ok(Drawn {
                loaded: l,
                device: load::recorded_device(l.run.as_ref(), &args.device, &setup.options)
                    .unwrap_or_else(|| setup.options.clone()),
                specs: load::policies(&args.policies, &settings.caching)?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bytes = match args.segments {
        None => {
            let chart = timeline_chart(&drawn, &setup, args.x_axis)?;
            plot::render_timeline(&chart, format, args.width, args.height)?
        }
        Some(moment) => {
            let map = segment_map(&drawn[0], &setup, moment)?;
            plot::render_segments(&map, format, args.width)?
        }
    };
    let mut out = output::create(Some(&args.output))?;
    out.write_all(&bytes)
        .with_context(|| format!("writing {}", args.output.display()))?;
    out.finish()?;
    eprintln!("wrote {}", args.output.display());
    Ok(Exit::Ran)
}

/// A trace to draw, with the device and the policies its replays run on.
struct Drawn<'a> {
    loaded: &'a Loaded,
    /// The device it recorded, unless flags name one; else the flags' device.
    device: SimDeviceOptions,
    /// `--policies` under the settings it recorded, unless flags replace them.
    specs: Vec<PolicySpec>,
}

impl Drawn<'_> {
    /// The device a replay under `spec` runs on.
    fn device(&self, spec: &PolicySpec) -> SimDevice {
        SimDevice::with_hints(
            self.device.clone(),
            self.loaded.hints.for_policy(&spec.config),
        )
    }
}

/// Memory over the run of every trace under every policy.
fn timeline_chart(
    drawn: &[Drawn<'_>],
    setup: &DeviceSetup,
    x_axis: Option<XAxisArg>,
) -> anyhow::Result<TimelineChart> {
    let loaded: Vec<&Loaded> = drawn.iter().map(|d| d.loaded).collect();
    let timed = loaded.iter().all(|l| !l.trace.times_us.is_empty());
    // Over time when every trace says when its events happened, unless asked otherwise.
    let x_axis = match (x_axis, timed) {
        (Some(XAxisArg::Events), _) | (None, false) => XAxis::Events,
        (Some(XAxisArg::Time), true) | (None, true) => XAxis::Seconds,
        (Some(XAxisArg::Time), false) => {
            let untimed = loaded
                .iter()
                .find(|l| l.trace.times_us.is_empty())
                .map_or(String::new(), |l| l.trace.name.clone());
            bail!(
                "--x-axis time: {untimed} does not record when its events happened (snapshots, \
                 recorded runs and RMM logs do; YAML and CSV traces do not): use --x-axis events"
            )
        }
    };
    let several = loaded.len() > 1;
    let mut runs = Vec::new();
    let mut ticks = Vec::new();
    for d in drawn {
        let l = d.loaded;
        ticks.extend(Tick::marks(&l.trace, x_axis));
        ticks.extend(annotations(l, x_axis));
        // Requested bytes are the trace's, whatever the policy: drawn once, from the
        // replay that went furthest (a replay stops at its first out-of-memory).
        let mut furthest: Option<(f64, usize, plot::Series)> = None;
        for spec in &d.specs {
            let mut policy = spec.config.build()?;
            let mut device = d.device(spec);
            let mut recorder = SeriesRecorder::new(&l.trace, x_axis);
            let in_order = interrupt::in_order();
            let r = sim::replay_with(
                &l.trace,
                policy.as_mut(),
                &mut device,
                &setup.replay,
                &mut (&mut recorder, crate::progress::EventSpinner::on_terminal()),
            )
            .with_context(|| format!("replaying {} under {}", l.trace.name, spec.label))?;
            drop(in_order);
            // No event to draw: said, and its (empty) lines kept in the legend.
            if let Some(o) = r.oom.as_ref().filter(|o| o.before_first_event()) {
                eprintln!(
                    "note: not drawn: {} under {} runs out of memory before the first event: {}",
                    l.trace.name,
                    spec.label,
                    o.what_did_not_fit()
                );
            }
            let (requested, allocated, reserved, oom) = recorder.finish();
            let label = if several {
                format!("{} · {}", l.trace.name, spec.label)
            } else {
                spec.label.clone()
            };
            let reach = requested.points.last().map_or(0.0, |p| p.x);
            if furthest.as_ref().is_none_or(|(x, _, _)| reach > *x) {
                furthest = Some((reach, runs.len(), requested));
            }
            runs.push(Run {
                label,
                requested: None,
                allocated,
                reserved,
                oom,
            });
        }
        if let Some((_, i, requested)) = furthest {
            runs[i].requested = Some((l.trace.name.clone(), requested));
        }
    }
    let names: Vec<&str> = loaded.iter().map(|l| l.trace.name.as_str()).collect();
    // One device for all: named, its capacity drawn; runs recorded on other devices
    // each replay on their own, and no one capacity line stands for them all.
    let device = &drawn[0].device;
    let one = drawn.iter().all(|d| {
        (
            &d.device.name,
            d.device.capacity_bytes,
            d.device.total_bytes,
        ) == (&device.name, device.capacity_bytes, device.total_bytes)
    });
    Ok(TimelineChart {
        title: if one {
            format!(
                "{}: memory over the run on {}",
                names.join(", "),
                device.name
            )
        } else {
            format!(
                "{}: memory over the run, each on the device it recorded",
                names.join(", ")
            )
        },
        x_axis,
        runs,
        capacity: one.then(|| {
            (
                device.capacity_bytes,
                format!(
                    "capacity {} usable of {}",
                    format_size_human(device.capacity_bytes),
                    format_size_human(device.total_bytes)
                ),
            )
        }),
        ticks,
    })
}

/// Ticks at a snapshot's `annotate` entries and external annotations.
fn annotations(l: &Loaded, x_axis: XAxis) -> Vec<Tick> {
    let Some(info) = l.run.as_ref().and_then(|r| r.snapshot.as_ref()) else {
        return Vec::new();
    };
    // An entry of the file falls before the first event recorded at or after it.
    let at = |entry: u64| -> usize {
        l.trace
            .locations
            .partition_point(|&loc| loc < entry)
            .min(l.trace.events.len().saturating_sub(1))
    };
    let mut out: Vec<Tick> = info
        .annotations
        .iter()
        .map(|a| Tick::at(&l.trace, x_axis, at(a.entry), a.text.clone()))
        .collect();
    out.extend(info.external_annotations.iter().map(|a| {
        let label = a
            .fields
            .iter()
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        Tick::at(&l.trace, x_axis, at(a.entry), label)
    }));
    out
}

/// The segments of `loaded` at `moment` under every policy, one panel each.
fn segment_map(
    drawn: &Drawn<'_>,
    setup: &DeviceSetup,
    moment: Moment,
) -> anyhow::Result<SegmentMap> {
    let trace = &drawn.loaded.trace;
    let options = &drawn.device;
    let mut panels = Vec::new();
    let mut missing = Vec::new();
    for spec in &drawn.specs {
        let at = match moment {
            Moment::Oom => None,
            Moment::Event(n) => {
                if n >= trace.events.len() {
                    bail!(
                        "--segments {n}: the trace has {} events, numbered from 0",
                        trace.events.len()
                    );
                }
                Some(n)
            }
            Moment::Peak => {
                let mut policy = spec.config.build()?;
                let mut device = drawn.device(spec);
                let r = replay(trace, policy.as_mut(), &mut device, setup, &mut ())?;
                match r.summary.reserved_peak_event_index {
                    Some(i) => Some(i as usize),
                    None => bail!(
                        "--segments peak: {} reserves nothing on {}: there is no peak to draw",
                        spec.label,
                        trace.name
                    ),
                }
            }
        };
        let mut policy = spec.config.build()?;
        let mut device = drawn.device(spec);
        let mut capture = Capture::new(at);
        let r = replay(trace, policy.as_mut(), &mut device, setup, &mut capture)?;
        let Some(snapshot) = capture.snapshot else {
            // This policy has nothing to draw at that moment: said, and left out (an
            // error when no policy has anything).
            missing.push(match (at, &r.oom) {
                (_, Some(oom)) if oom.before_first_event() => format!(
                    "--segments: under {} the replay ran out of memory before the first event \
                     (the trace starts mid-run and its starting state does not fit a device of \
                     capacity {}): there is nothing to draw",
                    spec.label,
                    format_size_human(options.capacity_bytes)
                ),
                (None, _) => format!(
                    "--segments oom: {} does not run out of memory on {} at capacity {} \
                     (give a smaller --capacity, or draw peak or an event)",
                    spec.label,
                    trace.name,
                    format_size_human(options.capacity_bytes)
                ),
                (Some(n), Some(oom)) => format!(
                    "--segments {n}: under {} the replay ran out of memory at event {}, \
                     before event {n} (--continue-after-oom replays past it)",
                    spec.label,
                    oom.event_index.unwrap_or_default()
                ),
                (Some(n), None) => format!("--segments {n}: the replay did not reach event {n}"),
            });
            continue;
        };
        let what = match (moment, &r.oom) {
            (Moment::Peak, _) => "peak reserved".to_string(),
            (Moment::Oom, Some(oom)) => format!(
                "out of memory: a {} request failed",
                format_size_human(oom.requested_bytes)
            ),
            _ => "after the event".to_string(),
        };
        // The source's own place, where it differs from the event number.
        let place = trace.location(snapshot.event_index);
        let place = if place == format!("event {}", snapshot.event_index) {
            String::new()
        } else {
            format!("{place}, ")
        };
        panels.push(SegmentPanel {
            title: format!(
                "{} at event {} ({place}{what})",
                spec.label, snapshot.event_index
            ),
            snapshot,
        });
    }
    if panels.is_empty() {
        bail!("{}", missing.join("; "));
    }
    for m in missing {
        eprintln!("note: not drawn: {m}");
    }
    Ok(SegmentMap {
        title: format!("{}: segments on {}", trace.name, options.name),
        panels,
        capacity_bytes: Some(options.capacity_bytes),
    })
}

/// One replay, stopped cleanly by Ctrl-C.
fn replay<O: sim::Observer>(
    trace: &Trace,
    policy: &mut dyn policies::Policy,
    device: &mut SimDevice,
    setup: &DeviceSetup,
    observer: &mut O,
) -> anyhow::Result<sim::Replay> {
    let _in_order = interrupt::in_order();
    let mut observer = (observer, crate::progress::EventSpinner::on_terminal());
    sim::replay_with(trace, policy, device, &setup.replay, &mut observer)
        .with_context(|| format!("replaying {}", trace.name))
}
