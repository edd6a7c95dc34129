//! The caching policy against every recorded PyTorch 2.11 run in `../shared/oracle`.

use std::path::PathBuf;

use sim::fidelity::{fidelity, FidelityOptions};

fn oracle_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/oracle/h100-torch2.11")
}

/// Every recorded run is reproduced exactly: segment decisions, peaks, OOM point and
/// checkpoints (with every policy invariant checked after each request).
#[test]
fn every_recorded_run_is_exact() {
    let dir = oracle_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (CI must have ../shared beside the repository)",
                dir.display()
            )
        })
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 17,
        "expected the 17 recorded runs, found {}",
        files.len()
    );
    let options = FidelityOptions {
        check_invariants: true,
        ..FidelityOptions::default()
    };
    let mut failures = Vec::new();
    for f in &files {
        let run = workloads::read_recorded_json(f).unwrap();
        let report = fidelity(&run, &options).unwrap();
        println!("{}", report.row.fields().join(","));
        if !report.row.exact {
            failures.push(report.explain().to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
