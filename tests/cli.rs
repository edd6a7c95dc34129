use crate::util::{allocsim, rmm_log_of, root, stderr, stdout, TempDir};

/// Runs `allocsim replay` on a file with `text` and returns (exit code, stderr).
fn replay_text(dir: &TempDir, name: &str, text: &str) -> (i32, String) {
    let path = dir.file(name, text);
    let o = allocsim(["replay".as_ref(), path.as_os_str()]);
    (o.status.code().unwrap(), stderr(&o))
}

/// Each kind of bad trace gets exit 2 and one line naming the file and the line or event.
#[test]
fn bad_traces_exit_2_with_file_and_place() {
    let dir = TempDir::new("cli-bad");
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "header.csv",
            "op,id,size,stream\nalloc,1,10,0\n",
            &["header.csv", "line 1"],
        ),
        (
            "nonnumeric.csv",
            "op,id,bytes,stream\nalloc,1,10,0\nalloc,2,ten,0\n",
            &["nonnumeric.csv", "line 3", "ten"],
        ),
        (
            "unknown-op.csv",
            "op,id,bytes,stream\nmalloc,1,10,0\n",
            &["unknown-op.csv", "line 2", "malloc"],
        ),
        (
            "unknown-free.csv",
            "op,id,bytes,stream\nalloc,1,10,0\nfree,2,,\n",
            &["unknown-free.csv", "line 3", "unknown id 2"],
        ),
        (
            "double-free.csv",
            "op,id,bytes,stream\nalloc,1,10,0\nfree,1,,\nfree,1,,\n",
            &["double-free.csv", "line 4", "1"],
        ),
        (
            "duplicate.csv",
            "op,id,bytes,stream\nalloc,1,10,0\nalloc,1,10,0\n",
            &["duplicate.csv", "line 3"],
        ),
        (
            "zero.csv",
            "op,id,bytes,stream\nalloc,1,0,0\n",
            &["zero.csv", "line 2"],
        ),
        (
            "negative.csv",
            "op,id,bytes,stream\nalloc,1,-5,0\n",
            &["negative.csv", "line 2"],
        ),
        (
            "fields.csv",
            "op,id,bytes,stream\nalloc,1\n",
            &["fields.csv", "line 2"],
        ),
        (
            "op.yaml",
            "events:\n  - {op: alloc, id: 1, bytes: 10}\n  - {op: teleport, id: 1}\n",
            &["op.yaml", "event 1"],
        ),
        (
            "bytes.yaml",
            "events:\n  - {op: alloc, id: 1, bytes: lots}\n",
            &["bytes.yaml", "event 0"],
        ),
        (
            "free.yaml",
            "events:\n  - {op: free, id: 9}\n",
            &["free.yaml", "event 0", "9"],
        ),
        (
            "requested-twice.csv",
            "op,id,bytes,stream\nalloc,1,10,0\nfree_requested,1,,\nfree_requested,1,,\n",
            &["requested-twice.csv", "line 4", "twice (first at line 3)"],
        ),
        (
            "bad-conf.json",
            "{\"alloc_conf\": \"max_split_size_mb:oops\", \"events\": []}",
            &["bad-conf.json", "alloc_conf 'max_split_size_mb:oops'"],
        ),
        ("syntax.yaml", "events: [\n", &["syntax.yaml", "line"]),
        ("trace.txt", "hello\n", &["trace.txt", "--trace-format"]),
    ];
    for (name, text, needles) in cases {
        let (code, err) = replay_text(&dir, name, text);
        assert_eq!(code, 2, "{name}: exit code, stderr: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{name}: one line, got: {err}"
        );
        assert!(err.starts_with("error: "), "{name}: {err}");
        for needle in *needles {
            assert!(
                err.contains(needle),
                "{name}: '{needle}' missing from: {err}"
            );
        }
    }
}

