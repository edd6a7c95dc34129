//! `allocsim generate`: synthetic traces from a seed.

use std::process::ExitCode;

use anyhow::Context;
use workloads::generate::{random, RandomOptions, SizeDistribution};
use workloads::size::parse_size;
use workloads::Format;

use crate::flags::{GenerateArgs, GeneratorArg, SizesArg};
use crate::load;

pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let size = |flag: &str, v: &str| parse_size(v).map_err(|e| anyhow::anyhow!("{flag}: {e}"));
    let sizes = match args.sizes {
        SizesArg::LogUniform => SizeDistribution::LogUniform {
            min_bytes: size("--min-bytes", &args.min_bytes)?,
            max_bytes: size("--max-bytes", &args.max_bytes)?,
        },
        SizesArg::LogNormal => SizeDistribution::LogNormal {
            median_bytes: size("--median-bytes", &args.median_bytes)?,
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
        })
        .map_err(anyhow::Error::msg)?,
    };
    let format = match load::format(args.format) {
        Some(f) => f,
        None => Format::from_path(&args.output)?,
    };
    let out = crate::output::create(Some(&args.output))?;
    workloads::write(&trace, format, out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    Ok(ExitCode::SUCCESS)
}
