//! The caching policy against every recorded PyTorch 2.11 run in `tests/data/oracle`,
//! `tests/data/recorded` and `tests/data/unseen`.

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

fn unseen_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/unseen")
}

/// Runs recorded after the address model and the mid-run rebuild were written, of
/// workloads the project had not seen (`tests/data/unseen`: resnet, unet, KV-cache
/// inference, GPT training, caps that run out, expandable segments on an H100; a
/// mixture of experts, a batch size found by catching out-of-memory errors, a
/// prefetching side stream, serving that drops requests that run out, activation
/// checkpointing under fp16 with a GradScaler, a pipeline of streams,
/// DistributedDataParallel and FSDP2 in one process, on an H200),
/// are reproduced exactly under their own settings, and the table of docs/fidelity.md
/// says so.
#[test]
fn every_unseen_run_is_exact() {
    all_exact(&unseen_dir(), 34);
    let mut out = String::from(
        "| run | entries | reserved peak (B) | allocated peak (B) | OOM entry | segment ops | checkpoints | exact |\n| --- | ---: | ---: | ---: | ---: | --- | --- | --- |\n",
    );
    for run in runs_in(&unseen_dir()) {
        let r = fidelity(&run, &FidelityOptions::default()).unwrap();
        let row = &r.row;
        out += &format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            row.trace,
            row.events,
            row.reserved_bytes_peak_torch,
            row.allocated_bytes_peak_torch
                .map_or("—".into(), |a| a.to_string()),
            row.oom_event_torch.map_or("—".into(), |o| o.to_string()),
            if row.segment_ops_match {
                "match"
            } else {
                "differ"
            },
            if row.checkpoints_match {
                "match"
            } else {
                "differ"
            },
            row.exact
        );
    }
    check_doc_table("unseen", &out);
}

/// The recorded runs of a directory, by name.
fn runs_in(dir: &std::path::Path) -> Vec<workloads::RecordedRun> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| workloads::read_recorded_json(f).unwrap())
        .collect()
}

