//! `allocsim generate`: synthetic traces from a seed, by a generator named on the
//! command line or in a YAML spec (`docs/generators.md`). The spec, `--set` and the
//! flags are read by `workloads::generate::spec::read_spec`, the one reader of
//! generator options (sweeps use it too).

use anyhow::Context;
use clap::ValueEnum;
use workloads::generate::spec::{read_spec, WriteError};
use workloads::Format;

use crate::flags::{GenerateArgs, SizesArg};
use crate::output::{self, Kind, Planned};
use crate::progress::Stage;
use crate::Exit;

pub fn run(args: GenerateArgs) -> anyhow::Result<Exit> {
    // The output's format and path are settled before anything is generated or written.
    let format = match args.format {
        Some(f) => f,
        None => Format::for_output(&args.output)?,
    };
    let mut inputs = Vec::new();
    if let Some(spec) = &args.spec {
        inputs.push(spec.as_path());
    }
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Trace,
        }],
        &inputs,
    )?;
    let text = match &args.spec {
        Some(path) => Some(
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        None => None,
    };
    let kind = args
        .generator
        .and_then(|g| g.to_possible_value())
        .map(|v| v.get_name().to_string());
    // The flags are settings like `--set`'s, after them; a random trace from flags
    // alone keeps the command line's default of 10 000 events.
    let mut settings = args.set.clone();
    let mut flag = |key: &str, value: Option<String>| {
        if let Some(v) = value {
            settings.push(format!("{key}={v}"));
        }
    };
    flag("seed", args.seed.map(|s| s.to_string()));
    flag("events", args.events.map(|s| s.to_string()));
    flag(
        "sizes",
        args.sizes.map(|s| match s {
            SizesArg::LogUniform => "log-uniform".to_string(),
            SizesArg::LogNormal => "log-normal".to_string(),
        }),
    );
    flag("min_bytes", args.min_bytes.map(|s| s.to_string()));
    flag("max_bytes", args.max_bytes.map(|s| s.to_string()));
    flag("median_bytes", args.median_bytes.map(|s| s.to_string()));
    flag("sigma", args.sigma.map(|s| s.to_string()));
    flag("mean_lifetime", args.mean_lifetime.map(|s| s.to_string()));
    flag("streams", args.streams.map(|s| s.to_string()));
    flag("mark_every", args.mark_every.map(|s| s.to_string()));
    flag("leave_live", args.leave_live.then(|| "true".to_string()));
    if kind.as_deref() == Some("random")
        && text.is_none()
        && !settings.iter().any(|s| s.starts_with("events="))
    {
        settings.insert(0, "events=10000".to_string());
    }
    let file = text.as_deref().zip(args.spec.as_deref());
    let (generator, seeds) = read_spec(file, kind.as_deref(), &settings)?;
    if seeds.len() > 1 {
        anyhow::bail!(
            "{}: seed: {} seeds; a spec lists several seeds for a sweep, `generate` writes one trace (--seed N)",
            args.spec
                .as_deref()
                .map_or("on the command line".to_string(), |p| p.display().to_string()),
            seeds.len()
        );
    }
    // The options are checked before the output is created; then the events are
    // written as they are made, never held: memory follows what is live at once,
    // whatever the trace's length.
    generator.check()?;
    let stage = Stage::start(format!("generating {}", args.output.display()));
    let mut out = output::create(Some(&args.output))?;
    let count = match generator.write(format, &mut out) {
        Ok(count) => count,
        Err(WriteError::Invalid(e)) => return Err(e.into()),
        Err(WriteError::Io(e)) => {
            return Err(anyhow::Error::new(e).context(format!("writing {}", args.output.display())))
        }
    };
    out.finish()?;
    drop(stage);
    eprintln!("wrote {} ({count} events)", args.output.display());
    Ok(Exit::Ran)
}
