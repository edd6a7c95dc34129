//! The same scenarios for every policy of the registry table (`policies::POLICIES`), and
//! the proof that the table is the only list: registering a policy there enlists it
//! here, in specifications, in `allocsim policies`, in the command line's help, defaults
//! and error messages.

use std::panic::{catch_unwind, AssertUnwindSafe};

use policies::caching::CachingDefaults;
use policies::registry::known_names;
use policies::spec::parse_policy;
use policies::testing::{broken_driver_error, duplicate, BrokenDevice, NullDevice, TestDevice};
use policies::{AllocError, Device, DeviceError, Policy, PolicyStats, Request, StreamId, POLICIES};
use sim::{SimDevice, SimDeviceOptions};

use crate::util::{allocsim, stderr, stdout};

const MIB: u64 = 1 << 20;

fn req(size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(0),
    }
}

/// Runs `f` on a fresh default instance of every registered policy.
fn each_policy(mut f: impl FnMut(&str, Box<dyn Policy>)) {
    for entry in POLICIES {
        f(entry.name, entry.default_config().build().unwrap());
    }
}

/// Every registered policy parses from its bare name to its defaults, which build,
/// print as that name and read back.
#[test]
fn every_entry_parses_builds_and_prints() {
    assert!(!POLICIES.is_empty());
    for entry in POLICIES {
        let spec = parse_policy(entry.name, &CachingDefaults::default()).unwrap();
        assert_eq!(spec.label, entry.name);
        assert_eq!(spec.config, entry.default_config(), "{}", entry.name);
        assert_eq!(spec.config.kind_name(), entry.name);
        assert_eq!(spec.config.to_string(), entry.name);
        spec.config.build().unwrap();
    }
}

/// `allocsim policies` lists every entry with every option and its default, and shows one
/// entry by name.
#[test]
fn policies_command_lists_the_table() {
    let o = allocsim(["policies"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let all = stdout(&o);
    for entry in POLICIES {
        assert!(
            all.lines().any(|l| l == entry.name),
            "{} missing",
            entry.name
        );
        let o = allocsim(["policies", entry.name]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let one = stdout(&o);
        assert!(one.starts_with(&format!("{}\n", entry.name)), "{one}");
        for doc in entry.docs() {
            let line = format!(
                "    {}={}  (default: {})\n",
                doc.name,
                doc.kind.placeholder(),
                doc.default
            );
            assert!(
                one.contains(&line),
                "{}: '{line}' missing from\n{one}",
                entry.name
            );
            assert!(all.contains(&line), "{}: '{line}' missing", entry.name);
        }
    }
    let o = allocsim(["policies", "magic"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim(),
        format!(
            "error: unknown policy 'magic' (known: {})",
            known_names(", ")
        )
    );
}

/// The command line's default policy list, help and error messages name exactly the
/// registered policies, and a comparison with the default list runs each of them.
#[test]
fn command_line_lists_come_from_the_table() {
    let names: Vec<&str> = POLICIES.iter().map(|e| e.name).collect();
    let help = stdout(&allocsim(["compare", "--help"]));
    assert!(
        help.contains(&format!("[default: {}]", names.join(","))),
        "{help}"
    );
    for command in ["compare", "validate", "replay"] {
        let help = stdout(&allocsim([command, "--help"]));
        assert!(help.contains(&names.join(", ")), "{command}: {help}");
        assert!(help.contains("allocsim policies"), "{command}: {help}");
    }
    let o = allocsim(["replay", "examples/seed000.yaml", "--policy", "magic"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("(known: {})", names.join(", "))),
        "{}",
        stderr(&o)
    );
    let o = allocsim(["compare", "examples/seed000.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let csv = stdout(&o);
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let column = reader
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "policy")
        .unwrap();
    let policies: Vec<String> = reader
        .records()
        .map(|r| r.unwrap()[column].to_string())
        .collect();
    assert_eq!(policies, names);
}

fn on(stream: u64, size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(stream),
    }
}

/// Freeing everything, on several streams, brings allocated bytes to zero, and
/// empty_cache then reserved bytes.
#[test]
fn free_all_then_empty_cache_is_zero() {
    each_policy(|name, mut p| {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let sizes = [
            1,
            512,
            700,
            4097,
            MIB,
            3 * MIB,
            25 * MIB,
            300 * MIB,
            2 << 30,
        ];
        let live: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| p.allocate(&mut d, on(i as u64 % 3, s)).unwrap())
            .collect();
        assert!(
            p.stats().allocated_bytes >= sizes.iter().sum::<u64>(),
            "{name}"
        );
        for a in live {
            p.free(&mut d, &a).unwrap();
        }
        assert_eq!(p.stats().allocated_bytes, 0, "{name}");
        p.empty_cache(&mut d).unwrap();
        assert_eq!(p.stats(), PolicyStats::default(), "{name}");
        assert_eq!(d.stats().reserved_bytes, 0, "{name}");
        p.check_invariants();
    });
}

/// A device with no memory makes every request an out-of-memory, and nothing changes.
#[test]
fn null_device_is_always_oom() {
    each_policy(|name, mut p| {
        let mut d = NullDevice;
        for size in [1, MIB, 100 * MIB] {
            let e = p.allocate(&mut d, req(size)).unwrap_err();
            assert!(
                matches!(e, AllocError::OutOfMemory { requested_bytes, .. } if requested_bytes == size),
                "{name}: {e:?}"
            );
        }
        assert_eq!(p.stats(), PolicyStats::default(), "{name}");
        p.check_invariants();
    });
}

/// Zero-byte requests are refused as such; requests of 1 EiB or more are an OOM that
/// touches nothing.
#[test]
fn degenerate_requests() {
    each_policy(|name, mut p| {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        assert_eq!(
            p.allocate(&mut d, req(0)),
            Err(AllocError::ZeroSize),
            "{name}"
        );
        let e = p.allocate(&mut d, req(1 << 60)).unwrap_err();
        assert!(matches!(e, AllocError::OutOfMemory { .. }), "{name}: {e:?}");
        assert_eq!(p.stats(), PolicyStats::default(), "{name}");
        assert_eq!(
            d.stats().allocate_count,
            0,
            "{name}: the device was not asked"
        );
    });
}

/// A request larger than the device is an OOM, and earlier allocations survive it.
#[test]
fn oversized_request_is_oom_and_keeps_allocations() {
    each_policy(|name, mut p| {
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 << 30));
        let a = p.allocate(&mut d, req(100 * MIB)).unwrap();
        let before = p.stats();
        assert!(
            matches!(
                p.allocate(&mut d, req(8 << 30)),
                Err(AllocError::OutOfMemory { .. })
            ),
            "{name}"
        );
        let after = p.stats();
        assert_eq!(
            (after.allocated_bytes, after.allocation_count),
            (before.allocated_bytes, before.allocation_count),
            "{name}"
        );
        p.free(&mut d, &a).unwrap();
        p.check_invariants();
    });
}

/// The same trace replayed twice gives identical results (determinism).
#[test]
fn replay_is_deterministic() {
    let trace = workloads::generate::random(&workloads::generate::RandomOptions {
        seed: 11,
        events: 2000,
        streams: 3,
        ..workloads::generate::RandomOptions::default()
    })
    .unwrap();
    for entry in POLICIES {
        let run = || {
            let mut p = entry.default_config().build().unwrap();
            let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(8 << 30));
            let mut timeline = sim::Timeline::default();
            let o = sim::ReplayOptions::default();
            let r = sim::replay_with(&trace, p.as_mut(), &mut d, &o, &mut timeline).unwrap();
            (r, timeline)
        };
        assert_eq!(run(), run(), "{}", entry.name);
    }
}

