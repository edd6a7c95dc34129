//! `allocsim diff`: two configurations on one trace, side by side (`sim::diff`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::diff::{event_text, ops_text, Diff, Side};
use workloads::size::format_size_human;
use workloads::Trace;

use crate::flags::DiffArgs;
use crate::output::{self, Kind, Planned};
use crate::progress::Stage;
use crate::table::{OutputFormat, Table};
use crate::{interrupt, load, Exit};

/// Events listed as the cost of the difference; the CSV has every event that changed
/// the gap.
const COSTS_SHOWN: usize = 10;

pub fn run(args: DiffArgs) -> anyhow::Result<Exit> {
    let mut inputs: Vec<&Path> = vec![&args.trace];
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
    if setup.capacities.len() > 1 {
        bail!("--capacity: diff takes one capacity");
    }
    // Flags are checked before the trace is read.
    let specs = load::policies(&args.policies, &setup.caching)?;
    if specs.len() != 2 {
        bail!(
            "--policies: diff compares two configurations, got {}: {}",
            specs.len(),
            specs
                .iter()
                .map(|s| s.label.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let stage = Stage::start(format!("reading {}", args.trace.display()));
    let loaded = load::load_trace(&args.trace, &args.input, &setup.options)?;
    drop(stage);
    // A recorded run on the device it recorded, unless a flag names one (as replay).
    let setup = setup.for_run(loaded.run.as_ref(), &args.device);
    // A recorded run under its recorded settings, unless flags replace them (as replay).
    let settings = load::settings(&loaded.trace.meta, &args.device);
    if let Some(note) = &settings.note {
        eprintln!("{}: {note}", args.trace.display());
    }
    let specs = load::policies(&args.policies, &settings.caching)?;
    let [a, b] = specs.as_slice() else {
        bail!(
            "--policies: diff compares two configurations, got {}: {}",
            specs.len(),
            specs
                .iter()
                .map(|s| s.label.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let input = sim::CompareInput {
        trace: loaded.trace,
        hints: loaded.hints,
    };
    let d = {
        let _in_order = interrupt::in_order();
        let _stage = Stage::start(format!("replaying under {} and {}", a.label, b.label));
        sim::diff::diff(&input, a, b, &setup.options, &setup.replay)?
    };
    let format = OutputFormat::resolve(args.format, args.output.is_some());
    if args.output.is_some() || format == OutputFormat::Csv {
        let mut out = output::create(args.output.as_deref())?;
        let rows = sim::diff::records(&input.trace, &d);
        let n = rows.len();
        sim::report::write_records(rows, &mut out).context("writing the CSV")?;
        out.finish()?;
        if let Some(path) = &args.output {
            eprintln!("wrote {} ({n} rows)", path.display());
        }
    }
    if args.output.is_some() || format == OutputFormat::Table {
        let mut out = output::create(None)?;
        write!(out, "{}", text(&input.trace, &d, &setup.options))?;
        out.finish()?;
    }
    Ok(Exit::Ran)
}

fn h(b: u64) -> String {
    format_size_human(b)
}

fn hi(b: i64) -> String {
    if b < 0 {
        format!("-{}", h(b.unsigned_abs()))
    } else {
        h(b as u64)
    }
}

/// The report for people.
fn text(trace: &Trace, d: &Diff, device: &sim::SimDeviceOptions) -> String {
    let mut out = String::new();
    let source = trace
        .path
        .as_ref()
        .map_or(trace.name.clone(), |p| p.display().to_string());
    let _ = writeln!(
        out,
        "trace               {source}: {} events",
        trace.events.len()
    );
    let _ = writeln!(out, "a                   {}", d.a.label);
    let _ = writeln!(out, "b                   {}", d.b.label);
    let _ = writeln!(
        out,
        "device              {}: total {}, usable {}",
        device.name,
        h(device.total_bytes),
        h(device.capacity_bytes)
    );
    let _ = writeln!(out);
    let mut t = Table::new(&["", "a", "b", "b − a"], &[false, true, true, true]);
    let row = |name: &str, f: &dyn Fn(&Side) -> u64| {
        let (x, y) = (f(&d.a), f(&d.b));
        vec![name.to_string(), h(x), h(y), hi(y as i64 - x as i64)]
    };
    t.row(row("requested peak", &|s| s.summary.requested_bytes_peak));
    t.row(row("allocated peak", &|s| s.summary.allocated_bytes_peak));
    t.row(row("reserved peak", &|s| s.summary.reserved_bytes_peak));
    t.row(row("charged peak", &|s| s.summary.charged_bytes_peak));
    let util = |s: &Side| {
        s.summary
            .utilization()
            .map_or("n/a".to_string(), |u| format!("{:.1}%", u * 100.0))
    };
    t.row(vec![
        "utilization".into(),
        util(&d.a),
        util(&d.b),
        String::new(),
    ]);
    let count = |s: &Side| {
        format!(
            "{} / {}",
            s.summary.device_allocate_count, s.summary.device_free_count
        )
    };
    t.row(vec![
        "device allocs/frees".into(),
        count(&d.a),
        count(&d.b),
        String::new(),
    ]);
    let oom = |s: &Side| {
        s.oom
            .as_ref()
            .map_or("none".to_string(), |o| match o.event_index {
                Some(i) => format!("{}: {}", trace.event_ref(i as usize), h(o.requested_bytes)),
                None => sim::explain::starting_state_cell(o),
            })
    };
    t.row(vec![
        "out of memory".into(),
        oom(&d.a),
        oom(&d.b),
        String::new(),
    ]);
    for line in t.render().lines().skip(2) {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
    // A side that could not hold the trace's starting state replayed nothing to
    // compare with.
    let short: Vec<String> = [("a", &d.a), ("b", &d.b)]
        .into_iter()
        .filter_map(|(name, s)| {
            let o = s.oom.as_ref().filter(|o| o.before_first_event())?;
            Some(format!(
                "{name} ({}) runs out of memory before the first event: {}",
                s.label,
                o.what_did_not_fit()
            ))
        })
        .collect();
    if !short.is_empty() {
        let _ = writeln!(
            out,
            "compared            nothing, event by event: {}",
            short.join("; ")
        );
        return out;
    }
    let reserved = |s: &Side, i: usize| s.trail.reserved.get(i).copied().unwrap_or(0);
    match d.parted_at {
        None if d.start_gap != 0 => {
            let _ = writeln!(
                out,
                "parted at           before the first event: the starting state takes {} under \
                 a, {} under b",
                h(d.a.trail.start_reserved),
                h(d.b.trail.start_reserved)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "parted at           never: both reserve the same bytes after every event"
            );
        }
        Some(i) => {
            let _ = writeln!(
                out,
                "parted at           {}: {}; a then reserves {}, b {}",
                trace.event_ref(i),
                event_text(trace, i),
                h(reserved(&d.a, i)),
                h(reserved(&d.b, i))
            );
        }
    }
    match d.first_decision {
        None => {
            let _ = writeln!(
                out,
                "first decision      none differs: the same device operations at every event"
            );
        }
        Some(i) => {
            let _ = writeln!(
                out,
                "first decision      {}: {}; a: {}; b: {}",
                trace.event_ref(i),
                event_text(trace, i),
                ops_text(&d.a.trail, i),
                ops_text(&d.b.trail, i)
            );
        }
    }
    let Some(higher_is_b) = d.higher_is_b else {
        let _ = writeln!(
            out,
            "the cost            none: the reserved peaks are equal"
        );
        return out;
    };
    let (hi_name, lo_name) = if higher_is_b { ("b", "a") } else { ("a", "b") };
    let peaks =
        d.a.summary
            .reserved_bytes_peak
            .abs_diff(d.b.summary.reserved_bytes_peak);
    let Some(p) = d.peak_event else {
        // The higher side's peak is the starting state of a trace that starts mid-run.
        let _ = writeln!(
            out,
            "the cost            {hi_name}'s reserved peak is {} higher, reached before the \
             first event: its starting state holds {} more than {lo_name}'s",
            h(peaks),
            hi(d.gap_at_peak)
        );
        return out;
    };
    // The gap before the first event, toward the higher side.
    let start_gap = if higher_is_b {
        d.start_gap
    } else {
        -d.start_gap
    };
    let from_start = match start_gap {
        0 => ",".to_string(),
        g if g > 0 => format!(": {} more before the first event, and", h(g.unsigned_abs())),
        g => format!(": {} less before the first event, and", h(g.unsigned_abs())),
    };
    let _ = writeln!(
        out,
        "the cost            {hi_name}'s reserved peak is {} higher; at its peak ({}) {hi_name} \
         holds {} more than {lo_name}{from_start} the sum of what these events added to the gap:",
        h(peaks),
        trace.event_ref(p),
        hi(d.gap_at_peak)
    );
    let mut t = Table::new(
        &[
            "event",
            "request",
            "widened by",
            &format!("{hi_name} did"),
            &format!("{lo_name} did"),
        ],
        &[false, false, true, false, false],
    );
    let (hi_side, lo_side) = if higher_is_b {
        (&d.b, &d.a)
    } else {
        (&d.a, &d.b)
    };
    for c in d.costs.iter().take(COSTS_SHOWN) {
        t.row(vec![
            trace.event_ref(c.event_index),
            event_text(trace, c.event_index),
            hi(c.bytes),
            ops_text(&hi_side.trail, c.event_index),
            ops_text(&lo_side.trail, c.event_index),
        ]);
    }
    for line in t.render().lines() {
        let _ = writeln!(out, "  {line}");
    }
    if d.costs.len() > COSTS_SHOWN {
        let rest: i64 = d.costs[COSTS_SHOWN..].iter().map(|c| c.bytes).sum();
        let _ = writeln!(
            out,
            "  ... and {} more events, {} in all (every one is in the CSV: -o FILE.csv)",
            d.costs.len() - COSTS_SHOWN,
            hi(rest)
        );
    }
    out
}
