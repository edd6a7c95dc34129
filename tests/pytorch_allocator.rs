//! PyTorch's own allocator tests that a trace can express, replayed through the engine
//! under the caching policy. Each test names the PyTorch test it comes from
//! (`test/test_cuda.py` of PyTorch 2.11 unless said otherwise); the expected values are
//! PyTorch's assertions, the trace is what the test's Python asks of the allocator.

use std::collections::BTreeMap;

use policies::caching::{CachingConfig, CachingPolicy};
use policies::{Policy, PolicyConfig};
use sim::{Observer, ReplayOptions, SimDevice, SimDeviceOptions, Step};
use workloads::{AllocId, Event, PoolId, PoolStreams, Trace};

const K_SMALL_SIZE: u64 = 1_048_576;
const K_SMALL_BUFFER: u64 = 2_097_152;
const K_LARGE_BUFFER: u64 = 20_971_520;
const K_MIN_LARGE_ALLOC: u64 = 10_485_760;
const K_ROUND_LARGE: u64 = 2_097_152;

/// `torch.cuda.memory_stats()` at every `mark`, by label.
#[derive(Default)]
struct StatsAtMarks(BTreeMap<String, BTreeMap<String, i64>>);

impl Observer for StatsAtMarks {
    fn after_event(&mut self, step: &Step<'_>) {
        if let Event::Mark { label } = step.event {
            self.0.insert(
                label.clone(),
                step.policy.detailed_stats().into_iter().collect(),
            );
        }
    }
}

/// Builds traces with fresh ids.
#[derive(Default)]
struct Program {
    events: Vec<Event>,
    next: u64,
}

impl Program {
    fn alloc(&mut self, bytes: u64, stream: u64) -> AllocId {
        let id = AllocId(self.next);
        self.next += 1;
        self.events.push(Event::Alloc {
            id,
            size_bytes: bytes,
            stream,
        });
        id
    }

    fn free(&mut self, id: AllocId) {
        self.events.push(Event::Free { id });
    }

    fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    fn mark(&mut self, label: &str) {
        self.events.push(Event::Mark {
            label: label.into(),
        });
    }
}

fn run(events: Vec<Event>, conf: &str, continue_after_oom: bool) -> (sim::Replay, StatsAtMarks) {
    let trace = Trace::new("pytorch-test", events);
    let mut policy = CachingPolicy::new(CachingConfig::from_alloc_conf(conf).unwrap());
    let mut device = SimDevice::new(SimDeviceOptions::default());
    let mut marks = StatsAtMarks::default();
    let options = ReplayOptions {
        check_invariants: true,
        continue_after_oom,
        ..ReplayOptions::default()
    };
    let replay = sim::replay_with(&trace, &mut policy, &mut device, &options, &mut marks).unwrap();
    (replay, marks)
}

