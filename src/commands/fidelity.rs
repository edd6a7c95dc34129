//! `allocsim fidelity`: the caching policy against recorded PyTorch runs.

use anyhow::Context;
use sim::fidelity::{fidelity, FidelityOptions, FidelityRow};
use sim::report::RecordWriter;

use crate::flags::FidelityArgs;
use crate::Exit;

pub fn run(args: FidelityArgs) -> anyhow::Result<Exit> {
    let options = FidelityOptions {
        use_recorded_addresses: !args.no_recorded_addresses,
        check_invariants: args.check_invariants,
        ..FidelityOptions::default()
    };
    // Every run is read and checked before the first line is written, so a bad file
    // leaves no header or partial table behind.
    let reports = args
        .files
        .iter()
        .map(|path| {
            let run = workloads::read_recorded(path, None, args.snapshot_device)?;
            // A snapshot that does not replay from an empty allocator is refused here,
            // as converting it to a trace would.
            run.check_replayable()?;
            let report = fidelity(&run, &options)?;
            crate::commands::replay::warn_caveats(
                run.meta
                    .caveats
                    .iter()
                    .map(|c| format!("{}: {c} (not exact)", path.display())),
            );
            Ok(report)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = crate::output::create(None)?;
    let mut csv = RecordWriter::new::<FidelityRow>(&mut out).context("writing the CSV")?;
    for report in &reports {
        csv.write(&report.row).context("writing the CSV")?;
        csv.flush().context("writing the CSV")?;
        if args.explain && !report.row.exact {
            eprint!("{}", report.explain());
        }
    }
    drop(csv);
    out.finish()?;
    Ok(Exit::Ran)
}
