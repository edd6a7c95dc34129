use crate::util::{allocsim, root, stderr, stdout, TempDir};

/// A sweep file in `dir` of the issue's form, on bundled traces (absolute paths).
fn issue_sweep(dir: &TempDir) -> std::path::PathBuf {
    let ex = root().join("examples");
    dir.file(
        "sweep.yaml",
        &format!(
            "traces: [{}, {}]\n\
             policies:\n  - caching:\n      expandable_segments: [false, true]\n      \
             max_split_size_mb: [none, 64]\n  - buddy:\n      min_block: [512, 4KiB]\n\
             capacities: [2GiB, 80GiB]   # or gpus: [h100, a100-40gb]\n",
            ex.join("training_loop.yaml").display(),
            ex.join("seed000.yaml").display()
        ),
    )
}

/// The issue's sweep form runs: one CSV row per (trace, configuration, device) with
/// the documented header, exactly one recommended row per trace, and a summary naming
/// the recommended configuration.
#[test]
fn the_issues_sweep_runs() {
    let dir = TempDir::new("sweep-issue");
    let sweep = issue_sweep(&dir);
    let csv = dir.path().join("results.csv");
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "-o".as_ref(),
        csv.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "combination,trace,policy,device,default,total_bytes,capacity_bytes,events,\
         requested_bytes_peak,allocated_bytes_peak,reserved_bytes_peak,charged_bytes_peak,\
         utilization,overhead_bytes,oom_event_index,oom_requested_bytes,oom_cause,oom_fix,margin,\
         saved_vs_default_bytes,rank,recommended"
    );
    let rows: Vec<&str> = lines.collect();
    // 2 traces × (4 caching + 2 buddy) × 2 capacities.
    assert_eq!(rows.len(), 24);
    for trace in ["training_loop", "seed000"] {
        let picked = rows
            .iter()
            .filter(|r| r.contains(&format!(",{trace},")) && r.ends_with(",true"))
            .count();
        assert_eq!(picked, 1, "{trace}\n{text}");
    }
    // seed000 needs 3 GiB: every row on 2 GiB runs out.
    assert!(rows
        .iter()
        .filter(|r| r.contains(",seed000,") && r.contains(",2GiB,"))
        .all(|r| r.contains(",too little memory,") || r.contains(",fragmentation,")));
    assert_eq!(
        stderr(&o).trim(),
        format!("wrote {} (24 rows)", csv.display())
    );
    let summary = stdout(&o);
    assert!(
        summary.contains("trace training_loop (12 rows)\n  recommended: caching:"),
        "{summary}"
    );
    assert!(summary.contains("needs "), "{summary}");
    assert!(
        summary.contains("against the default, caching"),
        "{summary}"
    );
}