/// From `TestCuda.test_graph_memory_stats_and_use_result_after_destroy_graph`: a graph
/// captured on a side stream clones an input six times into its private pool; the
/// segments, reserved bytes, active blocks and active bytes it adds (small and large
/// pools), before and after an `empty_cache` with the graph alive, and after the graph
/// is destroyed with its result still held, are PyTorch's.
#[test]
fn graph_memory_stats_and_use_result_after_destroy_graph() {
    let elem = 4;
    let round_large = |n: u64| K_ROUND_LARGE * n.div_ceil(K_ROUND_LARGE);
    // (numel, delta cudaMallocs, delta cudaMalloc bytes, post-delete bytes, pool)
    let cases = [
        (512 / elem, 1, K_SMALL_BUFFER, K_SMALL_BUFFER, "small_pool"),
        (
            K_SMALL_SIZE / elem,
            2,
            2 * K_SMALL_BUFFER,
            K_SMALL_BUFFER,
            "small_pool",
        ),
        (
            (K_SMALL_SIZE + 512) / elem,
            1,
            K_LARGE_BUFFER,
            K_LARGE_BUFFER,
            "large_pool",
        ),
        (
            (K_MIN_LARGE_ALLOC - 512) / elem,
            2,
            2 * K_LARGE_BUFFER,
            K_LARGE_BUFFER,
            "large_pool",
        ),
        (
            (K_MIN_LARGE_ALLOC + 512) / elem,
            3,
            3 * round_large(K_MIN_LARGE_ALLOC + 512),
            round_large(K_MIN_LARGE_ALLOC + 512),
            "large_pool",
        ),
    ];
    let s = 7; // the side stream `s`
    for (n, (numel, mallocs, malloc_bytes, post_del_bytes, pool_name)) in cases.iter().enumerate() {
        let pool = PoolId(n as u64 + 1, 0);
        let bytes = numel * elem;
        let mut p = Program::default();
        p.push(Event::EmptyCache);
        let a = p.alloc(bytes, s);
        p.mark("precapture");
        // capture_begin: the generator's seed and offset holders (one element each) on
        // the capture stream, before allocation to the graph's pool begins.
        let seed = p.alloc(8, s);
        let offset = p.alloc(8, s);
        p.push(Event::BeginAllocateToPool {
            pool,
            streams: PoolStreams::only(vec![s]),
        });
        let mut b = p.alloc(bytes, s); // b = a.clone()
        for _ in 0..5 {
            let t = p.alloc(bytes, s); // b.clone()
            let r = p.alloc(bytes, s); // ... + 1
            p.free(t);
            p.free(b);
            b = r;
        }
        p.push(Event::EndAllocateToPool { pool });
        p.mark("postcapture");
        p.push(Event::EmptyCache);
        p.mark("postcapture, empty_cache");
        // del g: the graph's pool loses its use, and its rng holders go.
        p.push(Event::ReleasePool { pool });
        p.free(seed);
        p.free(offset);
        p.push(Event::EmptyCache);
        p.mark("postdel");
        p.free(a);
        p.free(b);
        p.push(Event::EmptyCache);
        let (_, marks) = run(p.events, "", false);
        let stats = &marks.0;
        let delta = |at: &str, stat: &str| {
            let key = format!("{stat}.{pool_name}.current");
            stats[at][&key] - stats["precapture"][&key]
        };
        let (blocks, active_bytes) = if *pool_name == "small_pool" {
            (3, bytes + 1024)
        } else {
            (1, bytes)
        };
        for at in ["postcapture", "postcapture, empty_cache"] {
            assert_eq!(
                [
                    delta(at, "segment"),
                    delta(at, "reserved_bytes"),
                    delta(at, "active"),
                    delta(at, "active_bytes")
                ],
                [*mallocs, *malloc_bytes as i64, blocks, active_bytes as i64],
                "{at}, numel {numel}"
            );
        }
        assert_eq!(
            [
                delta("postdel", "segment"),
                delta("postdel", "reserved_bytes"),
                delta("postdel", "active"),
                delta("postdel", "active_bytes")
            ],
            [1, *post_del_bytes as i64, 1, bytes as i64],
            "post delete, numel {numel}"
        );
    }
}

/// From `TestCuda.test_out_of_memory`: a request of 800000000 GiB fails with "Tried to
/// allocate 800000000.00 GiB" (after the allocator's retry); one of 8000000000 GiB (over
/// 1 EiB) with "Tried to allocate more than 1EB memory", raised before the allocator (no
/// retry, no OOM counted: PyTorch's source); the allocator works on after both.
#[test]
fn out_of_memory() {
    let gib = 1u64 << 30;
    let mut p = Program::default();
    let tensor = p.alloc(1024 * 4, 0);
    p.alloc(gib * 800_000_000, 0);
    p.mark("after the first");
    p.alloc(gib * 8_000_000_000, 0);
    p.mark("after the second");
    p.free(tensor);
    let (r, marks) = run(p.events, "", true);
    assert_eq!(r.oom_count, 2);
    let first = r.oom.as_ref().unwrap().message.clone().unwrap();
    assert!(
        first.contains("Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of"),
        "{first}"
    );
    assert_eq!(marks.0["after the first"]["num_ooms"], 1);
    assert_eq!(marks.0["after the first"]["num_alloc_retries"], 1);
    assert_eq!(marks.0["after the second"]["num_ooms"], 1);
    assert_eq!(marks.0["after the second"]["num_alloc_retries"], 1);
    let mut p = Program::default();
    p.alloc(gib * 8_000_000_000, 0);
    let (r, _) = run(p.events, "", false);
    assert_eq!(
        r.oom.unwrap().message.as_deref(),
        Some("CUDA out of memory. Tried to allocate more than 1EB memory.")
    );
}

