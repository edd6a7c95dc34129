use crate::util::{allocsim, stderr, stdout, TempDir};

const GPT: &str = "tests/data/oracle/h100-torch2.11-pickles/gpt_train_small.pickle";

/// `diff` on a snapshot: the peaks side by side, where the reservations part, the first
/// differing decision and the requests that cost the difference; the CSV lists every
/// event that changed the gap, with the documented header, and its gaps add up.
#[test]
fn diff_two_configurations() {
    let o = allocsim([
        "diff",
        GPT,
        "--policies",
        "caching,caching:expandable_segments=True",
        "--format",
        "table",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "reserved peak        1.99 GiB  2.07 GiB  88.00 MiB",
        "parted at           event 40 (entry 46): alloc id 40 of 4.00 MiB on stream 0",
        "first decision      event 0 (entry 1): alloc id 0 of 1.00 MiB on stream 0; a: segment_alloc 2.00 MiB; b: map 2.00 MiB",
        "the cost            b's reserved peak is 88.00 MiB higher",
        "event 999 (entry 1429)",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    let dir = TempDir::new("diff");
    let csv = dir.path().join("diff.csv");
    let o = allocsim([
        "diff".as_ref(),
        GPT.as_ref(),
        "--policies".as_ref(),
        "caching,caching:expandable_segments=True".as_ref(),
        "-o".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).starts_with(&format!("wrote {} (", csv.display())));
    let rows = std::fs::read_to_string(&csv).unwrap();
    let mut lines = rows.lines();
    assert_eq!(
        lines.next().unwrap(),
        "event_index,op,id,bytes,reserved_a,reserved_b,gap_bytes,change_bytes,ops_a,ops_b"
    );
    let mut gap = 0i64;
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let (a, b): (i64, i64) = (f[4].parse().unwrap(), f[5].parse().unwrap());
        gap += f[7].parse::<i64>().unwrap();
        assert_eq!(gap, b - a, "{line}");
        assert_eq!(f[6].parse::<i64>().unwrap(), gap);
    }
}

/// `diff` refuses anything but two configurations, and a trace that does not read,
/// with one line and exit 2.
#[test]
fn diff_bad_input() {
    for (args, want) in [
        (
            &["diff", "examples/seed000.yaml", "--policies", "caching"][..],
            "--policies: diff compares two configurations, got 1",
        ),
        (
            &[
                "diff",
                "examples/seed000.yaml",
                "--policies",
                "caching,buddy,arena",
            ],
            "got 3",
        ),
        (
            &[
                "diff",
                "examples/seed000.yaml",
                "--policies",
                "caching,slab",
            ],
            "unknown policy 'slab'",
        ),
        (
            &["diff", "missing.yaml", "--policies", "caching,buddy"],
            "missing.yaml",
        ),
        (
            &[
                "diff",
                "examples/seed000.yaml",
                "--policies",
                "caching,buddy",
                "--capacity",
                "1GiB,2GiB",
            ],
            "diff takes one capacity",
        ),
    ] {
        let o = allocsim(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains(want) && e.lines().count() == 1, "{args:?}: {e}");
    }
}

/// Iterations: windows at the marks that match, each with its peaks; the warm-up is
/// left out of the steady state; the CSV has one row per window with the documented
/// header. A trace without marks says so.
#[test]
fn iterations_at_marks() {
    let dir = TempDir::new("iterations");
    let csv = dir.path().join("it.csv");
    let o = allocsim([
        "replay".as_ref(),
        "examples/training_loop.yaml".as_ref(),
        "--mark".as_ref(),
        "iteration".as_ref(),
        "--iterations-csv".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("iterations          3 from marks and annotations containing \"iteration\""),
        "{text}"
    );
    assert!(
        text.contains("steady state        2 iterations after the warm-up"),
        "{text}"
    );
    // Every column of the iterations table has a title (the notes column had none).
    assert!(
        text.lines()
            .any(|l| l.trim_end().ends_with("segment allocs  note")),
        "{text}"
    );
    assert!(
        text.contains("reserved peak     mean 790.00 MiB, median 790.00 MiB"),
        "{text}"
    );
    let rows = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(
        rows.lines().collect::<Vec<_>>(),
        [
            "iteration,label,first_event,last_event,requested_bytes_peak,allocated_bytes_peak,reserved_bytes_peak,utilization,reserved_bytes_at_end,device_allocs,warmup,complete",
            "0,start,0,3,150994944,150994944,150994944,1.000000,150994944,3,true,true",
            "1,iteration 1,4,32,603979776,603979776,761266176,0.793388,761266176,14,true,true",
            "2,iteration 2,33,55,704643072,704643072,828375040,0.850633,828375040,1,false,true",
            "3,iteration 3,56,79,704643072,704643072,828375040,0.850633,828375040,0,false,true",
        ]
    );
    let plain = dir.file(
        "plain.yaml",
        "events:\n  - {op: alloc, id: 1, bytes: 1024}\n",
    );
    let o = allocsim([
        "replay".as_ref(),
        plain.as_os_str(),
        "--iterations".as_ref(),
    ]);
    assert!(
        stdout(&o).contains("iterations          none: the trace has no marks and annotations"),
        "{}",
        stdout(&o)
    );
    // A snapshot's profiler annotations cut it too.
    let o = allocsim([
        "replay",
        GPT,
        "--iterations",
        "--mark",
        "START Optimizer.step",
    ]);
    assert!(
        stdout(&o).contains("iterations          3 from"),
        "{}",
        stdout(&o)
    );
}

/// Two YAML files converted from one snapshot report their own names (not the name
/// the snapshot recorded), and paths where stems collide; `convert` keeps the
/// snapshot's annotations as marks and what the run recorded, says what it wrote, and
/// the YAML reads back with it.
#[test]
fn names_and_conversions() {
    let dir = TempDir::new("names");
    let a = dir.path().join("first.yaml");
    let o = allocsim([
        "convert".as_ref(),
        GPT.as_ref(),
        "-o".as_ref(),
        a.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).trim(),
        format!(
            "wrote {} (2469 events, 12 of them marks from the snapshot's annotations, and what the run recorded)",
            a.display()
        )
    );
    let text = std::fs::read_to_string(&a).unwrap();
    assert!(
        text.starts_with(
            "name: \"gpt_train_small\"\nrecorded:\n  alloc_conf: \"\"\n  segments: [\"0x7f38c3e00000:2097152\", "
        ),
        "{}",
        &text[..200]
    );
    assert_eq!(text.matches("op: mark").count(), 12);
    let b = dir.path().join("second.yaml");
    std::fs::copy(&a, &b).unwrap();
    std::fs::create_dir_all(dir.path().join("x")).unwrap();
    let c = dir.path().join("x/first.yaml");
    std::fs::copy(&a, &c).unwrap();
    let o = allocsim([
        "compare".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        c.as_os_str(),
        "--policies".as_ref(),
        "caching".as_ref(),
        "--format".as_ref(),
        "csv".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let names: Vec<String> = stdout(&o)
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            a.display().to_string(),
            "second".to_string(),
            c.display().to_string()
        ]
    );
    // The converted trace replays as the snapshot does (marks change nothing).
    let peak = |path: &std::ffi::OsStr| {
        let o = allocsim(["replay".as_ref(), path]);
        stdout(&o)
            .lines()
            .find(|l| l.starts_with("peak reserved"))
            .unwrap()
            .split("  (")
            .nth(1)
            .unwrap()
            .split(" bytes")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(peak(a.as_os_str()), peak(GPT.as_ref()));
    // To CSV the recorded settings cannot go: a warning says so.
    let csv = dir.path().join("g.csv");
    let o = allocsim([
        "convert".as_ref(),
        GPT.as_ref(),
        "-o".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stderr(&o).starts_with("warning: csv cannot carry what"),
        "{}",
        stderr(&o)
    );
}

/// A YAML trace's `recorded` block is read back; an unknown key in it or a value of the
/// wrong kind is refused with its line.
#[test]
fn recorded_block_in_yaml() {
    let dir = TempDir::new("recorded");
    let good = dir.file(
        "r.yaml",
        "recorded:\n  alloc_conf: \"expandable_segments:True\"\n  total_bytes: 85899345920\n  caveats: [\"a caveat\"]\nevents:\n  - {op: alloc, id: 1, bytes: 1024}\n",
    );
    let o = allocsim(["replay".as_ref(), good.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: a caveat"), "{}", stderr(&o));
    for (text, want) in [
        ("recorded:\n  colour: blue\nevents: []\n", "line 2 column 3: not a YAML trace: recorded: unknown key `colour`"),
        ("recorded:\n  total_bytes: lots\nevents: []\n", "line 2 column 16: not a YAML trace: recorded: total_bytes: expected a whole number of bytes"),
        ("recorded: 5\nevents: []\n", "recorded: expected a mapping"),
    ] {
        let bad = dir.file("bad.yaml", text);
        let o = allocsim(["replay".as_ref(), bad.as_os_str()]);
        assert_eq!(o.status.code(), Some(2), "{text}");
        assert!(stderr(&o).contains(want), "{text}: {}", stderr(&o));
    }
}

/// Help offers only what works: `check` has no `--lenient` (it replays nothing), and
/// `convert --to` lists only the formats allocsim writes.
#[test]
fn help_offers_what_works() {
    let o = allocsim(["check", "--lenient", "examples/seed000.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unexpected argument '--lenient'"));
    let help = stdout(&allocsim(["convert", "--help"]));
    let to = help.split("--to <TO>").nth(1).unwrap();
    let to = to.split("--snapshot-device").next().unwrap();
    assert!(to.contains("yaml") && to.contains("csv"), "{to}");
    assert!(!to.contains("json") && !to.contains("pickle"), "{to}");
}

/// Every command that writes a file says what it wrote, on stderr.
#[test]
fn writers_say_what_they_wrote() {
    let dir = TempDir::new("wrote");
    let out = |name: &str| dir.path().join(name);
    let cases: Vec<(Vec<std::ffi::OsString>, std::path::PathBuf)> = vec![
        (
            vec![
                "generate".into(),
                "random".into(),
                "--events".into(),
                "10".into(),
                "-o".into(),
                out("g.yaml").into(),
            ],
            out("g.yaml"),
        ),
        (
            vec![
                "replay".into(),
                "examples/seed000.yaml".into(),
                "--timeline".into(),
                out("t.csv").into(),
            ],
            out("t.csv"),
        ),
        (
            vec![
                "compare".into(),
                "examples/seed000.yaml".into(),
                "-o".into(),
                out("c.csv").into(),
            ],
            out("c.csv"),
        ),
        (
            vec![
                "fit".into(),
                "examples/seed000.yaml".into(),
                "--policies".into(),
                "caching".into(),
                "--gpus".into(),
                "none".into(),
                "-o".into(),
                out("f.csv").into(),
            ],
            out("f.csv"),
        ),
    ];
    for (args, path) in cases {
        let o = allocsim(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("wrote {}", path.display())),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(path.exists());
    }
}

/// Every `allocsim` command in the README's shell examples runs on the bundled traces
/// (outputs redirected to a temporary directory), but for `probe` and `validate`, which
/// need a GPU.
#[test]
fn readme_examples_run() {
    let dir = TempDir::new("readme");
    let readme = std::fs::read_to_string(crate::util::root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(lines), l) => lines.push(l.to_string()),
            (None, _) => {}
        }
    }
    let bin = env!("CARGO_BIN_EXE_allocsim");
    let mut ran = 0;
    for block in blocks {
        let joined = block.join("\n").replace("\\\n", " ");
        let mut assignments = Vec::new();
        for line in joined.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            }) {
                assignments.push(line.to_string());
                continue;
            }
            let Some(rest) = line.strip_prefix("allocsim ") else {
                continue;
            };
            let command = rest.split_whitespace().next().unwrap();
            if ["probe", "validate"].contains(&command) {
                continue;
            }
            // Files the examples write (names not in the repository) go to the temporary
            // directory.
            let words: Vec<String> = rest
                .split(' ')
                .map(|w| {
                    let bare = !w.contains('/') && !w.contains('*');
                    let file = [".csv", ".yaml", ".png", ".svg", ".pickle", ".json"]
                        .iter()
                        .any(|e| w.ends_with(e));
                    if bare && file && !crate::util::root().join(w).exists() {
                        dir.path().join(w).display().to_string()
                    } else {
                        w.to_string()
                    }
                })
                .collect();
            let script = format!("{}\n{bin} {}", assignments.join("\n"), words.join(" "));
            let o = std::process::Command::new("sh")
                .arg("-c")
                .arg(&script)
                .current_dir(crate::util::root())
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{line}\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran >= 20, "only {ran} README examples found");
}

/// When no setting the policy proposes gets the trace to the end, the verdict says where
/// each ran out and how little the live requests leave for the allocator's overhead, so
/// "fragmentation" never reads as if a setting could fix it.
#[test]
fn verdict_when_no_setting_helps() {
    let o = allocsim([
        "replay",
        "examples/seed000.yaml",
        "--capacity",
        "2GiB",
        "--policy",
        "caching:expandable_segments=True",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let verdict = text
        .lines()
        .find(|l| l.starts_with("why it ran out"))
        .unwrap_or_else(|| panic!("no verdict\n{text}"));
    for want in [
        "tried max_split_size_mb=1024 (still here): none runs to the end",
        "leave only 0 B of the 2.00 GiB the allocator could hold",
        "a larger GPU",
    ] {
        assert!(verdict.contains(want), "{want}\n{verdict}");
    }
    assert!(
        text.contains("cached 16.00 MiB; the allocator could hold 2.00 GiB"),
        "{text}"
    );
}

/// `convert` to YAML keeps a recorded run's segment addresses in the `recorded` block
/// and a replay of the YAML follows them as the recording's replay does (the same
/// timeline, which differs from the address-free one on this run);
/// `--no-recorded-addresses` leaves them out; bad or out-of-range hints are refused
/// with the file and line.
#[test]
fn yaml_carries_address_hints() {
    let dir = TempDir::new("hints");
    let json = "tests/data/oracle/h100-torch2.11/gpt_train_small.json";
    let yaml = dir.path().join("g.yaml");
    let plain = dir.path().join("plain.yaml");
    let o = allocsim([
        "convert".as_ref(),
        json.as_ref(),
        "-o".as_ref(),
        yaml.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&yaml).unwrap();
    assert!(
        text.contains("  segments: [\"0x7fc30fe00000:2097152\", "),
        "{}",
        &text[..text.len().min(600)]
    );
    let o = allocsim([
        "convert".as_ref(),
        json.as_ref(),
        "--no-recorded-addresses".as_ref(),
        "-o".as_ref(),
        plain.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!std::fs::read_to_string(&plain)
        .unwrap()
        .contains("segments:"));
    let timeline = |trace: &std::path::Path, extra: &[&str]| {
        let out = dir.path().join("t.csv");
        let mut args: Vec<std::ffi::OsString> = vec!["replay".into(), trace.into()];
        args.extend(extra.iter().map(|a| a.into()));
        args.extend(["--timeline".into(), out.clone().into_os_string()]);
        let o = allocsim(args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        std::fs::read_to_string(&out).unwrap()
    };
    let recorded = timeline(json.as_ref(), &[]);
    assert_eq!(timeline(&yaml, &[]), recorded);
    let free = timeline(json.as_ref(), &["--no-recorded-addresses"]);
    assert_ne!(free, recorded, "this run's ties depend on the addresses");
    assert_eq!(timeline(&yaml, &["--no-recorded-addresses"]), free);
    assert_eq!(timeline(&plain, &[]), free);
    for (body, want) in [
        (
            "recorded:\n  segments: [\"7fc2:1024\"]\nevents: []\n",
            "line 2 column 13: not a YAML trace: recorded: segments: '7fc2:1024': expected a list of \"ADDRESS:BYTES\"",
        ),
        (
            "recorded:\n  ranges: [12]\nevents: []\n",
            "recorded: ranges: '12': expected a list of hex addresses",
        ),
        (
            "recorded:\n  segments: [\"0x1000:2097152\"]\nevents:\n  - {op: alloc, id: 1, bytes: 1024}\n",
            "bad.yaml: recorded: segments: item 1: address 0x1000 of 2097152 bytes lies outside a device's address space",
        ),
    ] {
        let bad = dir.file("bad.yaml", body);
        let o = allocsim(["replay".as_ref(), bad.as_os_str()]);
        assert_eq!(o.status.code(), Some(2), "{body}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{body}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
}

/// `replay` of a CSV trace or an RMM log streams it (read, checked and replayed in one
/// pass) and prints the summary the whole-trace path prints (`--timeline` takes that
/// path), for every policy and with `--stats`; a trace that runs out of memory is
/// explained as before (the explanation re-reads the whole trace).
#[test]
fn streamed_replay_prints_the_whole_trace_summary() {
    let dir = TempDir::new("streamed");
    let timeline = dir.path().join("t.csv");
    let every = policies::testing::every_policy();
    let runs = every
        .iter()
        .map(|s| (s.label.as_str(), "80GiB"))
        .chain([("caching", "1GiB")]);
    let files = ["examples/random_small.csv", "examples/rmm_log.csv"];
    for ((policy, capacity), file) in runs.flat_map(|r| files.map(|f| (r, f))) {
        let args = |extra: &[&std::ffi::OsStr]| {
            let mut a: Vec<&std::ffi::OsStr> = vec![
                "replay".as_ref(),
                file.as_ref(),
                "--policy".as_ref(),
                policy.as_ref(),
                "--capacity".as_ref(),
                capacity.as_ref(),
                "--stats".as_ref(),
            ];
            a.extend_from_slice(extra);
            allocsim(a)
        };
        let streamed = args(&[]);
        let whole = args(&["--timeline".as_ref(), timeline.as_os_str()]);
        assert_eq!(streamed.status.code(), Some(0), "{}", stderr(&streamed));
        assert_eq!(whole.status.code(), Some(0), "{}", stderr(&whole));
        assert_eq!(
            stdout(&streamed),
            stdout(&whole),
            "{file}: {policy} at {capacity}"
        );
        assert!(
            stdout(&streamed).contains("(line "),
            "{}",
            stdout(&streamed)
        );
    }
}

/// `bench` prints one CSV row per (trace, policy) in input order, with the run count
/// asked, and medians inside the spread of the runs (shape only: no speed is asserted);
/// `--runs 0` is a usage error.
#[test]
fn bench_rows_per_trace_and_policy() {
    let o = allocsim([
        "bench",
        "examples/random_small.csv",
        "examples/seed000.yaml",
        "--policies",
        "caching,buddy",
        "--runs",
        "2",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("trace,events,policy,runs,median_seconds,min_seconds,max_seconds,median_events_per_second,min_events_per_second,max_events_per_second")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let keys: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0], r[2], r[3])).collect();
    assert_eq!(
        keys,
        [
            ("random_small", "caching", "2"),
            ("random_small", "buddy", "2"),
            ("seed000", "caching", "2"),
            ("seed000", "buddy", "2"),
        ]
    );
    for r in &rows {
        let f = |i: usize| r[i].parse::<f64>().unwrap();
        assert!(f(5) <= f(4) && f(4) <= f(6), "{r:?}");
        assert!(f(7) > 0.0, "{r:?}");
    }
    assert_eq!(rows[0][1], "2032");
    let o = allocsim(["bench", "--runs", "0"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A recorded run replays on the device it recorded unless a flag names one: a run
/// recorded on an H200 (150 GB) that held 90 GiB ran out of memory at its first
/// request on the default 80 GiB device in `replay`, `compare`, `diff` and `export`.
#[test]
fn a_recorded_run_replays_on_its_own_device() {
    let dir = TempDir::new("recorded-device");
    let run = dir.path().join("h200.json");
    let (addr, size) = (0x7f00_0000_0000u64, 90u64 << 30);
    std::fs::write(
        &run,
        format!(
            r#"{{"device": "NVIDIA H200", "total_bytes": 150109880320,
              "events": [["segment_alloc", {addr}, {size}, 0, 1], ["alloc", {addr}, {size}, 0, 2],
                         ["free_requested", {addr}, {size}, 0, 3], ["free_completed", {addr}, {size}, 0, 4]]}}"#
        ),
    )
    .unwrap();
    let run = run.to_str().unwrap();
    let o = allocsim(["replay", run]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("device              NVIDIA H200, as recorded: total 139.80 GiB"),
        "{text}"
    );
    assert!(text.contains("out of memory               none"), "{text}");
    // A flag names another device: it runs out there.
    let o = allocsim(["replay", run, "--gpu-profile", "h100"]);
    assert!(
        stdout(&o).contains("out of memory       at event 0"),
        "{}",
        stdout(&o)
    );
    let o = allocsim(["compare", run, "--policies", "caching", "--format", "csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let csv = stdout(&o);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("total_bytes"), "150109880320", "{csv}");
    assert_eq!(col("oom_event_index"), "", "{csv}");
    let o = allocsim(["diff", run, "--policies", "caching,immediate"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("oom"), "{}", stdout(&o));
}
