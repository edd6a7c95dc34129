//! `allocsim compare`: traces × policies × capacities to CSV.

use std::path::Path;

use std::io::Write as _;

use anyhow::Context;
use workloads::size::format_size_human;

use crate::flags::CompareArgs;
use crate::output::{self, Kind, Planned};
use crate::table::{OutputFormat, Table};
use crate::{interrupt, load, Exit};

pub fn run(args: CompareArgs) -> anyhow::Result<Exit> {
    let mut inputs: Vec<&Path> = args.traces.iter().map(|p| p.as_path()).collect();
    inputs.extend(load::profile_file(&args.device));
    if let Some(path) = &args.output {
        output::check(
            &[Planned {
                flag: "-o",
                path,
                kind: Kind::Csv,
            }],
            &inputs,
        )?;
    }
    let setup = load::device_setup(&args.device)?;
    // Flags are checked before any trace is read.
    let per_trace = load::policies(&args.policies, &setup.caching)?.len();
    let bar =
        crate::progress::jobs_bar((args.traces.len() * per_trace * setup.devices.len()) as u64);
    let rows = {
        // Ctrl-C stops every replay at its next event, and loading before the next
        // trace; nothing is written then.
        let _in_order = interrupt::in_order();
        let batch = load::Batch::new(&args.traces, &args.input, &setup.options, &bar);
        // Each recorded run under its own recorded settings, unless flags replace them:
        // its notes, and its policies (or why they do not parse), kept apart from the
        // trace, which goes once its last replay ends.
        let notes: Vec<std::sync::Mutex<Option<Prepared>>> =
            args.traces.iter().map(|_| Default::default()).collect();
        let load = |i: usize| -> anyhow::Result<Loaded> {
            let (input, run) = batch.load_with_run(i)?;
            let path = &args.traces[i];
            // A recorded run replays on the device it recorded unless a flag names one.
            let device = load::recorded_device(run.as_ref(), &args.device, &setup.options);
            let settings = load::settings(&input.trace.meta, &args.device);
            let mut lines = Vec::new();
            if let Some(note) = &settings.note {
                lines.push(format!("{}: {note}", path.display()));
            }
            if let Some(start) = crate::commands::replay::start_line(&input.trace) {
                lines.push(format!("{}: starts mid-run: {start}", path.display()));
            }
            let specs = load::policies(&args.policies, &settings.caching);
            let (specs, error) = match specs {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e)),
            };
            *notes[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(Prepared { lines, error });
            Ok(Loaded {
                input,
                specs,
                device,
            })
        };
        // Every (trace, policy, device), in the rows' order.
        let devices = setup.devices.len();
        let jobs: Vec<(usize, (usize, usize))> = (0..args.traces.len())
            .flat_map(|t| (0..per_trace).flat_map(move |p| (0..devices).map(move |d| (t, (p, d)))))
            .collect();
        let cost = |&(p, _): &(usize, usize), l: &Loaded| {
            l.specs
                .as_ref()
                .map_or(0.0, |s| sim::replay_cost(&l.input.trace, &s[p].config))
        };
        let run = |&(p, d): &(usize, usize), l: &Loaded| {
            let row = l.specs.as_ref().map(|specs| {
                let device = l.device.as_ref().unwrap_or(&setup.devices[d]);
                sim::compare::run_one(&l.input, &specs[p], device, &setup.replay)
            });
            bar.inc(1);
            row
        };
        let work = sim::compare::Work {
            load: &load,
            cost: &cost,
            run: &run,
        };
        let ran = sim::compare::load_and_run(&batch.sizes(), &jobs, &work, false);
        bar.finish_and_clear();
        let ran = ran?;
        // The notes in input order, up to the first trace whose policies do not parse.
        for prepared in notes {
            let prepared = prepared
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every trace loaded");
            for line in &prepared.lines {
                eprintln!("{line}");
            }
            if let Some(e) = prepared.error {
                return Err(e);
            }
        }
        // The first failed replay in input order, whichever failed first in time.
        ran.results
            .into_iter()
            .map(|r| r.expect("every trace's policies parse"))
            .collect::<Result<Vec<sim::Row>, sim::CompareError>>()?
    };
    crate::commands::replay::warn_caveats(rows.iter().flat_map(|r| {
        r.caveats
            .iter()
            .map(move |c| format!("{} under {}: {c}", r.trace, r.policy))
    }));
    let format = OutputFormat::resolve(args.format, args.output.is_some());
    let mut out = output::create(args.output.as_deref())?;
    match format {
        OutputFormat::Csv => {
            sim::report::write_compare_csv(&rows, &mut out).context("writing the CSV")?
        }
        OutputFormat::Table => {
            write!(out, "{}", table(&rows))?;
            write!(out, "{}", across(&rows))?;
        }
    }
    out.finish()?;
    if let Some(path) = &args.output {
        eprintln!("wrote {} ({} rows)", path.display(), rows.len());
    }
    Ok(Exit::Ran)
}

