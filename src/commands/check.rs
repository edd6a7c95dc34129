//! `allocsim check`: every problem of every trace, one per line.

use std::io::Write as _;
use std::process::ExitCode;

use workloads::validate::{validate, Severity};
use workloads::Format;

use crate::flags::CheckArgs;
use crate::load;

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let mut bad = false;
    let mut out = crate::output::create(None)?;
    for path in &args.traces {
        let fmt = match load::format(args.input.format) {
            Some(f) => f,
            None => Format::from_path(path)?,
        };
        let trace = match fmt {
            Format::RecordedJson | Format::TorchPickle => {
                workloads::read_recorded(path, Some(fmt), load::snapshot_device(&args.input, None))?
                    .to_trace()?
            }
            _ => workloads::read(path, Some(fmt))?,
        };
        let issues = validate(&trace);
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
    out.flush()?;
    Ok(if bad {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
