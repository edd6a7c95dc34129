//! Hostile inputs for the text readers (YAML, CSV, recorded JSON, RMM logs): endless
//! streams, deep nesting.

use std::io::{self, Read};
use std::path::Path;

/// An endless stream of one byte that fails the test once a reader has taken more than
/// 64 MiB of it (a reader that reads to the end never stops).
struct Endless {
    byte: u8,
    given: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(
            self.given < 64 << 20,
            "the reader took 64 MiB of an endless input of {:#x} bytes",
            self.byte
        );
        buf.fill(self.byte);
        self.given += buf.len() as u64;
        Ok(buf.len())
    }
}

fn endless(byte: u8) -> Endless {
    Endless { byte, given: 0 }
}

/// `/dev/zero` and other endless inputs are refused by every text reader after a
/// bounded read, with a one-line message naming the file, instead of being read until
/// memory runs out.
#[test]
fn endless_inputs_are_refused() {
    for byte in [0u8, b'a', b' ', b'\n'] {
        let e = workloads::read_yaml_from(endless(byte), Path::new("zero.yaml")).unwrap_err();
        assert!(e.to_string().starts_with("zero.yaml"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        let e = workloads::read_csv_from(endless(byte), Path::new("zero.csv")).unwrap_err();
        assert!(e.to_string().starts_with("zero.csv"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        // The RMM log reader read a line without a break until memory ran out.
        let e = workloads::rmm::read_rmm_from(endless(byte), Path::new("zero.log")).unwrap_err();
        assert!(e.to_string().starts_with("zero.log: line 1"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        let header = format!("{}\n", workloads::rmm::RMM_HEADER);
        let after_header = io::Read::chain(header.as_bytes(), endless(byte));
        if byte != b'\n' {
            let e = workloads::rmm::read_rmm_from(after_header, Path::new("zero.log")).unwrap_err();
            assert!(e.to_string().starts_with("zero.log: line 2"), "{e}");
        }
    }
    for byte in [0u8, b'a', b'[', b'{'] {
        let e =
            workloads::read_recorded_json_from(endless(byte), Path::new("zero.json")).unwrap_err();
        assert!(e.to_string().starts_with("zero.json: line 1"), "{e}");
    }
    let e = workloads::read_yaml_from(endless(0), Path::new("z.yaml")).unwrap_err();
    assert!(e.to_string().contains("unprintable"), "{e}");
    let e = workloads::read_csv_from(endless(0), Path::new("z.csv")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("z.csv: line 1: not a CSV trace: a row longer than 1048576 bytes"),
        "{e}"
    );
}

/// Deeply nested YAML is refused at the first level too deep, naming its line and
/// column, instead of after minutes of parsing (600 KB of `[` took 149 s to a
/// "recursion limit exceeded"; nested `{a: ` 31 s).
#[test]
fn deep_yaml_nesting_is_refused_early() {
    let n = 600_000;
    for (prefix, open) in [("events: ", "["), ("events:\n  - {op: free, id: ", "{a: ")] {
        let text = format!("{prefix}{}", open.repeat(n));
        let e = workloads::read_yaml_from(text.as_bytes(), Path::new("deep.yaml"))
            .unwrap_err()
            .to_string();
        // Refused by the reader's bound, or by the parser's own (256 levels) when its
        // lookahead for a key gets there first.
        assert!(
            e.contains("nested more than 16 deep") || e.contains("recursion limit exceeded"),
            "{e}"
        );
        let column: usize = e
            .split("column ")
            .nth(1)
            .and_then(|c| c.split(':').next())
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{e}"));
        assert!(column < 1100, "{e}");
    }
    // At the top level and in keys it is refused at once as the wrong shape.
    for text in ["[".repeat(n), "{a: ".repeat(n)] {
        let e = workloads::read_yaml_from(text.as_bytes(), Path::new("deep.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("deep.yaml: line 1 column "), "{e}");
    }
}

/// Anchors and aliases of scalars and whole events are followed; an alias to a
/// collection inside an event is refused as the wrong type, not expanded.
#[test]
fn yaml_anchors_and_aliases() {
    let text = "events:\n  - &e {op: alloc, id: 1, bytes: &sz 4KiB}\n  - {op: free, id: 1}\n  - *e\n  - {op: alloc, id: 2, bytes: *sz}\n";
    let t = workloads::read_yaml_from(text.as_bytes(), Path::new("a.yaml")).unwrap();
    assert_eq!(t.events.len(), 4);
    assert_eq!(t.events[2], t.events[0]);
    assert_eq!(
        t.events[3],
        workloads::Event::Alloc {
            id: workloads::AllocId(2),
            size_bytes: 4096,
            stream: 0
        }
    );
    let text =
        "events:\n  - {op: alloc, id: 1, bytes: &l [1, 2]}\n  - {op: alloc, id: 2, bytes: *l}\n";
    let e = workloads::read_yaml_from(text.as_bytes(), Path::new("a.yaml")).unwrap_err();
    assert_eq!(e.count(), 2);
    assert!(e.to_string().contains("found a list"), "{e}");
}
