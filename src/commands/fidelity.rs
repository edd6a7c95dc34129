//! `allocsim fidelity`: the caching policy against recorded PyTorch runs, each under
//! its own recorded settings (or the flags' in their place); with `--requests-from`,
//! what-if checks: another run's requests under each run's settings.

use anyhow::Context;
use policies::caching::MemoryLimit;
use sim::fidelity::{fidelity, fidelity_with_requests, FidelityOptions, FidelityRow};
use sim::recorded::Overrides;
use sim::report::RecordWriter;
use workloads::size::format_size_human;
use workloads::RecordedRun;

use crate::flags::FidelityArgs;
use crate::progress::Stage;
use crate::Exit;

pub fn run(args: FidelityArgs) -> anyhow::Result<Exit> {
    let overrides = Overrides {
        alloc_conf: args.alloc_conf.clone(),
        memory_limit: match (args.cap, args.memory_fraction) {
            (Some(cap), _) => Some(MemoryLimit::Bytes(cap)),
            (None, Some(f)) => Some(MemoryLimit::Fraction(f)),
            (None, None) => None,
        },
    };
    let options = FidelityOptions {
        use_recorded_addresses: !args.no_recorded_addresses,
        check_invariants: args.check_invariants,
        overrides,
        ..FidelityOptions::default()
    };
    let read = |path: &std::path::Path| -> anyhow::Result<RecordedRun> {
        let run = workloads::read_recorded(path, None, args.snapshot_device)?;
        // A snapshot that cannot be replayed is refused here with what is missing, as
        // converting it to a trace would.
        run.check_replayable()?;
        Ok(run)
    };
    let requests = args.requests_from.as_deref().map(read).transpose()?;
    // Every run is read and checked before the first line is written, so a bad file
    // leaves no header or partial table behind.
    let reports = args
        .files
        .iter()
        .map(|path| {
            let stage = Stage::start(format!("reading {}", path.display()));
            let run = read(path)?;
            drop(stage);
            if let Some(note) = settings_note(&run, &args) {
                eprintln!("{}: {note}", path.display());
            }
            let stage = Stage::start(format!("replaying {}", path.display()));
            let report = match &requests {
                Some(a) => fidelity_with_requests(&run, a, &options)?,
                None => fidelity(&run, &options)?,
            };
            drop(stage);
            crate::commands::replay::warn_caveats(
                run.meta
                    .caveats
                    .iter()
                    .chain(requests.iter().flat_map(|a| &a.meta.caveats))
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

/// One line about the settings a run is checked under, when flags replace what it
/// recorded (or give what a snapshot does not record); `None` when it runs as recorded.
fn settings_note(run: &RecordedRun, args: &FidelityArgs) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(conf) = &args.alloc_conf {
        parts.push(match &run.meta.alloc_conf {
            Some(recorded) => {
                format!("PYTORCH_CUDA_ALLOC_CONF={conf:?} in place of the recorded {recorded:?}")
            }
            None => format!("PYTORCH_CUDA_ALLOC_CONF={conf:?} (none recorded)"),
        });
    }
    let limit = match (args.cap, args.memory_fraction) {
        (Some(cap), _) => Some(format!("cap {}", format_size_human(cap))),
        (None, Some(f)) => Some(format!("memory fraction {f}")),
        (None, None) => None,
    };
    if let Some(limit) = limit {
        parts.push(match run.meta.cap_bytes {
            Some(cap) => format!(
                "{limit} in place of the recorded cap {}",
                format_size_human(cap)
            ),
            None if run.snapshot.is_some() => {
                format!("{limit} (a snapshot does not record its cap)")
            }
            None => format!("{limit} (the run had none)"),
        });
    }
    (!parts.is_empty()).then(|| format!("checked with {}", parts.join(", ")))
}
