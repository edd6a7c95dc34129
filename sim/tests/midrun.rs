//! Snapshots that start mid-run (`tests/data/torch/cut`: real snapshots with the head
//! of their trace cut off, as a wrapped ring buffer or a late start leaves them):
//! replayed from the state rebuilt at their first entry, exact inside the window.

use std::path::PathBuf;

use policies::caching::MemoryLimit;
use sim::fidelity::{fidelity, FidelityOptions};
use sim::recorded::Overrides;

fn cut_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/torch/cut")
}

fn read(name: &str) -> workloads::RecordedRun {
    workloads::read_snapshot_pickle(&cut_dir().join(name), 0).unwrap()
}

/// The cap a capped run recorded (snapshot pickles do not record it): from its JSON.
fn recorded_cap(run: &str) -> Overrides {
    let json = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/oracle/h100-torch2.11-pickles")
        .join(format!("{run}.json"));
    let r = workloads::read_recorded_json(&json).unwrap();
    Overrides {
        alloc_conf: None,
        memory_limit: r.meta.memory_fraction().map(MemoryLimit::Fraction),
    }
}

/// Every cut snapshot is replayed exactly inside its window from its rebuilt state:
/// every segment decision, the reserved peak (from the rebuilt state on) and the OOM
/// point, with every invariant checked after each request.
#[test]
fn cut_snapshots_are_exact_inside_the_window() {
    let mut names: Vec<String> = std::fs::read_dir(cut_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pickle"))
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    let mut failures = Vec::new();
    for name in &names {
        let run = read(name);
        assert!(!run.starts_empty(), "{name} starts mid-run");
        let trace = run.to_trace().unwrap();
        let start = trace.start.as_ref().expect("a rebuilt state");
        let base = name
            .split("__wrap")
            .next()
            .unwrap()
            .split("__late")
            .next()
            .unwrap();
        let options = FidelityOptions {
            check_invariants: true,
            overrides: recorded_cap(base),
            ..FidelityOptions::default()
        };
        let report = fidelity(&run, &options).unwrap();
        println!("{name}: {} | {:?}", start.describe(), report.row);
        if !report.row.exact {
            failures.push(report.explain().to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const MIB: u64 = 1 << 20;

fn block(
    id: u64,
    addr: u64,
    size: Option<u64>,
    requested: u64,
    pending: bool,
) -> workloads::StartBlock {
    workloads::StartBlock {
        addr,
        size_bytes: size,
        requested_bytes: requested,
        pending_free: pending,
        id: workloads::AllocId(id),
    }
}

fn start_trace(start: workloads::StartState, events: Vec<workloads::Event>) -> workloads::Trace {
    workloads::Trace {
        start: Some(start),
        ..workloads::Trace::new("midrun", events)
    }
}

/// A trace that starts mid-run with one 20 MiB segment of two live blocks (block 0 of
/// 3 MiB, its size left to the policy; block 1 of 4 MiB, its free pending), then frees
/// block 1 and allocates 1 MiB (block 2), and frees block 0 if `free_first`.
fn two_blocks(free_first: bool) -> workloads::Trace {
    let start = workloads::StartState {
        segments: vec![workloads::StartSegment {
            addr: 0x7f00_0000_0000,
            size_bytes: 20 * MIB,
            stream: 0,
            pool: None,
            expandable: false,
            pool_id: workloads::PoolId::default(),
            blocks: vec![
                block(0, 0x7f00_0000_0000, None, 3 * MIB, false),
                block(1, 0x7f00_0040_0000, Some(4 * MIB), 4 * MIB, true),
            ],
        }],
        ..Default::default()
    };
    let mut events = vec![
        workloads::Event::Free {
            id: workloads::AllocId(1),
        },
        workloads::Event::Alloc {
            id: workloads::AllocId(2),
            size_bytes: MIB,
            stream: 0,
        },
    ];
    if free_first {
        events.push(workloads::Event::Free {
            id: workloads::AllocId(0),
        });
    }
    start_trace(start, events)
}

fn checked() -> sim::ReplayOptions {
    sim::ReplayOptions {
        check_invariants: true,
        ..sim::ReplayOptions::default()
    }
}

/// The caching policy adopts a hand-made state (a large segment with an allocated
/// block, a block whose size it decides from the request, a pending free and free
/// gaps; a small segment) with every invariant holding, counts it in the peaks, and
/// goes on from it: the pending block returns, a request takes the gap best fit.
#[test]
fn the_caching_policy_adopts_a_state_and_goes_on() {
    use workloads::Event;
    let base = 0x7f00_0000_0000u64;
    let start = workloads::StartState {
        segments: vec![
            workloads::StartSegment {
                addr: base,
                size_bytes: 20 * MIB,
                stream: 0,
                pool: Some(workloads::StartPool::Large),
                expandable: false,
                pool_id: workloads::PoolId::default(),
                blocks: vec![
                    block(0, base, Some(4 * MIB), 4 * MIB - 100, false),
                    // Asked 3 MiB: rounded to 3 MiB; 1 MiB up to the next block is too
                    // little to split off in the large pool, so the block takes 4 MiB.
                    block(1, base + 4 * MIB, None, 3 * MIB, false),
                    block(2, base + 8 * MIB, Some(2 * MIB), 2 * MIB, true),
                ],
            },
            workloads::StartSegment {
                addr: base + 64 * MIB,
                size_bytes: 2 * MIB,
                stream: 0,
                pool: None,
                expandable: false,
                pool_id: workloads::PoolId::default(),
                blocks: vec![block(3, base + 64 * MIB + 512, None, 100, false)],
            },
        ],
        ..Default::default()
    };
    let trace = start_trace(
        start,
        vec![
            Event::Free {
                id: workloads::AllocId(2),
            },
            Event::Alloc {
                id: workloads::AllocId(4),
                size_bytes: 6 * MIB,
                stream: 0,
            },
            Event::Free {
                id: workloads::AllocId(1),
            },
            Event::Free {
                id: workloads::AllocId(3),
            },
        ],
    );
    let mut policy = policies::caching::CachingPolicy::default();
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let mut timeline = sim::Timeline::default();
    let r = sim::replay_with(&trace, &mut policy, &mut device, &checked(), &mut timeline)
        .expect("replays from the adopted state");
    assert_eq!(r.summary.reserved_bytes_peak, 22 * MIB);
    assert_eq!(
        r.summary.reserved_peak_event_index, None,
        "the start holds the peak"
    );
    // Adopted: 4 + 4 + 512 allocated (the pending 2 MiB not counted), 6 MiB added.
    assert_eq!(r.summary.allocated_bytes_peak, 14 * MIB + 512);
    let after_alloc = &timeline.samples[1];
    assert_eq!(
        after_alloc.policy.reserved_bytes,
        22 * MIB,
        "the 6 MiB request fit in a gap"
    );
    assert_eq!(r.final_policy.allocated_bytes, 10 * MIB);
    assert_eq!(r.live_allocation_count, 2);
}

/// A policy that cannot take over PyTorch's state starts by allocating the blocks live
/// at the first entry (in address order, a pending one freed at once), replays the
/// trace's frees of them, and its replay carries a caveat saying so.
#[test]
fn other_policies_allocate_the_live_blocks_first() {
    let trace = two_blocks(true);
    // Every policy but the caching one, the only one that adopts a state.
    let others = policies::testing::every_policy()
        .into_iter()
        .filter(|s| s.config.kind_name() != "caching");
    for policy_spec in others {
        let spec = policy_spec.label.as_str();
        let config = [policy_spec.clone()];
        let mut policy = config[0].config.build().unwrap();
        let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
        let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked())
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(r.started_by_allocating, 2, "{spec}");
        assert_eq!(r.live_allocation_count, 1, "{spec}");
        assert!(r.summary.requested_bytes_peak >= 7 * MIB, "{spec}");
        let caveats = sim::caveats(&trace, &config[0].config, &r);
        assert!(
            caveats
                .iter()
                .any(|c| c.contains("started by allocating the 2 blocks live there")),
            "{spec}: {caveats:?}"
        );
    }
    // The caching policy adopts the state instead: no such caveat.
    let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
    let mut policy = config[0].config.build().unwrap();
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap();
    assert_eq!(r.started_by_allocating, 0);
    assert!(sim::caveats(&trace, &config[0].config, &r).is_empty());
}

/// Expandable segments' mapped runs are adopted into one address range per stream and
/// pool (from the lowest run), pages mapped where the runs are; the segment grows from
/// there.
#[test]
fn expandable_runs_are_adopted() {
    use workloads::Event;
    let base = 0x3_0200_0000u64;
    let page = 20 * MIB;
    let start = workloads::StartState {
        segments: vec![
            workloads::StartSegment {
                addr: base,
                size_bytes: 2 * page,
                stream: 0,
                pool: Some(workloads::StartPool::Large),
                expandable: true,
                pool_id: workloads::PoolId::default(),
                blocks: vec![block(0, base, Some(30 * MIB), 30 * MIB, false)],
            },
            workloads::StartSegment {
                addr: base + 3 * page,
                size_bytes: page,
                stream: 0,
                pool: Some(workloads::StartPool::Large),
                expandable: true,
                pool_id: workloads::PoolId::default(),
                blocks: vec![],
            },
        ],
        ..Default::default()
    };
    let trace = start_trace(
        start,
        vec![
            Event::Alloc {
                id: workloads::AllocId(1),
                size_bytes: 25 * MIB,
                stream: 0,
            },
            Event::Free {
                id: workloads::AllocId(0),
            },
            Event::EmptyCache,
        ],
    );
    let mut policy = policies::caching::CachingPolicy::new(
        policies::caching::CachingConfig::from_alloc_conf("expandable_segments:True").unwrap(),
    );
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let r = sim::replay(&trace, &mut policy, &mut device, &checked()).unwrap();
    assert_eq!(
        r.summary.reserved_bytes_peak,
        4 * page,
        "one page mapped for 25 MiB"
    );
    assert_eq!(
        r.final_policy.reserved_bytes,
        2 * page,
        "empty_cache unmapped the rest"
    );
}

fn unseen_midrun_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/unseen/midrun")
}

/// The six recordings of [`unseen_midrun_dir`], by name.
fn unseen_midrun_recordings() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(unseen_midrun_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "{files:?}");
    files
}

/// Real recordings that start mid-run, never seen while the rebuild was written
/// (`tests/data/unseen/midrun`: ring buffers that wrapped, a late start, both): every
/// segment decision, the reserved peak of the window and the OOM point agree, with and
/// without the recorded addresses, and the table of docs/fidelity.md is what the
/// simulator does now (its peaks are the window's, not the whole process's, which is
/// what made `gpt_train__wrap1500__late` look wrong before).
#[test]
fn unseen_midrun_recordings_are_current() {
    let files = unseen_midrun_recordings();
    let mut out = String::from(
        "| run | entries | state at the first entry | unsized blocks | exact | exact without addresses | checkpoints |\n| --- | ---: | --- | ---: | --- | --- | --- |\n",
    );
    let mut exact = [0, 0];
    for f in &files {
        let run = workloads::read_recorded_json(f).unwrap();
        assert!(!run.starts_empty(), "{}", run.name);
        let start = run.to_trace().unwrap().start.expect("a rebuilt state");
        let mut cells = Vec::new();
        for (k, hints) in [true, false].into_iter().enumerate() {
            let options = FidelityOptions {
                check_invariants: true,
                use_recorded_addresses: hints,
                ..FidelityOptions::default()
            };
            let r = fidelity(&run, &options).unwrap();
            let row = &r.row;
            assert!(row.segment_ops_match, "{}", r.explain());
            assert_eq!(
                row.reserved_bytes_peak_sim, row.reserved_bytes_peak_torch,
                "{}",
                row.trace
            );
            assert_eq!(row.oom_event_sim, row.oom_event_torch, "{}", row.trace);
            exact[k] += usize::from(row.exact);
            cells.push(row.clone());
        }
        out += &format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            run.name,
            run.entries.len(),
            start.describe(),
            start.unsized_block_count(),
            if cells[0].exact { "yes" } else { "no" },
            if cells[1].exact { "yes" } else { "no" },
            if cells[0].checkpoints_match {
                "match"
            } else {
                "differ"
            }
        );
    }
    out += &format!(
        "| all | | | | {} of {} | {} of {} | |\n",
        exact[0],
        files.len(),
        exact[1],
        files.len()
    );
    check_doc_table("midrun", &out);
}

/// The state rebuilt at the first entry of a recording begun late equals the state the
/// recorder saw when it began (its `start_state`, a `memory_snapshot()` taken then):
/// the same segments, the same live blocks at the same addresses, and, once the
/// caching policy has decided the sizes the trace does not record, the same sizes.
#[test]
fn a_late_start_is_rebuilt_as_it_was() {
    let path = unseen_midrun_dir().join("unet_train__late.json");
    let run = workloads::read_recorded_json(&path).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // The recorder's state: (segment address, size) and (block address, size).
    let mut segments = Vec::new();
    let mut blocks = Vec::new();
    for s in json["start_state"]["segments"].as_array().unwrap() {
        let addr = s["address"].as_u64().unwrap();
        segments.push((addr, s["total_size"].as_u64().unwrap()));
        let mut at = addr;
        for b in s["blocks"].as_array().unwrap() {
            let size = b[0].as_u64().unwrap();
            if b[1].as_str().unwrap().starts_with("active") {
                blocks.push((at, size));
            }
            at += size;
        }
    }
    assert!(blocks.len() > 50, "{}", blocks.len());
    let trace = run.to_trace().unwrap();
    let start = trace.start.clone().expect("a rebuilt state");
    let rebuilt: Vec<(u64, u64)> = start
        .segments
        .iter()
        .map(|s| (s.addr, s.size_bytes))
        .collect();
    assert_eq!(rebuilt, segments);
    // The sizes the caching policy gives the blocks when it adopts the state.
    let config = sim::recorded::run_config(&run).unwrap();
    let mut policy = policies::caching::CachingPolicy::new(config);
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let empty = workloads::Trace {
        events: Vec::new(),
        ..trace
    };
    sim::replay(&empty, &mut policy, &mut device, &checked()).unwrap();
    let adopted: Vec<(u64, u64)> = policies::Policy::snapshot(&policy)
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == policies::BlockState::Allocated)
        .map(|b| (b.addr.0, b.size_bytes))
        .collect();
    assert_eq!(adopted, blocks);
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

fn pools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pools")
}

