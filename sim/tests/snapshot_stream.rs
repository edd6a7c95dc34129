//! A snapshot pickle's streamed replay (`sim::inputs::SnapshotStream`: two passes over
//! the file, neither holding its entries) against the whole-trace path (read, to
//! `Trace`, validate, replay): on every snapshot pickle of the repository and on
//! synthetic ones, under every policy, at a capacity that fits and one that runs out,
//! checked and lenient, the same replay, event and alloc counts and entry of the
//! reserved peak, and the state a trace that starts mid-run starts from; what cannot
//! stream is what the whole-trace path needs.

use std::path::{Path, PathBuf};

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
    policies::testing::every_policy()
        .into_iter()
        .map(|s| s.config)
        .collect()
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
            assert_eq!(stream.shell().start, held.trace.start, "{name}");
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
                let expected = replay_with(&held.trace, p.as_mut(), &mut d, &options, &mut ());
                let mut p = config.build().unwrap();
                let mut d =
                    SimDevice::with_hints(device.clone(), stream.hints().for_policy(config));
                let got = stream.replay(p.as_mut(), &mut d, &options, lenient, &mut ());
                let expected = match expected {
                    Ok(r) => r,
                    // A replay that fails held fails the same streamed, or hands over
                    // to the whole-trace path. (A mid-run state that does not fit the
                    // device is no failure: an out-of-memory before the first event,
                    // streamed as held.)
                    Err(e) => {
                        match got {
                            Err(sim::inputs::StreamError::Replay(g)) => {
                                assert_eq!(format!("{g:?}"), format!("{e:?}"), "{name}");
                            }
                            Ok(None) => {}
                            other => panic!("{name}: {other:?} where held failed: {e:?}"),
                        }
                        continue;
                    }
                };
                let got = got
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
/// ones the held path replays do stream, from an empty allocator or from the state
/// rebuilt at their first entry (the ring-buffer and late-start cuts), with private
/// pools (CUDA graphs, MemPools; by entry and by address) or without; those that the
/// held path refuses do not, nor those that need their stack frames (checkpoint
/// restores, `empty_cache()` right before a new segment) or have none where a release
/// could be a malloc's (the graph captures here: read whole).
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
        "tests/data/pools/compiled/compiled_graphs__batches-4_16_calls-3.pickle",
        "tests/data/pools/mempool_phases__use_on_oom-1__cap1265M.pickle",
        "tests/data/pools/mempool_phases__use_on_oom-1__cap1265M__torch215.pickle",
        "tests/data/torch/cut/gpt_train_small__late59.pickle",
        "tests/data/torch/cut/gpt_train_small__wrap2000.pickle",
        "tests/data/torch/cut/multistream__wrap100.pickle",
        "tests/data/torch/cut/random_stress__cap5120M__wrap1000.pickle",
        "tests/data/torch/cut/random_stress__wrap3000.pickle",
        "tests/data/torch/cut/seed000__wrap10.pickle",
        "tests/data/torch/cut/seed002_retain__wrap20.pickle",
        "tests/data/torch/multistream.pickle",
        "tests/data/torch/seed002_retain.pickle",
        "tests/data/torch/synthetic/torch215_default_pool.pickle",
        "tests/data/torch/synthetic/torch215_frames.pickle",
        "tests/data/torch/synthetic/torch215_frames_p0.pickle",
        "tests/data/torch/synthetic/torch215_p0.pickle",
        "tests/data/torch/synthetic/torch215_p2.pickle",
        "tests/data/torch/synthetic/torch215_p4.pickle",
        "tests/data/torch/synthetic/torch215_p5.pickle",
        "tests/data/torch/user/scenario_config.pickle",
        "tests/data/torch/user/scenario_mempool.pickle",
        "tests/data/torch/user/scenario_oom_continue.pickle",
        "tests/data/torch/user/scenario_raw.pickle",
        "tests/data/torch/user/scenario_ring__expandable.pickle",
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

/// Writes `run`'s segments and the file entries `keep` of its trace (inferred
/// `empty_cache` entries left out, as PyTorch records none) as a snapshot pickle.
fn write_cut(run: &workloads::RecordedRun, keep: &[workloads::RecordedEntry], path: &Path) {
    let snapshot = workloads::snapshot::SnapshotOut {
        segments: run.segments.clone(),
        entries: keep
            .iter()
            .map(|e| workloads::snapshot::SnapshotEntry {
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: None,
                stack: None,
            })
            .collect(),
        alloc_conf: run.meta.alloc_conf.clone(),
        frames: None,
    };
    let bytes = workloads::snapshot::snapshot_bytes(
        &snapshot,
        workloads::snapshot::SnapshotEncoding::Pickle,
    );
    std::fs::write(path, bytes).unwrap();
}