/// A driver failure other than out of memory reaches the caller as a device error and
/// leaves the policy as it was.
#[test]
fn driver_failures_propagate() {
    each_policy(|name, mut p| {
        for size in [512, 3 * MIB, 300 * MIB] {
            let e = p.allocate(&mut BrokenDevice, req(size)).unwrap_err();
            assert_eq!(e, AllocError::Device(broken_driver_error()), "{name}");
        }
        assert_eq!(p.stats(), PolicyStats::default(), "{name}");
        p.check_invariants();
    });
}

/// The same, for a policy with virtual memory (expandable segments).
#[test]
fn driver_failures_propagate_through_virtual_memory() {
    let config = policies::caching::CachingConfig::from_alloc_conf("expandable_segments:True")
        .expect("config");
    let mut p = policies::caching::CachingPolicy::new(config);
    let e = p.allocate(&mut BrokenDevice, req(MIB)).unwrap_err();
    assert!(
        matches!(e, AllocError::Device(DeviceError::Driver { code: 700, .. })),
        "{e:?}"
    );
    assert_eq!(p.stats(), PolicyStats::default());
    p.check_invariants();
}

/// Freeing an allocation twice, or a stale handle whose block was handed out again,
/// panics naming the broken invariant, before anything changes.
#[test]
fn stale_and_double_frees_panic() {
    each_policy(|name, mut p| {
        let mut d = TestDevice::unbounded();
        let a = p.allocate(&mut d, req(512)).unwrap();
        let twin = duplicate(&a);
        p.free(&mut d, &a).unwrap();
        let message = |r: std::thread::Result<()>| {
            let e = r.expect_err("the free should panic");
            e.downcast_ref::<String>().cloned().unwrap_or_default()
        };
        let double = message(catch_unwind(AssertUnwindSafe(|| {
            let _ = p.free(&mut d, &duplicate(&twin));
        })));
        assert!(double.contains("is not live in this"), "{name}: {double}");
        let b = p.allocate(&mut d, req(512)).unwrap();
        let stale = message(catch_unwind(AssertUnwindSafe(|| {
            let _ = p.free(&mut d, &twin);
        })));
        assert!(stale.contains("is not live in this"), "{name}: {stale}");
        p.free(&mut d, &b).unwrap();
        p.empty_cache(&mut d).unwrap();
        assert_eq!(p.stats(), PolicyStats::default(), "{name}");
        p.check_invariants();
    });
}
