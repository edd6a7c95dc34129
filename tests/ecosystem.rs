//! Meeting users where they work (issue 11): RMM logs, named ids, pictures, PyTorch's
//! memory viewer, realistic generators, through the command line.

use crate::util::{allocsim, stderr, stdout, TempDir};

/// The one error line of a failed run and its exit code.
fn error_line(o: &std::process::Output) -> (i32, String) {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    (o.status.code().unwrap(), err.trim_end().to_string())
}

/// The bundled RMM log is detected by its header (it is named `.csv`, like a CSV
/// trace), replays, and the failure it recorded reproduces on a GPU as small as the
/// one it ran on.
#[test]
fn rmm_log_replays() {
    let o = allocsim(["replay", "examples/rmm_log.csv", "--policy", "arena"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("131 events, 69 allocations"), "{out}");
    assert!(out.contains("out of memory               none"), "{out}");
    let o = allocsim([
        "replay",
        "examples/rmm_log.csv",
        "--policy",
        "arena",
        "--capacity",
        "40GiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("out of memory       at event 108 (line 110)"),
        "{}",
        stdout(&o)
    );
}

/// A malformed RMM log is one line naming the file and the line, exit 2, whatever
/// its extension; `check` lists every bad line.
#[test]
fn malformed_rmm_log_exits_2() {
    let dir = TempDir::new("rmm-bad");
    let log = dir.file(
        "log.txt",
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,10:00:00.000001,allocate,0x10,512,0x0\n\
         1,10:00:00.000002,allocate,0x20,lots,0x0\n\
         1,10:00:00.000003,free,0x10,512\n",
    );
    let o = allocsim(["replay".as_ref(), log.as_os_str()]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert_eq!(
        line,
        format!(
            "error: {}: line 3: Size 'lots' is not a number of bytes (a decimal integer) \
             (and 1 more problem in this file); `allocsim check {}` lists them all",
            log.display(),
            log.display()
        )
    );
    let o = allocsim(["check".as_ref(), log.as_os_str()]);
    assert_eq!(o.status.code(), Some(2));
    let all = stdout(&o) + &stderr(&o);
    assert!(all.contains("line 3: Size 'lots'"), "{all}");
    assert!(all.contains("line 4: a line has 6 fields"), "{all}");
    // Forcing another format on it reads it as that format.
    let o = allocsim([
        "replay".as_ref(),
        log.as_os_str(),
        "--trace-format".as_ref(),
        "csv".as_ref(),
    ]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert!(
        line.contains("line 1: expected the header 'op,id,bytes,stream'"),
        "{line}"
    );
}

/// Named ids survive conversion both ways: an RMM log's pointers become the ids of
/// the YAML, and YAML -> CSV -> YAML gives back the same bytes.
#[test]
fn named_ids_convert_both_ways() {
    let dir = TempDir::new("named-ids");
    let yaml = dir.path().join("log.yaml");
    let o = allocsim([
        "convert".as_ref(),
        "examples/rmm_log.csv".as_ref(),
        "-o".as_ref(),
        yaml.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&yaml).unwrap();
    assert!(
        text.contains("  - {op: alloc, id: \"0x7f3a00000000\", bytes: 134217728, stream: 0}"),
        "{text}"
    );
    let csv = dir.path().join("log.csv");
    let back = dir.path().join("back.yaml");
    for (from, to) in [(&yaml, &csv), (&csv, &back)] {
        let o = allocsim([
            "convert".as_ref(),
            from.as_os_str(),
            "-o".as_ref(),
            to.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert!(std::fs::read_to_string(&csv)
        .unwrap()
        .contains("\nalloc,0x7f3a00000000,134217728,0\n"));
    // The name line differs (the trace is named after the file it was read from).
    let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&std::fs::read_to_string(&back).unwrap()), body(&text));
}

/// A hand-written trace with named ids replays, and a bad free names the id as
/// written.
#[test]
fn named_ids_in_messages() {
    let dir = TempDir::new("named-msg");
    let t = dir.file(
        "t.yaml",
        "events:\n  - {op: alloc, id: weights, bytes: 1GiB}\n  - {op: alloc, id: kv_cache_3, bytes: 20MiB}\n  - {op: free, id: kv_cache_3}\n  - {op: free, id: kv_cache_4}\n",
    );
    let o = allocsim(["replay".as_ref(), t.as_os_str()]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert_eq!(
        line,
        format!(
            "error: {}: event 3: free of unknown id kv_cache_4; --lenient replays it anyway",
            t.display()
        )
    );
    let o = allocsim(["replay".as_ref(), t.as_os_str(), "--lenient".as_ref()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("peak requested          1.02 GiB"),
        "{}",
        stdout(&o)
    );
}

/// The texts of an SVG file (which must parse as XML with an `svg` root).
fn svg_texts(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("SVG parses");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

/// Runs `allocsim plot` with `args`, expecting success.
fn plot(args: &[&std::ffi::OsStr]) {
    let mut all: Vec<&std::ffi::OsStr> = vec!["plot".as_ref()];
    all.extend_from_slice(args);
    let o = allocsim(all);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `plot` draws every policy's series over a bundled trace's events, with its marks,
/// into an SVG that parses and a PNG that decodes; the same command gives the same
/// bytes.
#[test]
fn plot_memory_over_the_run() {
    let dir = TempDir::new("plot-timeline");
    let svg = dir.path().join("t.svg");
    let trace: &std::ffi::OsStr = "examples/training_loop.yaml".as_ref();
    plot(&[trace, "-o".as_ref(), svg.as_os_str()]);
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.starts_with(s));
    for want in [
        "training_loop: memory over the run on simulated 80 GiB",
        "requested · training_loop (peak",
        "reserved · caching (peak",
        "reserved · immediate (peak",
        "reserved · buddy (peak",
        "reserved · arena (peak",
        "allocated · arena (peak",
        "iteration 1",
        "iteration 3",
        "capacity 80.00 GiB usable of 80.00 GiB",
    ] {
        assert!(has(want), "no {want:?} in {texts:?}");
    }
    let png = dir.path().join("t.png");
    let again = dir.path().join("again.png");
    for out in [&png, &again] {
        plot(&[
            trace,
            "-o".as_ref(),
            out.as_os_str(),
            "--width".as_ref(),
            "900".as_ref(),
        ]);
    }
    let bytes = std::fs::read(&png).unwrap();
    let mut reader = png::Decoder::new(&bytes[..]).read_info().expect("PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!((info.width, info.height), (900, 800));
    assert_eq!(bytes, std::fs::read(&again).unwrap(), "not deterministic");
}

/// A recorded run is drawn as `replay` replays it: under the settings it recorded
/// (here `expandable_segments:True`) on the device it recorded (an H200), unless flags
/// name others; the picture said otherwise (the default settings on the default 80 GiB
/// device: a reserved peak of 2.09 GiB against the replay's 1.50 GiB).
#[test]
fn plot_a_recorded_run_as_replay_replays_it() {
    let dir = TempDir::new("plot-recorded");
    let svg = dir.path().join("t.svg");
    let run: &std::ffi::OsStr =
        "tests/data/unseen/moe_train__expandable_segments-True.json".as_ref();
    plot(&[
        run,
        "--policies".as_ref(),
        "caching".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.starts_with(s));
    for want in [
        "moe_train__expandable_segments-True: memory over the run on NVIDIA H200",
        "reserved · caching (peak 1.50 GiB)",
        "capacity 139.07 GiB usable of 139.80 GiB",
    ] {
        assert!(has(want), "no {want:?} in {texts:?}");
    }
    // Flags name the device and the settings: those apply.
    plot(&[
        run,
        "--policies".as_ref(),
        "caching".as_ref(),
        "--alloc-conf".as_ref(),
        "".as_ref(),
        "--capacity".as_ref(),
        "80GiB".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.starts_with(s));
    assert!(has("reserved · caching (peak 2.09 GiB)"), "{texts:?}");
}

/// Over time for a snapshot that records it, with its annotations as ticks; an
/// out-of-memory on a small device is named in the legend, and requested bytes are the
/// whole trace's (from the replay that did not stop).
#[test]
fn plot_over_time_with_oom() {
    let dir = TempDir::new("plot-time");
    let svg = dir.path().join("t.svg");
    plot(&[
        "tests/data/oracle/h100-torch2.11-pickles/gpt_train_small.pickle".as_ref(),
        "--policies".as_ref(),
        "caching,caching:expandable_segments=True".as_ref(),
        "--capacity".as_ref(),
        "2000MiB".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    let texts = svg_texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t.starts_with(s));
    for want in [
        "seconds since the first event",
        "START Optimizer.step",
        "out of memory · caching",
        "250.00 MiB request at event 1005",
        // 1 976 892 424 B, the trace's peak; caching stops before it.
        "requested · gpt_train_small (peak 1.84 GiB)",
    ] {
        assert!(has(want), "no {want:?} in {texts:?}");
    }
    assert!(!has("out of memory · caching:expandable"), "{texts:?}");
}

/// `--segments` draws each policy's segments at the peak, the out-of-memory or after an
/// event, streams apart; a policy with nothing to draw then is left out with a note.
#[test]
fn plot_segment_maps() {
    let dir = TempDir::new("plot-segments");
    let svg = dir.path().join("s.svg");
    plot(&[
        "tests/data/torch/multistream.pickle".as_ref(),
        "--segments".as_ref(),
        "peak".as_ref(),
        "--policies".as_ref(),
        "caching,immediate".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    let texts = svg_texts(&svg);
    let count = |s: &str| texts.iter().filter(|t| t.starts_with(s)).count();
    assert_eq!(count("caching at event "), 1, "{texts:?}");
    assert_eq!(count("immediate at event "), 1, "{texts:?}");
    // Two streams in each panel.
    assert_eq!(count("stream 0x"), 4, "{texts:?}");
    assert!(count("reserved 440.00 MiB of 80.00 GiB usable in 24 segments") == 1);
    let o = allocsim([
        "plot".as_ref(),
        "tests/data/oracle/h100-torch2.11-pickles/gpt_train_small.pickle".as_ref(),
        "--segments".as_ref(),
        "oom".as_ref(),
        "--policies".as_ref(),
        "caching".as_ref(),
        "--capacity".as_ref(),
        "1.5GiB".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&svg);
    assert!(
        texts.iter().any(|t| t
            == "caching at event 1003 (entry 1434, out of memory: a 250.00 MiB request failed)"),
        "{texts:?}"
    );
    // Arena's first segment (1 GiB) does not fit in 900 MiB; caching never runs out.
    let o = allocsim([
        "plot".as_ref(),
        "examples/training_loop.yaml".as_ref(),
        "--segments".as_ref(),
        "oom".as_ref(),
        "--policies".as_ref(),
        "caching,arena".as_ref(),
        "--capacity".as_ref(),
        "900MiB".as_ref(),
        "-o".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = svg_texts(&svg);
    assert!(
        texts
            .iter()
            .any(|t| t == "arena at event 1 (out of memory: a 64.00 MiB request failed)"),
        "{texts:?}"
    );
    assert!(
        !texts.iter().any(|t| t.starts_with("caching at")),
        "{texts:?}"
    );
    let err = stderr(&o);
    assert!(
        err.contains("note: not drawn: --segments oom: caching does not run out of memory"),
        "{err}"
    );
}

/// Bad plot arguments: one line, exit 2, and no file written.
#[test]
fn plot_bad_arguments_exit_2() {
    let dir = TempDir::new("plot-bad");
    let out = dir.path().join("x.svg");
    let out = out.to_str().unwrap();
    let t = "examples/training_loop.yaml";
    let cases: &[(&[&str], &str)] = &[
        (
            &[t, "-o", "x.jpg"],
            "x.jpg: a picture is written as .svg or .png",
        ),
        (
            &[t, "-o", out, "--segments", "9999"],
            "--segments 9999: the trace has 80 events",
        ),
        (
            &[t, "-o", out, "--segments", "oom"],
            "caching does not run out of memory",
        ),
        (
            &[t, "-o", out, "--segments", "later"],
            "'later' is not a moment",
        ),
        (
            &[t, "-o", out, "--x-axis", "time"],
            "does not record when its events happened",
        ),
        (&[t, t, "-o", out, "--segments", "peak"], "give one trace"),
        (&[t, "-o", out, "--width", "5"], "5 is not in 200..=10000"),
        (
            &[t, "-o", out, "--capacity", "1GiB,2GiB"],
            "plot takes one capacity",
        ),
        (
            &[t, "-o", out, "--policies", "cashing"],
            "unknown policy 'cashing'",
        ),
        (&["nonexistent.yaml", "-o", out], "nonexistent.yaml"),
    ];
    for (args, want) in cases {
        let mut all = vec!["plot"];
        all.extend_from_slice(args);
        let o = allocsim(&all);
        let (code, line) = error_line(&o);
        assert_eq!(code, 2, "{args:?}: {line}");
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(!std::path::Path::new(out).exists(), "{args:?} wrote a file");
    }
}

/// `generate training|inference` from a spec, `--set` and `--seed`: the same command
/// gives the same bytes, the trace replays with a window per iteration, and another
/// seed of a spec that draws gives another trace.
#[test]
fn generators_from_specs() {
    let dir = TempDir::new("gen-spec");
    let a = dir.path().join("a.csv");
    let b = dir.path().join("b.csv");
    let spec = "examples/generators/transformer.yaml";
    for out in [&a, &b] {
        let o = allocsim([
            "generate".as_ref(),
            "--spec".as_ref(),
            spec.as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let o = allocsim([
        "replay".as_ref(),
        a.as_os_str(),
        "--iterations".as_ref(),
        "--policy".as_ref(),
        "caching".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("iteration 5"), "{}", stdout(&o));
    let o = allocsim([
        "generate".as_ref(),
        "training".as_ref(),
        "--spec".as_ref(),
        spec.as_ref(),
        "--seed".as_ref(),
        "8".as_ref(),
        "--set".as_ref(),
        "steps=2".as_ref(),
        "-o".as_ref(),
        b.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let y = dir.path().join("inference.yaml");
    let o = allocsim([
        "generate".as_ref(),
        "inference".as_ref(),
        "--set".as_ref(),
        "batches=2".as_ref(),
        "-o".as_ref(),
        y.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&y)
        .unwrap()
        .contains("name: \"inference-seed0\""));
}

/// A bad generator spec is one line naming the file, the line and the key, exit 2; so
/// is a bad `--set` and a flag of another generator.
#[test]
fn bad_generator_specs_exit_2() {
    let dir = TempDir::new("gen-bad");
    let spec = dir.file(
        "spec.yaml",
        "generate: training\nsteps: 3\nlayers:\n  - {params: [4096x4096], activations: [4096]}\n  - {params: [4096x4096], activations: lots}\n",
    );
    let out = dir.path().join("t.csv");
    let o = allocsim([
        "generate".as_ref(),
        "--spec".as_ref(),
        spec.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert_eq!(
        line,
        format!(
            "error: {}: line 5: layers: 1: activations: 'lots' is not a number of elements (N, or a shape AxB...)",
            spec.display()
        )
    );
    assert!(!out.exists());
    let o = allocsim([
        "generate",
        "inference",
        "--set",
        "growth=triple",
        "-o",
        "x.csv",
    ]);
    assert_eq!(
        error_line(&o),
        (
            2,
            "error: on the command line: growth: 'triple' is not exact, double or {block: TOKENS}"
                .to_string()
        )
    );
    let o = allocsim(["generate", "training", "--events", "5", "-o", "x.csv"]);
    let (code, line) = error_line(&o);
    assert_eq!(code, 2);
    assert!(
        line.starts_with(
            "error: on the command line: unknown key 'events' of the training generator (known: "
        ),
        "{line}"
    );
}

/// The summary lines of a replay that do not depend on how events are numbered.
fn replay_numbers(args: &[&str]) -> Vec<String> {
    let o = allocsim(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
        .lines()
        .filter(|l| {
            [
                "peak requested",
                "peak allocated",
                "peak reserved",
                "peak charged",
                "utilization",
                "segments (peak)",
                "device allocs/frees",
                "live at end",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        // The reserved peak's event number is the file's own.
        .map(|l| l.split(", first at").next().unwrap().to_string())
        .collect()
}

/// `export` writes what a policy did as a PyTorch snapshot that `replay` reads back to
/// the same numbers, for every policy, and says what it wrote; the same inputs give the
/// same bytes.
#[test]
fn export_replays_to_the_same_numbers() {
    let dir = TempDir::new("export");
    for spec in policies::testing::every_policy() {
        let policy = spec.label.as_str();
        let out = dir
            .path()
            .join(format!("{}.pickle", policy.replace([':', '='], "_")));
        let out = out.to_str().unwrap();
        let o = allocsim([
            "export",
            "examples/training_loop.yaml",
            "--policy",
            policy,
            "-o",
            out,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).starts_with(&format!("wrote {out} (training_loop under ")),
            "{}",
            stderr(&o)
        );
        let original =
            replay_numbers(&["replay", "examples/training_loop.yaml", "--policy", policy]);
        assert_eq!(original.len(), 8, "{original:?}");
        assert_eq!(
            replay_numbers(&["replay", out, "--policy", policy]),
            original,
            "{policy}"
        );
        let first = std::fs::read(out).unwrap();
        assert!(allocsim([
            "export",
            "examples/training_loop.yaml",
            "--policy",
            policy,
            "-o",
            out
        ])
        .status
        .success());
        assert_eq!(
            std::fs::read(out).unwrap(),
            first,
            "{policy}: not deterministic"
        );
    }
}

/// A JSON export holds the same dict as the pickle: the keys PyTorch writes, the
/// segments and the trace.
#[test]
fn export_to_json_is_the_same_dict() {
    let dir = TempDir::new("export-json");
    let pickle = dir.path().join("run.pickle");
    let json = dir.path().join("run.json");
    for out in [&pickle, &json] {
        let o = allocsim([
            "export".as_ref(),
            "tests/data/torch/multistream.pickle".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let run = workloads::read_snapshot_pickle(&pickle, 0).unwrap();
    let entries = v["device_traces"][0].as_array().unwrap();
    assert_eq!(
        entries.len(),
        run.entries.len() - inferred_empty_caches(&run)
    );
    assert_eq!(v["segments"].as_array().unwrap().len(), run.segments.len());
    for (e, seg) in v["segments"].as_array().unwrap().iter().zip(&run.segments) {
        assert_eq!(e["address"], seg.address);
        assert_eq!(e["total_size"], seg.total_size);
        assert_eq!(e["blocks"].as_array().unwrap().len(), seg.blocks.len());
    }
    assert_eq!(entries[0]["action"], "segment_alloc");
    assert!(
        entries[0]["time_us"].as_u64().unwrap() > 0,
        "times are carried over"
    );
}

/// `empty_cache` entries the reader inferred (not in the file).
fn inferred_empty_caches(run: &workloads::RecordedRun) -> usize {
    run.entries
        .iter()
        .filter(|e| e.action == workloads::recorded::Action::EmptyCache)
        .count()
}

/// A window holds only its events' entries and the segments after its last event;
/// it reads back as a snapshot that starts mid-run.
#[test]
fn export_window_is_a_mid_run_snapshot() {
    let dir = TempDir::new("export-window");
    let out = dir.path().join("w.pickle");
    let o = allocsim([
        "export".as_ref(),
        "examples/training_loop.yaml".as_ref(),
        "--from".as_ref(),
        "30".as_ref(),
        "--to".as_ref(),
        "50".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("events 30 to 50"), "{}", stderr(&o));
    let run = workloads::read_snapshot_pickle(&out, 0).unwrap();
    assert!(!run.starts_empty());
    let o = allocsim(["replay".as_ref(), out.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("starts mid-run"), "{}", stdout(&o));
}

/// Stack frames of a snapshot's entries are carried over to the entries of the same
/// requests.
#[test]
fn export_carries_frames_over() {
    let dir = TempDir::new("export-frames");
    let out = dir.path().join("f.pickle");
    let input = "tests/data/torch/synthetic/torch215_frames.pickle";
    let o = allocsim([
        "export".as_ref(),
        input.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let options = workloads::snapshot::SnapshotOptions { keep_frames: true };
    let read = |p: &std::path::Path| {
        workloads::snapshot::read_snapshot_pickle_with(p, 0, &options).unwrap()
    };
    let (original, exported) = (read(&crate::util::root().join(input)), read(&out));
    let frames_of = |run: &workloads::RecordedRun, action: workloads::recorded::Action| {
        let f = run.snapshot.as_ref().unwrap().frames.as_ref().unwrap();
        let mut out = Vec::new();
        for &(entry, stack) in &f.entries {
            let i = run
                .source_indexes
                .iter()
                .position(|&s| s == entry)
                .unwrap_or(entry as usize);
            if run.entries[i].action == action {
                out.push(
                    f.stack(stack)
                        .map(|fr| format!("{}:{}", fr.filename, fr.line))
                        .collect::<Vec<_>>(),
                );
            }
        }
        out
    };
    let alloc = workloads::recorded::Action::Alloc;
    let stacks = frames_of(&original, alloc);
    assert!(!stacks.is_empty());
    assert_eq!(frames_of(&exported, alloc), stacks);
}

/// Bad arguments are one line and exit 2: an unknown policy, a window backwards or
/// past the trace, an output that is the input, an extension that is no snapshot's.
#[test]
fn export_bad_arguments_exit_2() {
    let dir = TempDir::new("export-bad");
    let out = dir.path().join("x.pickle");
    let out = out.to_str().unwrap();
    let t = "examples/training_loop.yaml";
    let input = "tests/data/torch/multistream.pickle";
    for (args, expected) in [
        (vec!["export", t, "-p", "nope", "-o", out], "error: unknown policy 'nope' (known: caching, immediate, buddy, arena)".to_string()),
        (vec!["export", t, "--from", "5", "--to", "3", "-o", out], "error: --from 5 is after --to 3: the window is events FROM to TO, both included".into()),
        (vec!["export", t, "--to", "80", "-o", out], "error: --to 80: the trace has 80 events, numbered from 0".into()),
        (vec!["export", input, "-o", input], format!("error: -o {input}: that is the input {input}; write to another file (allocsim never overwrites its input)")),
        (vec!["export", t, "-o", "x.yaml"], "error: -o x.yaml: export writes a PyTorch memory snapshot: name it FILE.pickle (or .pkl), or FILE.json for the same dict as JSON".into()),
    ] {
        let o = allocsim(&args);
        let (code, line) = error_line(&o);
        assert_eq!((code, line.as_str()), (2, expected.as_str()), "{args:?}");
    }
    assert!(!std::path::Path::new(out).exists());
}

/// Every export, each policy's full run, a window and a run out of memory, passes the
/// walk PyTorch's web viewer makes over a snapshot (`tools/check_export.py`: every
/// block drawn inside a segment at every entry), when python3 is there (as the
/// recorder's tests, `.ci/run` says when it is not).
#[test]
fn exports_pass_the_viewer_walk() {
    let Ok(python) = which_python() else {
        eprintln!("skipped: python3 not found");
        return;
    };
    let dir = TempDir::new("export-viewer");
    let mut files = Vec::new();
    for spec in policies::testing::every_policy() {
        let policy = spec.label.as_str();
        for (i, extra) in [
            vec![],
            vec!["--from", "20", "--to", "45"],
            vec!["--capacity", "300MiB"],
        ]
        .iter()
        .enumerate()
        {
            for trace in [
                "examples/training_loop.yaml",
                "tests/data/torch/multistream.pickle",
                "tests/data/torch/cut/multistream__wrap100.pickle",
            ] {
                let out = dir.path().join(format!(
                    "{}-{i}-{}.pickle",
                    policy.replace([':', '='], "_"),
                    files.len()
                ));
                let mut args = vec![
                    "export",
                    trace,
                    "--policy",
                    policy,
                    "-o",
                    out.to_str().unwrap(),
                ];
                args.extend(extra);
                let o = allocsim(&args);
                if o.status.success() {
                    files.push(out);
                } else {
                    // Only a mid-run state too large for the small device may fail.
                    assert!(
                        stderr(&o).contains("the trace starts mid-run"),
                        "{args:?}: {}",
                        stderr(&o)
                    );
                }
            }
        }
    }
    assert!(files.len() >= 40, "{}", files.len());
    let o = std::process::Command::new(python)
        .arg(crate::util::root().join("tools/check_export.py"))
        .args(&files)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        stdout(&o).matches(": ok (").count(),
        files.len(),
        "{}",
        stdout(&o)
    );
}

fn which_python() -> Result<&'static str, ()> {
    std::process::Command::new("python3")
        .arg("--version")
        .output()
        .map(|_| "python3")
        .map_err(|_| ())
}