/// Ring-buffer cuts of the real snapshots (their last N entries with the final
/// segments, as PyTorch's ring buffer keeps them) at many points stream, from the
/// start state the whole-trace path rebuilds, as they replay held; the same cuts with
/// an entry dropped, two swapped or an address moved (so that undoing the trace fails,
/// or rebuilds another state) stream as held or hand over to the whole-trace path.
#[test]
fn ring_buffer_cuts_stream_as_held() {
    let dir = std::env::temp_dir().join(format!("allocsim-cuts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let oracle = root().join("tests/data/oracle/h100-torch2.11-pickles");
    let all = policies();
    let some = &all[..1];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let (mut cuts, mut streamed, mut mutants, mut mutants_streamed) = (0, 0, 0, 0);
    for name in [
        "gpt_train_small",
        "random_stress",
        "random_stress__cap5120M",
        "multistream",
        "seed000",
        "seed002_retain",
    ] {
        let run =
            workloads::read_snapshot_pickle(&oracle.join(format!("{name}.pickle")), 0).unwrap();
        let entries: Vec<workloads::RecordedEntry> = run
            .entries
            .iter()
            .copied()
            .filter(|e| e.action != workloads::Action::EmptyCache)
            .collect();
        let n = entries.len();
        for k in 1..6 {
            let keep = &entries[n * k / 6..];
            let path = dir.join(format!("{name}-{k}.pickle"));
            write_cut(&run, keep, &path);
            let held = workloads::read_snapshot_pickle(&path, 0).unwrap();
            cuts += 1;
            let midrun = !held.starts_empty() && held.to_trace().is_ok();
            let (yes, _, _) = compare(&path, if k == 3 { &all } else { some });
            assert!(yes || !midrun, "{}: did not stream", path.display());
            streamed += usize::from(yes);
            for m in 0..if k % 2 == 1 { 6 } else { 0 } {
                let mut keep = keep.to_vec();
                let i = next(keep.len());
                match m % 4 {
                    0 => {
                        keep.remove(i);
                    }
                    1 if i + 1 < keep.len() => keep.swap(i, i + 1),
                    2 => keep[i].addr = keep[i].addr.wrapping_add(512),
                    _ => {
                        let j = next(keep.len());
                        let e = keep.remove(i);
                        keep.insert(j, e);
                    }
                }
                let path = dir.join(format!("{name}-{k}-{m}.pickle"));
                write_cut(&run, &keep, &path);
                mutants += 1;
                mutants_streamed += usize::from(compare(&path, some).0);
            }
        }
    }
    // Most clean cuts start mid-run and stream; some mutants still fit.
    assert!(streamed >= cuts * 3 / 4, "{streamed} of {cuts}");
    assert!(
        mutants_streamed > 0 && mutants_streamed < mutants,
        "{mutants_streamed} of {mutants}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ring-buffer cuts of the real snapshots with private pools recorded by PyTorch 2.11
/// (CUDA graph captures, with and without expandable segments, and MemPools): the
/// whole-trace path rebuilds the private pools' state at the first entry, and the
/// streamed path replays each cut as it does (the same events, results and caveats
/// under every policy), or hands it over where a segment the trace gives back needs the
/// requests in it to tell its pool.
#[test]
fn cuts_with_private_pools_stream_as_held() {
    let dir = std::env::temp_dir().join(format!("allocsim-pool-cuts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut midrun, mut streamed) = (0, 0);
    for name in [
        "graph_capture",
        "graph_capture__expandable_segments-True",
        "mempool_phases__use_on_oom-1__cap1265M",
    ] {
        let file = root().join(format!("tests/data/pools/{name}.pickle"));
        let run = workloads::read_snapshot_pickle(&file, 0).unwrap();
        assert!(!run.calls.is_empty(), "{name}");
        let entries: Vec<workloads::RecordedEntry> = run
            .entries
            .iter()
            .copied()
            .filter(|e| e.action != workloads::Action::EmptyCache)
            .collect();
        let n = entries.len();
        for k in 1..6 {
            let path = dir.join(format!("{name}-{k}.pickle"));
            write_cut(&run, &entries[n * k / 6..], &path);
            let held = workloads::read_snapshot_pickle(&path, 0).unwrap();
            if held.starts_empty() {
                continue;
            }
            let trace = held.to_trace().unwrap();
            if trace.start.as_ref().is_some_and(|s| !s.pools.is_empty()) {
                midrun += 1;
            }
            let (yes, _, _) = compare(&path, &policies());
            streamed += usize::from(yes);
        }
    }
    assert!(midrun >= 8 && streamed > 0, "{midrun} {streamed}");
    std::fs::remove_dir_all(&dir).unwrap();
}
