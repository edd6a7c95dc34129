//! `allocsim compare`: traces × policies × capacities to CSV.

use std::process::ExitCode;

use anyhow::Context;

use crate::flags::CompareArgs;
use crate::load;

pub fn run(args: CompareArgs) -> anyhow::Result<ExitCode> {
    let setup = load::device_setup(&args.device)?;
    let specs = load::policies(&args.policies, &setup.caching)?;
    let inputs = load::load_inputs(&args.traces, &args.input, &args.device, &setup.options)?;
    let rows = sim::compare(
        &inputs,
        &specs,
        &setup.capacities,
        &setup.options,
        &setup.replay,
    )
    .map_err(anyhow::Error::msg)?;
    let out = crate::output::create(args.output.as_deref())?;
    sim::report::write_compare_csv(&rows, out).context("writing the CSV")?;
    Ok(ExitCode::SUCCESS)
}
