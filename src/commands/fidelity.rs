//! `allocsim fidelity`: the caching policy against recorded PyTorch runs.

use std::process::ExitCode;

use anyhow::Context;
use sim::fidelity::{fidelity, FidelityOptions, FidelityRow};
use sim::report::RecordWriter;

use crate::flags::FidelityArgs;

pub fn run(args: FidelityArgs) -> anyhow::Result<ExitCode> {
    let options = FidelityOptions {
        use_recorded_addresses: !args.no_recorded_addresses,
        check_invariants: args.check_invariants,
        ..FidelityOptions::default()
    };
    let mut out = RecordWriter::new::<FidelityRow>(crate::output::create(None)?)?;
    for path in &args.files {
        let run = workloads::read_recorded(path, None, args.device.unwrap_or(0))?;
        // A snapshot that does not replay from an empty allocator is refused here, as
        // converting it to a trace would.
        run.check_replayable()?;
        let report = fidelity(&run, &options)?;
        out.write(&report.row)?;
        out.flush().context("writing the CSV")?;
        if args.explain && !report.row.exact {
            eprint!("{}", report.explain());
        }
    }
    Ok(ExitCode::SUCCESS)
}