/// A trace of the batch, loaded, with its policies under its own settings (`None`
/// when they do not parse: the error is in its [`Prepared`]).
struct Loaded {
    input: sim::CompareInput,
    specs: Option<Vec<policies::spec::PolicySpec>>,
    /// The device of a recorded run, where no flag names one (`setup.devices` then holds
    /// one, which it replaces).
    device: Option<sim::SimDeviceOptions>,
}

/// What a trace's loading printed before the batch ran in parallel (each recorded
/// run's settings, a start mid-run), printed in input order once it is done.
struct Prepared {
    lines: Vec<String>,
    error: Option<anyhow::Error>,
}

/// With two traces or more, each (policy, capacity)'s spread across them: mean,
/// median, p95 and the 95% confidence interval (the range below five traces) of
/// utilization, reserved peak and overhead (as `sweep` prints it; `docs/metrics.md`).
fn across(rows: &[sim::Row]) -> String {
    let records: Vec<sim::sweep::SweepRecord> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let device = workloads::size::format_size_exact(r.total_bytes);
            sim::sweep::SweepRecord::of(i as u64, r, &device, false)
        })
        .collect();
    let traces: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.trace.as_str()).collect();
    if traces.len() < 2 {
        return String::new();
    }
    format!(
        "\n{}",
        crate::commands::sweep::across_text(traces.len(), &sim::sweep::group_stats(&records))
    )
}

/// The rows for people: sizes in binary units, the OOM as an event number.
fn table(rows: &[sim::Row]) -> String {
    let h = format_size_human;
    let mut t = Table::new(
        &[
            "trace",
            "policy",
            "total",
            "usable",
            "requested peak",
            "allocated peak",
            "reserved peak",
            "utilization",
            "out of memory",
        ],
        &[false, false, true, true, true, true, true, true, false],
    );
    for r in rows {
        let s = &r.summary;
        t.row(vec![
            r.trace.clone(),
            r.policy.clone(),
            h(r.total_bytes),
            h(r.capacity_bytes),
            h(s.requested_bytes_peak),
            h(s.allocated_bytes_peak),
            h(s.reserved_bytes_peak),
            s.utilization()
                .map_or("n/a".to_string(), |u| format!("{:.1}%", u * 100.0)),
            r.oom.as_ref().map_or("none".to_string(), |o| {
                let why = r
                    .explanation
                    .as_ref()
                    .map_or(String::new(), |e| match e.fix() {
                        Some(f) => format!(" ({}; {} fixes it)", e.cause.name(), f.setting),
                        None => format!(" ({})", e.cause.name()),
                    });
                match o.event_index {
                    Some(i) => format!("event {i}: {}{why}", h(o.requested_bytes)),
                    None => sim::explain::starting_state_cell(o),
                }
            }),
        ]);
    }
    let mut text = t.render();
    // A run that could not hold its starting state: what did not fit, and what helps.
    for r in rows {
        if let Some(o) = r.oom.as_ref().filter(|o| o.before_first_event()) {
            text.push_str(&format!(
                "before the first event: {} under {} on {}: {}\n",
                r.trace,
                r.policy,
                h(r.total_bytes),
                sim::explain::starting_state_verdict(o)
            ));
        }
    }
    // A run whose outcome could change in another process on the same card.
    for r in rows.iter().filter(|r| r.margin.is_marginal()) {
        text.push_str(&format!(
            "marginal: {} under {} on {}: {}\n",
            r.trace,
            r.policy,
            h(r.total_bytes),
            r.margin
        ));
    }
    text
}
