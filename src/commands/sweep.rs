//! `allocsim sweep` and `allocsim merge`: thin glue over `sim::sweep` (the sweep file,
//! the runs, the ranking and the summary are the library's), with a progress bar and
//! the summary for people.

use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::stats::{Shown, Spread, MIN_VALUES_FOR_INTERVAL};
use sim::sweep::{self, Summary, SweepRecord};
use workloads::size::format_size_human;

use crate::flags::{MergeArgs, SweepArgs};
use crate::output::{self, Kind, Planned};
use crate::table::{OutputFormat, Table};
use crate::{interrupt, Exit};

/// Rows of a trace's ranking shown in the summary; the CSV has them all.
const SHOWN: usize = 10;

pub fn run(args: SweepArgs) -> anyhow::Result<Exit> {
    let mut sweep = sweep::Sweep::read(&args.sweep)?;
    if !args.trace.is_empty() {
        sweep.traces = args
            .trace
            .iter()
            .cloned()
            .map(sim::inputs::TraceSource::File)
            .collect();
    }
    if sweep.traces.is_empty() {
        bail!(
            "{}: traces: none; list them under `traces:` in the file, or give --trace FILE",
            args.sweep.display()
        );
    }
    let mut inputs: Vec<&Path> = vec![args.sweep.as_path()];
    inputs.extend(sweep.traces.iter().filter_map(|t| match t {
        sim::inputs::TraceSource::File(p) => Some(p.as_path()),
        sim::inputs::TraceSource::Generated(_) => None,
    }));
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
    let format = OutputFormat::resolve(args.format, args.output.is_some());
    if args.shard.is_some() && args.output.is_none() && format == OutputFormat::Table {
        bail!("--shard: a shard writes CSV for `allocsim merge`; give -o FILE.csv or --format csv");
    }
    let bar = crate::progress::jobs_bar(sweep::steps(&sweep, args.shard));
    let tick = || bar.inc(1);
    let options = sweep::RunOptions {
        replay: sim::ReplayOptions {
            check_invariants: args.check_invariants,
            continue_after_oom: false,
            interrupt: Some(interrupt::flag()),
        },
        shard: args.shard,
        progress: Some(&tick),
    };
    let outcome = {
        // Ctrl-C stops every replay at its next event; nothing is written then.
        let _in_order = interrupt::in_order();
        sweep::run(&sweep, &options)
    };
    bar.finish_and_clear();
    let outcome = outcome?;
    crate::commands::replay::warn_caveats(outcome.caveats.iter().cloned());
    write(
        &outcome.records,
        outcome.summary.as_ref(),
        format,
        args.output.as_deref(),
    )
}

pub fn merge(args: MergeArgs) -> anyhow::Result<Exit> {
    if let Some(path) = &args.output {
        let inputs: Vec<&Path> = args.shards.iter().map(|p| p.as_path()).collect();
        output::check(
            &[Planned {
                flag: "-o",
                path,
                kind: Kind::Csv,
            }],
            &inputs,
        )?;
    }
    let records = sweep::merge(&args.shards)?;
    let summary = sweep::summarize(&records);
    let format = OutputFormat::resolve(args.format, args.output.is_some());
    write(&records, Some(&summary), format, args.output.as_deref())
}

/// The CSV to `-o` (and the summary to stdout), or to stdout the CSV or the summary.
fn write(
    records: &[SweepRecord],
    summary: Option<&Summary>,
    format: OutputFormat,
    to: Option<&Path>,
) -> anyhow::Result<Exit> {
    if to.is_some() || format == OutputFormat::Csv {
        let mut out = output::create(to)?;
        sim::report::write_records(records.iter().cloned(), &mut out).context("writing the CSV")?;
        out.finish()?;
    }
    if let Some(path) = to {
        eprintln!("wrote {} ({} rows)", path.display(), records.len());
    }
    if to.is_some() || format == OutputFormat::Table {
        if let Some(summary) = summary {
            let mut out = output::create(None)?;
            write!(out, "{}", summary_text(records, summary))?;
            out.finish()?;
        }
    }
    Ok(Exit::Ran)
}

fn h(bytes: u64) -> String {
    format_size_human(bytes)
}

/// A size that may be negative or fractional (a mean, an interval's end).
fn hf(bytes: f64) -> String {
    let rounded = bytes.abs().round() as u64;
    if bytes < 0.0 && rounded > 0 {
        format!("-{}", h(rounded))
    } else {
        h(rounded)
    }
}

fn pct(value: Option<f64>) -> String {
    value.map_or("n/a".to_string(), |u| format!("{:.1}%", u * 100.0))
}

