//! `allocsim convert`: any readable trace to YAML or CSV.

use anyhow::Context;
use workloads::Format;

use crate::flags::ConvertArgs;
use crate::output::{self, Kind, Planned};
use crate::Exit;

pub fn run(args: ConvertArgs) -> anyhow::Result<Exit> {
    // The output's format and path are settled before anything is read or written.
    let to = match args.to {
        Some(f) => f,
        None => Format::for_output(&args.output)?,
    };
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Trace,
        }],
        &[&args.input],
    )?;
    let (trace, _) = workloads::read_source(&args.input, args.format, args.snapshot_device)?;
    if let Some(start) = &trace.start {
        anyhow::bail!(
            "{}: the recording starts mid-run (its first entry finds {}); YAML and CSV traces \
             start from an empty allocator and cannot carry that state: replay, compare or \
             check the recording itself",
            args.input.display(),
            start.describe()
        );
    }
    let mut out = output::create(Some(&args.output))?;
    workloads::write(&trace, to, &mut out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    out.finish()?;
    Ok(Exit::Ran)
}
