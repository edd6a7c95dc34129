//! `allocsim generate`: synthetic traces from a seed.

use anyhow::Context;
use workloads::generate::{random, RandomOptions, SizeDistribution};
use workloads::Format;

use crate::flags::{GenerateArgs, GeneratorArg, SizesArg};
use crate::output::{self, Kind, Planned};
use crate::Exit;

pub fn run(args: GenerateArgs) -> anyhow::Result<Exit> {
    // The output's format and path are settled before anything is generated or written.
    let format = match args.format {
        Some(f) => f,
        None => Format::for_output(&args.output)?,
    };
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Trace,
        }],
        &[],
    )?;
    let sizes = match args.sizes {
        SizesArg::LogUniform => SizeDistribution::LogUniform {
            min_bytes: args.min_bytes,
            max_bytes: args.max_bytes,
        },
        SizesArg::LogNormal => SizeDistribution::LogNormal {
            median_bytes: args.median_bytes,
            sigma: args.sigma,
        },
    };
    let trace = match args.generator {
        GeneratorArg::Random => random(&RandomOptions {
            seed: args.seed,
            events: args.events,
            sizes,
            mean_lifetime_events: args.mean_lifetime,
            streams: args.streams,
            mark_every: args.mark_every,
            free_at_end: !args.leave_live,
        })?,
    };
    let mut out = output::create(Some(&args.output))?;
    workloads::write(&trace, format, &mut out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    out.finish()?;
    eprintln!(
        "wrote {} ({} events)",
        args.output.display(),
        trace.events.len()
    );
    Ok(Exit::Ran)
}
