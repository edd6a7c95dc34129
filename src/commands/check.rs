//! `allocsim check`: every problem of every trace, one per line.

use std::io::Write as _;
use std::path::Path;

use workloads::csv::{CsvEvents, EventStream};
use workloads::rmm::RmmEvents;
use workloads::validate::{validate, Severity, Validator};
use workloads::Format;

use crate::flags::CheckArgs;
use crate::progress::Stage;
use crate::Exit;

pub fn run(args: CheckArgs) -> anyhow::Result<Exit> {
    let mut bad = false;
    let mut out = crate::output::create(None)?;
    for path in &args.traces {
        // A clean CSV trace or RMM log is checked as it is read, without holding it;
        // anything else, or a file with a problem to list, is read whole.
        let stage = Stage::start(format!("checking {}", path.display()));
        if let Some(events) = streamed(path, &args) {
            drop(stage);
            writeln!(
                out,
                "{}: {events} events, 0 errors, 0 warnings",
                path.display()
            )?;
            continue;
        }
        Stage::set(&stage, format!("reading {}", path.display()));
        let read =
            workloads::read_source(path, args.input.trace_format, args.input.snapshot_device);
        let trace = match read {
            Ok((trace, _)) => trace,
            Err(e) => {
                drop(stage);
                // Unreadable: the problems the reader kept (the first hundred), then
                // how many it found, then the next file.
                for problem in e.all() {
                    writeln!(out, "{}", problem.one())?;
                }
                let unlisted = e.count() - e.all().count() as u64;
                if unlisted > 0 {
                    writeln!(out, "{}: ... and {unlisted} more", path.display())?;
                }
                writeln!(
                    out,
                    "{}: unreadable, {} problem{}",
                    path.display(),
                    e.count(),
                    if e.count() == 1 { "" } else { "s" }
                )?;
                bad = true;
                continue;
            }
        };
        Stage::set(&stage, format!("checking {}", path.display()));
        let issues = validate(&trace);
        drop(stage);
        let errors = issues
            .iter()
            .filter(|i| i.severity == Severity::Error)
            .count();
        for issue in &issues {
            writeln!(out, "{}", issue.display_with(&trace))?;
        }
        writeln!(
            out,
            "{}: {} events, {} error{}, {} warning{}",
            path.display(),
            trace.events.len(),
            errors,
            if errors == 1 { "" } else { "s" },
            issues.len() - errors,
            if issues.len() - errors == 1 { "" } else { "s" },
        )?;
        bad |= errors > 0;
    }
    out.finish()?;
    Ok(if bad { Exit::BadInput } else { Exit::Ran })
}

/// The events of the trace at `path` where it streams ([`sim::inputs::streamed_format`]:
/// a CSV trace or an RMM log that a line at a time tells everything about) and the
/// check finds no problem in them: memory follows the live ids, not the file's length.
/// `None` for anything else (a file that does not open or read, another format, a row
/// that needs the whole file, any problem): the whole-file read then lists every
/// problem, with the messages it always gave.
fn streamed(path: &Path, args: &CheckArgs) -> Option<u64> {
    // A pipe gives its content once: read once, whole (a problem would need it again).
    if !crate::load::rereadable(path) {
        return None;
    }
    let options = sim::inputs::LoadOptions {
        format: args.input.trace_format,
        snapshot_device: args.input.snapshot_device,
        ..sim::inputs::LoadOptions::default()
    };
    match sim::inputs::streamed_format(path, &options).ok()?.ok()? {
        Format::Csv => clean(CsvEvents::open(path).ok()?),
        Format::Rmm => clean(RmmEvents::open(path).ok()?),
        _ => None,
    }
}

/// How many events `events` gives, if it gives them all and they have no problem.
fn clean<S: EventStream>(mut events: S) -> Option<u64> {
    let mut validator = Validator::new(None);
    for (index, event) in events.by_ref().enumerate() {
        validator.step(index, &event);
        // An error sends the file to the whole-file read (asked now and then: the
        // question reads every issue found).
        if index % 4096 == 0 && validator.has_errors() {
            return None;
        }
    }
    if events.stopped().is_some() {
        return None;
    }
    let found = validator.finish();
    if found.needs_events() || !found.resolve(std::iter::empty()).is_empty() {
        return None;
    }
    Some(events.events_read())
}
