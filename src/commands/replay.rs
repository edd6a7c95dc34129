//! `allocsim replay`: one trace, one policy, a readable summary.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::{Replay, SimDevice, Timeline};
use workloads::size::format_size_human;
use workloads::Trace;

use crate::flags::ReplayArgs;
use crate::output::{self, Kind, Planned};
use crate::{interrupt, load, Exit};

pub fn run(args: ReplayArgs) -> anyhow::Result<Exit> {
    if let Some(path) = &args.timeline {
        let mut inputs: Vec<&Path> = vec![&args.trace];
        inputs.extend(load::profile_file(&args.device));
        output::check(
            &[Planned {
                flag: "--timeline",
                path,
                kind: Kind::Csv,
            }],
            &inputs,
        )?;
    }
    let setup = load::device_setup(&args.device)?;
    if setup.capacities.len() > 1 {
        bail!("--capacity: replay takes one capacity; `allocsim compare` takes several");
    }
    let loaded = load::load_trace(&args.trace, &args.input, &setup.options)?;
    let specs = load::policies(std::slice::from_ref(&args.policy), &setup.caching)?;
    let [spec] = specs.as_slice() else {
        bail!("--policy takes one policy; `allocsim compare --policies` takes several");
    };
    let mut policy = spec.config.build()?;
    let mut device =
        SimDevice::with_hints(setup.options.clone(), loaded.hints.for_policy(&spec.config));
    let mut timeline = Timeline::default();
    // Ctrl-C stops the replay at its next event; nothing is written then.
    let in_order = interrupt::in_order();
    let r = match &args.timeline {
        Some(_) => sim::replay_with(
            &loaded.trace,
            policy.as_mut(),
            &mut device,
            &setup.replay,
            &mut timeline,
        ),
        None => sim::replay(&loaded.trace, policy.as_mut(), &mut device, &setup.replay),
    }
    .with_context(|| format!("replaying {}", args.trace.display()))?;
    drop(in_order);
    let label = match spec.config.options::<policies::caching::CachingConfig>() {
        Some(c) => {
            let conf = c.to_alloc_conf();
            let limit = match c.memory_limit {
                policies::caching::MemoryLimit::FromConfig => String::new(),
                limit => format!(", memory limit: {limit}"),
            };
            if conf.is_empty() && limit.is_empty() {
                spec.label.clone()
            } else {
                format!("{} (PYTORCH_CUDA_ALLOC_CONF={conf:?}{limit})", spec.label)
            }
        }
        None => spec.label.clone(),
    };
    let caveats = sim::caveats(&loaded.trace, &spec.config, &r);
    warn_caveats(caveats.iter().cloned());
    // The timeline file is complete before the summary says the replay is done.
    if let Some(path) = &args.timeline {
        let mut out = output::create(Some(path))?;
        sim::report::write_timeline_csv(&timeline.samples, &mut out)
            .with_context(|| format!("writing {}", path.display()))?;
        out.finish()?;
    }
    let mut out = output::create(None)?;
    write!(
        out,
        "{}",
        summary(&loaded.trace, &label, device.options(), &r)
    )?;
    for c in &caveats {
        writeln!(out, "not exact           {c}")?;
    }
    if args.stats {
        writeln!(out)?;
        write!(out, "{}", stats_table(&policy.detailed_stats()))?;
    }
    out.finish()?;
    Ok(Exit::Ran)
}

/// Prints each reason a result is not exact as a `warning:` line on stderr, once.
pub fn warn_caveats(caveats: impl Iterator<Item = String>) {
    let mut seen = std::collections::BTreeSet::new();
    for c in caveats {
        if seen.insert(c.clone()) {
            eprintln!("warning: {c}");
        }
    }
}

fn bytes(b: u64) -> String {
    format!("{:>12}  ({b} bytes)", format_size_human(b))
}

