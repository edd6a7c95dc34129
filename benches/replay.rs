//! Replay throughput: events per second of `sim::replay` per policy (`caching`,
//! `caching:expandable_segments=True`, `immediate`, `buddy`, `arena`), on generated
//! traces held in memory (reading files is not measured): group `replay`, sizes from
//! 512 B to 256 MiB (segments created and released, both pools, oversize blocks), and
//! group `replay_small`, sizes from 1 B to 1 MiB (the small pool's hot path: cached blocks
//! found, split and merged, few new segments), and group `replay_pressure`, the caching
//! policy on a 512 MiB device that runs out of memory about 3 500 times (long-lived
//! allocations of 1 B to 1 MiB, replayed on past each out-of-memory: each one's retry
//! releases the cache, whose cost once grew with every free block of the pool). Figures
//! and the machine they came from are recorded in docs/performance.md. Group
//! `replay_many`: `immediate` with about 5 000 allocations of 2 to 8 MiB live on a 1 TiB
//! device (as many segments, each placed by the simulated driver's address model), and
//! `caching` on 1 024 streams (each request finds its stream's slot).
//!
//! Run with `cargo bench --bench replay`.

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use policies::caching::CachingDefaults;
use policies::registry::PolicyConfig;
use policies::spec::{parse_policy_list, PolicySpec};
use sim::{ReplayOptions, SimDevice, SimDeviceOptions};
use workloads::generate::{random, RandomOptions, SizeDistribution};
use workloads::Trace;

fn bench_replay(c: &mut Criterion) {
    let wide = random(&RandomOptions {
        seed: 3,
        events: 200_000,
        streams: 2,
        ..RandomOptions::default()
    })
    .unwrap();
    let small = random(&RandomOptions {
        seed: 3,
        events: 200_000,
        streams: 2,
        sizes: SizeDistribution::LogUniform {
            min_bytes: 1,
            max_bytes: 1 << 20,
        },
        ..RandomOptions::default()
    })
    .unwrap();
    let specs = parse_policy_list(
        "caching,caching:expandable_segments=True,immediate,buddy,arena",
        &CachingDefaults::default(),
    )
    .unwrap();
    let device = SimDeviceOptions::default();
    let replay = ReplayOptions::default();
    for (name, trace) in [("replay", &wide), ("replay_small", &small)] {
        bench_group(c, name, trace, &specs, &device, &replay);
    }
    let pressed = random(&RandomOptions {
        seed: 3,
        events: 200_000,
        streams: 2,
        mean_lifetime_events: 20_000.0,
        sizes: SizeDistribution::LogUniform {
            min_bytes: 1,
            max_bytes: 1 << 20,
        },
        ..RandomOptions::default()
    })
    .unwrap();
    let caching = parse_policy_list(
        "caching,caching:expandable_segments=True",
        &CachingDefaults::default(),
    )
    .unwrap();
    let many_segments = random(&RandomOptions {
        seed: 1,
        events: 200_000,
        mean_lifetime_events: 10_000.0,
        sizes: SizeDistribution::LogUniform {
            min_bytes: 2 << 20,
            max_bytes: 8 << 20,
        },
        ..RandomOptions::default()
    })
    .unwrap();
    let many_streams = random(&RandomOptions {
        seed: 2,
        events: 200_000,
        streams: 1024,
        ..RandomOptions::default()
    })
    .unwrap();
    let tera = SimDeviceOptions::default().with_capacity(1 << 40);
    for (label, trace, policy, device) in [
        (
            "immediate/5000-segments",
            &many_segments,
            "immediate",
            &tera,
        ),
        ("caching/1024-streams", &many_streams, "caching", &device),
    ] {
        let spec = &parse_policy_list(policy, &CachingDefaults::default()).unwrap()[0];
        let mut group = c.benchmark_group("replay_many");
        group.throughput(Throughput::Elements(trace.events.len() as u64));
        group.sample_size(20);
        bench_one(&mut group, label, trace, &spec.config, device, &replay);
        group.finish();
    }
    bench_group(
        c,
        "replay_pressure",
        &pressed,
        &caching,
        &SimDeviceOptions::default().with_capacity(512 << 20),
        &ReplayOptions {
            continue_after_oom: true,
            ..ReplayOptions::default()
        },
    );
}

fn bench_group(
    c: &mut Criterion,
    name: &str,
    trace: &Trace,
    specs: &[PolicySpec],
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(trace.events.len() as u64));
    group.sample_size(20);
    for spec in specs {
        bench_one(
            &mut group,
            &spec.label,
            trace,
            &spec.config,
            device,
            options,
        );
    }
    group.finish();
}

/// One benchmark of `group`, named `id`: `trace` replayed under a fresh policy built
/// from `config` on a fresh device.
fn bench_one(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    trace: &Trace,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) {
    group.bench_with_input(BenchmarkId::from_parameter(id), config, |b, config| {
        b.iter(|| {
            let mut policy = config.build().unwrap();
            let mut device = SimDevice::new(device.clone());
            sim::replay(trace, policy.as_mut(), &mut device, options).unwrap()
        })
    });
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
