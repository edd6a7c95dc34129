//! A PyTorch snapshot pickle recorded on the GPU machine (tests/data/torch/) gives the
//! same trace and the same fidelity result as the JSON of the same run.

use sim::fidelity::{fidelity, FidelityOptions};

use crate::util::root;

/// Each committed pickle matches its JSON twin: same requests, same segment decisions,
/// and both reproduced exactly by the caching policy.
#[test]
fn recorded_pickle_matches_its_json() {
    let dir = root().join("tests/data/torch");
    let mut pickles: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    pickles.sort();
    assert!(!pickles.is_empty(), "no pickle under {}", dir.display());
    for pickle in pickles {
        let json = pickle.with_extension("json");
        let from_pickle = workloads::read_recorded(&pickle, None, 0).unwrap();
        let from_json = workloads::read_recorded(&json, None, 0).unwrap();
        assert_eq!(
            from_pickle.to_trace().unwrap().events,
            from_json.to_trace().unwrap().events,
            "{}",
            pickle.display()
        );
        let a = fidelity(&from_pickle, &FidelityOptions::default()).unwrap();
        let b = fidelity(&from_json, &FidelityOptions::default()).unwrap();
        assert!(
            a.row.exact && b.row.exact,
            "{}\n{}",
            a.explain(),
            b.explain()
        );
        // Same decisions; entry indexes differ where the JSON has an inserted marker.
        let decisions = |r: &sim::fidelity::FidelityReport| {
            r.sim_ops
                .iter()
                .map(|o| (o.action, o.bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(decisions(&a), decisions(&b), "{}", pickle.display());
        assert_eq!(
            a.row.reserved_bytes_peak_sim,
            b.row.reserved_bytes_peak_torch
        );
        assert_eq!(a.row.oom_event_torch, b.row.oom_event_torch);
    }
}

/// Any bytes, and real files cut short or with a byte changed, given to every reader:
/// an error or a trace, never a panic; whatever parses also validates and replays
/// (leniently, continuing after OOMs) under every policy with invariants checked.
mod robustness {
    use std::path::Path;

    use policies::PolicyConfig;
    use proptest::prelude::*;
    use sim::{ReplayOptions, SimDevice, SimDeviceOptions};

    use crate::util::root;

    fn samples() -> Vec<(&'static str, Vec<u8>)> {
        let read = |p: &str| std::fs::read(root().join(p)).unwrap();
        vec![
            ("csv", read("examples/random_small.csv")),
            ("yaml", read("examples/training_loop.yaml")),
            ("pickle", read("tests/data/torch/multistream.pickle")),
            ("json", read("tests/data/torch/seed002_retain.json")),
        ]
    }

    fn parse(kind: &str, bytes: &[u8]) -> Option<workloads::Trace> {
        let path = Path::new("fuzz");
        match kind {
            "csv" => workloads::csv::read_csv_from(bytes, path).ok(),
            "yaml" => workloads::yaml::read_yaml_from(bytes, path).ok(),
            "pickle" => workloads::snapshot::read_snapshot_pickle_from(bytes, path, 0)
                .ok()?
                .to_trace()
                .ok(),
            _ => workloads::read_recorded_json_from(bytes, path)
                .ok()?
                .to_trace()
                .ok(),
        }
    }

    /// Returns whether the bytes parsed (and were replayed).
    fn exercise(kind: &str, bytes: &[u8]) -> bool {
        let Some(trace) = parse(kind, bytes) else {
            return false;
        };
        let _ = workloads::validate::validate(&trace);
        let options = ReplayOptions {
            check_invariants: true,
            continue_after_oom: true,
            ..ReplayOptions::default()
        };
        for config in PolicyConfig::defaults() {
            let mut policy = config.build().unwrap();
            let mut device = SimDevice::new(SimDeviceOptions::default().with_capacity(4 << 30));
            sim::replay(&trace, policy.as_mut(), &mut device, &options).unwrap();
        }
        true
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// Arbitrary bytes.
        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512), kind in 0usize..4) {
            exercise(["csv", "yaml", "pickle", "json"][kind], &bytes);
        }

        /// A real file cut short, with one byte changed.
        #[test]
        fn mutated_real_files(kind in 0usize..4, cut in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let (name, mut bytes) = samples().swap_remove(kind);
            let len = cut.index(bytes.len() + 1);
            bytes.truncate(len);
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            exercise(name, &bytes);
        }

        /// A text trace with one line dropped (a dropped alloc leaves an unknown free,
        /// replayed leniently) and cut after some line: these mostly parse.
        #[test]
        fn dropped_and_cut_lines(kind in 0usize..2, drop_at in any::<prop::sample::Index>(), keep in any::<prop::sample::Index>()) {
            let (name, bytes) = samples().swap_remove(kind);
            let text = String::from_utf8(bytes).unwrap();
            let mut lines: Vec<&str> = text.lines().collect();
            let keep = 2 + keep.index(lines.len() - 1);
            lines.truncate(keep);
            let dropped = 1 + drop_at.index(lines.len() - 1);
            lines.remove(dropped);
            let cut = lines.join("\n") + "\n";
            exercise(name, cut.as_bytes());
        }
    }

    /// The mutations above do reach the replay: most line-level cuts parse.
    #[test]
    fn line_cuts_mostly_parse() {
        let (name, bytes) = samples().swap_remove(0);
        let text = String::from_utf8(bytes).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let parsed = (2..40)
            .filter(|&k| exercise(name, (lines[..k].join("\n") + "\n").as_bytes()))
            .count();
        assert_eq!(parsed, 38);
    }
}

/// A user's own script's snapshots (`tests/data/torch/user/user_empty_cache.py`, H200,
/// no recorder, no private pool; PyTorch's default stack traces, Python ones only, and
/// with expandable segments): `torch.cuda.empty_cache()`, then an allocation that needs
/// a new segment at once. By position that release was the malloc's own (which PyTorch
/// does only when cudaMalloc fails), and the replay kept the freed segments (a reserved
/// peak of 700 MiB where PyTorch had 400); the frames say it was `empty_cache()`, and
/// every one replays exactly. Such a snapshot is read whole (twice: with its frames the
/// second time), and read from a stream its frames cannot be read again: a warning.
#[test]
fn an_empty_cache_right_before_a_new_segment_is_one() {
    let dir = root().join("tests/data/torch/user");
    for name in [
        "empty_cache",
        "empty_cache__python",
        "empty_cache__expandable",
    ] {
        let path = dir.join(format!("{name}.pickle"));
        let run = workloads::read_recorded(&path, None, 0).unwrap();
        let empty_caches = run
            .entries
            .iter()
            .filter(|e| e.action == workloads::Action::EmptyCache)
            .count();
        assert_eq!(empty_caches, 2, "{name}");
        let report = fidelity(&run, &FidelityOptions::default()).unwrap();
        assert!(report.row.exact, "{name}: {}", report.explain());
        assert!(matches!(
            workloads::snapshot::plan_stream(&path, 0),
            Err(workloads::snapshot::WholeTrace::Frames)
        ));
        let bytes = std::fs::read(&path).unwrap();
        let streamed =
            workloads::snapshot::read_snapshot_pickle_from(bytes.as_slice(), &path, 0).unwrap();
        let caveat = streamed.meta.caveats.join("\n");
        assert!(
            caveat.contains("torch.cuda.empty_cache() calls"),
            "{caveat}"
        );
        assert!(
            !fidelity(&streamed, &FidelityOptions::default())
                .unwrap()
                .row
                .exact
        );
    }
    // Recorded without stack frames (`context=None`), the snapshot cannot say: it
    // replays by position (the freed segments kept) and says so, naming the entry.
    let path = dir.join("empty_cache__no_frames.pickle");
    let run = workloads::read_recorded(&path, None, 0).unwrap();
    let caveat = run.meta.caveats.join("\n");
    assert!(
        caveat.contains("has no stack frames") && caveat.contains("at entry 16,"),
        "{caveat}"
    );
    let report = fidelity(&run, &FidelityOptions::default()).unwrap();
    assert!(!report.row.exact && !report.row.segment_ops_match);
    let out = crate::util::allocsim(["replay", path.to_str().unwrap()]);
    assert!(crate::util::stderr(&out).contains("has no stack frames"));
}

/// Users' own scripts' snapshots (`tests/data/torch/user/user_scenarios*.py`, H200,
/// no recorder, PyTorch's default stack traces), each a
/// common way of using the allocator: every one makes PyTorch's segment decisions, peak
/// and OOM, and each is exact but the CUDA graph captures, whose warm-up requests on the
/// side stream were given back before the snapshot (PyTorch 2.11 writes no pool for
/// them: a warning). Capped runs are given their cap (`set_per_process_memory_fraction`
/// of 0.02 and 0.01 of the H200's 150 109 880 320 bytes), which a snapshot does not
/// hold. Main before (`7dc5d2f`) made eleven of the sixteen part from PyTorch, each at
/// an `empty_cache()` right before a new segment (the ring buffer's too).
#[test]
fn users_snapshots_make_pytorchs_decisions() {
    let dir = root().join("tests/data/torch/user");
    for (name, cap, exact) in [
        ("expandable_empty_cache", None, true),
        ("gc_fraction", Some(3_002_197_606u64), true),
        ("gc_fraction__gc", Some(3_002_197_606), true),
        ("graph", None, false),
        ("graph__expandable", None, false),
        ("mempool", None, true),
        ("train_empty_cache", None, true),
        // user_scenarios2.py
        ("ring", None, true),
        ("ring__expandable", None, true),
        ("graphed", None, false),
        ("oom_continue", Some(1_501_098_803), true),
        ("raw", None, true),
        ("config", None, true),
        // user_scenarios3.py
        ("kv_server", None, true),
        ("kv_server__expandable_gc", None, true),
        ("shared_pool_graphs", None, false),
    ] {
        let path = dir.join(format!("scenario_{name}.pickle"));
        let run = workloads::read_recorded(&path, None, 0).unwrap();
        let mut options = FidelityOptions::default();
        options.overrides.memory_limit = cap.map(policies::caching::MemoryLimit::Bytes);
        let report = fidelity(&run, &options).unwrap();
        assert!(report.row.segment_ops_match, "{name}: {}", report.explain());
        assert_eq!(
            report.row.reserved_bytes_peak_sim, report.row.reserved_bytes_peak_torch,
            "{name}"
        );
        assert_eq!(
            report.row.oom_event_sim, report.row.oom_event_torch,
            "{name}"
        );
        assert_eq!(report.row.exact, exact, "{name}: {:?}", run.meta.caveats);
        if !exact {
            assert_eq!(run.meta.caveats.len(), 1, "{name}");
            assert!(
                run.meta.caveats[0].contains("does not say the pool of"),
                "{name}: {}",
                run.meta.caveats[0]
            );
        }
    }
}