/// From `TestCuda.test_graph_record_stream`: a block freed during a capture while
/// another stream used it (`record_stream`) is not reused during the capture (PyTorch
/// defers it: no event may be queried while capturing) and returns at the first request
/// after the capture; with `graph_capture_record_stream_reuse:True` the next request on
/// its stream during the capture reuses it (PyTorch's source; the test checks that
/// nothing fails).
#[test]
fn graph_record_stream() {
    let (s1, s2) = (11, 12);
    let pool = PoolId(1, 0);
    for (conf, reused_in_capture) in [
        ("", false),
        ("graph_capture_record_stream_reuse:True", true),
    ] {
        let mut p = Program::default();
        p.push(Event::BeginAllocateToPool {
            pool,
            streams: PoolStreams::only(vec![s1, s2]),
        });
        let b = p.alloc(4096, s1); // b = a.clone()
        p.push(Event::FreeRequested { id: b }); // b.record_stream(s2); del b
        p.push(Event::Free { id: b }); // s2's work is done (s1.wait_stream(s2))
        p.mark("freed");
        let c = p.alloc(4096, s1);
        p.mark("next request");
        p.push(Event::EndAllocateToPool { pool });
        p.free(c);
        p.push(Event::ReleasePool { pool });
        let (_, marks) = run(p.events, conf, false);
        let m = &marks.0;
        // Still active (pending) after its free in both; reused by the next request only
        // with the setting: then one block is active, else two.
        assert_eq!(m["freed"]["active.all.current"], 1, "{conf}");
        let active = if reused_in_capture { 1 } else { 2 };
        assert_eq!(m["next request"]["active.all.current"], active, "{conf}");
        assert_eq!(m["next request"]["segment.all.current"], 1, "{conf}");
    }
}

/// From `TestCuda.test_mempool_ctx_multithread`-style use (one thread): requests inside
/// `use_mem_pool` come from the MemPool's own segments; after the block, requests come
/// from the default pools again; destroying the pool (`release_pool` then its
/// `empty_cache`) gives its free segments back while the default pool's stay cached.
#[test]
fn mempool_routing_and_destruction() {
    let pool = PoolId(0, 1);
    let mut p = Program::default();
    p.push(Event::CreatePool {
        pool,
        use_on_oom: false,
        no_split: false,
    });
    let x = p.alloc(1 << 20, 0);
    p.push(Event::BeginAllocateToPool {
        pool,
        streams: PoolStreams::All,
    });
    let y = p.alloc(1 << 20, 0);
    p.push(Event::EndAllocateToPool { pool });
    p.push(Event::ReleasePool { pool });
    p.mark("two pools");
    p.free(y);
    p.free(x);
    p.push(Event::ReleasePool { pool });
    p.push(Event::EmptyPoolCache { pool });
    p.mark("pool destroyed");
    let (_, marks) = run(p.events, "", false);
    assert_eq!(marks.0["two pools"]["segment.all.current"], 2);
    assert_eq!(marks.0["pool destroyed"]["segment.all.current"], 1);
    assert_eq!(
        marks.0["pool destroyed"]["reserved_bytes.all.current"],
        K_SMALL_BUFFER as i64
    );
}

/// From `TestCuda.test_allocator_settings` (2.11's `_set_allocator_settings`): settings
/// changed mid-run take effect for later requests, `max_split_size_mb` goes back to
/// unlimited when a later string leaves it out, and `memory_stats()["max_split_size"]`
/// keeps the value the allocator was created with.
#[test]
fn allocator_settings_mid_run() {
    let mut p = Program::default();
    p.push(Event::SetAllocatorSettings {
        conf: "max_split_size_mb:40".into(),
    });
    let a = p.alloc(50 << 20, 0);
    p.free(a);
    p.mark("oversize");
    p.push(Event::SetAllocatorSettings {
        conf: "expandable_segments:False".into(),
    });
    p.mark("reset");
    let (_, marks) = run(p.events, "", false);
    assert_eq!(marks.0["oversize"]["oversize_segments.current"], 1);
    assert_eq!(marks.0["oversize"]["max_split_size"], -1);
    let trace = Trace::new(
        "bad",
        vec![Event::SetAllocatorSettings {
            conf: "backend:cudaMallocAsync".into(),
        }],
    );
    let mut policy = CachingPolicy::default();
    let mut device = SimDevice::new(SimDeviceOptions::default());
    let e = sim::replay(&trace, &mut policy, &mut device, &ReplayOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "event 0: Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native"
    );
}

/// From `TestCuda.test_memory_stats` and `test_reset_peak_memory_stats` semantics
/// (`reset_peak_memory_stats`: every peak becomes the current value;
/// `reset_accumulated_memory_stats`: every total and counter becomes 0).
#[test]
fn statistics_resets() {
    let mut p = Program::default();
    let a = p.alloc(40 << 20, 0);
    p.free(a);
    p.push(Event::ResetPeakStats);
    p.mark("peak reset");
    p.push(Event::ResetAccumulatedStats);
    p.mark("accumulated reset");
    let (_, marks) = run(p.events, "", false);
    let m = &marks.0;
    assert_eq!(m["peak reset"]["allocated_bytes.all.peak"], 0);
    assert_eq!(m["peak reset"]["reserved_bytes.all.peak"], 40 << 20);
    assert_eq!(m["peak reset"]["allocated_bytes.all.allocated"], 40 << 20);
    assert_eq!(m["accumulated reset"]["allocated_bytes.all.allocated"], 0);
    assert_eq!(m["accumulated reset"]["num_device_alloc"], 0);
    assert_eq!(
        m["accumulated reset"]["reserved_bytes.all.current"],
        40 << 20
    );
}

