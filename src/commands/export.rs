//! `allocsim export`: a replay written as a PyTorch memory snapshot, for
//! pytorch.org/memory_viz and `python -m torch.cuda._memory_viz`.

use std::io::Read as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::inputs::LoadError;
use sim::{SimDevice, SimDeviceOptions, SnapshotExport};
use workloads::snapshot::{write_snapshot, Frames, SnapshotEncoding, SnapshotOptions};
use workloads::Format;

use crate::flags::ExportArgs;
use crate::output::{self, Kind, Planned};
use crate::{interrupt, load, Exit};

pub fn run(args: ExportArgs) -> anyhow::Result<Exit> {
    // The output's encoding and path are settled before anything is read.
    let Some(encoding) = SnapshotEncoding::from_path(&args.output) else {
        bail!(
            "-o {}: export writes a PyTorch memory snapshot: name it FILE.pickle (or .pkl), or \
             FILE.json for the same dict as JSON",
            args.output.display()
        );
    };
    let mut inputs: Vec<&Path> = vec![&args.trace];
    inputs.extend(load::profile_file(&args.device));
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Snapshot,
        }],
        &inputs,
    )?;
    if let (Some(from), Some(to)) = (args.from, args.to) {
        if from > to {
            bail!(
                "--from {from} is after --to {to}: the window is events FROM to TO, both included"
            );
        }
    }
    let setup = load::device_setup(&args.device)?;
    if setup.capacities.len() > 1 {
        bail!("--capacity: export takes one capacity; `allocsim compare` takes several");
    }
    let stage = crate::progress::Stage::start(format!("reading {}", args.trace.display()));
    let (loaded, frames) = load_with_frames(&args, &setup.options)?;
    drop(stage);
    // A recorded run on the device it recorded, unless a flag names one (as replay).
    let setup = setup.for_run(loaded.run.as_ref(), &args.device);
    let trace = &loaded.trace;
    let n = trace.events.len();
    for (flag, event) in [("--from", args.from), ("--to", args.to)] {
        if let Some(event) = event.filter(|&e| e >= n) {
            bail!("{flag} {event}: the trace has {n} events, numbered from 0");
        }
    }
    let settings = load::settings(&trace.meta, &args.device);
    let specs = load::policies(std::slice::from_ref(&args.policy), &settings.caching)?;
    let [spec] = specs.as_slice() else {
        bail!("--policy takes one policy; export writes one run");
    };
    if let Some(note) = &settings.note {
        eprintln!("settings: {note}");
    }
    let mut policy = spec.config.build()?;
    let mut device =
        SimDevice::with_hints(setup.options.clone(), loaded.hints.for_policy(&spec.config));
    let mut export = SnapshotExport::new(trace).window(
        args.from.unwrap_or(0),
        args.to.unwrap_or(n.saturating_sub(1)),
    );
    if let Some(frames) = frames {
        export = export.with_frames(frames);
    }
    // Ctrl-C stops the replay at its next event; nothing is written then.
    let in_order = interrupt::in_order();
    let r = sim::replay_with(
        trace,
        policy.as_mut(),
        &mut device,
        &setup.replay,
        &mut (&mut export, crate::progress::EventSpinner::on_terminal()),
    )
    .with_context(|| format!("replaying {}", args.trace.display()))?;
    drop(in_order);
    // PyTorch never held a state it could not hold: no snapshot shows that run.
    if let Some(o) = r.oom.as_ref().filter(|o| o.before_first_event()) {
        bail!(
            "{}: nothing to export: under {} the replay runs out of memory before the first \
             event ({})",
            args.trace.display(),
            spec.label,
            sim::explain::starting_state_verdict(o)
        );
    }
    let conf = spec
        .config
        .options::<policies::caching::CachingConfig>()
        .map(|c| c.to_alloc_conf());
    let snapshot = export.finish(policy.as_ref(), conf);
    let mut caveats = sim::caveats(trace, &spec.config, &r);
    if !trace.pools().is_empty() {
        caveats.push(
            "the trace uses private memory pools: the snapshot does not say which pool served \
             each request (its segments are written with pool id (0, 0)), so a replay of it \
             serves them from the default pools"
                .to_string(),
        );
    }
    crate::commands::replay::warn_caveats(caveats.into_iter());
    let stage = crate::progress::Stage::start(format!("writing {}", args.output.display()));
    let mut out = output::create(Some(&args.output))?;
    write_snapshot(&snapshot, encoding, &mut out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    out.finish()?;
    drop(stage);
    let window = match (args.from, args.to) {
        (None, None) => String::new(),
        _ => format!(
            ", events {} to {}",
            args.from.unwrap_or(0),
            args.to.unwrap_or(n.saturating_sub(1))
        ),
    };
    let oom = match r.oom.as_ref().and_then(|o| o.event_index) {
        Some(i) => format!(", out of memory at event {i}"),
        None => String::new(),
    };
    eprintln!(
        "wrote {} ({} under {}{window}: {} trace entries, {} segments{oom})",
        args.output.display(),
        trace.name,
        spec.label,
        snapshot.entries.len(),
        snapshot.segments.len()
    );
    Ok(Exit::Ran)
}

/// The trace, and the stack frames of a snapshot pickle's entries, to carry over into
/// the export (`None` for other inputs or a snapshot without frames). A snapshot is
/// read once, its frames kept, and made ready to replay from that run as the one
/// loader makes a file's (`sim::inputs::load_recorded`: the same trace, hints and
/// checks); other inputs go through the one loader.
fn load_with_frames(
    args: &ExportArgs,
    model: &SimDeviceOptions,
) -> anyhow::Result<(load::Loaded, Option<Frames>)> {
    if format_of(args) != Some(Format::TorchPickle) {
        let mut loaded = load::load_trace(&args.trace, &args.input, model)?;
        loaded.run = None;
        return Ok((loaded, None));
    }
    let options = SnapshotOptions { keep_frames: true };
    let run = workloads::snapshot::read_snapshot_pickle_with(
        &args.trace,
        args.input.read.snapshot_device,
        &options,
    )
    .map_err(LoadError::Read)?;
    let (input, run) = sim::inputs::load_recorded(run, &load::load_options(&args.input), model)?;
    // The run's records are not needed past the trace and hints: only its frames.
    let frames = run
        .snapshot
        .and_then(|s| s.frames)
        .filter(|f| !f.entries.is_empty());
    let loaded = load::Loaded {
        trace: input.trace,
        hints: input.hints,
        run: None,
    };
    Ok((loaded, frames))
}

/// The format the one loader would read `args.trace` in (forced, or detected from its
/// first bytes); `None` where it cannot tell, the file does not open (the loader
/// then says why) or is a pipe.
fn format_of(args: &ExportArgs) -> Option<Format> {
    if let Some(format) = args.input.read.trace_format {
        return Some(format);
    }
    // Reading a pipe's first bytes takes them: the one loader reads it (a snapshot's
    // frames are then not carried over).
    if !load::rereadable(&args.trace) {
        return None;
    }
    let file = std::fs::File::open(&args.trace).ok()?;
    let mut prefix = Vec::with_capacity(workloads::SNIFF_BYTES);
    file.take(workloads::SNIFF_BYTES as u64)
        .read_to_end(&mut prefix)
        .ok()?;
    workloads::detect(&args.trace, &prefix).ok()
}