/// Running the same sweep twice gives byte-identical CSVs, and the shards of a sweep
/// joined by `allocsim merge` give the CSV of one run, byte for byte, with the same
/// ranking in the summary.
#[test]
fn shards_merge_into_one_run() {
    let dir = TempDir::new("sweep-shards");
    let sweep = issue_sweep(&dir);
    let run = |extra: &[&str], out: &str| {
        let path = dir.path().join(out);
        let mut args: Vec<std::ffi::OsString> = vec!["sweep".into(), sweep.clone().into()];
        args.extend(extra.iter().map(Into::into));
        args.extend(["-o".into(), path.clone().into()]);
        let o = allocsim(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        (std::fs::read(&path).unwrap(), stdout(&o))
    };
    let (whole, summary) = run(&[], "whole.csv");
    assert_eq!(run(&[], "again.csv").0, whole);
    let mut shards = Vec::new();
    for k in ["3/3", "1/3", "2/3"] {
        let name = format!("shard{}.csv", &k[..1]);
        let (csv, shard_summary) = run(&["--shard", k], &name);
        assert!(shard_summary.is_empty(), "a shard prints no summary");
        assert!(csv.len() < whole.len());
        shards.push(dir.path().join(name));
    }
    let merged = dir.path().join("merged.csv");
    let mut args: Vec<std::ffi::OsString> = vec!["merge".into()];
    args.extend(shards.iter().map(|p| p.clone().into_os_string()));
    args.extend(["-o".into(), merged.clone().into()]);
    let o = allocsim(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(&merged).unwrap(), whole);
    // The same summary, but for the bisection that needs the traces.
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.trim_start().starts_with("needs"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&stdout(&o)), strip(&summary));
    // Bad merges: a shard twice, a shard missing, a file that is not a sweep's CSV.
    for (files, want) in [
        (
            vec![&shards[0], &shards[0], &shards[1], &shards[2]],
            "is in",
        ),
        (vec![&shards[0], &shards[2]], "is missing"),
        (vec![&sweep], "not the CSV of `allocsim sweep`"),
    ] {
        let mut args: Vec<std::ffi::OsString> = vec!["merge".into()];
        args.extend(files.iter().map(|p| p.as_os_str().to_owned()));
        let o = allocsim(&args);
        assert_eq!(o.status.code(), Some(2), "{want}");
        let e = stderr(&o);
        assert!(e.starts_with("error: ") && e.contains(want), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

/// Bad sweep files and flags exit 2 with one line naming the file, the line and the
/// key; nothing is written.
#[test]
fn bad_sweeps_name_the_key_and_line() {
    let dir = TempDir::new("sweep-bad");
    let trace = root().join("examples/seed000.yaml");
    let t = trace.display();
    let cases = [
        (
            format!("traces: [{t}]\npolicies:\n  - caching:\n      max_split: [64]\n"),
            "line 4: policies: caching: unknown option 'max_split' (known: ",
        ),
        (
            format!("traces: [{t}]\npolicies: [caching]\ncapacity: [1GiB]\n"),
            "line 3: unknown key 'capacity' (known: ",
        ),
        (
            format!("traces: [{t}]\npolicies: [caching]\ncapacities: [16]\n"),
            "line 3: capacities: ",
        ),
        (
            format!("traces: [{t}, nowhere.yaml]\npolicies: [caching]\n"),
            "line 1: traces: ",
        ),
        (
            format!("traces: [{t}]\npolicies:\n  - buddy: {{min_block: [512, 3KiB]}}\n"),
            "line 3: policies: buddy: min_block: ",
        ),
        (
            "policies: [caching]\n".to_string(),
            "traces: none; list them",
        ),
        (
            format!("traces: [{t}]\npolicies:\n  - caching: 5\n"),
            "line 3: policies: caching: the options are a mapping of option: [values], found '5'",
        ),
    ];
    let out = dir.path().join("out.csv");
    for (text, want) in cases {
        let path = dir.file("bad.yaml", &text);
        let o = allocsim([
            "sweep".as_ref(),
            path.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{text}");
        let e = stderr(&o);
        assert!(
            e.starts_with(&format!("error: {}: ", path.display())) && e.contains(want),
            "{text}\n{e}\nwanted {want}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(!out.exists());
    }
    let good = issue_sweep(&dir);
    for (flags, want) in [
        (&["--shard", "0/2"][..], "--shard"),
        (&["--shard", "3/2"], "--shard"),
        (
            &["--shard", "1/2", "--format", "table"],
            "a shard writes CSV",
        ),
        (&["-o", good.to_str().unwrap()], "that is the input"),
    ] {
        let mut args: Vec<&std::ffi::OsStr> = vec!["sweep".as_ref(), good.as_os_str()];
        args.extend(flags.iter().map(std::ffi::OsStr::new));
        let o = allocsim(&args);
        assert_eq!(o.status.code(), Some(2), "{flags:?}");
        assert!(stderr(&o).contains(want), "{flags:?}: {}", stderr(&o));
    }
}

/// Generated traces with a list of seeds are one trace per seed, named by seed; a
/// grid file without traces applies to `--trace` files; a setting that changes nothing
/// (a garbage-collection threshold without a memory limit) is warned about.
#[test]
fn generators_grids_and_inert_settings() {
    let dir = TempDir::new("sweep-gen");
    let sweep = dir.file(
        "gen.yaml",
        "traces:\n  - {generate: random, seed: [4, 5], events: 300, max_bytes: 8MiB}\n\
         policies:\n  - caching:\n      garbage_collection_threshold: [none, 0.5]\n",
    );
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "--format".as_ref(),
        "csv".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let csv = stdout(&o);
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(
        csv.contains(",random-seed4,") && csv.contains(",random-seed5,"),
        "{csv}"
    );
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "--format".as_ref(),
        "table".as_ref(),
    ]);
    let summary = stdout(&o);
    assert!(
        summary.contains(
            "warning: garbage_collection_threshold (caching) changed nothing for this trace"
        ),
        "{summary}"
    );
    assert!(summary.contains("needs a memory limit"), "{summary}");
    assert!(summary.contains("across the 2 traces"), "{summary}");
    let o = allocsim([
        "sweep",
        "examples/pytorch-knobs.yaml",
        "--trace",
        "examples/seed000.yaml",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // 2 × 4 × 3 configurations on one GPU.
    assert_eq!(stdout(&o).lines().count(), 25);
}

/// A sweep file that names no device runs a recorded run on the device it recorded (an
/// H200 here, as `replay` runs it), other traces on the default device; one that names
/// devices runs every trace on them. The H200 run ran on the default 80 GiB device.
#[test]
fn a_recorded_run_sweeps_on_its_own_device() {
    let dir = TempDir::new("sweep-recorded");
    let traces = format!(
        "traces: [{}, {}]\npolicies:\n  - caching:\n      expandable_segments: [false, true]\n",
        root().join("tests/data/unseen/moe_train.json").display(),
        root().join("examples/seed000.yaml").display()
    );
    let plain = dir.file("plain.yaml", &traces);
    let named = dir.file("named.yaml", &format!("{traces}capacities: [80GiB]\n"));
    let run = |sweep: &std::path::Path| {
        let o = allocsim([
            "sweep".as_ref(),
            sweep.as_os_str(),
            "--format".as_ref(),
            "csv".as_ref(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let csv = run(&plain);
    let moe: Vec<&str> = csv.lines().filter(|l| l.contains(",moe_train,")).collect();
    assert_eq!(moe.len(), 2, "{csv}");
    for row in &moe {
        // The recorded card and its total; the default configuration's reserved peak
        // is `replay`'s (2 246 049 792 bytes).
        assert!(row.contains(",NVIDIA H200 (recorded),"), "{row}");
        assert!(row.contains(",150109880320,"), "{row}");
    }
    assert!(moe[0].contains(",2246049792,"), "{}", moe[0]);
    assert!(
        csv.lines()
            .filter(|l| l.contains(",seed000,"))
            .all(|l| l.contains(",80GiB,")),
        "{csv}"
    );
    let csv = run(&named);
    assert!(csv.lines().skip(1).all(|l| l.contains(",80GiB,")), "{csv}");
}

/// The bundled example sweep runs and recommends a configuration for every trace.
#[test]
fn the_example_sweep_runs() {
    let o = allocsim(["sweep", "examples/sweep.yaml", "--format", "table"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let summary = stdout(&o);
    assert_eq!(summary.matches("  recommended: ").count(), 2, "{summary}");
}

/// A sweep's traces may be any generator's spec, as `allocsim generate --spec` reads
/// it: a training spec with two seeds and an inference spec are three traces, named
/// by generator and seed, and run like files.
#[test]
fn training_and_inference_specs_in_a_sweep() {
    let dir = TempDir::new("sweep-gen-kinds");
    let sweep = dir.file(
        "gen.yaml",
        "traces:\n  - {generate: training, seed: [1, 2], steps: 2, seq_len: {uniform: [16, 64]}}\n  \
         - {generate: inference, batches: 2, layers: 2}\n\
         policies:\n  - caching:\n      expandable_segments: [false, true]\n",
    );
    let o = allocsim([
        "sweep".as_ref(),
        sweep.as_os_str(),
        "--format".as_ref(),
        "csv".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let csv = stdout(&o);
    assert_eq!(csv.lines().count(), 7, "{csv}");
    for name in ["training-seed1", "training-seed2", "inference-seed0"] {
        assert!(csv.contains(&format!(",{name},")), "{name}: {csv}");
    }
}