/// The runs with private pools this project recorded with PyTorch 2.11
/// (`tests/data/pools`: on an H100, CUDA graphs captured in pools of their own, in one
/// shared pool, with expandable segments; a MemPool with `no_split`, with `use_on_oom`
/// and with expandable segments running out of memory inside it; on an H200,
/// `torch.compile(mode="reduce-overhead")` inference and training, whose CUDA graph
/// trees warm up in their pool outside any capture, and with several batch sizes set
/// their pool back to a checkpoint: `setCheckpointPoolState`, an MLP and a GPT-like
/// decoder; `make_graphed_callables` for training) are reproduced exactly,
/// pool windows, releases, restores and all.
#[test]
fn every_pool_run_recorded_here_is_exact() {
    all_exact(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pools"),
        19,
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

/// Every recorded run that starts from an empty allocator: the oracle's, the ones
/// recorded here, the unseen ones.
fn all_runs() -> Vec<workloads::RecordedRun> {
    let mut runs = Vec::new();
    for dir in [
        oracle_dir(),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/recorded"),
        unseen_dir(),
    ] {
        runs.extend(runs_in(&dir));
    }
    runs
}

/// The lines of `docs/fidelity.md` between `<!-- table:NAME -->` and
/// `<!-- /table:NAME -->` must be `generated` (`UPDATE_EXPECT=1` rewrites them).
fn check_doc_table(name: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/fidelity.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (open, close) = (
        format!("<!-- table:{name} -->\n"),
        format!("<!-- /table:{name} -->"),
    );
    let start = text
        .find(&open)
        .unwrap_or_else(|| panic!("docs/fidelity.md has no {open}"))
        + open.len();
    let end = start
        + text[start..]
            .find(&close)
            .unwrap_or_else(|| panic!("no {close}"));
    if text[start..end] == *generated {
        return;
    }
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        let updated = format!("{}{generated}{}", &text[..start], &text[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "docs/fidelity.md table '{name}' is out of date (UPDATE_EXPECT=1 rewrites it); now:\n{generated}"
    );
}

/// The driver address model against every recorded run's segment addresses: the
/// placement table of docs/fidelity.md ("Addresses") is what the model does now.
#[test]
fn placement_table_is_current() {
    let mut out = String::from(
        "| run | segments | below all earlier | order right (model) | exact, given the recorded state |\n| --- | ---: | ---: | ---: | ---: |\n",
    );
    let mut total = sim::address::PlacementCheck::default();
    for run in all_runs() {
        let c = sim::address::check_placements(&sim::recorded::placements(&run), 0);
        if c.segments == 0 {
            continue;
        }
        total.segments += c.segments;
        total.below_all += c.below_all;
        total.order_right += c.order_right;
        total.exact_right += c.exact_right;
        out += &format!(
            "| `{}` | {} | {} | {} | {} |\n",
            run.name, c.segments, c.below_all, c.order_right, c.exact_right
        );
    }
    let pct = |n: usize| format!("{n} ({:.0} %)", 100.0 * n as f64 / total.segments as f64);
    out += &format!(
        "| all | {} | {} | {} | {} |\n",
        total.segments,
        pct(total.below_all),
        pct(total.order_right),
        pct(total.exact_right)
    );
    check_doc_table("placements", &out);
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn peak_delta(sim: u64, torch: u64) -> String {
    if sim == torch {
        "0".into()
    } else {
        let d = sim as i128 - torch as i128;
        format!(
            "{}{} MiB",
            if d > 0 { "+" } else { "−" },
            d.unsigned_abs() >> 20
        )
    }
}

fn oom_cell(sim: Option<usize>, torch: Option<usize>) -> String {
    match (sim, torch) {
        (None, None) => "—".into(),
        (s, t) if s == t => format!("{} (same)", t.unwrap()),
        (s, t) => format!("sim {s:?}, PyTorch {t:?}"),
    }
}

/// The fallback target of a run or pair that is not exact (and of every other): the
/// OOM event exact, and the reserved peak within one segment (the run's largest).
fn check_fallback(row: &sim::fidelity::FidelityRow, largest_segment: u64) {
    assert_eq!(
        row.oom_event_sim, row.oom_event_torch,
        "{}: the OOM event differs",
        row.trace
    );
    assert!(
        row.reserved_bytes_peak_sim
            .abs_diff(row.reserved_bytes_peak_torch)
            <= largest_segment,
        "{}: reserved peak off by more than one segment",
        row.trace
    );
}

/// What `--explain` must show of a run or pair that is not exact: the first request
/// placed differently, a best-fit tie between equal free blocks of two segments that
/// lie in the other order in the recording, said to come from placement, and the
/// reserved peak's difference measured in segments.
fn check_explained(r: &sim::fidelity::FidelityReport) {
    let row = &r.row;
    if row.exact {
        assert!(
            r.misplaced.is_none() && r.explain().is_empty(),
            "{}",
            row.trace
        );
        return;
    }
    let text = r.explain();
    let m = r
        .misplaced
        .unwrap_or_else(|| panic!("{}: no misplaced request found:\n{text}", row.trace));
    assert!(
        m.tie_bytes.is_some() && m.order_differs,
        "{}: {m:?}\n{text}",
        row.trace
    );
    for needle in [
        format!("first request placed differently: entry {}", m.entry),
        format!(
            "a best-fit tie: two free blocks of {} bytes",
            m.tie_bytes.unwrap()
        ),
        format!("segment #{} (", m.torch.0),
        format!("segment #{} (", m.sim.0),
        "the difference comes from placement".to_string(),
    ] {
        assert!(
            text.contains(&needle),
            "{}: no '{needle}' in\n{text}",
            row.trace
        );
    }
    if row.reserved_bytes_peak_sim != row.reserved_bytes_peak_torch {
        assert!(
            text.contains("reserved peak: ") && text.contains("within one segment"),
            "{}: {text}",
            row.trace
        );
    }
}

/// The fallback check fails when the OOM event differs or the reserved peak is off by
/// more than one segment, and passes at exactly one segment.
#[test]
fn the_fallback_check_can_fail() {
    let row = sim::fidelity::FidelityRow {
        trace: "x".into(),
        reserved_bytes_peak_sim: 100 << 20,
        reserved_bytes_peak_torch: 120 << 20,
        oom_event_sim: Some(7),
        oom_event_torch: Some(7),
        ..Default::default()
    };
    check_fallback(&row, 20 << 20);
    for broken in [
        sim::fidelity::FidelityRow {
            reserved_bytes_peak_torch: (120 << 20) + 1,
            ..row.clone()
        },
        sim::fidelity::FidelityRow {
            oom_event_sim: Some(8),
            ..row.clone()
        },
        sim::fidelity::FidelityRow {
            oom_event_sim: None,
            ..row.clone()
        },
    ] {
        let caught = std::panic::catch_unwind(|| check_fallback(&broken, 20 << 20));
        assert!(caught.is_err(), "{broken:?} passed");
    }
}

/// Every recorded run replayed under its own configuration without its addresses
/// (the driver model places every segment): the table of docs/fidelity.md is what
/// the simulator does now, and every run keeps its reserved peak within one segment
/// and its OOM point exact.
#[test]
fn address_free_replays_are_current() {
    let options = FidelityOptions {
        use_recorded_addresses: false,
        ..FidelityOptions::default()
    };
    let mut out = String::from(
        "| run | exact | first divergence | reserved peak (sim − PyTorch) | OOM entry | checkpoints |\n| --- | --- | ---: | ---: | --- | --- |\n",
    );
    let (mut n, mut exact) = (0, 0);
    for run in all_runs() {
        let r = fidelity(&run, &options).unwrap();
        let row = &r.row;
        n += 1;
        exact += usize::from(row.exact);
        check_fallback(row, sim::fidelity::largest_segment_bytes(&run));
        check_explained(&r);
        out += &format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            row.trace,
            yes(row.exact),
            row.first_divergence_event
                .map_or("—".into(), |e| e.to_string()),
            peak_delta(row.reserved_bytes_peak_sim, row.reserved_bytes_peak_torch),
            oom_cell(row.oom_event_sim, row.oom_event_torch),
            if row.checkpoints_match {
                "match"
            } else {
                "differ"
            }
        );
    }
    out += &format!("| all | {exact} of {n} | | | | |\n");
    check_doc_table("address-free", &out);
}

/// Every ordered pair of recorded runs of one workload: the requests of A replayed
/// under B's recorded settings, with A's addresses as hints, against B's real run
/// (`allocsim fidelity B --requests-from A`). The table of docs/fidelity.md is what
/// the simulator does now; where A's requests cover B's run, the OOM point is exact
/// and the reserved peak within one segment.
#[test]
fn what_if_pairs_are_current() {
    check_doc_table("what-if", &what_if_table(&all_runs()));
}

/// The same for the runs with private pools (`tests/data/pools`): a capture's side
/// stream has another raw handle in each process, and a MemPool's flags are the checked
/// run's settings, so graph and MemPool runs compare in full.
#[test]
fn pool_what_if_pairs_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pools");
    let table = what_if_table(&runs_in(&dir));
    for (b, a) in [
        ("graph_capture", "graph_capture__expandable_segments-True"),
        ("graph_capture__expandable_segments-True", "graph_capture"),
        ("mempool_phases", "mempool_phases__no_split-1"),
        (
            "graphed_callables",
            "graphed_callables__expandable_segments-True",
        ),
    ] {
        let row = format!("| `{b}` | `{a}` | all | yes |");
        assert!(table.contains(&row), "{row} is not in\n{table}");
    }
    check_doc_table("what-if-pools", &table);
}

/// The what-if table of `runs`: every ordered pair of runs of one workload, checked.
fn what_if_table(runs: &[workloads::RecordedRun]) -> String {
    let options = FidelityOptions::default();
    let mut out = String::from(
        "| run B | requests of A | compared | exact | first divergence | reserved peak (sim − PyTorch) | OOM entry |\n| --- | --- | --- | --- | ---: | ---: | --- |\n",
    );
    let (mut n, mut covered, mut exact, mut peaks, mut agree) = (0, 0, 0, 0, 0);
    for b in runs {
        for a in runs {
            if a.name == b.name || a.meta.workload != b.meta.workload {
                continue;
            }
            let r = sim::fidelity::fidelity_with_requests(b, a, &options).unwrap();
            let row = &r.row;
            let c = r.coverage.as_ref().expect("a what-if has a coverage");
            n += 1;
            let compared = if c.complete {
                covered += 1;
                exact += usize::from(row.exact);
                peaks += usize::from(row.reserved_bytes_peak_sim == row.reserved_bytes_peak_torch);
                check_fallback(row, sim::fidelity::largest_segment_bytes(b));
                check_explained(&r);
                // Where B ran out of memory, the comparison stops after its OOM, and so
                // does PyTorch's peak (its final statistics include the unwinding).
                if row.oom_event_torch.is_some() {
                    assert_eq!(
                        row.reserved_bytes_peak_sim, row.reserved_bytes_peak_torch,
                        "{}",
                        row.trace
                    );
                }
                "all".to_string()
            } else {
                let why = if a.entries.iter().any(|e| e.action == workloads::Action::Oom) {
                    "A ran out of memory"
                } else {
                    "the requests differ"
                };
                format!("entries 0..{} ({why})", c.covered)
            };
            let verdict = if c.complete {
                yes(row.exact)
            } else if row.segment_ops_match
                && row.checkpoints_match
                && row.reserved_bytes_peak_sim == row.reserved_bytes_peak_torch
            {
                agree += 1;
                "up to there"
            } else {
                "no"
            };
            out += &format!(
                "| `{}` | `{}` | {} | {} | {} | {} | {} |\n",
                b.name,
                a.name,
                compared,
                verdict,
                row.first_divergence_event
                    .map_or("—".into(), |e| e.to_string()),
                peak_delta(row.reserved_bytes_peak_sim, row.reserved_bytes_peak_torch),
                oom_cell(row.oom_event_sim, row.oom_event_torch)
            );
        }
    }
    out += &format!(
        "| all {n} pairs | | {covered} compared in full | {exact} of {covered} exact; {agree} of {} compared in part agree up to there | | {peaks} of {covered} equal | |\n",
        n - covered
    );
    out
}
