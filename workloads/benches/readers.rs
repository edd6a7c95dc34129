//! Every trace reader, MB/s on small inputs (held in memory, so the disk is not
//! measured; nothing is written anywhere):
//!
//! - CSV: a 100 000-event `random` trace (seed 1, two streams) written as CSV, read
//!   whole (`read_csv_from`) and streamed (`CsvEvents`, what `allocsim replay` uses);
//! - YAML: the same trace written as YAML (`read_yaml_from`);
//! - recorded JSON: `tests/data/oracle/h100-torch2.11/gpt_train_small.json`, a real
//!   `record_torch.py` run (`read_recorded_json_from`, and `to_trace` after it);
//! - snapshot pickle: `random_stress.pickle`, a real PyTorch 2.11 snapshot
//!   (`read_snapshot_pickle`; `benches/snapshot.rs` measures a 512 MiB one);
//! - RMM log: the same 100 000 events written as an RMM `logging_resource_adaptor` log,
//!   each allocation at a fresh address, read whole (`read_rmm_from`), streamed
//!   (`RmmEvents`) and streamed on a second thread (`ReadAhead`, what `allocsim replay`
//!   uses where it may use two cores).
//!
//! Run with `cargo bench -p workloads --bench readers`; figures in docs/performance.md.

use std::fmt::Write as _;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use workloads::csv::EventStream;
use workloads::{random, Event, RandomOptions, Trace};

fn trace() -> Trace {
    random(&RandomOptions {
        seed: 1,
        events: 100_000,
        streams: 2,
        ..RandomOptions::default()
    })
    .expect("valid options")
}

/// `trace` as an RMM log: one line per allocation and free, allocations at fresh
/// addresses, streams as RMM prints them.
fn rmm_log(trace: &Trace) -> String {
    let mut out = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let mut live = std::collections::HashMap::new();
    let mut next = 0x7f00_0000_0000u64;
    for (i, e) in trace.events.iter().enumerate() {
        let time = format!(
            "10:{:02}:{:02}.{:06}",
            i / 60_000_000 % 60,
            i / 1_000_000 % 60,
            i % 1_000_000
        );
        match *e {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => {
                live.insert(id, (next, size_bytes, stream));
                let _ = writeln!(out, "1,{time},allocate,{next:#x},{size_bytes},{stream:#x}");
                next += size_bytes.div_ceil(256).max(1) * 256;
            }
            Event::Free { id } => {
                if let Some((ptr, size, stream)) = live.remove(&id) {
                    let _ = writeln!(out, "1,{time},free,{ptr:#x},{size},{stream:#x}");
                }
            }
            _ => {}
        }
    }
    out
}

fn bench_readers(c: &mut Criterion) {
    let t = trace();
    let mut csv = Vec::new();
    workloads::write_csv(&t, &mut csv).unwrap();
    let mut yaml = Vec::new();
    workloads::write_yaml(&t, &mut yaml).unwrap();
    let rmm = rmm_log(&t).into_bytes();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/oracle");
    let json_path = data.join("h100-torch2.11/gpt_train_small.json");
    let json = std::fs::read(&json_path).unwrap();
    let pickle = data.join("h100-torch2.11-pickles/random_stress.pickle");
    let pickle_len = std::fs::metadata(&pickle).unwrap().len();
    let name = Path::new("bench");

    let mut group = c.benchmark_group("read");
    group.sample_size(10);
    let mut bench = |id: BenchmarkId, bytes: usize, f: &mut dyn FnMut()| {
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(id, |b| b.iter(&mut *f));
    };
    bench(BenchmarkId::new("csv", "whole"), csv.len(), &mut || {
        workloads::read_csv_from(&csv[..], name).unwrap();
    });
    bench(BenchmarkId::new("csv", "streamed"), csv.len(), &mut || {
        let n = workloads::csv::CsvEvents::new(&csv[..], name).count();
        assert_eq!(n, t.events.len());
    });
    bench(BenchmarkId::new("yaml", "whole"), yaml.len(), &mut || {
        workloads::read_yaml_from(&yaml[..], name).unwrap();
    });
    bench(BenchmarkId::new("rmm", "whole"), rmm.len(), &mut || {
        workloads::rmm::read_rmm_from(&rmm[..], name).unwrap();
    });
    bench(BenchmarkId::new("rmm", "streamed"), rmm.len(), &mut || {
        let mut events = workloads::rmm::RmmEvents::new(&rmm[..], name);
        let n = events.by_ref().count();
        assert_eq!((n, events.stopped()), (t.events.len(), None));
    });
    // The same, read on a second thread and taken on this one (`ReadAhead`, what
    // `allocsim replay` does with a log where it may use two cores).
    let shared: std::sync::Arc<[u8]> = rmm.clone().into();
    bench(
        BenchmarkId::new("rmm", "read_ahead"),
        rmm.len(),
        &mut || {
            let reader = std::io::Cursor::new(std::sync::Arc::clone(&shared));
            let events = workloads::rmm::RmmEvents::new(reader, name);
            let mut ahead = workloads::ahead::ReadAhead::start(events).unwrap();
            let n = ahead.by_ref().count();
            assert_eq!((n, ahead.stopped()), (t.events.len(), None));
        },
    );
    bench(
        BenchmarkId::new("recorded_json", "gpt_train_small"),
        json.len(),
        &mut || {
            workloads::recorded::read_recorded_json_from(&json[..], &json_path).unwrap();
        },
    );
    bench(
        BenchmarkId::new("recorded_json_to_trace", "gpt_train_small"),
        json.len(),
        &mut || {
            let run = workloads::recorded::read_recorded_json_from(&json[..], &json_path).unwrap();
            run.to_trace().unwrap();
        },
    );
    bench(
        BenchmarkId::new("snapshot_pickle", "random_stress"),
        pickle_len as usize,
        &mut || {
            workloads::read_snapshot_pickle(&pickle, 0).unwrap();
        },
    );
    group.finish();
}

criterion_group!(benches, bench_readers);
criterion_main!(benches);