/// The policy's own statistics, aligned: name, value, and for byte counts the size in
/// binary units.
fn stats_table(stats: &[(String, i64)]) -> String {
    let width = stats.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in stats {
        let human = match u64::try_from(*value) {
            Ok(v) if key.contains("bytes") => format!("  {}", format_size_human(v)),
            _ => String::new(),
        };
        let _ = writeln!(out, "{key:<width$}  {value:>15}{human}");
    }
    out
}

/// A size in binary units with its exact bytes: `1.50 GiB (1610612736 bytes)`.
fn human_exact(b: u64) -> String {
    format!("{} ({b} bytes)", format_size_human(b))
}

/// The readable summary of one replay.
pub fn summary(trace: &Trace, policy: &str, device: &sim::SimDeviceOptions, r: &Replay) -> String {
    let s = &r.summary;
    let mut out = String::new();
    let source = trace
        .path
        .as_ref()
        .map_or(trace.name.clone(), |p| p.display().to_string());
    let _ = writeln!(
        out,
        "trace               {source}: {} events, {} allocations",
        trace.events.len(),
        trace.alloc_count()
    );
    let _ = writeln!(out, "policy              {policy}");
    let kept = device.reserved_by_driver_bytes();
    let kept = if kept == 0 {
        String::new()
    } else {
        format!(
            " (the CUDA context and the driver keep {})",
            format_size_human(kept)
        )
    };
    let _ = writeln!(
        out,
        "device              {}: total {}, usable {}{kept}",
        device.name,
        format_size_human(device.total_bytes),
        format_size_human(device.capacity_bytes),
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "peak requested      {}", bytes(s.requested_bytes_peak));
    let _ = writeln!(out, "peak allocated      {}", bytes(s.allocated_bytes_peak));
    let at = s
        .reserved_peak_event_index
        .map(|i| format!(", first at {}", trace.event_ref(i as usize)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "peak reserved       {}{at}",
        bytes(s.reserved_bytes_peak)
    );
    let _ = writeln!(
        out,
        "peak charged        {}  (driver pages)",
        bytes(s.charged_bytes_peak)
    );
    let util = s
        .utilization()
        .map_or("n/a".to_string(), |u| format!("{u:.6}"));
    let _ = writeln!(
        out,
        "utilization         {util:>12}  (allocated peak / reserved peak)"
    );
    let _ = writeln!(
        out,
        "cached at peak      {}",
        bytes(s.cached_bytes_at_reserved_peak())
    );
    let _ = writeln!(out, "segments (peak)     {:>12}", s.segment_count_peak);
    let _ = writeln!(
        out,
        "device allocs/frees {:>12}",
        format!("{} / {}", s.device_allocate_count, s.device_free_count)
    );
    match &r.oom {
        None => {
            let _ = writeln!(out, "out of memory       {:>12}", "none");
        }
        Some(o) => {
            let _ = writeln!(
                out,
                "out of memory       at {}: request of {}, tried to get {} from the device",
                trace.event_ref(o.event_index as usize),
                human_exact(o.requested_bytes),
                human_exact(o.tried_bytes)
            );
            let _ = writeln!(
                out,
                "  state then        allocated {}, reserved {}, device free {}",
                human_exact(o.policy.allocated_bytes),
                human_exact(o.policy.reserved_bytes),
                human_exact(o.device.free_bytes())
            );
            if let Some(m) = &o.message {
                let _ = writeln!(out, "  policy says       {m}");
            }
            if r.oom_count > 1 {
                let _ = writeln!(out, "  out-of-memory events in all: {}", r.oom_count);
            }
        }
    }
    let _ = writeln!(
        out,
        "events replayed     {:>12}  of {}",
        s.event_count,
        trace.events.len()
    );
    let _ = writeln!(
        out,
        "live at end         {:>12}  allocations",
        r.live_allocation_count
    );
    if r.skipped_event_count > 0 {
        let _ = writeln!(out, "skipped events      {:>12}", r.skipped_event_count);
    }
    out
}