/// A recorder's JSON with the first `k` entries of its trace dropped, as a ring buffer
/// of `len - k` entries that wrapped keeps it: positions before the cut become `null`
/// (before the first entry), the others move down by `k`; checkpoints before it are
/// gone.
fn cut_json(name: &str, k: u64) -> workloads::RecordedRun {
    use serde_json::Value;
    let path = pools_dir().join(name);
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let moved = |v: &Value| -> Value {
        match v.as_u64() {
            Some(x) if x >= k => Value::from(x - k),
            _ => Value::Null,
        }
    };
    let events = json["events"].as_array().unwrap().clone();
    assert!((k as usize) < events.len());
    json["events"] = Value::from(events[k as usize..].to_vec());
    // Trace lengths do not count the `empty_cache` markers.
    let markers = events[..k as usize]
        .iter()
        .filter(|e| e[0] == "empty_cache")
        .count() as u64;
    let entries_cut = k - markers;
    let checkpoints: Vec<Value> = json["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["trace_len"].as_u64().unwrap() >= entries_cut)
        .map(|c| {
            let mut c = c.clone();
            c["trace_len"] = Value::from(c["trace_len"].as_u64().unwrap() - entries_cut);
            c
        })
        .collect();
    json["checkpoints"] = Value::from(checkpoints);
    if let Some(n) = json["oom"]["trace_len"].as_u64() {
        json["oom"]["trace_len"] = Value::from(n - entries_cut);
    }
    for (list, keys) in [
        ("pools", &["created_at"][..]),
        ("pool_windows", &["begin", "end"][..]),
        ("pool_releases", &["at"][..]),
        ("calls", &["at"][..]),
    ] {
        for item in json[list].as_array_mut().unwrap() {
            for key in keys {
                item[*key] = moved(&item[*key]);
            }
        }
    }
    let request_pools: Vec<Value> = json["request_pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[0].as_u64().unwrap() >= k)
        .map(|r| {
            let mut r = r.clone();
            r[0] = moved(&r[0]);
            r
        })
        .collect();
    json["request_pools"] = Value::from(request_pools);
    json["wrapped"] = Value::from(true);
    let cut = format!("{}__cut{k}.json", name.trim_end_matches(".json"));
    workloads::read_recorded_json_from(json.to_string().as_bytes(), std::path::Path::new(&cut))
        .unwrap()
}

/// Recordings with private pools (CUDA graphs, shared and expandable; MemPools, with
/// `no_split`, `use_on_oom`, expandable segments) cut as a ring buffer that wrapped
/// would keep them, at points where pools hold segments at the first entry (after the
/// captures, inside a pool's window): the state at the first entry is rebuilt with the
/// private pools' segments, blocks, uses and windows, and the replay agrees with
/// PyTorch's: every segment decision, the reserved peak of the window, the OOM point
/// and every checkpoint (its allocated and inactive-split bytes where no block live at
/// the first entry is freed in the trace without its size recorded), with every
/// invariant checked after each event.
#[test]
fn recordings_with_private_pools_cut_mid_run_are_exact() {
    let mut failures = Vec::new();
    for (name, cuts) in [
        ("graph_capture.json", &[100u64, 130, 210, 330, 400, 600][..]),
        ("graph_capture__shared_pool-1.json", &[110, 330, 400][..]),
        (
            "graph_capture__expandable_segments-True.json",
            &[110, 330, 400][..],
        ),
        ("kv_cache_inference__graphs-1.json", &[1000, 3000][..]),
        ("mempool_phases.json", &[500, 1500, 3000][..]),
        ("mempool_phases__no_split-1.json", &[500, 1500][..]),
        (
            "mempool_phases__use_on_oom-1__cap1265M.json",
            &[300, 900][..],
        ),
        (
            "mempool_phases__expandable_segments-True__cap1265M.json",
            &[300, 900][..],
        ),
    ] {
        for &k in cuts {
            let run = cut_json(name, k);
            assert!(!run.starts_empty(), "{name} cut at {k}");
            let trace = run
                .to_trace()
                .unwrap_or_else(|e| panic!("{name} cut at {k}: {e}"));
            let start = trace.start.as_ref().expect("a rebuilt state");
            let options = FidelityOptions {
                check_invariants: true,
                ..FidelityOptions::default()
            };
            let report = match fidelity(&run, &options) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{name} cut at {k}: {e}"));
                    continue;
                }
            };
            let row = &report.row;
            println!("{name} cut at {k}: {} | {row:?}", start.describe());
            if !agrees_inside_the_window(&report, start.unsized_block_count() == 0) {
                failures.push(format!("{name} cut at {k}: {}", report.explain()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A mid-run replay agrees with PyTorch inside its window: every segment decision, the
/// reserved peak, the OOM point, and at every checkpoint reserved bytes and segments;
/// allocated and inactive_split bytes too where the state at the first entry is `sized`
/// (no block live then was freed without its size recorded: such a size is PyTorch's
/// rules' guess).
fn agrees_inside_the_window(report: &sim::fidelity::FidelityReport, sized: bool) -> bool {
    let row = &report.row;
    let checkpoints = report.checkpoints.iter().all(|c| {
        let (r, s) = (c.recorded_values(), c.simulated);
        if sized {
            r == s
        } else {
            r[1] == s[1] && r[3] == s[3]
        }
    });
    row.segment_ops_match
        && checkpoints
        && row.reserved_bytes_peak_sim == row.reserved_bytes_peak_torch
        && row.oom_event_sim == row.oom_event_torch
}

/// Real ring buffers that wrapped in programs with private pools
/// (`tests/data/unseen/midrun-pools`, recorded on an H200 after the rebuild was
/// written): every JSON replays from its rebuilt state (private pools' segments,
/// blocks, uses and windows open at the first entry) with every segment decision, the
/// window's reserved peak, the OOM point and the checkpoints as PyTorch's (allocated
/// and inactive-split bytes where no block live at the first entry was freed without
/// its size); the graph captures' snapshot pickles make the same segment decisions and
/// peak, and carry the caveat of the segments whose pool a 2.11 snapshot does not say.
#[test]
fn recorded_ring_buffers_with_private_pools() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/unseen/midrun-pools");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "pickle"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 13, "{files:?}");
    let mut failures = Vec::new();
    for f in &files {
        let run = workloads::read_recorded(f, None, 0).unwrap();
        let trace = run.to_trace().unwrap();
        let start = trace.start.as_ref().expect("a rebuilt state");
        assert!(
            !start.pools.is_empty(),
            "{}: private pools at the first entry",
            run.name
        );
        let pickle = f.extension().is_some_and(|x| x == "pickle");
        let options = FidelityOptions {
            check_invariants: true,
            ..FidelityOptions::default()
        };
        let report = fidelity(&run, &options).unwrap();
        let row = &report.row;
        let sized = start.unsized_block_count() == 0;
        let agrees = agrees_inside_the_window(&report, sized);
        if !agrees {
            failures.push(format!("{}: {}", f.display(), report.explain()));
        }
        // The recorder's JSON says everything; a 2.11 pickle of these programs does
        // not say the pool of the memory its graphs' resets gave back.
        if pickle {
            assert!(
                trace
                    .meta
                    .caveats
                    .iter()
                    .any(|c| c.contains("does not say")),
                "{}: {:?}",
                run.name,
                trace.meta.caveats
            );
        } else {
            assert!(
                trace.meta.caveats.is_empty(),
                "{}: {:?}",
                run.name,
                trace.meta.caveats
            );
            assert!(row.exact || !sized || !agrees, "{}", run.name);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The caching policy adopts a private pool live at the first entry with its segment
/// and live block, its uses and the capture under way: the captured request takes the
/// pool's free space, a request of another stream does not (it gets a segment of the
/// default pools), and with the capture ended and the pool's last use released, an
/// `empty_cache` gives the pool's segment back once its block is freed.
#[test]
fn private_pools_are_adopted_with_their_segments_and_windows() {
    use workloads::{AllocId, Event, PoolId, PoolStreams};
    let base = 0x7f00_0000_0000u64;
    let pool = PoolId(1, 0);
    let start = workloads::StartState {
        segments: vec![workloads::StartSegment {
            addr: base,
            size_bytes: 20 * MIB,
            stream: 7,
            pool: Some(workloads::StartPool::Large),
            expandable: false,
            pool_id: pool,
            blocks: vec![block(0, base, Some(4 * MIB), 4 * MIB, false)],
        }],
        pools: vec![workloads::StartPrivatePool {
            id: pool,
            uses: 1,
            use_on_oom: false,
            no_split: false,
            routing: Some(PoolStreams::only(vec![7])),
        }],
        pools_recorded: true,
    };
    let alloc = |id, size_bytes, stream| Event::Alloc {
        id: AllocId(id),
        size_bytes,
        stream,
    };
    let trace = start_trace(
        start,
        vec![
            alloc(1, 6 * MIB, 7),
            alloc(2, 6 * MIB, 0),
            Event::EndAllocateToPool { pool },
            Event::ReleasePool { pool },
            Event::Free { id: AllocId(0) },
            Event::Free { id: AllocId(1) },
            Event::EmptyCache,
        ],
    );
    let mut policy = policies::caching::CachingPolicy::default();
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let mut timeline = sim::Timeline::default();
    let r = sim::replay_with(&trace, &mut policy, &mut device, &checked(), &mut timeline)
        .expect("replays from the adopted state");
    let reserved: Vec<u64> = timeline
        .samples
        .iter()
        .map(|s| s.policy.reserved_bytes)
        .collect();
    // The captured 6 MiB fits the pool's segment; the other stream's takes a new one;
    // the released pool's segment goes back at empty_cache, the default one's too.
    assert_eq!(reserved[0], 20 * MIB);
    assert_eq!(reserved[1], 40 * MIB);
    assert_eq!(*reserved.last().unwrap(), 20 * MIB);
    assert_eq!(r.final_policy.reserved_bytes, 20 * MIB);
    assert!(policy.private_pools().is_empty(), "the pool is gone");
}

/// Expandable runs whose pool the state does not say that lie in two address ranges
/// (two pools' segments the trace gave back) are adopted as two ranges, not refused as
/// runs that do not fit one; a run not made of large pages is the small pool's.
#[test]
fn expandable_runs_of_unknown_pools_are_adopted() {
    let page = 20 * MIB;
    let run = |addr: u64, size_bytes: u64| workloads::StartSegment {
        addr,
        size_bytes,
        stream: 0,
        pool: None,
        expandable: true,
        pool_id: workloads::PoolId::default(),
        blocks: vec![],
    };
    let start = workloads::StartState {
        segments: vec![
            run(1 << 40, 2 * page),
            run(2 << 40, page),
            run(3 << 40, 14 * MIB),
        ],
        ..Default::default()
    };
    let trace = start_trace(start, vec![workloads::Event::EmptyCache]);
    let mut policy = policies::caching::CachingPolicy::new(
        policies::caching::CachingConfig::from_alloc_conf("expandable_segments:True").unwrap(),
    );
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let r = sim::replay(&trace, &mut policy, &mut device, &checked()).expect("adopted");
    assert_eq!(r.summary.reserved_bytes_peak, 3 * page + 14 * MIB);
    assert_eq!(r.final_policy.reserved_bytes, 0);
}

/// A device below a trace's starting state is a result, not an error, under every
/// policy: an out-of-memory before the first event (no event number, no event
/// replayed, even with `continue_after_oom`), the starting state's bytes as the
/// request, what did not fit in the message; `fits` says no, and the compare CSV's row
/// names it (`oom_event_index` empty, `oom_requested_bytes` set, cause `starting state`).
#[test]
fn a_device_below_the_starting_state_runs_out_before_the_first_event() {
    let trace = two_blocks(false);
    let small = sim::SimDeviceOptions::default()
        .with_total(4 * MIB)
        .unwrap();
    for spec in policies::testing::every_policy() {
        let label = spec.label.as_str();
        for continue_after_oom in [false, true] {
            let options = sim::ReplayOptions {
                continue_after_oom,
                ..checked()
            };
            let mut policy = spec.config.build().unwrap();
            let mut device = sim::SimDevice::new(small.clone());
            let r = sim::replay(&trace, policy.as_mut(), &mut device, &options)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            let oom = r.oom.as_ref().unwrap_or_else(|| panic!("{label}: no OOM"));
            assert!(oom.before_first_event(), "{label}: {oom:?}");
            assert_eq!((oom.event_index, r.oom_count), (None, 1), "{label}");
            assert_eq!(r.summary.event_count, 0, "{label}");
            let message = oom.message.as_deref().unwrap();
            if spec.config.kind_name() == "caching" {
                // The state's segments, all of them or nothing held.
                assert_eq!(oom.requested_bytes, 20 * MIB, "{label}");
                assert!(
                    message.starts_with("the starting state of 1 segment(s) / 20.00 MiB"),
                    "{label}: {message}"
                );
            } else {
                // The live blocks' requests.
                assert_eq!(oom.requested_bytes, 7 * MIB, "{label}");
                assert!(
                    message.starts_with("the 2 block(s) live at the first entry"),
                    "{label}: {message}"
                );
            }
            assert!(
                message.contains("4.00 MiB (4194304 bytes) usable"),
                "{label}: {message}"
            );
        }
        let hints = sim::AddressHints::default();
        let fits = sim::fit::fits(&trace, &hints, &spec.config, &small, &checked()).unwrap();
        assert!(!fits, "{label}");
        let input = sim::CompareInput {
            trace: trace.clone(),
            hints,
        };
        let rows = sim::compare(
            std::slice::from_ref(&input),
            std::slice::from_ref(&spec),
            &[small.clone(), sim::SimDeviceOptions::default()],
            &checked(),
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        let record = sim::report::CompareRecord::from(&rows[0]);
        assert_eq!(
            (
                record.oom_event_index,
                record.oom_requested_bytes.is_some(),
                record.oom_cause,
                record.events_replayed
            ),
            (None, true, "starting state", 0),
            "{label}"
        );
        // The batch went on: the larger device ran to the end.
        assert!(rows[1].oom.is_none(), "{label}");
    }
}

/// A real recording that wrapped (`resnet_train__wrap3000`, 40 segments of 1.29 GiB
/// at its first entry) on a 1200 MiB device: the caching policy takes over what fits,
/// in order, with every invariant holding, and runs out before the first event; on the
/// default device it runs to the end.
#[test]
fn a_real_starting_state_larger_than_the_device_is_an_oom() {
    let run =
        workloads::read_recorded_json(&unseen_midrun_dir().join("resnet_train__wrap3000.json"))
            .unwrap();
    let trace = run.to_trace().unwrap();
    let hints = sim::recorded::address_hints(&run, 1200 * MIB).unwrap();
    let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
    let small = sim::SimDeviceOptions::default()
        .with_total(1200 * MIB)
        .unwrap();
    let mut policy = config[0].config.build().unwrap();
    let mut device = sim::SimDevice::with_hints(small, hints.for_policy(&config[0].config));
    let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap();
    let oom = r.oom.unwrap();
    assert_eq!(oom.event_index, None);
    assert_eq!(oom.requested_bytes, 1_388_314_624);
    assert!(oom.policy.reserved_bytes < 1200 * MIB, "{oom:?}");
    assert!(
        oom.message.as_deref().unwrap().starts_with(
            "the starting state of 40 segment(s) / 1.29 GiB (1388314624 bytes) does not fit a \
             device with 1.17 GiB (1258291200 bytes) usable"
        ),
        "{oom:?}"
    );
    let mut policy = config[0].config.build().unwrap();
    let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
    let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap();
    assert!(r.oom.is_none());
}

/// `fit`'s requested peak of a trace that starts mid-run counts the blocks live at its
/// first entry until their free, as the replay does (it left them out: 767551911
/// bytes instead of 929264007 for `resnet_train__wrap3000`, and `fit`'s overhead was
/// that much too high).
#[test]
fn fit_counts_the_starting_state_in_the_requested_peak() {
    for name in ["resnet_train__wrap3000.json", "unet_train__late.json"] {
        let run = workloads::read_recorded_json(&unseen_midrun_dir().join(name)).unwrap();
        let trace = run.to_trace().unwrap();
        let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
        let mut policy = config[0].config.build().unwrap();
        let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
        let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap();
        assert_eq!(
            sim::fit::requested_bytes_peak(&trace),
            r.summary.requested_bytes_peak,
            "{name}"
        );
    }
}

/// Every real recording that starts mid-run, on a device of half its starting state:
/// an out-of-memory before the first event, expandable segments included (a mapped
/// run larger than the device's address range was refused as a bad state: it is a
/// device too small for it).
#[test]
fn every_recorded_start_on_half_its_memory_runs_out_before_the_first_event() {
    let files = unseen_midrun_recordings();
    let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
    for f in &files {
        let run = workloads::read_recorded_json(f).unwrap();
        let trace = run.to_trace().unwrap();
        let state = trace.start.as_ref().unwrap().reserved_bytes();
        let total = (state / 2).next_multiple_of(2 * MIB);
        let hints = sim::recorded::address_hints(&run, total).unwrap();
        let device = sim::SimDeviceOptions::default().with_total(total).unwrap();
        let mut policy = config[0].config.build().unwrap();
        let mut device = sim::SimDevice::with_hints(device, hints.for_policy(&config[0].config));
        let r = sim::replay(&trace, policy.as_mut(), &mut device, &checked())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let oom = r.oom.unwrap_or_else(|| panic!("{}: no OOM", f.display()));
        assert_eq!(
            (oom.event_index, oom.requested_bytes),
            (None, state),
            "{}",
            f.display()
        );
    }
}

/// On a device that puts a mid-run state's segments and expandable ranges elsewhere than
/// recorded (a real GPU, as `allocsim validate` replays), the caching policy builds the
/// state where the device put it: every recording replays under the caching policy with
/// and without expandable segments, every invariant checked after each event, every
/// live block inside a segment of the device, and the reserved peak that of the replay
/// that adopts at the recorded addresses.
#[test]
fn a_device_that_relocates_the_starting_state_replays_it() {
    for f in &unseen_midrun_recordings() {
        let run = workloads::read_recorded_json(f).unwrap();
        let trace = run.to_trace().unwrap();
        for spec in ["caching", "caching:expandable_segments=True"] {
            let config = policies::spec::parse_policy_list(spec, &Default::default()).unwrap();
            let replay = |relocate: bool| {
                let mut policy = config[0].config.build().unwrap();
                let device = sim::SimDevice::new(sim::SimDeviceOptions::default());
                let r = if relocate {
                    sim::replay(
                        &trace,
                        policy.as_mut(),
                        &mut sim::Relocated(device),
                        &checked(),
                    )
                } else {
                    let mut device = device;
                    sim::replay(&trace, policy.as_mut(), &mut device, &checked())
                };
                r.unwrap_or_else(|e| panic!("{} under {spec}: {e}", f.display()))
            };
            let (moved, recorded) = (replay(true), replay(false));
            assert_eq!(
                moved.summary.reserved_bytes_peak,
                recorded.summary.reserved_bytes_peak,
                "{} under {spec}",
                f.display()
            );
            assert_eq!(
                moved.oom.is_some(),
                recorded.oom.is_some(),
                "{}",
                f.display()
            );
        }
    }
}

/// `validate`'s prediction of a mid-run trace adopts the starting state where the model
/// places new segments, as the GPU does: `mempool_phases__wrap2290` under the caching
/// policy is predicted at the reserved peak an H200 gave (1 893 728 256 bytes, 95 of 95
/// mid-run validation runs agreeing, docs/validation.md), where the recorded addresses
/// (the recorded process's placement, which a GPU run cannot have) predict 2 MiB more.
#[test]
fn validation_predicts_a_midrun_state_where_the_gpu_puts_it() {
    let path = unseen_midrun_dir().join("../midrun-pools/mempool_phases__wrap2290.json");
    let run = workloads::read_recorded_json(&path).unwrap();
    let trace = run.to_trace().unwrap();
    assert!(trace.start.is_some());
    let model = sim::DeviceProfile::builtin("h200").unwrap().to_options();
    let hints = sim::recorded::address_hints(&run, model.total_bytes).unwrap();
    let input = sim::CompareInput { trace, hints };
    let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
    let config = &config[0].config;
    let predicted = sim::validation::predict(
        &input,
        config.build().unwrap().as_mut(),
        config,
        &model,
        &checked(),
    )
    .unwrap();
    assert_eq!(predicted.summary.reserved_bytes_peak, 1_893_728_256);
    let mut device = sim::SimDevice::with_hints(model, input.hints.for_policy(config));
    let recorded = sim::replay(
        &input.trace,
        config.build().unwrap().as_mut(),
        &mut device,
        &checked(),
    )
    .unwrap();
    assert_eq!(
        recorded.summary.reserved_bytes_peak,
        1_893_728_256 + 2 * MIB
    );
}

/// Faults reach a starting state's adoption (a real GPU allocates it): without a fault the
/// fault-injecting device replays a mid-run trace as the simulated device does; a driver
/// failure at the state's `cuMemAlloc` is the replay's error, an injected out-of-memory
/// there an out-of-memory before the first event.
#[test]
fn faults_reach_the_adoption_of_a_starting_state() {
    use sim::{FaultKind, FaultOp, FaultPlan, FaultyDevice, SimDevice, SimDeviceOptions};
    let trace = two_blocks(true);
    let config = policies::spec::parse_policy_list("caching", &Default::default()).unwrap();
    let replay = |plan: FaultPlan| {
        let mut policy = config[0].config.build().unwrap();
        let mut device = FaultyDevice::new(SimDevice::new(SimDeviceOptions::default()), plan);
        sim::replay(&trace, policy.as_mut(), &mut device, &checked())
    };
    let mut policy = config[0].config.build().unwrap();
    let mut device = SimDevice::new(SimDeviceOptions::default());
    let plain = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap();
    let faultless = replay(FaultPlan::At(Vec::new())).unwrap();
    assert_eq!(faultless.summary, plain.summary);
    let first = |kind| FaultPlan::At(vec![(FaultOp::AllocateSegment, 1, kind)]);
    match replay(first(FaultKind::LaunchFailure)) {
        Err(sim::ReplayError::Start {
            error: policies::AdoptError::Device(policies::DeviceError::Driver { code: 719, .. }),
        }) => {}
        other => panic!("{other:?}"),
    }
    let oom = replay(first(FaultKind::OutOfMemory)).unwrap();
    assert_eq!(oom.oom.map(|o| o.event_index), Some(None));
}
