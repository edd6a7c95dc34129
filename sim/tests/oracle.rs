//! The caching policy against every recorded PyTorch 2.11 run in `tests/data/oracle`
//! and `tests/data/recorded`.

use std::path::PathBuf;

use sim::fidelity::{fidelity, FidelityOptions};

fn oracle_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/oracle/h100-torch2.11")
}

/// Every recorded run is reproduced exactly: segment decisions, peaks, OOM point and
/// checkpoints (with every policy invariant checked after each request).
#[test]
fn every_recorded_run_is_exact() {
    all_exact(&oracle_dir(), 17);
}

/// The runs this project recorded itself on an H100 with PyTorch 2.11
/// (`tests/data/recorded`: other configurations and caps than `tests/data/oracle`, among them
/// expandable segments running out under a cap, `large_segment_size_mb`, GC at 0.8 and
/// `max_non_split_rounding_mb`) are reproduced exactly too.
#[test]
fn every_run_recorded_here_is_exact() {
    all_exact(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/recorded"),
        14,
    );
}

fn all_exact(dir: &std::path::Path, expected: usize) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= expected,
        "expected {expected} recorded runs in {}, found {}",
        dir.display(),
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
        println!("{:?}", report.row);
        if !report.row.exact {
            failures.push(report.explain().to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
