//! Snapshot pickle reading: MB/s of `read_snapshot_pickle` on a synthetic snapshot of
//! about 512 MiB (set `SNAPSHOT_BENCH_MB` for another size) made from the real ones in
//! tests/data/oracle (see `synth`), with stack frames, written to the system's
//! temporary directory first (not committed). Peak memory is measured by the
//! `snapshot_read` example in its own process. Figures, machine and command are in
//! docs/performance.md.
//!
//! Run with `cargo bench -p workloads --bench snapshot`.

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use workloads::snapshot::{read_snapshot_pickle, read_snapshot_pickle_with, SnapshotOptions};

mod synth;

fn bench_file() -> PathBuf {
    let mb: u64 = std::env::var("SNAPSHOT_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let path = std::env::temp_dir().join(format!("allocsim-bench-snapshot-{mb}MiB.pickle"));
    if !path.exists() {
        let tmp = path.with_extension("tmp");
        synth::write_snapshot(&tmp, mb << 20, true).expect("writing the synthetic snapshot");
        std::fs::rename(&tmp, &path).expect("renaming the synthetic snapshot");
    }
    path
}

fn bench_read(c: &mut Criterion) {
    let big = bench_file();
    let real = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/oracle/h100-torch2.11-pickles/random_stress.pickle");
    let mut group = c.benchmark_group("snapshot_read");
    group.sample_size(10);
    for (name, path) in [("random_stress", &real), ("synthetic", &big)] {
        let bytes = std::fs::metadata(path).unwrap().len();
        group.throughput(Throughput::Bytes(bytes));
        group.bench_with_input(BenchmarkId::new("default", name), path, |b, path| {
            b.iter(|| read_snapshot_pickle(path, 0).unwrap())
        });
    }
    let bytes = std::fs::metadata(&big).unwrap().len();
    group.throughput(Throughput::Bytes(bytes));
    let keep = SnapshotOptions { keep_frames: true };
    group.bench_with_input(
        BenchmarkId::new("keep_frames", "synthetic"),
        &big,
        |b, path| b.iter(|| read_snapshot_pickle_with(path, 0, &keep).unwrap()),
    );
    group.finish();
}

criterion_group!(benches, bench_read);
criterion_main!(benches);
