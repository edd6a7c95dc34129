//! Reads a snapshot pickle once and prints its size, the time taken, the entries read
//! and the process's peak resident memory (Linux `VmHWM`), for docs/performance.md.
//! With `--make N` it writes a synthetic snapshot of about N MiB to the path instead
//! (see benches/synth; `--no-frames` leaves the stack frames out). `--frames` keeps
//! the frames when reading.
//!
//! `cargo run --release -p workloads --example snapshot_read -- --make 1024 FILE [--no-frames]`
//! `cargo run --release -p workloads --example snapshot_read -- FILE [--frames]`

use std::path::PathBuf;
use std::time::Instant;

use workloads::snapshot::{read_snapshot_pickle_with, SnapshotOptions};

#[path = "../benches/synth/mod.rs"]
mod synth;

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let keep_frames = args.iter().any(|a| a == "--frames");
    let no_frames = args.iter().any(|a| a == "--no-frames");
    args.retain(|a| a != "--frames" && a != "--no-frames");
    if args.first().is_some_and(|a| a == "--make") {
        let mb: u64 = args[1].parse().expect("--make MiB");
        let path = PathBuf::from(&args[2]);
        let (bytes, entries) = synth::write_snapshot(&path, mb << 20, !no_frames).expect("writing");
        println!(
            "wrote {} ({bytes} bytes, {entries} entries)",
            path.display()
        );
        return;
    }
    let path = PathBuf::from(args.first().expect("a snapshot pickle"));
    let bytes = std::fs::metadata(&path).expect("the file").len();
    let start = Instant::now();
    let run = read_snapshot_pickle_with(&path, 0, &SnapshotOptions { keep_frames })
        .unwrap_or_else(|e| panic!("{e}"));
    let secs = start.elapsed().as_secs_f64();
    let peak = peak_rss_kib().unwrap_or(0) * 1024;
    println!(
        "{}: {:.1} MB in {:.2} s = {:.0} MB/s, {} entries, {} segments, peak RSS {:.1} MB = {:.2}x the file",
        path.display(),
        bytes as f64 / 1e6,
        secs,
        bytes as f64 / 1e6 / secs,
        run.entries.len(),
        run.segments.len(),
        peak as f64 / 1e6,
        peak as f64 / bytes as f64
    );
}
