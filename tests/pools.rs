//! Private pools recorded on the GPU (tests/data/pools/): the snapshot pickles of those
//! runs against the recorder's JSON, which knows the pool of every request; and the
//! same pickles as PyTorch 2.15 writes them (`pool_id` on every entry).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sim::fidelity::{fidelity, FidelityOptions};
use workloads::{Action, PoolId, RecordedRun};

use crate::util::{allocsim, root, stderr};

fn pools_dir() -> PathBuf {
    root().join("tests/data/pools")
}

fn read(path: &Path) -> RecordedRun {
    workloads::read_recorded(path, None, 0).unwrap_or_else(|e| panic!("{e}"))
}

/// The recorder's pool of each request of a JSON run, by the index of the same entry
/// in its pickle (the JSON has the pickle's entries and the recorder's `empty_cache`
/// markers).
fn ground_truth(json: &Path, pickle: &RecordedRun) -> HashMap<u64, PoolId> {
    let text = std::fs::read_to_string(json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = v["events"].as_array().unwrap();
    let pickle_index: Vec<Option<u64>> = {
        let mut k = 0u64;
        events
            .iter()
            .map(|e| {
                if e[0] == "empty_cache" {
                    None
                } else {
                    k += 1;
                    Some(k - 1)
                }
            })
            .collect()
    };
    let mut truth = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if e[0] == "alloc" || e[0] == "oom" {
            truth.insert(pickle_index[i].unwrap(), PoolId(0, 0));
        }
    }
    for p in v["request_pools"].as_array().unwrap() {
        let i = p[0].as_u64().unwrap() as usize;
        truth.insert(
            pickle_index[i].unwrap(),
            PoolId(p[1].as_u64().unwrap(), p[2].as_u64().unwrap()),
        );
    }
    // The pickle's requests are the JSON's.
    let requests = pickle
        .source_indexes
        .iter()
        .zip(&pickle.entries)
        .filter(|(_, e)| matches!(e.action, Action::Alloc | Action::Oom))
        .count();
    assert_eq!(requests, truth.len(), "{}", json.display());
    truth
}

fn pickles(suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(pools_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "pickle")
                && p.file_stem().unwrap().to_str().unwrap().ends_with(suffix)
        })
        .collect();
    out.sort();
    out
}

