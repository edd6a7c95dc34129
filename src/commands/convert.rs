//! `allocsim convert`: any readable trace to YAML or CSV.

use anyhow::Context;
use workloads::Format;

use crate::flags::ConvertArgs;
use crate::output::{self, Kind, Planned};
use crate::progress::Stage;
use crate::Exit;

pub fn run(args: ConvertArgs) -> anyhow::Result<Exit> {
    // The output's format and path are settled before anything is read or written.
    let to = match args.to {
        Some(f) => f,
        None => Format::for_output(&args.output)?,
    };
    output::check(
        &[Planned {
            flag: "-o",
            path: &args.output,
            kind: Kind::Trace,
        }],
        &[&args.input],
    )?;
    let stage = Stage::start(format!("reading {}", args.input.display()));
    let (mut trace, run) = workloads::read_source(&args.input, args.format, args.snapshot_device)?;
    if let Some(start) = &trace.start {
        anyhow::bail!(
            "{}: the recording starts mid-run (its first entry finds {}); YAML and CSV traces \
             start from an empty allocator and cannot carry that state: replay, compare or \
             check the recording itself",
            args.input.display(),
            start.describe()
        );
    }
    // A snapshot's annotations (`_annotate_memory`, profiler ranges) become marks where
    // they fall, so that iterations, plots and timelines of the converted trace see them.
    let marks = sim::iterations::annotation_marks(&trace, run.as_ref());
    let added = marks.len();
    if added > 0 {
        let mut events = Vec::with_capacity(trace.events.len() + added);
        let mut next = marks.into_iter().peekable();
        for (i, e) in std::mem::take(&mut trace.events).into_iter().enumerate() {
            while let Some(m) = next.next_if(|m| m.event_index <= i) {
                events.push(workloads::Event::Mark { label: m.label });
            }
            events.push(e);
        }
        events.extend(next.map(|m| workloads::Event::Mark { label: m.label }));
        trace.events = events;
        // Places and times in the source no longer line up; neither format writes them.
        trace.locations.clear();
        trace.times_us.clear();
    }
    // The segment addresses the run got, for replays of the YAML to follow as they
    // follow the recording's (the caching policy's best-fit ties depend on them).
    if let Some(run) = run.as_ref().filter(|_| !args.no_recorded_addresses) {
        let total = sim::SimDeviceOptions::default().total_bytes;
        let a = sim::recorded::recorded_addresses(run, total)?;
        if !a.segments.is_empty() || !a.ranges.is_empty() {
            trace.meta.addresses = Some(a);
        }
    }
    let m = &trace.meta;
    let recorded = m.alloc_conf.is_some()
        || m.cap_bytes.is_some()
        || m.total_bytes.is_some()
        || m.device.is_some()
        || m.torch_version.is_some()
        || !m.caveats.is_empty()
        || m.addresses.is_some();
    drop(stage);
    if recorded && to != Format::Yaml {
        eprintln!(
            "warning: {} cannot carry what {} recorded about its run (its PYTORCH_CUDA_ALLOC_CONF, memory limit, device, caveats, segment addresses); convert to YAML to keep it",
            to.name(),
            args.input.display()
        );
    }
    let stage = Stage::start(format!("writing {}", args.output.display()));
    let mut out = output::create(Some(&args.output))?;
    workloads::write(&trace, to, &mut out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    out.finish()?;
    drop(stage);
    eprintln!(
        "wrote {} ({} events{}{})",
        args.output.display(),
        trace.events.len(),
        match added {
            0 => String::new(),
            n => format!(", {n} of them marks from the snapshot's annotations"),
        },
        if recorded && to == Format::Yaml {
            ", and what the run recorded"
        } else {
            ""
        }
    );
    Ok(Exit::Ran)
}
