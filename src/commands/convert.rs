//! `allocsim convert`: any readable trace to YAML or CSV.

use std::process::ExitCode;

use anyhow::{bail, Context};
use workloads::Format;

use crate::flags::ConvertArgs;
use crate::load;

pub fn run(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    let fmt = match load::format(args.format) {
        Some(f) => f,
        None => Format::from_path(&args.input)?,
    };
    let trace = match fmt {
        Format::RecordedJson | Format::TorchPickle => {
            workloads::read_recorded(&args.input, Some(fmt), args.snapshot_device.unwrap_or(0))?
                .to_trace()?
        }
        _ => workloads::read(&args.input, Some(fmt))?,
    };
    let to = match load::format(args.to) {
        Some(f) => f,
        None => Format::from_path(&args.output)?,
    };
    if !matches!(to, Format::Yaml | Format::Csv) {
        bail!(
            "{}: can only write YAML or CSV traces",
            args.output.display()
        );
    }
    let out = crate::output::create(Some(&args.output))?;
    workloads::write(&trace, to, out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    Ok(ExitCode::SUCCESS)
}