/// A 2.11 snapshot says the pool of the requests in the segments it lists, and every
/// pool it says is the one the recorder saw; the requests in memory given back before
/// it was taken are named, with the pools, in a caveat, so `fidelity` never calls the
/// snapshot exact and `replay` warns.
#[test]
fn torch_2_11_pickles_attribute_what_their_segments_show() {
    let list: Vec<PathBuf> = pickles("")
        .into_iter()
        .filter(|p| !p.to_str().unwrap().ends_with("__torch215.pickle"))
        .collect();
    assert!(list.len() >= 3, "{list:?}");
    for pickle in list {
        let run = read(&pickle);
        let truth = ground_truth(&pickle.with_extension("json"), &run);
        let info = run.snapshot.as_ref().unwrap();
        let pools = &info.pools;
        let mut private = 0;
        for &(i, pool) in &pools.request_pools {
            assert_eq!(truth[&i], pool, "{}: entry {i}", pickle.display());
            private += 1;
        }
        let truth_private = truth.values().filter(|p| !p.is_default()).count();
        assert!(private > 0, "{}", pickle.display());
        // The requests said to be the default pools' are.
        let said: std::collections::HashSet<u64> = pools
            .request_pools
            .iter()
            .map(|&(i, _)| i)
            .chain(pools.unattributed.iter().copied())
            .collect();
        for (&i, pool) in &truth {
            if !said.contains(&i) {
                assert!(pool.is_default(), "{}: entry {i}", pickle.display());
            }
        }
        assert!(
            private + pools.unattributed.len() >= truth_private,
            "{}: {private} attributed, {} unknown, {truth_private} private",
            pickle.display(),
            pools.unattributed.len()
        );
        assert!(!pools.unattributed.is_empty(), "{}", pickle.display());
        let caveat = run.meta.caveats.join("\n");
        assert!(
            caveat.contains("the snapshot shows private pools (1, 0)")
                || caveat.contains("the snapshot shows private pools (0, 1)"),
            "{}: {caveat}",
            pickle.display()
        );
        let report = fidelity(&run, &FidelityOptions::default()).unwrap();
        assert!(!report.row.exact, "{}", pickle.display());
        let out = allocsim(["replay", pickle.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("warning: the snapshot shows private pools"),
            "{}",
            stderr(&out)
        );
    }
}

/// The same runs as PyTorch 2.15 writes them (`make_torch215.py`: each entry's
/// `pool_id` from the recorder's ground truth): every request's pool is read from its
/// entry, and the replay of the snapshot alone makes PyTorch's segment decisions, peaks
/// and OOM exactly, with nothing left unsaid.
#[test]
fn torch_2_15_pickles_replay_exactly() {
    let list = pickles("__torch215");
    assert!(list.len() >= 2, "{list:?}");
    for pickle in list {
        let run = read(&pickle);
        let stem = pickle.file_stem().unwrap().to_str().unwrap();
        let json = pools_dir().join(format!("{}.json", stem.trim_end_matches("__torch215")));
        let truth = ground_truth(&json, &run);
        let pools = &run.snapshot.as_ref().unwrap().pools;
        assert!(pools.unattributed.is_empty(), "{}", pickle.display());
        assert_eq!(pools.by_entry as usize, truth.len());
        let private: HashMap<u64, PoolId> = truth
            .iter()
            .filter(|(_, p)| !p.is_default())
            .map(|(&i, &p)| (i, p))
            .collect();
        assert_eq!(
            pools
                .request_pools
                .iter()
                .copied()
                .collect::<HashMap<_, _>>(),
            private,
            "{}",
            pickle.display()
        );
        assert!(run.meta.caveats.is_empty(), "{:?}", run.meta.caveats);
        // A snapshot holds neither the cap nor the device's total: the JSON's.
        let recorded = read(&json);
        let mut options = FidelityOptions {
            check_invariants: true,
            ..FidelityOptions::default()
        };
        options.device.total_bytes = recorded.meta.total_bytes.unwrap();
        options.overrides.memory_limit = recorded
            .meta
            .memory_fraction()
            .map(policies::caching::MemoryLimit::Fraction);
        let report = fidelity(&run, &options).unwrap();
        assert!(report.row.exact, "{}", report.explain());
        let from_json = fidelity(&recorded, &FidelityOptions::default()).unwrap();
        let decisions = |r: &sim::fidelity::FidelityReport| {
            r.sim_ops
                .iter()
                .map(|o| (o.action, o.bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            decisions(&report),
            decisions(&from_json),
            "{}",
            pickle.display()
        );
        assert_eq!(
            report.row.oom_event_torch.is_some(),
            from_json.row.oom_event_torch.is_some()
        );
    }
}

fn compiled_dir() -> PathBuf {
    pools_dir().join("compiled")
}

/// The `restore_block` events of a trace: (pool, address).
fn restore_blocks(run: &RecordedRun) -> Vec<(PoolId, u64)> {
    run.to_trace()
        .unwrap()
        .events
        .iter()
        .filter_map(|e| match e {
            workloads::Event::RestoreBlock { pool, addr } => Some((*pool, *addr)),
            _ => None,
        })
        .collect()
}

/// The allocations of `torch.compile`'s checkpoint restores in a snapshot pickle
/// (`compiled_graphs` training, its trees' pool alive when the snapshot was taken),
/// found by their stack frames, take their blocks as the recorder's JSON of the same
/// run has them, and the `empty_cache()` of `torch.cuda.graph` between the trees'
/// warm-up and a capture ends the pool's window: every request is placed and every
/// segment allocated and given back as PyTorch did (before: a restore's block went to
/// the best fit at entry 1710, and the window that spanned the `empty_cache()` kept a
/// default-pool segment at entry 6001); only the pool of 3 requests whose memory was
/// given back is unknown (PyTorch 2.11 writes none), which the caveat says.
#[test]
fn checkpoint_restores_in_a_pickle_take_their_blocks() {
    let pickle = compiled_dir().join("compiled_graphs__train-1_reset-0.pickle");
    let run = read(&pickle);
    let json = read(&pickle.with_extension("json"));
    let from_pickle = restore_blocks(&run);
    let from_json = restore_blocks(&json);
    assert_eq!(from_pickle.len(), 43);
    assert_eq!(from_pickle, from_json);
    // Frames were read to find them, not kept.
    assert!(run.snapshot.as_ref().unwrap().frames.is_none());
    let report = fidelity(&run, &FidelityOptions::default()).unwrap();
    assert!(report.misplaced.is_none(), "{}", report.explain());
    assert!(report.row.segment_ops_match, "{}", report.explain());
    assert_eq!(
        report.row.reserved_bytes_peak_sim,
        report.row.reserved_bytes_peak_torch
    );
    assert_eq!(run.meta.caveats.len(), 1, "{:?}", run.meta.caveats);
    assert!(run.meta.caveats[0].contains("does not say the pool of 3 of its"));

    // With the frames asked for, the same restores; read from a stream (no file to
    // read again), none, and a caveat says why.
    let options = workloads::snapshot::SnapshotOptions { keep_frames: true };
    let framed = workloads::snapshot::read_snapshot_pickle_with(&pickle, 0, &options).unwrap();
    assert_eq!(restore_blocks(&framed), from_json);
    assert!(framed.snapshot.as_ref().unwrap().frames.is_some());
    let bytes = std::fs::read(&pickle).unwrap();
    let streamed =
        workloads::snapshot::read_snapshot_pickle_from(bytes.as_slice(), &pickle, 0).unwrap();
    assert!(restore_blocks(&streamed).is_empty());
    assert!(
        streamed
            .meta
            .caveats
            .iter()
            .any(|c| c.contains("was not read from a file")),
        "{:?}",
        streamed.meta.caveats
    );
    // The streaming replay hands such a snapshot to the whole-trace reader.
    assert!(matches!(
        workloads::snapshot::plan_stream(&pickle, 0),
        Err(workloads::snapshot::WholeTrace::Frames)
    ));
}

/// Compiled runs' pickles taken while their trees' pool was alive (`compiled_graphs`,
/// batch sizes 4 and 16; 4, 16 and 64 with expandable segments) replay exactly from the
/// snapshot alone, their restores taking their blocks, with no warning: the trees'
/// pool `(0, 1)` is known from the frames to be a graph pool's, not a MemPool's whose
/// `no_split` nothing shows (the expandable run was reported not exact for that before).
#[test]
fn compiled_pickles_with_their_pool_replay_exactly() {
    for name in [
        "compiled_graphs__batches-4_16_calls-3_reset-0",
        "compiled_graphs__reset-0__expandable_segments-True",
    ] {
        let pickle = compiled_dir().join(format!("{name}.pickle"));
        let run = read(&pickle);
        assert_eq!(
            restore_blocks(&run),
            restore_blocks(&read(&pickle.with_extension("json")))
        );
        assert!(!restore_blocks(&run).is_empty());
        assert!(
            run.meta.caveats.is_empty(),
            "{name}: {:?}",
            run.meta.caveats
        );
        let report = fidelity(&run, &FidelityOptions::default()).unwrap();
        assert!(report.row.exact, "{}", report.explain());
        let out = allocsim(["replay", pickle.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    }
}

/// A pickle taken after the trees' pool was gone (`torch._dynamo.reset()`) shows no
/// private pool; its frames show the trees, and the reader says that the trees'
/// requests replay from the default pools (it replayed them silently before).
#[test]
fn trees_whose_pool_was_gone_are_named() {
    let pickle = compiled_dir().join("compiled_graphs__batches-4_16_calls-3.pickle");
    let run = read(&pickle);
    assert!(run.snapshot.as_ref().unwrap().pools.shown.is_empty());
    let caveat = run.meta.caveats.join("\n");
    assert!(caveat.contains("CUDA graph trees"), "{caveat}");
    let report = fidelity(&run, &FidelityOptions::default()).unwrap();
    assert!(!report.row.exact);
    let plan = workloads::snapshot::plan_stream(&pickle, 0).unwrap();
    assert!(plan
        .shell()
        .meta
        .caveats
        .join("\n")
        .contains("CUDA graph trees"));
    let out = allocsim(["replay", pickle.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning") && stderr(&out).contains("CUDA graph trees"),
        "{}",
        stderr(&out)
    );
}

/// A user's own script's snapshot, taken without the recorder (`user_compiled.py`: a
/// CNN under `torch.compile(mode="reduce-overhead")`, three batch sizes, memory history
/// with PyTorch's defaults, C++ frames too): its segment decisions and peak are
/// PyTorch's. `torch.cuda.graph` calls `torch.cuda.empty_cache()` just before each
/// capture, and there the release was followed at once by the capture's first segment
/// (no recorder's mark between), so it was taken for that malloc giving memory back,
/// which kept a 60 MiB segment (entry 1770); the frames now say it was `empty_cache()`.
/// Only the pool of 6 requests whose memory was given back is unknown (PyTorch 2.11).
#[test]
fn a_users_compiled_snapshot_makes_pytorchs_decisions() {
    let pickle = compiled_dir().join("user_cnn_infer.pickle");
    let run = read(&pickle);
    let report = fidelity(&run, &FidelityOptions::default()).unwrap();
    assert!(report.row.segment_ops_match, "{}", report.explain());
    assert_eq!(
        report.row.reserved_bytes_peak_sim,
        report.row.reserved_bytes_peak_torch
    );
    assert_eq!(run.meta.caveats.len(), 1, "{:?}", run.meta.caveats);
    assert!(run.meta.caveats[0].contains("does not say the pool of 6 of its"));
    // The empty_cache() before the capture's first segment.
    let k = run.source_indexes.iter().position(|&i| i == 1770).unwrap();
    assert_eq!(run.entries[k].action, Action::EmptyCache);
}

/// A user's transformer under `torch.compile(mode="reduce-overhead")` with sequence
/// buckets, trained, recorded into a ring buffer of 1500 entries
/// (`user_scenarios4.py compiled_ring`, H200, no recorder): a snapshot that starts
/// mid-run with the trees' pool live, and `torch.cuda.graph`'s `empty_cache()` before
/// captures in it. It makes PyTorch's segment decisions and peak (main before parted at
/// entry 181); what it cannot say (segments live at its start whose pool is unknown, 2
/// requests' pool) its caveats say.
#[test]
fn a_compiled_ring_buffer_snapshot_makes_pytorchs_decisions() {
    let pickle = compiled_dir().join("user_transformer_ring.pickle");
    let run = read(&pickle);
    assert!(run.to_trace().unwrap().start.is_some());
    let report = fidelity(&run, &FidelityOptions::default()).unwrap();
    assert!(report.row.segment_ops_match, "{}", report.explain());
    assert_eq!(
        report.row.reserved_bytes_peak_sim,
        report.row.reserved_bytes_peak_torch
    );
    let caveats = run.meta.caveats.join("\n");
    assert!(
        caveats.contains("does not say the pool of 2 of its"),
        "{caveats}"
    );
}
