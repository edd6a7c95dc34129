//! Snapshot exports (`allocsim export`): a replay written as a PyTorch snapshot reads
//! back through the snapshot reader and replays, under the same policy, to the same
//! result; a window replays as a mid-run snapshot to the state the full run had at its
//! end.

use std::path::{Path, PathBuf};

use policies::PolicyConfig;
use sim::inputs::{LoadOptions, TraceSource};
use sim::{
    replay_with, AddressHints, Replay, ReplayOptions, SimDevice, SimDeviceOptions, SnapshotExport,
    Timeline,
};
use workloads::recorded::{Action, BlockState};
use workloads::snapshot::{snapshot_bytes, SnapshotEncoding, SnapshotOut};
use workloads::Trace;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bundled traces the round trip runs on: hand-written ones, examples, recorded
/// snapshots, and snapshots that start mid-run.
const TRACES: &[&str] = &[
    "tests/data/traces/empty_cache.yaml",
    "tests/data/traces/one_gib_plus_one.yaml",
    "tests/data/traces/pool_boundaries.yaml",
    "tests/data/traces/seed000.yaml",
    "tests/data/traces/small_1000x512.yaml",
    "tests/data/traces/two_streams.yaml",
    "examples/training_loop.yaml",
    "examples/random_small.csv",
    "tests/data/torch/multistream.pickle",
    "tests/data/torch/seed002_retain.pickle",
    "tests/data/torch/cut/seed000__wrap10.pickle",
    "tests/data/torch/cut/multistream__wrap100.pickle",
];

/// Every registered policy with its defaults, and the caching policy with expandable
/// segments.
fn policies() -> Vec<PolicyConfig> {
    policies::testing::every_policy()
        .into_iter()
        .map(|s| s.config)
        .collect()
}

/// The caching policy with its defaults, and with expandable segments.
fn caching_and_expandable() -> [PolicyConfig; 2] {
    ["caching", "caching:expandable_segments=True"].map(|s| {
        policies::spec::parse_policy(s, &Default::default())
            .unwrap()
            .config
    })
}

fn load(path: &Path) -> (Trace, AddressHints) {
    let (loaded, _) = sim::inputs::load_with_run(
        &TraceSource::File(path.to_path_buf()),
        &LoadOptions::default(),
        &SimDeviceOptions::default(),
    )
    .unwrap();
    (loaded.trace, loaded.hints)
}

fn options() -> ReplayOptions {
    ReplayOptions {
        check_invariants: true,
        ..ReplayOptions::default()
    }
}

/// Replays and exports events `window` (all when `None`).
fn export(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    window: Option<(usize, usize)>,
) -> (Replay, SnapshotOut) {
    try_export(trace, hints, config, device, window).unwrap()
}

/// [`export`], or the engine's error.
fn try_export(
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    window: Option<(usize, usize)>,
) -> Result<(Replay, SnapshotOut), sim::ReplayError> {
    let mut policy = config.build().unwrap();
    let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(config));
    let mut observer = SnapshotExport::new(trace);
    if let Some((from, to)) = window {
        observer = observer.window(from, to);
    }
    let r = replay_with(trace, policy.as_mut(), &mut dev, &options(), &mut observer)?;
    let out = observer.finish(policy.as_ref(), None);
    Ok((r, out))
}

/// The exported snapshot read back as a trace, with its addresses as hints.
fn read_back(out: &SnapshotOut, name: &str) -> (Trace, AddressHints) {
    read_back_on(out, name, &SimDeviceOptions::default())
}

/// [`read_back`] for replaying on `device` (a snapshot records no total: the hints
/// measure ranges with the device's).
fn read_back_on(out: &SnapshotOut, name: &str, device: &SimDeviceOptions) -> (Trace, AddressHints) {
    let bytes = snapshot_bytes(out, SnapshotEncoding::Pickle);
    let run =
        workloads::snapshot::read_snapshot_pickle_from(&bytes[..], Path::new(name), 0).unwrap();
    let trace = run.to_trace().unwrap();
    let hints = sim::recorded::address_hints(&run, device.total_bytes).unwrap();
    (trace, hints)
}