/// The summary for people: per trace the recommendation, the ranking and the settings
/// that changed nothing; across traces the spread of each configuration.
pub fn summary_text(records: &[SweepRecord], summary: &Summary) -> String {
    let mut text = String::new();
    for t in &summary.traces {
        let rows = &t.ranking;
        text += &format!("trace {} ({} rows)\n", t.trace, rows.len());
        match t.recommended.map(|i| &records[i]) {
            Some(best) => {
                text += &format!(
                    "  recommended: {} on {}: reserved peak {} (utilization {})\n",
                    best.policy,
                    best.device,
                    h(best.reserved_bytes_peak),
                    pct(best.utilization_value())
                );
                text += &match &t.needs {
                    Some(fit) => match fit.min_capacity_bytes {
                        Some(min) => format!(
                            "    needs {} of GPU memory: the least total memory it runs in{} \
                             (bisection to the 2 MiB page{})\n",
                            h(min),
                            if best.total_bytes == best.capacity_bytes {
                                String::new()
                            } else {
                                format!(
                                    ", counting {}'s CUDA context and driver reserve",
                                    best.device
                                )
                            },
                            if fit.monotonic {
                                ""
                            } else {
                                "; not monotonic in memory: the smallest size seen to fit"
                            }
                        ),
                        None => "    needs more memory than any GPU has (no fit found)\n".into(),
                    },
                    None => format!(
                        "    needs: `allocsim fit` on this trace with --policies '{}' bisects \
                         the least memory it runs in (merge has no traces)\n",
                        best.policy
                    ),
                };
                text += &match t.default.map(|i| &records[i]) {
                    Some(d) if d.combination == best.combination => {
                        "    it is the default: no configuration of the sweep reserves less\n"
                            .to_string()
                    }
                    Some(d) => match (d.fits(), best.saved_vs_default_bytes) {
                        (false, _) => format!(
                            "    the default, {}, runs out of memory {} on {}\n",
                            d.policy,
                            oom_point(d),
                            d.device
                        ),
                        (true, Some(saved)) => format!(
                            "    saves {} of reserved peak ({:.1}%) against the default, {}\n",
                            hf(saved as f64),
                            saved as f64 * 100.0 / d.reserved_bytes_peak.max(1) as f64,
                            d.policy
                        ),
                        (true, None) => String::new(),
                    },
                    None => String::new(),
                };
            }
            None => {
                text += "  nothing recommended: every configuration runs out of memory on every \
                         device (see the out-of-memory column for the cause and the fix)\n";
            }
        }
        let mut devices: Vec<&str> = Vec::new();
        let mut in_order = rows.clone();
        in_order.sort_unstable();
        for &i in &in_order {
            if !devices.contains(&records[i].device.as_str()) {
                devices.push(&records[i].device);
            }
        }
        for device in &devices {
            let mine: Vec<&SweepRecord> = rows
                .iter()
                .map(|&i| &records[i])
                .filter(|r| r.device == *device)
                .collect();
            if devices.len() > 1 {
                text += &format!("  on {device}:\n");
            }
            text += &ranking_table(&mine);
        }
        for i in &t.inert {
            text += &format!(
                "  warning: {} ({}) changed nothing for this trace: the rows that differ only in \
                 it ({}) have the same peaks and out-of-memory point. {}: {}\n",
                i.key,
                i.policy,
                i.values.join(", "),
                i.key,
                i.help
            );
        }
        text += "\n";
    }
    if summary.traces.len() > 1 {
        text += &across_text(summary.traces.len(), &summary.groups);
    }
    text
}

/// Where a row that ran out of memory ran out: `at event N`, or `before the first
/// event` (a trace that starts mid-run whose starting state the device cannot hold).
fn oom_point(r: &SweepRecord) -> String {
    match r.oom_event_index {
        Some(e) => format!("at event {e}"),
        None => "before the first event (its starting state does not fit)".to_string(),
    }
}