/// From `TestCuda.test_caching_allocator_enable` semantics
/// (`torch.cuda.memory.caching_allocator_enable(False)`): while disabled, a request is
/// its own `cudaMalloc` of exactly its size, outside `memory_stats()`, and its free gives
/// the memory straight back.
#[test]
fn caching_allocator_disabled() {
    let mut p = Program::default();
    p.push(Event::SetEnabled { enabled: false });
    let a = p.alloc(1000, 0);
    p.mark("disabled");
    p.free(a);
    p.push(Event::SetEnabled { enabled: true });
    let b = p.alloc(1000, 0);
    p.mark("enabled");
    p.free(b);
    let (r, marks) = run(p.events, "", false);
    assert_eq!(marks.0["disabled"]["allocation.all.current"], 0);
    assert_eq!(marks.0["disabled"]["reserved_bytes.all.current"], 0);
    assert_eq!(
        marks.0["enabled"]["reserved_bytes.all.current"],
        K_SMALL_BUFFER as i64
    );
    assert!(r.summary.reserved_bytes_peak >= 1000);
}

/// `trace` replayed under `config` on the default simulated device, invariants checked
/// after every event.
fn replay_checked(trace: &Trace, config: &PolicyConfig) -> sim::Replay {
    let mut policy: Box<dyn Policy> = config.build().unwrap();
    let mut device = SimDevice::new(SimDeviceOptions::default());
    let options = ReplayOptions {
        check_invariants: true,
        ..ReplayOptions::default()
    };
    sim::replay(trace, policy.as_mut(), &mut device, &options).unwrap()
}

/// Every policy replays a trace with pool events and allocator calls: the caching policy
/// applies them, the others ignore them and say so (a caveat naming the pools).
#[test]
fn every_policy_replays_pool_events() {
    let pool = PoolId(1, 0);
    let mut p = Program::default();
    p.push(Event::BeginAllocateToPool {
        pool,
        streams: PoolStreams::only(vec![3]),
    });
    let a = p.alloc(3 << 20, 3);
    p.push(Event::EndAllocateToPool { pool });
    p.free(a);
    p.push(Event::ReleasePool { pool });
    p.push(Event::ResetPeakStats);
    p.push(Event::EmptyCache);
    let trace = Trace::new("pools", p.events);
    for config in PolicyConfig::defaults() {
        let r = replay_checked(&trace, &config);
        assert_eq!(r.final_policy.reserved_bytes, 0, "{}", config.kind_name());
        let caveats = sim::caveats(&trace, &config, &r);
        if config.kind_name() == "caching" {
            assert!(caveats.is_empty(), "{caveats:?}");
        } else {
            assert_eq!(r.ignored_call_count, 4, "{}", config.kind_name());
            assert!(caveats[0].contains("private pools (1, 0)"), "{caveats:?}");
        }
    }
}

/// A checkpoint restore's `restore_block` places the next request at the pool's free
/// block it names (no large segment for a 1.5 MiB block carved from a small one); one
/// naming an address where no free block starts is counted missed and said in a caveat,
/// and policies without pools ignore it.
#[test]
fn a_checkpoint_restore_is_placed_or_said_missed() {
    use policies::Device as _;
    let pool = PoolId(0, 1);
    let base = SimDevice::new(SimDeviceOptions::default())
        .allocate_segment(2 << 20)
        .unwrap()
        .addr
        .0;
    let program = |addr: u64| {
        let mut p = Program::default();
        p.push(Event::BeginAllocateToPool {
            pool,
            streams: PoolStreams::All,
        });
        let a = p.alloc(256 << 10, 0);
        let b = p.alloc(512 << 10, 0);
        p.push(Event::EndAllocateToPool { pool });
        p.free(a);
        p.free(b);
        p.push(Event::RestoreBlock { pool, addr });
        let c = p.alloc(1536 << 10, 0);
        p.free(c);
        p.push(Event::ReleasePool { pool });
        Trace::new("restore", p.events)
    };
    for (addr, missed, peak) in [(base, 0, 2u64 << 20), (base + 4096, 1, 22 << 20)] {
        let trace = program(addr);
        for config in PolicyConfig::defaults() {
            let r = replay_checked(&trace, &config);
            let caveats = sim::caveats(&trace, &config, &r);
            if config.kind_name() == "caching" {
                assert_eq!(r.missed_restore_count, missed, "{addr:#x}");
                assert_eq!(r.summary.reserved_bytes_peak, peak, "{addr:#x}");
                assert_eq!(caveats.len() as u64, missed, "{caveats:?}");
                if missed > 0 {
                    assert!(
                        caveats[0].contains("not where the recording had them"),
                        "{caveats:?}"
                    );
                }
            } else {
                assert_eq!(r.ignored_call_count, 4, "{}", config.kind_name());
                assert_eq!(r.missed_restore_count, 0, "{}", config.kind_name());
            }
        }
    }
}