/// What a replay decided, without its event numbering (the exported trace numbers its
/// events differently: a plain free is one event either way, but marks are not
/// written and `empty_cache` calls that released nothing are not recorded).
fn result(r: &Replay) -> String {
    let mut s = r.summary;
    s.event_count = 0;
    s.reserved_peak_event_index = None;
    format!(
        "{s:?} oom={:?} live={} final={:?} {:?}",
        r.oom.as_ref().map(|o| (o.tried_bytes, o.policy, o.device)),
        r.live_allocation_count,
        r.final_policy,
        r.final_device
    )
}

/// The entries without times and frames, and the segments (a free block's requested
/// size, its last tenant's, left out: a rebuilt state does not know it). Without
/// `addresses`, addresses are left out too.
fn decisions(out: &SnapshotOut, addresses: bool) -> (Vec<(String, u64, u64, u64)>, String) {
    let addr = |a: u64| if addresses { a } else { 0 };
    let mut segments = out.segments.clone();
    for s in &mut segments {
        s.address = addr(s.address);
        for b in &mut s.blocks {
            b.address = addr(b.address);
            if b.state == BlockState::Inactive {
                b.requested_size = None;
            }
        }
    }
    if !addresses {
        segments.sort_by_key(|s| format!("{s:?}"));
    }
    (
        out.entries
            .iter()
            .map(|e| {
                let a = if e.action == Action::Oom {
                    e.addr
                } else {
                    addr(e.addr)
                };
                (e.action.name().to_string(), a, e.size, e.stream)
            })
            .collect(),
        format!("{segments:?}"),
    )
}

/// Export, then replay of the export under the same policy: the same result (peaks,
/// OOM, final state, device operations), and exporting that replay gives the same
/// entries and segments; for every policy on every bundled trace, at the default
/// capacity and at one where the run runs out of memory.
#[test]
fn export_then_replay_gives_the_same_result() {
    let mut checked = 0;
    let mut ooms = 0;
    for name in TRACES {
        let (trace, hints) = load(&root().join(name));
        for config in policies() {
            let full = SimDeviceOptions::default();
            let (first, _) = export(&trace, &hints, &config, &full, None);
            let mut devices = vec![full.clone()];
            // A device too small for the run (above the first segment it takes).
            let peak = first.summary.reserved_bytes_peak;
            if let Some(small) = full.clone().with_total((peak / 4 * 3).max(64 << 20)) {
                devices.push(small);
            }
            for device in &devices {
                let label = format!("{name} under {} on {}", config, device.name);
                let (r, out) = match try_export(&trace, &hints, &config, device, None) {
                    // A trace that starts mid-run whose state does not fit the small
                    // device runs out before the first event: nothing to export.
                    Ok((r, _))
                        if r.oom.as_ref().is_some_and(|o| o.before_first_event())
                            && device.name != full.name =>
                    {
                        continue
                    }
                    Ok(done) => done,
                    Err(e) => panic!("{label}: {e}"),
                };
                let (back, back_hints) = read_back_on(&out, "x.pickle", device);
                let (r2, out2) = export(&back, &back_hints, &config, device, None);
                assert_eq!(result(&r), result(&r2), "{label}");
                // A policy that allocated a mid-run trace's live blocks itself (in
                // address order) allocates them again, in the order of its own
                // addresses: the same blocks, placed elsewhere.
                let a = r.started_by_allocating == 0;
                assert_eq!(decisions(&out, a), decisions(&out2, a), "{label}");
                checked += 1;
                ooms += usize::from(r.oom.is_some());
            }
        }
    }
    assert!(checked >= 100, "{checked}");
    assert!(ooms >= 20, "only {ooms} runs ran out of memory");
}