/// One device's rows of a trace, ranked (at most [`SHOWN`]), indented.
fn ranking_table(rows: &[&SweepRecord]) -> String {
    let mut table = Table::new(
        &[
            "rank",
            "policy",
            "reserved peak",
            "utilization",
            "vs default",
            "out of memory",
        ],
        &[true, false, true, true, true, false],
    );
    for r in rows.iter().take(SHOWN) {
        table.row(vec![
            r.rank.map_or("-".to_string(), |k| k.to_string()),
            format!("{}{}", r.policy, if r.default { " (default)" } else { "" }),
            h(r.reserved_bytes_peak),
            pct(r.utilization_value()),
            r.saved_vs_default_bytes
                .map_or("-".to_string(), |s| match s {
                    0 => "same".to_string(),
                    s if s > 0 => format!("saves {}", hf(s as f64)),
                    s => format!("{} more", hf(-s as f64)),
                }),
            if r.fits() {
                "none".to_string()
            } else {
                let why = match (r.oom_cause.as_str(), r.oom_fix.as_str()) {
                    ("", _) => String::new(),
                    (c, "") => format!(" ({c})"),
                    (c, f) => format!(" ({c}; {f} fixes it)"),
                };
                match r.oom_event_index {
                    Some(e) => format!("event {e}{why}"),
                    None => format!("before the first event{why}"),
                }
            } + if r.is_marginal() { " [marginal]" } else { "" },
        ]);
    }
    let mut text = String::new();
    for line in table.render().lines() {
        text += &format!("  {line}\n");
    }
    if rows.iter().take(SHOWN).any(|r| r.is_marginal()) {
        text += "  [marginal]: the outcome may change in another process on the same card (the \
                 driver's hold-back varies between processes)\n";
    }
    if rows.len() > SHOWN {
        let oom = rows.iter().filter(|r| !r.fits()).count();
        let more = rows.len() - SHOWN;
        text += &format!(
            "  ... and {more} more row{}{} (every row is in the CSV: -o FILE.csv)\n",
            if more == 1 { "" } else { "s" },
            match oom {
                0 => String::new(),
                n => format!(", {n} of all {} running out of memory", rows.len()),
            }
        );
    }
    text
}

/// A row of the spreads: its name, the spread, and how a figure is shown.
type Quantity<'a> = (&'a str, Option<Spread>, fn(f64) -> String, (f64, f64));

/// Each configuration's spread over the `traces` traces (at most [`SHOWN`] per device:
/// those that ran out least, by mean reserved peak).
pub fn across_text(traces: usize, groups: &[sim::sweep::GroupStats]) -> String {
    let mut text = format!(
        "across the {traces} traces (rows that ran to the end; mean, median, 95th percentile \
         and the 95% confidence interval of the mean, cut to what each quantity can take):\n"
    );
    let mut ranges = false;
    let mut table = Table::new(
        &[
            "policy", "device", "ran", "quantity", "mean", "median", "p95", "95% CI",
        ],
        &[false, false, true, false, true, true, true, true],
    );
    // Per device, the configurations that ran out least, by mean reserved peak.
    let mut devices: Vec<&str> = Vec::new();
    for g in groups {
        if !devices.contains(&g.device.as_str()) {
            devices.push(&g.device);
        }
    }
    let mut shown = Vec::new();
    let mut left = 0;
    for device in devices {
        let mut mine: Vec<&sim::sweep::GroupStats> =
            groups.iter().filter(|g| g.device == device).collect();
        mine.sort_by(|a, b| {
            let mean = |g: &sim::sweep::GroupStats| {
                g.reserved_bytes_peak.map_or(f64::INFINITY, |s| s.mean)
            };
            a.out_of_memory
                .cmp(&b.out_of_memory)
                .then(mean(a).total_cmp(&mean(b)))
        });
        left += mine.len().saturating_sub(SHOWN);
        shown.extend(mine.into_iter().take(SHOWN));
    }
    for g in shown {
        let ran = format!("{}/{}", g.fits, g.fits + g.out_of_memory);
        let bytes = (0.0, f64::INFINITY);
        let quantities: [Quantity<'_>; 3] = [
            (
                "utilization",
                g.utilization,
                |u| format!("{:.1}%", u * 100.0),
                (0.0, 1.0),
            ),
            ("reserved peak", g.reserved_bytes_peak, hf, bytes),
            ("overhead", g.overhead_bytes, hf, bytes),
        ];
        for (k, (name, spread, show, bounds)) in quantities.into_iter().enumerate() {
            let (policy, device, ran) = if k == 0 {
                (g.policy.clone(), g.device.clone(), ran.clone())
            } else {
                (String::new(), String::new(), String::new())
            };
            let cells = match spread {
                Some(s) => vec![
                    show(s.mean),
                    show(s.median),
                    show(s.p95),
                    match s.shown_interval(bounds) {
                        Shown::Nothing => "-".to_string(),
                        Shown::Range(lo, hi) => {
                            ranges = true;
                            format!("range {} to {}", show(lo), show(hi))
                        }
                        Shown::Interval(lo, hi) => format!("{} to {}", show(lo), show(hi)),
                    },
                ],
                None => vec!["-".to_string(); 4],
            };
            let mut row = vec![policy, device, ran, name.to_string()];
            row.extend(cells);
            table.row(row);
        }
    }
    text += &table.render();
    if ranges {
        text += &format!(
            "range: fewer than {MIN_VALUES_FOR_INTERVAL} rows ran to the end, too few for a \
             confidence interval of the mean (Student's t spans ±12.7 standard errors at 2, \
             ±4.3 at 3): the lowest and the highest value instead\n"
        );
    }
    if left > 0 {
        text += &format!(
            "... and {left} more (configuration, device) pairs that reserve more on average\n"
        );
    }
    text
}
