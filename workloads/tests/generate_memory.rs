//! Generators write as they go: `allocsim generate`'s path (`Generator::write`) keeps
//! nothing per event, so its peak heap does not grow with the trace's length (it held
//! the whole trace before writing: 6.26 GB at 10^8 events). Measured by a counting
//! allocator (this test binary's own; one test, so nothing runs beside it).

use std::io;
use std::path::Path;

use workloads::generate::spec::read_spec;
use workloads::Format;

mod common;
use common::peak_during;

/// A writer that keeps nothing, counting the bytes it is given.
#[derive(Default)]
struct Counting(u64);

impl io::Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Each generator, in each format, writes a trace of tens of MB in a peak heap of at
/// most 2 MB (holding its events would take 32 bytes each, and the first generator
/// here makes 600 000 of them).
#[test]
fn generators_write_as_they_go() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/generators");
    let specs: [(Option<&str>, &str, &[&str]); 3] = [
        (None, "random", &["events=600000", "mark_every=1000"]),
        (Some("mlp_train.yaml"), "training", &["steps=8000"]),
        (Some("inference.yaml"), "inference", &["batches=40"]),
    ];
    for (file, kind, settings) in specs {
        let text = file.map(|f| std::fs::read_to_string(examples.join(f)).unwrap());
        let path = file.map(|f| examples.join(f));
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        let (generator, _) =
            read_spec(text.as_deref().zip(path.as_deref()), Some(kind), &settings).unwrap();
        for format in [Format::Csv, Format::Yaml] {
            let mut out = Counting::default();
            let (written, peak) = peak_during(|| generator.write(format, &mut out).unwrap());
            assert!(written > 300_000, "{kind}: {written} events");
            assert!(
                peak < 2 << 20,
                "{kind} as {format}: peak heap {peak} bytes for {written} events ({} bytes written)",
                out.0
            );
        }
    }
}