/// A window exported from the middle of a run reads back as a snapshot that starts
/// mid-run; replayed under the caching policy from its rebuilt state, it ends in the
/// state the full run had after the window's last event, with the same segments.
#[test]
fn a_window_replays_as_a_mid_run_snapshot() {
    let [caching, expandable] = caching_and_expandable();
    let caching = &caching;
    let mut checked = 0;
    for name in [
        "examples/training_loop.yaml",
        "tests/data/traces/small_1000x512.yaml",
        "tests/data/torch/multistream.pickle",
        "tests/data/torch/seed002_retain.pickle",
    ] {
        let (trace, hints) = load(&root().join(name));
        for config in [caching, &expandable] {
            let device = SimDeviceOptions::default();
            let n = trace.events.len();
            let (from, to) = (n / 3, 2 * n / 3);
            let mut timeline = Timeline::default();
            let mut policy = config.build().unwrap();
            let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(config));
            replay_with(&trace, policy.as_mut(), &mut dev, &options(), &mut timeline).unwrap();
            let at_to = timeline.samples[to].policy;
            let (_, out) = export(&trace, &hints, config, &device, Some((from, to)));
            let (back, back_hints) = read_back(&out, "w.pickle");
            assert!(back.start.is_some(), "{name}: the window starts mid-run");
            let (r, out2) = export(&back, &back_hints, config, &device, None);
            let label = format!("{name} under {config}, events {from}..={to}");
            assert_eq!(r.final_policy, at_to, "{label}");
            assert_eq!(decisions(&out, true), decisions(&out2, true), "{label}");
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
}

/// An export of the caching policy is a recording PyTorch's allocator could have made:
/// the fidelity check (the caching policy against a recorded run, decision by
/// decision) finds every export exact, with and without expandable segments.
#[test]
fn caching_exports_are_exact_under_fidelity() {
    let configs = caching_and_expandable();
    let caching = [&configs[0], &configs[1]];
    for name in TRACES {
        let (trace, hints) = load(&root().join(name));
        for config in caching {
            let (_, mut out) = export(&trace, &hints, config, &SimDeviceOptions::default(), None);
            out.alloc_conf = config
                .options::<policies::caching::CachingConfig>()
                .map(|c| c.to_alloc_conf());
            let bytes = snapshot_bytes(&out, SnapshotEncoding::Pickle);
            let run = workloads::snapshot::read_snapshot_pickle_from(
                &bytes[..],
                Path::new("x.pickle"),
                0,
            )
            .unwrap();
            let report =
                sim::fidelity::fidelity(&run, &sim::fidelity::FidelityOptions::default()).unwrap();
            assert!(
                report.row.exact,
                "{name} under {config}: {}",
                report.explain()
            );
        }
    }
}

/// An export under expandable segments on the H100 (whose total makes the small pool's
/// range 91 213.875 MiB and the large pool's 91 220 MiB) replays at the exported
/// addresses, both ranges included: the second range's hint is not taken for a mapping
/// inside the first (the hints once measured every range as the large pool's, wider
/// than the simulated device's spacing, and the second range moved 20 MiB up).
#[test]
fn expandable_exports_keep_both_ranges_on_the_h100() {
    let [_, config] = caching_and_expandable();
    let device = sim::DeviceProfile::builtin("h100").unwrap().to_options();
    let mut two_ranges = 0;
    for name in TRACES {
        let (trace, hints) = load(&root().join(name));
        let (_, out) = export(&trace, &hints, &config, &device, None);
        let (back, back_hints) = read_back_on(&out, "x.pickle", &device);
        two_ranges += usize::from(back_hints.ranges.len() >= 2);
        let (_, out2) = export(&back, &back_hints, &config, &device, None);
        assert_eq!(decisions(&out, true), decisions(&out2, true), "{name}");
    }
    assert!(two_ranges >= 5, "only {two_ranges} traces use two ranges");
}
