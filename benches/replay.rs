//! Replay throughput: events per second of `sim::replay` per policy (`caching`,
//! `caching:expandable_segments=True`, `immediate`, `buddy`, `arena`), on generated
//! traces held in memory (reading files is not measured): group `replay`, sizes from
//! 512 B to 256 MiB (segments created and released, both pools, oversize blocks), and
//! group `replay_small`, sizes from 1 B to 1 MiB (the small pool's hot path: cached blocks
//! found, split and merged, few new segments). Figures and the machine they came from
//! are recorded in docs/performance.md.
//!
//! Run with `cargo bench --bench replay`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use policies::caching::CachingDefaults;
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
    for (name, trace) in [("replay", &wide), ("replay_small", &small)] {
        bench_group(c, name, trace, &specs);
    }
}

fn bench_group(c: &mut Criterion, name: &str, trace: &Trace, specs: &[PolicySpec]) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(trace.events.len() as u64));
    group.sample_size(20);
    for spec in specs {
        group.bench_with_input(
            BenchmarkId::from_parameter(&spec.label),
            &spec.config,
            |b, config| {
                b.iter(|| {
                    let mut policy = config.build().unwrap();
                    let mut device = SimDevice::new(SimDeviceOptions::default());
                    sim::replay(
                        trace,
                        policy.as_mut(),
                        &mut device,
                        &ReplayOptions::default(),
                    )
                    .unwrap()
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
