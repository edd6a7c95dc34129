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