/// When the reader of stdout goes away (`| head`), allocsim stops quietly: no panic, no
/// error line.
#[test]
fn closed_stdout_is_not_an_error() {
    let dir = TempDir::new("cli-pipe");
    let mut text = String::from("op,id,bytes,stream\n");
    for i in 0..20_000 {
        text.push_str(&format!("free,{i},,\n"));
    }
    let p = dir.file("many-problems.csv", &text);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["check".as_ref(), p.as_os_str()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    assert!(
        o.status.code() == Some(0) || o.status.code() == Some(2),
        "{:?}",
        o.status
    );
}

/// Every malformed row is reported, not only the first: the refusal counts them, and
/// `check` lists each with its line.
#[test]
fn every_malformed_row_is_reported() {
    let dir = TempDir::new("cli-rows");
    let p = dir.file(
        "rows.csv",
        "op,id,bytes,stream\nalloc,1,ten,0\nalloc,2,10,0\nfree,,,\nteleport,3,,\n",
    );
    let o = allocsim(["replay".as_ref(), p.as_os_str()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("rows.csv: line 2:")
            && err.contains("(and 2 more problems in this file); `allocsim check"),
        "{err}"
    );
    let o = allocsim([
        "check".as_ref(),
        p.as_os_str(),
        "examples/seed000.yaml".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let out = stdout(&o);
    for needle in [
        "rows.csv: line 2:",
        "rows.csv: line 4:",
        "rows.csv: line 5:",
        "rows.csv: unreadable, 3 problems",
        "seed000.yaml: 19 events, 0 errors",
    ] {
        assert!(out.contains(needle), "'{needle}' missing from {out}");
    }
}

/// A missing file is one line with its path and exit 2.
#[test]
fn missing_file() {
    let o = allocsim(["replay", "no/such/trace.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no/such/trace.yaml"), "{}", stderr(&o));
}

/// Bad flags and option values exit 2 with a message naming the flag or value.
#[test]
fn bad_flags_exit_2() {
    let t = "examples/seed000.yaml";
    let cases: &[(&[&str], &str)] = &[
        (
            &["replay", t, "--policy", "magic"],
            "unknown policy 'magic'",
        ),
        (
            &["replay", t, "--policy", "buddy:min_block=3000"],
            "power of two",
        ),
        (&["replay", t, "--capacity", "lots"], "--capacity"),
        (
            &["replay", t, "--alloc-conf", "max_split_size_mb:5"],
            "max_split_size_mb too small, must be >= 20",
        ),
        (
            &["replay", t, "--alloc-conf", "expandable_segments:yes"],
            "Expected 'True' or 'False'",
        ),
        (
            &["replay", t, "--memory-fraction", "1.5"],
            "--memory-fraction",
        ),
        (
            &["replay", t, "--gpu-profile", "tpu9"],
            "unknown GPU profile 'tpu9' (built in: h100, h200,",
        ),
        (
            &["replay", t, "--gpu-profile", "no/such/card.yaml"],
            "no/such/card.yaml",
        ),
        (
            &["replay", t, "--device", "h100"],
            "--gpu-profile NAME|FILE",
        ),
        (&["replay", t, "--device", "1"], "--snapshot-device N"),
        (&["fidelity", t, "--device", "1"], "--snapshot-device N"),
        (
            &["replay", t, "--capacity", "16"],
            "'16' has no unit, so it means 16 bytes",
        ),
        (
            &["compare", t, "--capacity", "18446744073709551616"],
            "'18446744073709551616' is too large",
        ),
        (
            &["replay", t, "--cap", "18446744073709551616B"],
            "'18446744073709551616B' is too large",
        ),
        (&["replay", t, "--total-bytes", "0.5GiB5"], "--total-bytes"),
        (
            &[
                "generate",
                "random",
                "--min-bytes",
                "0.3",
                "-o",
                "target/x.csv",
            ],
            "'0.3' is not a whole number of bytes",
        ),
        (
            &["convert", t, "--to", "json", "-o", "target/x.json"],
            "[possible values: yaml, csv]",
        ),
        (
            &["replay", t, "--trace-format", "xml"],
            "[possible values: yaml, csv, json, pickle, rmm]",
        ),
        (&["replay", t, "--frobnicate"], "--frobnicate"),
        (&["compare"], "TRACES"),
        (
            &[
                "generate",
                "random",
                "--events",
                "10",
                "-o",
                "target/x.docx",
            ],
            "x.docx",
        ),
    ];
    for (args, needle) in cases {
        let o = allocsim(*args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(needle),
            "{args:?}: '{needle}' missing from {}",
            stderr(&o)
        );
        assert_eq!(
            stderr(&o).trim_end().lines().count(),
            1,
            "{args:?}: one line, got {}",
            stderr(&o)
        );
    }
}

/// Usage errors of the argument parser are one line on stderr, with the hint where to
/// read more (clap prints several).
#[test]
fn usage_errors_are_one_line() {
    for args in [
        &["replay", "examples/seed000.yaml", "--frobnicate"][..],
        &["compare"],
        &["replay"],
        &[],
        &["teleport"],
    ] {
        let o = allocsim(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains("--help"), "{args:?}: {err}");
    }
    let o = allocsim(["replay", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).lines().count() > 10, "help stays whole");
}

/// Sizes are exact: a YAML size above u64::MAX is refused (it was clamped), and a
/// decimal above 2^53 keeps its last byte (it went through a float).
#[test]
fn trace_sizes_are_exact() {
    let dir = TempDir::new("cli-sizes");
    let huge = dir.file(
        "huge.yaml",
        "events:\n  - {op: alloc, id: 1, bytes: \"18446744073709551616B\"}\n",
    );
    let o = allocsim(["check".as_ref(), huge.as_os_str()]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stdout(&o)
            .contains("huge.yaml: event 0: alloc: bytes: '18446744073709551616B' is too large"),
        "{}",
        stdout(&o)
    );
    let exact = dir.file(
        "exact.yaml",
        "events:\n  - {op: alloc, id: 1, bytes: \"9007199254740993.0\"}\n  - {op: free, id: 1}\n",
    );
    let csv = dir.path().join("exact.csv");
    let o = allocsim([
        "convert".as_ref(),
        exact.as_os_str(),
        "-o".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        "op,id,bytes,stream\nalloc,1,9007199254740993,0\nfree,1,,\n"
    );
}

/// A trace's format comes from its content when the name says otherwise or nothing:
/// a snapshot pickle named .json and a YAML trace without extension replay as what
/// they are.
#[test]
fn formats_are_detected_by_content() {
    let dir = TempDir::new("cli-detect");
    let pickle = dir.path().join("run.json");
    std::fs::copy(
        root().join("tests/data/torch/seed002_retain.pickle"),
        &pickle,
    )
    .unwrap();
    let o = allocsim(["replay".as_ref(), pickle.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("peak reserved           5.00 GiB  (5370806272 bytes)"),
        "{}",
        stdout(&o)
    );
    let yaml = dir.path().join("trace");
    std::fs::copy(root().join("examples/seed000.yaml"), &yaml).unwrap();
    let o = allocsim(["replay".as_ref(), yaml.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("19 events"), "{}", stdout(&o));
}

/// A device profile whose figures contradict each other (usable memory above the
/// free memory at start, which wrapped or panicked when subtracted) is refused with
/// one line naming the file and the field.
#[test]
fn bad_gpu_profile_is_refused() {
    let dir = TempDir::new("cli-profile");
    let text = std::fs::read_to_string(root().join("sim/profiles/h100.yaml"))
        .unwrap()
        .replace(
            "free_at_start_bytes: 84465090560",
            "free_at_start_bytes: 4096",
        );
    let p = dir.file("card.yaml", &text);
    let o = allocsim([
        "replay".as_ref(),
        "examples/seed000.yaml".as_ref(),
        "--gpu-profile".as_ref(),
        p.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("card.yaml: usable_bytes: 84462796800 exceeds free_at_start_bytes (4096)"),
        "{err}"
    );
}

/// A write that fails on stdout (a full disk) is exit 5, with one line naming stdout.
#[test]
fn failed_write_is_exit_5() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this system");
        return;
    };
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["compare", "examples/seed000.yaml"])
        .current_dir(root())
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("cannot write stdout"), "{err}");
}

/// Running out of memory in a replay is a result: exit 0, and the summary names the event.
#[test]
fn oom_is_exit_0() {
    let o = allocsim(["replay", "examples/seed000.yaml", "--capacity", "2GiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("out of memory       at event"), "{out}");
    assert!(
        out.contains("CUDA out of memory. Tried to allocate 1024.00 MiB."),
        "{out}"
    );
}

/// A PyTorch snapshot pickle replays directly, with PyTorch's statistics on request.
#[test]
fn replay_pickle_with_stats() {
    let o = allocsim([
        "replay",
        "tests/data/torch/seed002_retain.pickle",
        "--stats",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("peak reserved           5.00 GiB  (5370806272 bytes)"),
        "{out}"
    );
    assert!(out.contains("reserved_bytes.all.peak"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("num_sync_all_streams") && l.ends_with(" 1")),
        "{out}"
    );
    let o = allocsim([
        "compare",
        "tests/data/torch/multistream.pickle",
        "--policies",
        "caching,caching:expandable_segments=True",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("\nmultistream,caching,85899345920,"),
        "{}",
        stdout(&o)
    );
}

/// A trace with a delayed free replays: the caching policy stops counting the block as
/// allocated at `free_requested` but does not reuse it before its `free`, a policy
/// without streams keeps it allocated; `convert` keeps the delayed free.
#[test]
fn free_requested_traces_replay_and_convert() {
    let dir = TempDir::new("cli-free-requested");
    let trace = dir.file(
        "delayed.yaml",
        "events:\n  - {op: alloc, id: 1, bytes: 64MiB}\n  - {op: free_requested, id: 1}\n  - {op: alloc, id: 2, bytes: 64MiB}\n  - {op: free_completed, id: 1}\n  - {op: free, id: 2}\n",
    );
    let peaks = |policy: &str| {
        let o = allocsim([
            "replay".as_ref(),
            trace.as_os_str(),
            "--policy".as_ref(),
            policy.as_ref(),
            "--check-invariants".as_ref(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let line = |key: &str| {
            out.lines()
                .find(|l| l.starts_with(key))
                .unwrap()
                .to_string()
        };
        (line("peak allocated"), line("peak reserved"))
    };
    let (allocated, reserved) = peaks("caching");
    assert!(allocated.contains("(67108864 bytes)"), "{allocated}");
    assert!(reserved.contains("(134217728 bytes)"), "{reserved}");
    let (allocated, _) = peaks("immediate");
    assert!(allocated.contains("(134217728 bytes)"), "{allocated}");
    let csv = dir.path().join("delayed.csv");
    let o = allocsim([
        "convert".as_ref(),
        trace.as_os_str(),
        "-o".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        "op,id,bytes,stream\nalloc,1,67108864,0\nfree_requested,1,,\nalloc,2,67108864,0\nfree,1,,\nfree,2,,\n"
    );
}

/// `compare` writes exactly the documented header, then one row per trace and policy,
/// every policy's, in input order.
#[test]
fn compare_header_and_rows() {
    let every = policies::testing::every_policy();
    let o = allocsim([
        "compare",
        "examples/seed000.yaml",
        "examples/training_loop.yaml",
        "--policies",
        &policies::testing::every_policy_list(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with(
        "trace,policy,capacity_bytes,events,requested_bytes_peak,allocated_bytes_peak,reserved_bytes_peak,utilization,oom_event_index,oom_requested_bytes"
    ));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2 * every.len());
    let mut at = rows.iter();
    for trace in ["seed000", "training_loop"] {
        for spec in &every {
            let row = at.next().unwrap();
            let want = csv_field(&spec.label);
            assert!(
                row.starts_with(&format!("{trace},{want},85899345920,")),
                "{row}"
            );
        }
    }
}

/// `text` as a CSV field: quoted where it holds a comma or a quote.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// Several capacities give one row each, and the CSV is byte-identical run to run.
#[test]
fn compare_capacities_and_determinism() {
    let args = [
        "compare",
        "examples/random_small.csv",
        "--policies",
        "caching,buddy",
        "--capacity",
        "1GiB,4GiB",
    ];
    let a = allocsim(args);
    let b = allocsim(args);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout, "same inputs, same bytes");
    assert_eq!(stdout(&a).lines().count(), 5);
}

/// `generate` with the same seed writes the same file; another seed another file; and
/// the result replays.
#[test]
fn generate_is_deterministic() {
    let dir = TempDir::new("cli-generate");
    let a = dir.path().join("a.csv");
    let b = dir.path().join("b.csv");
    let c = dir.path().join("c.yaml");
    for (path, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let o = allocsim([
            "generate".as_ref(),
            "random".as_ref(),
            "--seed".as_ref(),
            seed.as_ref(),
            "--events".as_ref(),
            "500".as_ref(),
            "-o".as_ref(),
            path.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let o = allocsim([
        "replay".as_ref(),
        c.as_os_str(),
        "--policy".as_ref(),
        "arena".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `check` lists every problem, one per line, and exits 2 when there are errors.
#[test]
fn check_lists_every_problem() {
    let dir = TempDir::new("cli-check");
    let p = dir.file(
        "bad.csv",
        "op,id,bytes,stream\nfree,1,,\nalloc,2,0,\nalloc,3,10,\n",
    );
    let o = allocsim(["check".as_ref(), p.as_os_str()]);
    assert_eq!(o.status.code(), Some(2));
    let out = stdout(&o);
    assert!(out.contains("line 2: free of unknown id 1"), "{out}");
    assert!(
        out.contains("line 3: alloc of id 2 asks for 0 bytes"),
        "{out}"
    );
    assert!(out.contains("still live at the end"), "{out}");
    assert!(out.contains("2 errors, 1 warning"), "{out}");
}

/// `fidelity` writes the documented header and says exact for a recorded run.
#[test]
fn fidelity_header_and_exact_row() {
    let run = root().join("tests/data/oracle/h100-torch2.11/seed002_retain.json");
    let o = allocsim(["fidelity".as_ref(), run.as_os_str(), "--explain".as_ref()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        "trace,events,segment_ops_match,first_divergence_event,reserved_bytes_peak_sim,reserved_bytes_peak_torch,allocated_bytes_peak_sim,allocated_bytes_peak_torch,oom_event_sim,oom_event_torch,checkpoints_match,exact"
    );
    assert!(lines.next().unwrap().ends_with(",true,true"));
    let o = allocsim(["fidelity", "no/such/run.json"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `replay` of a recorded run runs under the settings it recorded (its
/// PYTORCH_CUDA_ALLOC_CONF and its cap) and says so; `--alloc-conf ''` gives PyTorch's
/// defaults, and `--capacity` (another card) leaves the recorded cap out.
#[test]
fn replay_applies_the_recorded_settings() {
    let run = "tests/data/unseen/gpt_train__expandable_segments-True__cap3140M.json";
    let o = allocsim(["replay", run]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(
            "settings            PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\", cap 3.07 GiB (3292528640 bytes) as recorded"
        ),
        "{out}"
    );
    // PyTorch ran out at entry 276 of this run; so does its replay.
    assert!(
        out.contains("out of memory       at event 204 (entry 276)"),
        "{out}"
    );
    assert!(out.contains("segments (peak)                2"), "{out}");
    let o = allocsim(["replay", run, "--alloc-conf", ""]);
    let out = stdout(&o);
    assert!(
        out.contains("not applied: PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\" (--alloc-conf given)"),
        "{out}"
    );
    assert!(!out.contains("segments (peak)                2"), "{out}");
    let o = allocsim(["replay", run, "--capacity", "80GiB"]);
    let out = stdout(&o);
    assert!(
        out.contains("not applied: cap 3.07 GiB (--capacity given)"),
        "{out}"
    );
    assert!(out.contains("out of memory               none"), "{out}");
}

/// `compare` runs each recorded run under its own recorded settings (a line per run on
/// stderr), with the policies' options on top.
#[test]
fn compare_applies_each_runs_settings() {
    let o = allocsim([
        "compare",
        "--format",
        "csv",
        "--policies",
        "caching,caching:expandable_segments=False",
        "tests/data/unseen/unet_train__expandable_segments-True__cap1642M.json",
        "examples/seed000.yaml",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("unet_train__expandable_segments-True__cap1642M.json: PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\", cap 1.60 GiB"),
        "{err}"
    );
    assert!(!err.contains("seed000.yaml:"), "{err}");
    let out = stdout(&o);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("unet_train"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    // Both run out under the recorded cap: as recorded, at the request PyTorch failed
    // (entry 322, event 242), too little memory; without expandable segments earlier,
    // from fragmentation.
    let oom = |row: &str| row.split(',').nth(8).unwrap().to_string();
    assert_eq!(oom(rows[0]), "242", "{out}");
    assert!(rows[0].contains(",too little memory,"), "{out}");
    assert_eq!(oom(rows[1]), "231", "{out}");
    assert!(rows[1].contains(",fragmentation,"), "{out}");
}

/// `fidelity --requests-from A B` replays A's requests under B's recorded settings and
/// compares with B (the row is named `B <- A`); a run that starts mid-run cannot take
/// part in a what-if, and says why.
#[test]
fn fidelity_what_if() {
    let o = allocsim([
        "fidelity",
        "tests/data/unseen/unet_train__cap1642M.json",
        "--requests-from",
        "tests/data/unseen/unet_train.json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let row = out.lines().nth(1).unwrap();
    assert!(
        row.starts_with("unet_train__cap1642M <- unet_train,311,true,"),
        "{row}"
    );
    assert!(row.ends_with(",310,310,true,true"), "{row}");
    let o = allocsim([
        "fidelity",
        "tests/data/unseen/midrun/gpt_train__wrap2000.json",
        "--requests-from",
        "tests/data/unseen/unet_train.json",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("gpt_train__wrap2000.json: the recording starts mid-run"),
        "{}",
        stderr(&o)
    );
}

/// A snapshot pickle does not record its cap: `fidelity --cap` gives it, which makes
/// the capped pickle exact, and says so on stderr; without it `--explain` says why the
/// simulation did not run out.
#[test]
fn fidelity_takes_a_cap_for_a_pickle() {
    let pickle = "tests/data/oracle/h100-torch2.11-pickles/random_stress__cap5120M.pickle";
    let o = allocsim(["fidelity", "--explain", pickle]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).trim_end().ends_with(",false"), "{}", stdout(&o));
    assert!(stderr(&o).contains("give it with --cap"), "{}", stderr(&o));
    let o = allocsim(["fidelity", pickle, "--cap", "5120MiB"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).trim_end().ends_with(",true"), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("checked with cap 5.00 GiB (a snapshot does not record its cap)"),
        "{}",
        stderr(&o)
    );
}

/// `--no-recorded-addresses` leaves a recorded run's addresses out of `replay`: the
/// driver model places its segments, and a best-fit tie then goes another way.
#[test]
fn replay_without_recorded_addresses() {
    let run = "tests/data/oracle/h100-torch2.11/gpt_train_small__max_split_size_mb-64.json";
    let with = stdout(&allocsim(["replay", run]));
    assert!(
        with.contains("peak reserved           2.83 GiB  (3042967552 bytes)"),
        "{with}"
    );
    let without = stdout(&allocsim(["replay", run, "--no-recorded-addresses"]));
    assert!(without.contains("(3026190336 bytes)"), "{without}");
}

/// A recording that starts mid-run: `replay` says what its first entry finds and
/// that it was rebuilt; `convert` refuses it (YAML and CSV cannot carry the state).
#[test]
fn midrun_recordings_say_so() {
    let run = "tests/data/unseen/midrun/unet_train__late.json";
    let o = allocsim(["replay", run]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("starts mid-run      the recording's ring buffer wrapped or it began late; its first entry finds 4 segment(s) of 44.00 MiB reserved, 70 live block(s)"),
        "{}",
        stdout(&o)
    );
    let dir = TempDir::new("midrun-convert");
    let out = dir.path().join("t.yaml");
    let o = allocsim([
        "convert".as_ref(),
        run.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the recording starts mid-run"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

/// `fidelity` reads every run before writing: a bad file after a good one leaves
/// stdout empty (no header, no partial table) and exits 2.
#[test]
fn fidelity_writes_nothing_before_failing() {
    let run = root().join("tests/data/oracle/h100-torch2.11/seed002_retain.json");
    let o = allocsim([
        "fidelity".as_ref(),
        run.as_os_str(),
        "no/such/run.json".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stdout(&o), "", "nothing on stdout");
    assert!(stderr(&o).contains("no/such/run.json"), "{}", stderr(&o));
}

/// GPU commands without a driver: one line, exit 3 (unless a GPU is present).
#[test]
fn gpu_commands_without_driver_exit_3() {
    if crate::gpu::driver_present() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    for args in [&["probe"][..], &["validate", "examples/seed000.yaml"][..]] {
        let o = allocsim(args);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));
        assert!(stderr(&o).contains("CUDA"), "{}", stderr(&o));
    }
}

/// The README's commands are the ones that work.
#[test]
fn readme_commands_exist() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("cargo build --release"));
    assert!(readme.contains(".ci/run"));
    assert!(readme.contains("allocsim compare"));
}

/// `--capacity` is the card's total memory: the summary and PyTorch's OOM message say
/// the same total (not the default 80 GiB), a memory fraction is taken of it, and a GPU
/// profile keeps its context and driver reserve back from it.
#[test]
fn capacity_is_the_total_everywhere() {
    let o = allocsim(["replay", "examples/seed000.yaml", "--capacity", "2GiB"]);
    let out = stdout(&o);
    assert!(
        out.contains("device              simulated 2.00 GiB: total 2.00 GiB, usable 2.00 GiB\n"),
        "{out}"
    );
    assert!(
        out.contains("GPU 0 has a total capacity of 2.00 GiB"),
        "{out}"
    );
    // 16 GiB × 0.5 = 8 GiB allowed, not half of 80 GiB.
    let o = allocsim([
        "replay",
        "examples/seed000.yaml",
        "--capacity",
        "16GiB",
        "--memory-fraction",
        "0.125",
    ]);
    let out = stdout(&o);
    assert!(out.contains("2.00 GiB allowed"), "{out}");
    assert!(out.contains("total capacity of 16.00 GiB"), "{out}");
    let o = allocsim([
        "replay",
        "examples/seed000.yaml",
        "--gpu-profile",
        "l4",
        "--capacity",
        "2GiB",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("NVIDIA L4 (nominal profile): total 2.00 GiB, usable 1.48 GiB (the CUDA context and the driver keep 529.00 MiB)"),
        "{out}"
    );
    let o = allocsim([
        "replay",
        "examples/seed000.yaml",
        "--gpu-profile",
        "l4",
        "--capacity",
        "500MiB",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--capacity 500MiB: not above"),
        "{}",
        stderr(&o)
    );
}

/// `allocsim gpus` lists every built-in profile, measured and nominal, with its
/// figures, its spread between processes and source; the CSV has the documented columns.
#[test]
fn gpus_lists_the_catalog() {
    let o = allocsim(["gpus", "--format", "csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("gpu,card,total_bytes,usable_bytes,usable_spread_bytes,kind,source")
    );
    assert!(out.contains("\nh100,NVIDIA H100 80GB HBM3,85017493504,84462796800,2097152,measured,"));
    assert!(out.contains("\nh200,NVIDIA H200,150109880320,149554200576,4194304,measured,"));
    assert!(out.contains("\na100-40gb,NVIDIA A100-SXM4-40GB,42505273344,41950576640,0,nominal,"));
    for gpu in [
        "l4",
        "a10g",
        "rtx-4090",
        "a100-80gb",
        "t4",
        "v100-16gb",
        "l40s",
    ] {
        assert!(out.contains(&format!("\n{gpu},")), "{gpu}: {out}");
    }
    let o = allocsim(["gpus", "--format", "table"]);
    let out = stdout(&o);
    assert!(out.starts_with("gpu "), "{out}");
    assert!(out.contains("39.59 GiB"), "{out}");
    let h200 = out.lines().find(|l| l.starts_with("h200 ")).unwrap();
    assert!(h200.contains(" 4.00 MiB "), "{out}");
    let o = allocsim(["replay", "examples/seed000.yaml", "--gpu-profile", "a100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("a100-40gb"), "{}", stderr(&o));
}

/// The timeline names each event's op, id and bytes; the summary names events by the
/// one numbering (from 0), with the file's own place for recorded runs.
#[test]
fn one_event_numbering() {
    let dir = TempDir::new("cli-numbering");
    let t = dir.path().join("t.csv");
    let o = allocsim([
        "replay".as_ref(),
        "examples/seed000.yaml".as_ref(),
        "--capacity".as_ref(),
        "2GiB".as_ref(),
        "--timeline".as_ref(),
        t.as_os_str(),
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("out of memory       at event 8: request of 1.00 GiB"),
        "{out}"
    );
    let timeline = std::fs::read_to_string(&t).unwrap();
    let lines: Vec<&str> = timeline.lines().collect();
    assert_eq!(
        lines[0],
        "event_index,op,id,bytes,requested_bytes,allocated_bytes,reserved_bytes,charged_bytes,allocation_count,segment_count"
    );
    assert!(lines[9].starts_with("8,alloc,"), "{timeline}");
    assert!(lines[1].starts_with("0,alloc,1,1073741824,"), "{timeline}");
    assert_eq!(lines.len(), 10, "stopped at the OOM, event 8");
    let o = allocsim([
        "replay",
        "tests/data/oracle/h100-torch2.11-pickles/random_stress__cap5120M.pickle",
        "--cap",
        "5120MiB",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("out of memory       at event 5076 (entry 7575): request of 203.05 MiB"),
        "{out}"
    );
    assert!(out.contains("first at event 5072 (entry 7571)"), "{out}");
}

/// `fit` gives, per (trace, policy), the smallest capacity in whole pages that replays
/// without an OOM (and one page less does not), the requested peak and the overhead,
/// then one column per named GPU; bad input is one line and exit 2.
#[test]
fn fit_finds_the_smallest_capacity() {
    let o = allocsim([
        "fit",
        "examples/training_loop.yaml",
        "--policies",
        "caching,immediate",
        "--gpus",
        "t4,a100-40gb",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "trace,policy,min_capacity_bytes,requested_bytes_peak,overhead_bytes,overhead_pct,monotonic,\
         usable_spread_bytes,min_capacity_with_spread_bytes,marginal_gpus,t4,a100-40gb"
    );
    assert_eq!(
        lines[1],
        "training_loop,caching,761266176,704643072,56623104,8.04,true,0,761266176,,true,true"
    );
    assert_eq!(
        lines[2],
        "training_loop,immediate,704643072,704643072,0,0.00,true,0,704643072,,true,true"
    );
    // The answer replays; one page less runs out.
    for (capacity, oom) in [("761266176B", false), ("759169024B", true)] {
        let o = allocsim([
            "replay",
            "examples/training_loop.yaml",
            "--capacity",
            capacity,
        ]);
        assert_eq!(
            stdout(&o).contains("out of memory       at event"),
            oom,
            "{capacity}: {}",
            stdout(&o)
        );
    }
    for (args, needle) in [
        (
            &["fit", "examples/seed000.yaml", "--capacity", "1GiB"][..],
            "--capacity: fit searches",
        ),
        (
            &["fit", "examples/seed000.yaml", "--gpus", "tpu9"],
            "--gpus tpu9",
        ),
        (
            &["fit", "examples/seed000.yaml", "--policies", "slab"],
            "slab",
        ),
        (&["fit", "missing.yaml"], "missing.yaml"),
    ] {
        let o = allocsim(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

/// At an out-of-memory, `replay` says why: the failing request with its mark, the
/// memory by cause, the segments with the most free memory, a verdict and the setting
/// that fixes it, checked by replaying; `compare` has the same in its `oom_*` columns.
/// On the H200 profile (usable memory varies by 4 MiB between processes), `fit` gives
/// the smallest total and the smallest that fits with 4 MiB to spare, and names the H200
/// as marginal where the run fits it with less; `replay` marks a run that fits with less
/// than 4 MiB to spare as "may run out", one that runs out by less as "may fit", and
/// says nothing 4 MiB above; on the H100 profile (one page of spread) the same with 2 MiB.
#[test]
fn marginal_runs_within_the_driver_variation() {
    let fit = |profile: &str| {
        let o = allocsim([
            "fit",
            "examples/training_loop.yaml",
            "--policies",
            "immediate",
            "--gpu-profile",
            profile,
            "--format",
            "csv",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let row: Vec<String> = out
            .lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(String::from)
            .collect();
        (
            row[2].parse::<u64>().unwrap(),
            row[7].clone(),
            row[8].clone(),
        )
    };
    let mib = 1u64 << 20;
    let (min, spread, with_spread) = fit("h200");
    assert_eq!(spread, (4 * mib).to_string());
    assert_eq!(with_spread, (min + 4 * mib).to_string());
    let (h100_min, spread, with_spread) = fit("h100");
    assert_eq!(spread, (2 * mib).to_string());
    assert_eq!(with_spread, (h100_min + 2 * mib).to_string());
    let replay = |profile: &str, total: u64| {
        let o = allocsim([
            "replay",
            "examples/training_loop.yaml",
            "--policy",
            "immediate",
            "--gpu-profile",
            profile,
            "--capacity",
            &format!("{total}B"),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let line = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("marginal "))
            .map(|l| l["marginal".len()..].trim().to_string())
    };
    assert_eq!(
        line(&replay("h200", min)).as_deref(),
        Some(
            "may run out on this card: the driver's hold-back varies by up to 4.00 MiB \
             between processes"
        )
    );
    assert_eq!(
        line(&replay("h200", min - 2 * mib)).as_deref(),
        Some("may fit on this card: the driver's hold-back varies by up to 4.00 MiB between processes")
    );
    assert_eq!(line(&replay("h200", min + 4 * mib)), None);
    assert_eq!(
        line(&replay("h100", h100_min)).as_deref(),
        Some(
            "may run out on this card: the driver's hold-back varies by up to 2.00 MiB \
             between processes"
        )
    );
    assert_eq!(line(&replay("h100", h100_min + 2 * mib)), None);
    // The H200 named as a GPU: fits at its full memory, clear; the CSV names no
    // marginal GPU, the table no "may run out".
    let o = allocsim([
        "fit",
        "examples/training_loop.yaml",
        "--policies",
        "immediate",
        "--gpu-profile",
        "h200",
        "--gpus",
        "h200",
        "--format",
        "table",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        out.contains("with 4.00 MiB to spare (driver varies)"),
        "{out}"
    );
    assert!(!out.contains("may run out"), "{out}");
    // A card like the H200 with just the memory the run needs: it fits there, but only
    // in some processes; the table names the H200 and then this one, the CSV this one.
    let dir = TempDir::new("marginal-gpu");
    let small = dir.path().join("small.yaml");
    let total = min;
    let free = total - 552_402_944;
    let h200 = std::fs::read_to_string(root().join("sim/profiles/h200.yaml")).unwrap();
    let text = h200
        .replace(
            "total_bytes: 150109880320",
            &format!("total_bytes: {total}"),
        )
        .replace(
            "free_at_start_bytes: 149557477376",
            &format!("free_at_start_bytes: {free}"),
        )
        .replace(
            "usable_bytes: 149554200576",
            &format!("usable_bytes: {}", free - 3_276_800),
        );
    std::fs::write(&small, text).unwrap();
    let gpus = format!("h200,{}", small.display());
    let run = |format: &str| {
        let o = allocsim([
            "fit",
            "examples/training_loop.yaml",
            "--policies",
            "immediate",
            "--gpus",
            &gpus,
            "--format",
            format,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let table = run("table");
    assert!(
        table.contains(&format!(
            "h200 (139.80 GiB); {} (1.17 GiB) fits, but may run out on this card",
            small.display()
        )),
        "{table}"
    );
    let csv = run("csv");
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!(",{},true,true", small.display())),
        "{csv}"
    );
}

/// `compare` and `sweep` mark a row whose outcome changes within the profile's spread
/// (`margin` = `marginal` in the CSV, a note under the table) and leave the rest clear;
/// the sweep recommends a clear row over a marginal one with a smaller peak.
#[test]
fn compare_and_sweep_mark_marginal_rows() {
    let mib = 1u64 << 20;
    let o = allocsim([
        "fit",
        "examples/training_loop.yaml",
        "--policies",
        "immediate",
        "--gpu-profile",
        "h200",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let min: u64 = stdout(&o)
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    let capacities = format!("{min}B,{}B", min + 4 * mib);
    let compare = |format: &str| {
        let o = allocsim([
            "compare",
            "examples/training_loop.yaml",
            "--policies",
            "immediate",
            "--gpu-profile",
            "h200",
            "--capacity",
            &capacities,
            "--format",
            format,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let csv = compare("csv");
    let margins: Vec<&str> = csv.lines().map(|l| l.rsplit(',').next().unwrap()).collect();
    assert_eq!(margins, ["margin", "marginal", ""], "{csv}");
    let table = compare("table");
    let notes: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("marginal: "))
        .collect();
    assert_eq!(notes.len(), 1, "{table}");
    assert!(
        notes[0].ends_with(
            "may run out on this card: the driver's hold-back varies by up to \
             4.00 MiB between processes"
        ),
        "{table}"
    );
    // The sweep: the smaller card fits with a smaller reserved peak (nothing is cached
    // by `immediate`, so both peaks are equal: the smaller device would win the tie),
    // but only in some processes; the larger one is recommended.
    let dir = TempDir::new("marginal-sweep");
    let sweep = dir.path().join("sweep.yaml");
    std::fs::write(
        &sweep,
        format!(
            "traces: [{}]\npolicies: [immediate]\ngpu_profile: h200\ncapacities: [{min}B, {}B]\n",
            root().join("examples/training_loop.yaml").display(),
            min + 4 * mib
        ),
    )
    .unwrap();
    let o = allocsim(["sweep", sweep.to_str().unwrap(), "--format", "csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let header: Vec<&str> = out.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    // The default (caching) rows run out on both; the immediate rows fit.
    let pick: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r[col("policy")] == "immediate")
        .map(|r| (r[col("margin")], r[col("recommended")]))
        .collect();
    assert_eq!(pick, [("marginal", "false"), ("", "true")], "{out}");
}

#[test]
fn why_it_ran_out() {
    let o = allocsim([
        "replay",
        "tests/data/oracle/h100-torch2.11-pickles/random_stress__cap5120M.pickle",
        "--cap",
        "5120MiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "why it ran out      fragmentation: 798.52 MiB free in pieces this request could not use",
        "expandable_segments=True fixes it (checked: replays to the end, reserved peak 4.62 GiB)",
        "  request           event 5076 (entry 7575): alloc id 2618 of 203.05 MiB",
        "  largest free      145.42 MiB (usable by this request: 0 B) against 203.05 MiB asked",
        "too small 794.54 MiB",
        "  most free in      segment ",
        "  tried             caching:expandable_segments=True,cap=5GiB: runs to the end",
    ] {
        assert!(out.contains(needle), "'{needle}' missing from {out}");
    }
    let o = allocsim([
        "replay",
        "examples/training_loop.yaml",
        "--capacity",
        "300MiB",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("why it ran out      too little memory: the live requests and this one need 304.00 MiB, more than the 300.00 MiB the allocator could hold"),
        "{out}"
    );
    assert!(
        out.contains("after mark \"iteration 1\" (event 4)"),
        "{out}"
    );
    let o = allocsim([
        "compare",
        "tests/data/oracle/h100-torch2.11-pickles/random_stress__cap5120M.pickle",
        "--policies",
        "caching",
        "--capacity",
        "5GiB",
        "--format",
        "csv",
    ]);
    let out = stdout(&o);
    assert!(
        out.lines()
            .next()
            .unwrap()
            .ends_with(",total_bytes,oom_cause,oom_largest_free_block_bytes,oom_fix,margin"),
        "{out}"
    );
    assert!(
        out.lines()
            .nth(1)
            .unwrap()
            .ends_with(",fragmentation,152481792,expandable_segments=True,"),
        "{out}"
    );
}

/// With stderr not a terminal (a pipe here), every command that can run longer than a
/// second and shows a bar or spinner on a terminal (`replay` reading a whole trace,
/// explaining an out-of-memory and reading a snapshot's first pass, `compare`, `fit`,
/// `sweep`, `bench`, `export`, `plot`, `fidelity`) writes none of it: no cursor codes,
/// no carriage returns, no progress text.
#[test]
fn no_progress_from_long_commands_when_stderr_is_not_a_terminal() {
    let dir = TempDir::new("cli-no-progress-long");
    let out = |name: &str| dir.path().join(name).display().to_string();
    let sweep = dir.file(
        "s.yaml",
        &format!(
            "traces: [{}]\npolicies: [caching, buddy]\n",
            root().join("examples/random_small.csv").display()
        ),
    );
    let snapshot = "tests/data/torch/multistream.pickle";
    let recorded = "tests/data/oracle/h100-torch2.11/seed002_retain.json";
    let cases: Vec<Vec<String>> = vec![
        vec![
            "replay",
            "examples/training_loop.yaml",
            "--timeline",
            &out("t.csv"),
        ],
        vec![
            "replay",
            "examples/training_loop.yaml",
            "--capacity",
            "300MiB",
        ],
        vec!["replay", snapshot],
        vec![
            "compare",
            "examples/random_small.csv",
            "examples/seed000.yaml",
        ],
        vec!["fit", "examples/random_small.csv", "--gpus", "h100"],
        vec!["sweep", sweep.to_str().unwrap()],
        vec![
            "bench",
            "examples/seed000.yaml",
            "--policies",
            "buddy",
            "--runs",
            "1",
        ],
        vec![
            "export",
            "examples/training_loop.yaml",
            "-o",
            &out("e.pickle"),
        ],
        vec!["export", snapshot, "-o", &out("s.pickle")],
        vec!["plot", "examples/training_loop.yaml", "-o", &out("p.svg")],
        vec!["fidelity", recorded],
    ]
    .into_iter()
    .map(|a| a.into_iter().map(String::from).collect())
    .collect();
    for args in cases {
        let o = allocsim(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {e}");
        assert!(!e.contains(['\u{1b}', '\r']), "{args:?}: {e:?}");
        for progress in [
            "replays",
            "traces read",
            "events replayed",
            "reading ",
            "replaying",
            "writing ",
            "generating",
        ] {
            assert!(!e.contains(progress), "{args:?}: {e:?}");
        }
    }
}

/// With stderr not a terminal (a pipe here), the commands that show a spinner or bar
/// on a terminal (check, convert, diff, generate, replay, compare) write nothing to
/// stderr but their own lines: no progress, no cursor codes.
#[test]
fn no_progress_when_stderr_is_not_a_terminal() {
    let dir = TempDir::new("cli-no-progress");
    let out = |name: &str| dir.path().join(name).display().to_string();
    let trace = "examples/random_small.csv";
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["check".into(), trace.into()], String::new()),
        (
            vec!["convert".into(), trace.into(), "-o".into(), out("c.yaml")],
            format!("wrote {} (", out("c.yaml")),
        ),
        (
            vec![
                "diff".into(),
                trace.into(),
                "--policies".into(),
                "caching,buddy".into(),
                "--format".into(),
                "csv".into(),
            ],
            String::new(),
        ),
        (
            vec![
                "generate".into(),
                "random".into(),
                "--events".into(),
                "1000".into(),
                "-o".into(),
                out("g.csv"),
            ],
            format!("wrote {} (", out("g.csv")),
        ),
        (
            vec![
                "replay".into(),
                trace.into(),
                "--policy".into(),
                "caching".into(),
            ],
            String::new(),
        ),
        (
            vec![
                "compare".into(),
                trace.into(),
                "--policies".into(),
                "caching,buddy".into(),
                "--format".into(),
                "csv".into(),
            ],
            String::new(),
        ),
    ];
    for (args, starts) in cases {
        let o = allocsim(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        if starts.is_empty() {
            assert!(e.is_empty(), "{args:?}: {e:?}");
        } else {
            assert!(
                e.starts_with(&starts) && e.lines().count() == 1,
                "{args:?}: {e:?}"
            );
        }
        assert!(!e.contains('\x1b') && !e.contains('\r'), "{args:?}: {e:?}");
    }
}

/// Every command that holds whole traces in memory says so in its `--help`, with the
/// figure per event where one was measured (docs/performance.md, "What holds the whole
/// trace").
#[test]
fn help_says_which_commands_hold_whole_traces() {
    for command in [
        "replay", "compare", "fit", "sweep", "diff", "check", "convert", "fidelity", "validate",
        "plot", "export", "bench",
    ] {
        let o = allocsim([command, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{command}: {}", stderr(&o));
        let help = stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains(" in memory"), "{command}: {help}");
        if command != "fidelity" {
            assert!(help.contains("bytes per event)"), "{command}: {help}");
        }
    }
}

/// `replay` reading an RMM log on a second thread (the default where the process may
/// use two cores, as on the test machines) prints what `--one-thread` prints, byte for
/// byte: summaries, out-of-memory reports, and a bad line's error and exit code, on a
/// log of several read-ahead chunks.
#[test]
fn replay_reads_ahead_with_the_same_output() {
    let dir = TempDir::new("cli-read-ahead");
    let csv = dir.path().join("t.csv");
    let t = csv.to_str().unwrap();
    let o = allocsim([
        "generate", "random", "--seed", "4", "--events", "30000", "-o", t,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = dir.path().join("t.log");
    rmm_log_of(&csv, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[20_000] = "1,00:00:00.000000,free,0x1234,512,0x0";
    let bad = dir.file("bad.log", &(lines.join("\n") + "\n"));
    let (l, b) = (log.to_str().unwrap(), bad.to_str().unwrap());
    let cases: [Vec<&str>; 5] = [
        vec!["replay", l, "--policy", "caching", "--stats"],
        vec!["replay", l, "--policy", "arena", "--capacity", "1GiB"],
        vec!["replay", l, "--capacity", "1GiB", "--continue-after-oom"],
        vec!["replay", l, "--policy", "immediate"],
        vec!["replay", b],
    ];
    for case in cases {
        let run = |extra: &[&str]| allocsim(case.iter().chain(extra));
        let (two, one) = (run(&[]), run(&["--one-thread"]));
        assert_eq!(stdout(&two), stdout(&one), "{case:?}");
        assert_eq!(stderr(&two), stderr(&one), "{case:?}");
        assert_eq!(two.status.code(), one.status.code(), "{case:?}");
    }
}
