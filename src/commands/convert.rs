//! `allocsim convert`: any readable trace to YAML or CSV.

use std::process::ExitCode;

use anyhow::{bail, Context};
use workloads::Format;

use crate::flags::ConvertArgs;
use crate::load;

pub fn run(args: ConvertArgs) -> anyhow::Result<ExitCode> {
    let (trace, _) = workloads::read_source(
        &args.input,
        load::format(args.format),
        args.snapshot_device.unwrap_or(0),
    )?;
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
