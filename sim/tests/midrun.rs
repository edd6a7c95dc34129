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
                blocks: vec![block(3, base + 64 * MIB + 512, None, 100, false)],
            },
        ],
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

/// A policy that cannot take over PyTorch's state says so, naming itself, and the
/// replay stops before its first event.
#[test]
fn other_policies_refuse_a_state() {
    let start = workloads::StartState {
        segments: vec![workloads::StartSegment {
            addr: 0x7f00_0000_0000,
            size_bytes: 2 * MIB,
            stream: 0,
            pool: None,
            expandable: false,
            blocks: vec![],
        }],
    };
    let trace = start_trace(start, vec![]);
    for spec in ["immediate", "buddy", "arena"] {
        let config = policies::spec::parse_policy_list(spec, &Default::default()).unwrap();
        let mut policy = config[0].config.build().unwrap();
        let mut device = sim::SimDevice::new(sim::SimDeviceOptions::default());
        let e = sim::replay(&trace, policy.as_mut(), &mut device, &checked()).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("the trace starts mid-run, from a rebuilt allocator state: the ")
                && m.contains("policy cannot start from a recorded allocator state"),
            "{m}"
        );
    }
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
                blocks: vec![block(0, base, Some(30 * MIB), 30 * MIB, false)],
            },
            workloads::StartSegment {
                addr: base + 3 * page,
                size_bytes: page,
                stream: 0,
                pool: Some(workloads::StartPool::Large),
                expandable: true,
                blocks: vec![],
            },
        ],
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
