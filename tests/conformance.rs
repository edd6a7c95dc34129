//! The same scenarios for every registered policy (adding a policy to
//! `PolicyConfig::defaults()` enlists it here).

use policies::testing::NullDevice;
use policies::{AllocError, Device, Policy, PolicyConfig, PolicyStats, Request, StreamId};
use sim::{SimDevice, SimDeviceOptions};

const MIB: u64 = 1 << 20;

fn req(size_bytes: u64) -> Request {
    Request {
        size_bytes,
        stream: StreamId(0),
    }
}

fn each_policy(mut f: impl FnMut(&str, Box<dyn Policy>)) {
    for config in PolicyConfig::defaults() {
        f(config.kind_name(), config.build().unwrap());
    }
}

/// Freeing everything brings allocated bytes to zero, and empty_cache then reserved bytes.
#[test]
fn free_all_then_empty_cache_is_zero() {
    each_policy(|name, mut p| {
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let sizes = [1, 512, 4097, MIB, 3 * MIB, 25 * MIB, 300 * MIB];
        let live: Vec<_> = sizes
            .iter()
            .map(|&s| p.allocate(&mut d, req(s)).unwrap())
            .collect();
        assert!(
            p.stats().allocated_bytes >= sizes.iter().sum::<u64>(),
            "{name}"
        );
        for a in live {
            p.free(&mut d, a).unwrap();
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
        p.free(&mut d, a).unwrap();
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
    for config in PolicyConfig::defaults() {
        let run = || {
            let mut p = config.build().unwrap();
            let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(8 << 30));
            let o = sim::ReplayOptions {
                timeline: true,
                ..sim::ReplayOptions::default()
            };
            sim::replay(&trace, p.as_mut(), &mut d, &o).unwrap()
        };
        assert_eq!(run(), run(), "{}", config.kind_name());
    }
}
