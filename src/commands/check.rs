//! `allocsim check`: every problem of every trace, one per line.

use std::io::Write as _;

use workloads::validate::{validate, Severity};

use crate::flags::CheckArgs;
use crate::progress::Stage;
use crate::Exit;

pub fn run(args: CheckArgs) -> anyhow::Result<Exit> {
    let mut bad = false;
    let mut out = crate::output::create(None)?;
    for path in &args.traces {
        let stage = Stage::start(format!("reading {}", path.display()));
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
