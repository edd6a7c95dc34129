//! `allocsim compare`: traces × policies × capacities to CSV.

use std::path::Path;

use anyhow::Context;

use crate::flags::CompareArgs;
use crate::output::{self, Kind, Planned};
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
    let specs = load::policies(&args.policies, &setup.caching)?;
    let inputs = load::load_inputs(&args.traces, &args.input, &setup.options)?;
    let rows = {
        // Ctrl-C stops every replay at its next event; nothing is written then.
        let _in_order = interrupt::in_order();
        sim::compare(
            &inputs,
            &specs,
            &setup.capacities,
            &setup.options,
            &setup.replay,
        )?
    };
    crate::commands::replay::warn_caveats(rows.iter().flat_map(|r| {
        r.caveats
            .iter()
            .map(move |c| format!("{} under {}: {c}", r.trace, r.policy))
    }));
    let mut out = output::create(args.output.as_deref())?;
    sim::report::write_compare_csv(&rows, &mut out).context("writing the CSV")?;
    out.finish()?;
    Ok(Exit::Ran)
}
