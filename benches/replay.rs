//! Replay throughput: events per second of `sim::replay` per policy, on a generated
//! trace held in memory (reading files is not measured). Figures and the machine they
//! came from are recorded in docs/performance.md.
//!
//! Run with `cargo bench --bench replay`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use policies::caching::CachingDefaults;
use policies::spec::parse_policy_list;
use sim::{ReplayOptions, SimDevice, SimDeviceOptions};
use workloads::generate::{random, RandomOptions};

fn bench_replay(c: &mut Criterion) {
    let trace = random(&RandomOptions {
        seed: 3,
        events: 200_000,
        streams: 2,
        ..RandomOptions::default()
    })
    .unwrap();
    let specs = parse_policy_list(
        "caching,caching:expandable_segments=True,immediate,buddy,arena",
        &CachingDefaults::default(),
    )
    .unwrap();
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(trace.events.len() as u64));
    group.sample_size(20);
    for spec in &specs {
        group.bench_with_input(
            BenchmarkId::from_parameter(&spec.label),
            &spec.config,
            |b, config| {
                b.iter(|| {
                    let mut policy = config.build().unwrap();
                    let mut device = SimDevice::new(SimDeviceOptions::default());
                    sim::replay(
                        &trace,
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
