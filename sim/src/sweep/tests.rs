use super::*;

/// A temporary directory, removed with what it holds when dropped.
struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory with empty files of these names, for sweep files that name traces;
/// removed when the test is done with it.
fn dir_with(files: &[&str]) -> TestDir {
    let dir = std::env::temp_dir().join(format!(
        "allocsim-sweep-{}-{}",
        std::process::id(),
        files.join("-").replace(['/', '.'], "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for f in files {
        std::fs::write(dir.join(f), "events: []\n").unwrap();
    }
    TestDir(dir)
}

/// The tests' directories do not outlive them (they were left in the temporary
/// directory, hundreds after a day of test runs).
#[test]
fn test_directories_are_removed() {
    let path = {
        let dir = dir_with(&["gone.yaml"]);
        assert!(dir.join("gone.yaml").exists());
        dir.to_path_buf()
    };
    assert!(!path.exists());
}

const ISSUE: &str = "traces: [run.pickle, other.yaml]
policies:
  - caching:
      expandable_segments: [false, true]
      max_split_size_mb: [none, 64]
  - buddy:
      min_block: [512, 4KiB]
capacities: [40GiB, 80GiB]   # or gpus: [h100, a100-40gb]
";

/// The issue's example parses: two traces from the file's directory, four caching
/// combinations (the last option fastest, the first being the default) and two buddy
/// ones, two capacities; rows are numbered trace, configuration, device.
#[test]
fn the_issues_example() {
    let dir = dir_with(&["run.pickle", "other.yaml"]);
    let s = parse(ISSUE, &dir.join("sweep.yaml")).unwrap();
    assert_eq!(
        s.traces,
        [
            TraceSource::File(dir.join("run.pickle")),
            TraceSource::File(dir.join("other.yaml"))
        ]
    );
    let labels: Vec<(&str, bool)> = s
        .combinations()
        .iter()
        .map(|c| (c.spec.label.as_str(), c.default))
        .collect();
    assert_eq!(
        labels,
        [
            ("caching:expandable_segments=False", true),
            (
                "caching:expandable_segments=False,max_split_size_mb=64",
                false
            ),
            ("caching:expandable_segments=True", false),
            (
                "caching:expandable_segments=True,max_split_size_mb=64",
                false
            ),
            ("buddy:min_block=512", false),
            ("buddy:min_block=4KiB", false),
        ]
    );
    let devices: Vec<&str> = s.devices.iter().map(|d| d.label.as_str()).collect();
    assert_eq!(devices, ["40GiB", "80GiB"]);
    assert_eq!(s.devices[0].options.total_bytes, 40 << 30);
    assert_eq!(s.rows(), 24);
    let jobs = s.jobs(None);
    assert_eq!(
        (
            jobs[13].combination,
            jobs[13].trace,
            jobs[13].policy,
            jobs[13].device
        ),
        (13, 1, 0, 1)
    );
    let shard: Vec<u64> = s
        .jobs(Some(Shard::parse("2/5").unwrap()))
        .iter()
        .map(|j| j.combination)
        .collect();
    assert_eq!(shard, [1, 6, 11, 16, 21]);
}

/// GPU names and profile-based capacities, generators with seeds, the default added
/// first when no grid gives it, and the sweep's alloc_conf under every caching row.
#[test]
fn gpus_generators_and_the_default() {
    let s = parse(
        "traces:\n  - {generate: random, seed: [1, 2], events: 100, streams: 2}\n\
         policies:\n  - caching: {expandable_segments: true}\n  - arena\n\
         gpu_profile: h100\ncapacities: [16GiB]\ngpus: [l4]\nalloc_conf: max_split_size_mb:64\n",
        Path::new("s.yaml"),
    )
    .unwrap();
    assert_eq!(s.traces.len(), 2);
    assert!(
        matches!(&s.traces[1], TraceSource::Generated(g) if matches!(&**g, workloads::generate::Generator::Random(o) if o.seed == 2 && o.events == 100 && o.streams == 2))
    );
    let devices: Vec<&str> = s.devices.iter().map(|d| d.label.as_str()).collect();
    assert_eq!(devices, ["h100@16GiB", "l4"]);
    assert!(
        s.devices[0].options.capacity_bytes < 16 << 30,
        "h100 keeps a context back"
    );
    let labels: Vec<&str> = s
        .combinations()
        .iter()
        .map(|c| c.spec.label.as_str())
        .collect();
    assert_eq!(
        labels,
        ["caching", "caching:expandable_segments=True", "arena"]
    );
    assert!(s.combinations()[0].default);
    let caching = s.combinations()[0]
        .spec
        .config
        .options::<policies::caching::CachingConfig>()
        .unwrap();
    assert_eq!(caching.max_split_size_bytes, 64 << 20);
}

/// Bad files: one line naming the file, the line and the key.
#[test]
fn errors_name_key_and_line() {
    let dir = dir_with(&["a.yaml"]);
    let cases = [
        (
            "traces: [a.yaml]\npolicies:\n  - caching:\n      max_split: [64]\n",
            "line 4: policies: caching: unknown option 'max_split' (known: cap, ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - slab\n",
            "line 3: policies: unknown policy 'slab' (known: caching, immediate, buddy, arena)",
        ),
        (
            "traces: [a.yaml]\npolicies: [caching]\ncapacites: [1GiB]\n",
            "line 3: unknown key 'capacites' (known: traces, policies, capacities, ",
        ),
        (
            "traces: [a.yaml]\npolicies: [caching]\ncapacities: [80GiB,\n   16]\n",
            "line 4: capacities: ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - buddy:\n      min_block: [512, 3]\n",
            "line 4: policies: buddy: min_block: ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - caching:\n      max_split_size_mb:\n        - 64\n        - lots\n",
            "line 6: policies: caching: max_split_size_mb: ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - arena:\n      superblock: [512KiB]\n      threshold: [1MiB]\n",
            "line 3: policies: the combination policy 'arena:superblock=512KiB,threshold=1MiB': ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - arena:\n      superblock: [1MiB]\n      threshold: [2MiB]\n",
            "line 5: policies: arena: threshold: threshold (2097152) must not exceed superblock",
        ),
        (
            "traces: [a.yaml, missing.yaml]\npolicies: [caching]\n",
            "line 1: traces: ",
        ),
        (
            "traces:\n  - generate: random\n    sigma: x\npolicies: [caching]\n",
            "line 3: traces: sigma: 'x' is not a number",
        ),
        (
            "traces:\n  - generate: random\n    streams: 0\npolicies: [caching]\n",
            "line 2: traces: the random generator: streams must be at least 1",
        ),
        (
            "traces:\n  - generate: random\n    events: 1000000000000\npolicies: [caching]\n",
            "line 3: traces: events: 1000000000000 is more than a sweep generates",
        ),
        (
            "traces:\n  - {generate: fractal}\npolicies: [caching]\n",
            "line 2: traces: generate: unknown generator 'fractal' (known: random, training, inference)",
        ),
        (
            "traces:\n  - generate: training\n    steps: 2\n    layers:\n      - {params: [4096x4096], activations: [4096y]}\npolicies: [caching]\n",
            "line 5: traces: layers: 0: activations: '4096y' is not a number of elements",
        ),
        (
            "traces:\n  - generate: inference\n    batch: {uniform: [8, 2]}\npolicies: [caching]\n",
            "line 3: traces: batch: uniform: the smallest value 8 is more than the largest 2",
        ),
        (
            "traces: [a.yaml]\npolicies: [caching]\ngpus: [h100, tpu]\n",
            "line 3: gpus: unknown GPU 'tpu' (built in: ",
        ),
        (
            "traces: [a.yaml]\npolicies: [caching]\nalloc_conf: 'expandable_segments:maybe'\n",
            "line 3: alloc_conf: ",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - immediate: {x: [1]}\n",
            "line 3: policies: immediate: unknown option 'x' (immediate has no options)",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - caching:\n      expandable_segments: [[true]]\n",
            "line 4: policies: caching: expandable_segments: values are single values",
        ),
        (
            "traces: [a.yaml]\npolicies:\n  - caching:\n      roundup_power2_divisions: [0, 4]\n",
            "line 4: policies: caching: roundup_power2_divisions: ",
        ),
        ("traces: [a.yaml]\n", "line 1: policies: missing"),
        ("traces: []\npolicies: [caching]\n", "line 1: traces: none given"),
        ("- a\n", "line 1: a sweep file is a mapping"),
        (
            "traces: [a.yaml]\npolicies:\n  - [caching]\n",
            "line 3: policies: each item is a policy (caching, immediate, buddy, arena) or",
        ),
        ("traces: [a.yaml\n", "line 2: not YAML: "),
        ("", "line 1: the file is empty"),
    ];
    let path = dir.join("s.yaml");
    for (text, want) in cases {
        let e = parse(text, &path).unwrap_err().to_string();
        let want = format!("{}: {want}", path.display());
        assert!(e.starts_with(&want), "{text}\n{e}\nwanted {want}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// `K/N` is checked; shards split rows round robin.
#[test]
fn shards() {
    let s = Shard::parse("2/3").unwrap();
    let mine: Vec<u64> = (0..7).filter(|&i| s.has(i)).collect();
    assert_eq!(mine, [1, 4]);
    for bad in ["0/3", "4/3", "x", "1/0", "1/", "-1/2"] {
        assert!(Shard::parse(bad).is_err(), "{bad}");
    }
}

fn rec(c: u64, trace: &str, device: &str, reserved: u64, oom: Option<u64>) -> SweepRecord {
    SweepRecord {
        combination: c,
        trace: trace.into(),
        policy: format!("p{c}"),
        device: device.into(),
        total_bytes: if device == "small" { 1 } else { 2 },
        reserved_bytes_peak: reserved,
        oom_event_index: oom,
        oom_requested_bytes: oom.map(|_| 1),
        ..SweepRecord::default()
    }
}

/// Ranks per (trace, device) by reserved peak among rows that do not run out; one
/// recommendation per trace, ties going to the smaller device; savings against the
/// default on the same device, empty where either runs out.
#[test]
fn finishing() {
    let mut r = vec![
        rec(3, "a", "big", 5, None),
        rec(0, "a", "small", 9, None),
        rec(1, "a", "big", 9, None),
        rec(2, "a", "small", 5, None),
        rec(4, "a", "small", 1, Some(3)),
        rec(5, "b", "small", 7, Some(1)),
        rec(6, "b", "small", 7, None),
    ];
    r[1].default = true;
    r[2].default = true;
    r[5].default = true;
    finish(&mut r);
    let got: Vec<(u64, Option<u64>, bool, Option<i64>)> = r
        .iter()
        .map(|r| {
            (
                r.combination,
                r.rank,
                r.recommended,
                r.saved_vs_default_bytes,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, Some(2), false, Some(0)),
            (1, Some(2), false, Some(0)),
            (2, Some(1), true, Some(4)),
            (3, Some(1), false, Some(4)),
            (4, None, false, None),
            (5, None, false, None),
            (6, Some(1), true, None),
        ]
    );
}

/// Shards' CSVs merge into the rows of one run; a shard given twice, a missing shard
/// and a file that is not a sweep's CSV are refused, naming what is wrong.
#[test]
fn merging() {
    let dir = dir_with(&[]);
    let mut all: Vec<SweepRecord> = (0..5).map(|c| rec(c, "t", "d", 10 - c, None)).collect();
    all[0].default = true;
    let write = |name: &str, rows: &[SweepRecord]| {
        let p = dir.join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        crate::report::write_records(rows.iter().cloned(), &mut f).unwrap();
        p
    };
    let a = write("a.csv", &[all[0].clone(), all[2].clone(), all[4].clone()]);
    let b = write("b.csv", &[all[1].clone(), all[3].clone()]);
    let merged = merge(&[b.clone(), a.clone()]).unwrap();
    finish(&mut all);
    assert_eq!(merged, all);
    let e = merge(&[a.clone(), a.clone(), b.clone()])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("combination 0 is in "), "{e}");
    let e = merge(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(e.starts_with("combination 1 is missing"), "{e}");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "trace,policy\nx,y\n").unwrap();
    let e = merge(std::slice::from_ref(&bad)).unwrap_err().to_string();
    assert!(
        e.contains("bad.csv: line 1: not the CSV of `allocsim sweep`"),
        "{e}"
    );
    let header = crate::report::columns::<SweepRecord>().join(",");
    std::fs::write(&bad, format!("{header}\nzero,t\n")).unwrap();
    let e = merge(&[bad]).unwrap_err().to_string();
    assert!(e.contains("bad.csv: line 2: "), "{e}");
    assert!(merge(&[]).is_err());
}

/// Policies may also be one mapping of name to options.
#[test]
fn policies_as_a_mapping() {
    let s = parse(
        "policies:\n  caching: {expandable_segments: [true]}\n  buddy:\n  arena: {superblock: 2MiB}\n",
        Path::new("m.yaml"),
    )
    .unwrap();
    let labels: Vec<&str> = s
        .combinations()
        .iter()
        .map(|c| c.spec.label.as_str())
        .collect();
    assert_eq!(
        labels,
        [
            "caching",
            "caching:expandable_segments=True",
            "buddy",
            "arena:superblock=2MiB"
        ]
    );
}

/// A file without traces is a grid for traces given elsewhere; running it without any
/// is refused.
#[test]
fn a_grid_without_traces() {
    let s = parse("policies: [caching, buddy]\n", Path::new("grid.yaml")).unwrap();
    assert!(s.traces.is_empty());
    let e = run(&s, &RunOptions::default()).unwrap_err();
    assert!(matches!(e, RunError::NoTraces), "{e}");
}

/// An option is reported as changing nothing when every pair of rows differing only in
/// it agrees, and not when one pair differs.
#[test]
fn inert_options() {
    let row = |c: u64, policy: &str, reserved: u64| SweepRecord {
        combination: c,
        trace: "t".into(),
        policy: policy.into(),
        device: "d".into(),
        reserved_bytes_peak: reserved,
        ..SweepRecord::default()
    };
    let mut records = vec![
        row(0, "caching", 10),
        row(1, "caching:garbage_collection_threshold=0.5", 10),
        row(2, "caching:expandable_segments=True", 8),
        row(
            3,
            "caching:expandable_segments=True,garbage_collection_threshold=0.5",
            8,
        ),
        row(4, "buddy:min_block=512", 12),
        row(5, "buddy:min_block=4KiB", 13),
    ];
    records[0].default = true;
    finish(&mut records);
    let s = summarize(&records);
    let inert: Vec<(&str, &str)> = s.traces[0]
        .inert
        .iter()
        .map(|i| (i.policy.as_str(), i.key.as_str()))
        .collect();
    assert_eq!(inert, [("caching", "garbage_collection_threshold")]);
    assert_eq!(s.traces[0].inert[0].values, ["default", "0.5"]);
    assert!(s.traces[0].inert[0].help.contains("memory limit"));
    assert_eq!(s.traces[0].recommended, Some(2));
    assert_eq!(s.traces[0].default, Some(0));
    assert_eq!(s.traces[0].ranking, [2, 3, 0, 1, 4, 5]);
}
