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
    load::policies(&args.policies, &setup.caching)?;
    let inputs = load::load_inputs(&args.traces, &args.input, &setup.options)?;
    // Each recorded run under its own recorded settings, unless flags replace them.
    let mut runs = Vec::with_capacity(inputs.len());
    for (input, path) in inputs.into_iter().zip(&args.traces) {
        let settings = load::settings(&input.trace.meta, &args.device);
        if let Some(note) = &settings.note {
            eprintln!("{}: {note}", path.display());
        }
        if let Some(start) = crate::commands::replay::start_line(&input.trace) {
            eprintln!("{}: starts mid-run: {start}", path.display());
        }
        let specs = load::policies(&args.policies, &settings.caching)?;
        runs.push((input, specs));
    }
    let rows = {
        // Ctrl-C stops every replay at its next event; nothing is written then.
        let _in_order = interrupt::in_order();
        let jobs: Vec<(&sim::CompareInput, &[policies::spec::PolicySpec])> = runs
            .iter()
            .map(|(input, specs)| (input, specs.as_slice()))
            .collect();
        let steps = jobs.iter().map(|(_, s)| s.len()).sum::<usize>() * setup.devices.len();
        let bar = crate::progress::jobs_bar(steps as u64);
        let tick = || bar.inc(1);
        let rows = sim::compare_each(&jobs, &setup.devices, &setup.replay, Some(&tick))?;
        bar.finish_and_clear();
        rows
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
    load::free_in_parallel(runs);
    Ok(Exit::Ran)
}

/// With two traces or more, each (policy, capacity)'s spread across them: mean,
/// median, p95 and the 95% confidence interval of utilization, reserved peak and
/// overhead (as `sweep` prints it; `docs/metrics.md`).
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
                format!("event {}: {}{why}", o.event_index, h(o.requested_bytes))
            }),
        ]);
    }
    let mut text = t.render();
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
