//! A snapshot pickle's streamed replay (`sim::inputs::SnapshotStream`: two passes over
//! the file, neither holding its entries) against the whole-trace path (read, to
//! `Trace`, validate, replay): on every snapshot pickle of the repository and on
//! synthetic ones, under every policy, at a capacity that fits and one that runs out,
//! checked and lenient, the same replay, event and alloc counts and entry of the
//! reserved peak; what cannot stream is what the whole-trace path needs.

use std::path::{Path, PathBuf};

use policies::caching::CachingDefaults;
use policies::PolicyConfig;
use sim::inputs::{load, LoadOptions, SnapshotStream, TraceSource};
use sim::{replay_with, ReplayOptions, SimDevice, SimDeviceOptions};

#[path = "../../workloads/benches/synth/mod.rs"]
mod synth;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.pickle` under `dir`, sorted.
fn pickles(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            pickles(&p, out);
        } else if p.extension().is_some_and(|e| e == "pickle") {
            out.push(p);
        }
    }
}

fn policies() -> Vec<PolicyConfig> {
    let mut out = PolicyConfig::defaults();
    out.extend(
        policies::spec::parse_policy_list(
            "caching:expandable_segments=True",
            &CachingDefaults::default(),
        )
        .unwrap()
        .into_iter()
        .map(|s| s.config),
    );
    out
}

/// Compares the two paths on `path`; returns whether it streamed, and the
/// `empty_cache` and `free_requested` events of its trace.
fn compare(path: &Path, configs: &[PolicyConfig]) -> (bool, usize, usize) {
    let name = path.display().to_string();
    let mut streamed = false;
    let (mut empty_caches, mut free_requests) = (0, 0);
    for lenient in [false, true] {
        let options = LoadOptions {
            lenient,
            ..LoadOptions::default()
        };
        for capacity in [80u64 << 30, 3 << 30] {
            let device = SimDeviceOptions::default().with_capacity(capacity);
            let held = load(&TraceSource::File(path.to_path_buf()), &options, &device);
            let stream = SnapshotStream::open(path, &options, &device);
            let Ok(held) = held else {
                // What the whole-trace path refuses does not replay streamed either.
                if let Some(stream) = stream {
                    let c = &configs[0];
                    let mut p = c.build().unwrap();
                    let mut d = SimDevice::with_hints(device.clone(), stream.hints().for_policy(c));
                    let r = stream
                        .replay(
                            p.as_mut(),
                            &mut d,
                            &ReplayOptions::default(),
                            lenient,
                            &mut (),
                        )
                        .unwrap();
                    assert!(r.is_none(), "{name}: streamed what the held path refuses");
                }
                continue;
            };
            let Some(stream) = stream else {
                continue;
            };
            streamed = true;
            // The events, and the entry each came from, as the held trace has them.
            let plan = workloads::snapshot::plan_stream(path, 0).unwrap();
            let mut events = plan.events();
            let pairs: Vec<(workloads::Event, u64)> = events.by_ref().collect();
            events.finish().unwrap();
            let held_pairs: Vec<(workloads::Event, u64)> = held
                .trace
                .events
                .iter()
                .cloned()
                .zip(held.trace.locations.iter().copied())
                .collect();
            assert!(pairs == held_pairs, "{name}: the streamed events differ");
            assert_eq!(
                plan.entries as usize,
                workloads::read_snapshot_pickle(path, 0)
                    .unwrap()
                    .source_indexes
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                "{name}"
            );
            let count = |f: fn(&workloads::Event) -> bool| {
                held.trace.events.iter().filter(|e| f(e)).count()
            };
            empty_caches = count(|e| matches!(e, workloads::Event::EmptyCache));
            free_requests = count(|e| matches!(e, workloads::Event::FreeRequested { .. }));
            assert_eq!(stream.shell().name, held.trace.name, "{name}");
            assert_eq!(stream.shell().meta, held.trace.meta, "{name}");
            assert_eq!(stream.hints(), &held.hints, "{name}");
            for config in configs {
                let options = ReplayOptions {
                    // The engine's own checks are the oracle tests'; here the streamed
                    // events are what is checked, against the held ones.
                    check_invariants: false,
                    continue_after_oom: capacity < (80 << 30),
                    ..ReplayOptions::default()
                };
                let mut p = config.build().unwrap();
                let mut d = SimDevice::with_hints(device.clone(), held.hints.for_policy(config));
                let expected =
                    replay_with(&held.trace, p.as_mut(), &mut d, &options, &mut ()).unwrap();
                let mut p = config.build().unwrap();
                let mut d =
                    SimDevice::with_hints(device.clone(), stream.hints().for_policy(config));
                let got = stream
                    .replay(p.as_mut(), &mut d, &options, lenient, &mut ())
                    .unwrap()
                    .unwrap_or_else(|| panic!("{name}: {} did not stream", config.kind_name()));
                let what = format!(
                    "{name}, {}, {capacity}, lenient {lenient}",
                    config.kind_name()
                );
                assert_eq!(got.replay, expected, "{what}");
                assert_eq!(got.events, held.trace.events.len() as u64, "{what}");
                assert_eq!(got.allocs, held.trace.alloc_count() as u64, "{what}");
                let peak = expected
                    .summary
                    .reserved_peak_event_index
                    .map(|i| held.trace.locations[i as usize]);
                assert_eq!(got.reserved_peak_entry, peak, "{what}");
            }
        }
    }
    (streamed, empty_caches, free_requests)
}

/// Every snapshot pickle of the repository replays the same streamed as held, and the
/// ones that start from an empty allocator without private pools do stream; those
/// that start mid-run or show private pools, or that the held path refuses, do not.
#[test]
fn repository_snapshots_stream_as_held() {
    let mut files = Vec::new();
    for dir in ["tests/data", "examples", "docs", "fuzz/seeds", "workloads"] {
        let dir = root().join(dir);
        if dir.is_dir() {
            pickles(&dir, &mut files);
        }
    }
    assert!(files.len() >= 30, "{files:?}");
    let configs = policies();
    let mut streamed = Vec::new();
    let (mut empty_caches, mut free_requests) = (0, 0);
    for f in &files {
        let (yes, e, r) = compare(f, &configs);
        if yes {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            streamed.push(rel);
            empty_caches += e;
            free_requests += r;
        }
    }
    // The streamed ones have inferred empty_cache calls and delayed frees to place.
    assert!(
        empty_caches > 0 && free_requests > 0,
        "{empty_caches} {free_requests}"
    );
    let expected = [
        "tests/data/oracle/h100-torch2.11-pickles/gpt_train_small.pickle",
        "tests/data/oracle/h100-torch2.11-pickles/multistream.pickle",
        "tests/data/oracle/h100-torch2.11-pickles/random_stress.pickle",
        "tests/data/oracle/h100-torch2.11-pickles/random_stress__cap5120M.pickle",
        "tests/data/oracle/h100-torch2.11-pickles/seed000.pickle",
        "tests/data/oracle/h100-torch2.11-pickles/seed002_retain.pickle",
        "tests/data/torch/multistream.pickle",
        "tests/data/torch/seed002_retain.pickle",
        "tests/data/torch/synthetic/torch215_default_pool.pickle",
    ];
    assert_eq!(streamed, expected);
}

/// Synthetic snapshots made of the real traces repeated at fresh addresses (with and
/// without stack frames, as the benchmarks make them) stream as they replay held.
#[test]
fn synthetic_snapshots_stream_as_held() {
    let dir = std::env::temp_dir().join(format!("allocsim-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let configs = policies();
    for frames in [false, true] {
        let path = dir.join(format!("synth-{frames}.pickle"));
        synth::write_snapshot(&path, 1 << 20, frames).unwrap();
        assert!(compare(&path, &configs).0, "{}", path.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With a pickle memo window of a few slots (the streamed read lets most slots go many
/// times over), the real snapshots and synthetic ones with and without stack frames
/// still read in both passes, and give the held trace's events and entries: no slot
/// let go is referred to later.
#[test]
fn a_small_memo_window_reads_the_same() {
    let dir = std::env::temp_dir().join(format!("allocsim-memo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let oracle = root().join("tests/data/oracle/h100-torch2.11-pickles");
    let mut paths: Vec<PathBuf> = ["gpt_train_small", "random_stress", "multistream"]
        .iter()
        .map(|n| oracle.join(format!("{n}.pickle")))
        .collect();
    for frames in [false, true] {
        let path = dir.join(format!("synth-{frames}.pickle"));
        synth::write_snapshot(&path, 1 << 20, frames).unwrap();
        paths.push(path);
    }
    for path in &paths {
        let trace = workloads::read_snapshot_pickle(path, 0)
            .unwrap()
            .to_trace()
            .unwrap();
        let expected: Vec<(workloads::Event, u64)> =
            trace.events.into_iter().zip(trace.locations).collect();
        for window in [16, 1000] {
            let plan = workloads::snapshot::plan_stream_with(path, 0, window)
                .unwrap_or_else(|w| panic!("{}: {w:?}", path.display()));
            let mut events = plan.events_with(window);
            let got: Vec<(workloads::Event, u64)> = events.by_ref().collect();
            events.finish().unwrap();
            assert!(got == expected, "{}, window {window}", path.display());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