/// On a device that puts the recording's segments elsewhere (a GPU; here a simulated
/// device not following the recorded addresses), `sim::Placed` translates a restore's
/// recorded address to where the device put that segment: placed, none missed; without
/// it the block is missed.
#[test]
fn a_restore_is_placed_where_the_device_put_the_recorded_segment() {
    let pool = PoolId(0, 1);
    let recorded = 0x7f00_0000_0000_u64;
    let mut p = Program::default();
    p.push(Event::BeginAllocateToPool {
        pool,
        streams: PoolStreams::All,
    });
    let a = p.alloc(256 << 10, 0);
    p.push(Event::EndAllocateToPool { pool });
    p.free(a);
    p.push(Event::RestoreBlock {
        pool,
        addr: recorded,
    });
    let b = p.alloc(1536 << 10, 0);
    p.free(b);
    let trace = Trace::new("restore", p.events);
    let hints = sim::AddressHints {
        segments: [(2 << 20, recorded)].into_iter().collect(),
        ranges: Default::default(),
    };
    for translate in [true, false] {
        let mut policy = CachingPolicy::default();
        let mut sim_device = SimDevice::new(SimDeviceOptions::default());
        let mut placed = sim::Placed::new(&mut sim_device, hints.clone());
        let device: &mut dyn policies::Device = if translate {
            &mut placed
        } else {
            placed.inner()
        };
        let r = sim::replay(&trace, &mut policy, device, &ReplayOptions::default()).unwrap();
        // Placed: the front of the small segment's free block, no new segment.
        let (missed, peak) = if translate {
            (0, 2 << 20)
        } else {
            (1, 22 << 20)
        };
        assert_eq!(r.missed_restore_count, missed, "translate {translate}");
        assert_eq!(r.summary.reserved_bytes_peak, peak, "translate {translate}");
    }
}

/// `backend:cudaMallocAsync` parses as PyTorch 2.11 parses it (values of the native
/// allocator's keys are not read under it, and are under `native`), and a replay under
/// it says that backend is not modelled.
#[test]
fn cuda_malloc_async_backend() {
    assert!(CachingConfig::from_alloc_conf("backend:cudaMallocAsync,max_split_size_mb:5").is_ok());
    assert_eq!(
        CachingConfig::from_alloc_conf("backend:native,max_split_size_mb:5")
            .unwrap_err()
            .to_string(),
        "CachingAllocator option max_split_size_mb too small, must be >= 20"
    );
    let config =
        PolicyConfig::new(CachingConfig::from_alloc_conf("backend:cudaMallocAsync").unwrap());
    let trace = Trace::new("t", vec![]);
    let mut policy = config.build().unwrap();
    let mut device = SimDevice::new(SimDeviceOptions::default());
    let r = sim::replay(
        &trace,
        policy.as_mut(),
        &mut device,
        &ReplayOptions::default(),
    )
    .unwrap();
    let caveats = sim::caveats(&trace, &config, &r);
    assert!(
        caveats[0].starts_with("backend:cudaMallocAsync is not modelled"),
        "{caveats:?}"
    );
}

/// Keys of later PyTorch releases are refused with the release they belong to; every
/// key of 2.11 (`per_process_memory_fraction` and `graph_capture_record_stream_reuse`
/// included) is accepted.
#[test]
fn keys_of_later_releases_name_their_release() {
    let e = CachingConfig::from_alloc_conf("expandable_segments_reserve:True")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "Unrecognized key 'expandable_segments_reserve' in CUDA allocator config. \
         ('expandable_segments_reserve' is a key of PyTorch 2.15 and later; allocsim models PyTorch 2.11's allocator)"
    );
    for conf in [
        "per_process_memory_fraction:0.5",
        "graph_capture_record_stream_reuse:True",
        "large_segment_size_mb:40",
        "pinned_reserve_segment_size_mb:8",
    ] {
        assert!(CachingConfig::from_alloc_conf(conf).is_ok(), "{conf}");
    }
}
