//! The YAML trace format: readable, hand-written traces with sizes in units.
//!
//! ```yaml
//! # optional; the file stem otherwise
//! name: my-trace
//! events:
//!   - {op: alloc, id: 1, bytes: 1GiB, stream: 0}
//!   - {op: free, id: 1}
//!   - {op: empty_cache}
//!   - {op: mark, label: step 1}
//! ```
//!
//! Each event is a mapping with an `op` and exactly the keys that op takes:
//! `alloc` takes `id`, `bytes` and optionally `stream` (default 0); `free` (or its alias
//! `free_completed`) and `free_requested` take `id`; `empty_cache` takes nothing; `mark` takes `label`. `bytes` is an integer or a size
//! string (`512`, `4KiB`, `20MiB`, `1.5GiB`; see [`crate::size::parse_size`]); `id` and
//! `stream` are unsigned integers. Unknown keys and ops are refused rather than
//! ignored, because a misspelt `strem:` would otherwise silently replay on stream 0.
//!
//! Errors name `event N` (1-based position in the `events` list) for problems inside
//! an event, and the YAML parser's line and column for syntax errors. Events of the
//! returned trace are located by the same `event N` ([`LocationKind::Event`]).
//!
//! The writer emits one event per line in flow style, exactly like the example, with
//! plain integers for sizes and every string double-quoted (so any label reads back
//! unchanged); its output depends only on the trace, so it is deterministic.

use std::io;
use std::path::Path;

use serde::Deserialize;
use serde_yaml::Value;

use crate::csv::{file_stem, shorten};
use crate::size::parse_size;
use crate::trace::{AllocId, Event, LocationKind, Trace, TraceMeta};
use crate::{Format, ReadError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlTrace {
    #[serde(default)]
    name: Option<String>,
    events: Vec<Value>,
}

/// Reads a YAML trace from a file.
///
/// # Errors
/// I/O errors, YAML syntax errors (with line and column), and events that are not
/// valid (with `event N`).
pub fn read_yaml(path: &Path) -> Result<Trace, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
    read_yaml_from(io::BufReader::new(file), path)
}

/// Reads a YAML trace from any reader; `path` names the source in messages, and its
/// stem names the trace when the file has no `name`.
///
/// # Errors
/// As [`read_yaml`].
pub fn read_yaml_from(mut reader: impl io::Read, path: &Path) -> Result<Trace, ReadError> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::io(path, &e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ReadError::syntax(path, None, "not valid UTF-8 text"))?;
    let doc: YamlTrace = serde_yaml::from_str(&text).map_err(|e| yaml_error(path, &e))?;
    let mut events = Vec::with_capacity(doc.events.len());
    let mut problems = Vec::new();
    for (index, value) in doc.events.iter().enumerate() {
        // A malformed event is reported with every other one, not only the first.
        match parse_event(value) {
            Ok(event) => events.push(event),
            Err(message) => problems.push(ReadError::syntax(
                path,
                Some(format!("event {}", index + 1)),
                message,
            )),
        }
    }
    if let Some(e) = ReadError::collect(problems) {
        return Err(e);
    }
    Ok(Trace {
        name: doc.name.unwrap_or_else(|| file_stem(path)),
        path: Some(path.to_path_buf()),
        events,
        locations: Vec::new(),
        location_kind: LocationKind::Event,
        meta: TraceMeta::of_format(Format::Yaml),
    })
}

/// Writes `trace` as YAML: `name`, then `events` with one flow mapping per line.
/// Sizes are written as integers (exact), streams always, strings double-quoted.
///
/// # Errors
/// Errors of `out`.
pub fn write_yaml(trace: &Trace, mut out: impl io::Write) -> io::Result<()> {
    writeln!(out, "name: {}", quote(&trace.name))?;
    if trace.events.is_empty() {
        return writeln!(out, "events: []");
    }
    writeln!(out, "events:")?;
    for event in &trace.events {
        match event {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => writeln!(
                out,
                "  - {{op: alloc, id: {id}, bytes: {size_bytes}, stream: {stream}}}"
            )?,
            Event::FreeRequested { id } => writeln!(out, "  - {{op: free_requested, id: {id}}}")?,
            Event::Free { id } => writeln!(out, "  - {{op: free, id: {id}}}")?,
            Event::EmptyCache => writeln!(out, "  - {{op: empty_cache}}")?,
            Event::Mark { label } => writeln!(out, "  - {{op: mark, label: {}}}", quote(label))?,
        }
    }
    Ok(())
}

/// The keys each op takes, `op` first.
fn allowed_keys(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "alloc" => &["op", "id", "bytes", "stream"],
        "free" | "free_completed" | "free_requested" => &["op", "id"],
        "empty_cache" => &["op"],
        "mark" => &["op", "label"],
        _ => return None,
    })
}

fn parse_event(value: &Value) -> Result<Event, String> {
    let Value::Mapping(map) = value else {
        return Err(format!(
            "an event is a mapping like {{op: free, id: 1}}, found {}",
            describe(value)
        ));
    };
    let get = |key: &str| map.get(key);
    let op = match get("op") {
        Some(Value::String(op)) => op.as_str(),
        Some(other) => return Err(format!("op must be a name, found {}", describe(other))),
        None => {
            return Err("missing 'op' (alloc, free, free_requested, empty_cache or mark)".into())
        }
    };
    let Some(allowed) = allowed_keys(op) else {
        return Err(format!(
            "unknown op '{}' (expected alloc, free, free_requested, empty_cache or mark)",
            shorten(op)
        ));
    };
    for key in map.keys() {
        let known = matches!(key, Value::String(k) if allowed.contains(&k.as_str()));
        if !known {
            return Err(format!(
                "unknown key {} for op {op} (allowed: {})",
                describe(key),
                allowed.join(", ")
            ));
        }
    }
    let required = |key: &str| get(key).ok_or_else(|| format!("{op} needs '{key}'"));
    let uint = |key: &str, v: &Value| {
        v.as_u64().ok_or_else(|| {
            format!(
                "{op}: {key} must be an unsigned integer, found {}",
                describe(v)
            )
        })
    };
    Ok(match op {
        "alloc" => Event::Alloc {
            id: AllocId(uint("id", required("id")?)?),
            size_bytes: bytes(op, required("bytes")?)?,
            stream: match get("stream") {
                Some(v) => uint("stream", v)?,
                None => 0,
            },
        },
        "free" | "free_completed" => Event::Free {
            id: AllocId(uint("id", required("id")?)?),
        },
        "free_requested" => Event::FreeRequested {
            id: AllocId(uint("id", required("id")?)?),
        },
        "empty_cache" => Event::EmptyCache,
        _ => Event::Mark {
            label: match required("label")? {
                Value::String(s) => s.clone(),
                // `label: 3` or `label: true` mean the text as written.
                v @ (Value::Number(_) | Value::Bool(_)) => scalar_text(v),
                v => return Err(format!("mark: label must be text, found {}", describe(v))),
            },
        },
    })
}

fn bytes(op: &str, v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(|| {
            format!("{op}: bytes must be a whole number of bytes or a size like 4KiB, found {n}")
        }),
        Value::String(s) => parse_size(s).map_err(|e| format!("{op}: bytes: {e}")),
        other => Err(format!(
            "{op}: bytes must be an integer or a size like 4KiB, found {}",
            describe(other)
        )),
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// A short description of a YAML value for messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{}'", shorten(s)),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A YAML double-quoted scalar that reads back as exactly `text`. Everything outside
/// YAML's printable set, and the characters YAML parsers treat as line breaks (NEL,
/// LS, PS) or strip (BOM), is escaped.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fefe}' | '\u{ff00}'..='\u{fffd}' => {
                if matches!(c, '\u{2028}' | '\u{2029}') {
                    out.push_str(&format!("\\u{:04X}", c as u32));
                } else {
                    out.push(c);
                }
            }
            c if (c as u32) >= 0x10000 => out.push(c),
            c => out.push_str(&format!("\\u{:04X}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn yaml_error(path: &Path, e: &serde_yaml::Error) -> ReadError {
    let mut message = e.to_string();
    let location = e.location().map(|l| {
        // serde_yaml puts " at line L column C" in the message; the location has its
        // own place.
        let mark = format!(" at line {} column {}", l.line(), l.column());
        message = message.replacen(&mark, "", 1);
        format!("line {} column {}", l.line(), l.column())
    });
    let message = message.replace('\n', " ");
    ReadError::syntax(path, location, format!("not a YAML trace: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every malformed event is reported, in order, not only the first.
    #[test]
    fn every_bad_event_is_reported() {
        let text =
            "events:\n  - {op: alloc, id: 1, bytes: lots}\n  - {op: free, id: 1}\n  - {op: warp}\n";
        let e = read_yaml_from(text.as_bytes(), Path::new("t.yaml")).unwrap_err();
        let places: Vec<_> = e.all().map(|p| p.location.clone().unwrap()).collect();
        assert_eq!(places, ["event 1", "event 3"]);
        assert!(
            e.to_string().ends_with("(and 1 more problem in this file)"),
            "{e}"
        );
    }

    fn read(text: &str) -> Result<Trace, ReadError> {
        read_yaml_from(text.as_bytes(), Path::new("dir/t.yaml"))
    }

    fn read_err(text: &str) -> String {
        read(text).unwrap_err().to_string()
    }

    fn write(trace: &Trace) -> String {
        let mut out = Vec::new();
        write_yaml(trace, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The example of the module docs reads as documented: units, default stream,
    /// name, event locations.
    #[test]
    fn reads_documented_example() {
        let t = read(
            "# optional\nname: my-trace\nevents:\n  - {op: alloc, id: 1, bytes: 1GiB, stream: 0}\n  - {op: alloc, id: 2, bytes: 1.5KiB}\n  - {op: free, id: 1}\n  - {op: empty_cache}\n  - {op: mark, label: step 1}\n",
        )
        .unwrap();
        assert_eq!(t.name, "my-trace");
        assert_eq!(
            t.events,
            vec![
                Event::Alloc {
                    id: AllocId(1),
                    size_bytes: 1 << 30,
                    stream: 0
                },
                Event::Alloc {
                    id: AllocId(2),
                    size_bytes: 1536,
                    stream: 0
                },
                Event::Free { id: AllocId(1) },
                Event::EmptyCache,
                Event::Mark {
                    label: "step 1".into()
                },
            ]
        );
        assert_eq!(t.describe(2), "dir/t.yaml: event 3");
    }

    /// Without `name` the trace is named after the file stem; block style works too.
    #[test]
    fn name_defaults_to_file_stem() {
        let t = read("events:\n  - op: alloc\n    id: 4\n    bytes: 512\n").unwrap();
        assert_eq!(t.name, "t");
        assert_eq!(t.events.len(), 1);
        assert!(read("events: []").unwrap().events.is_empty());
    }

    /// The writer emits the documented flow style with integer sizes.
    #[test]
    fn writes_documented_shape() {
        let t = Trace::new(
            "demo",
            vec![
                Event::Alloc {
                    id: AllocId(1),
                    size_bytes: 1 << 30,
                    stream: 0,
                },
                Event::Free { id: AllocId(1) },
                Event::EmptyCache,
                Event::Mark {
                    label: "step 1".into(),
                },
            ],
        );
        assert_eq!(
            write(&t),
            "name: \"demo\"\nevents:\n  - {op: alloc, id: 1, bytes: 1073741824, stream: 0}\n  - {op: free, id: 1}\n  - {op: empty_cache}\n  - {op: mark, label: \"step 1\"}\n"
        );
        assert_eq!(write(&Trace::new("e", vec![])), "name: \"e\"\nevents: []\n");
    }

    /// `free_requested` reads and writes as the delayed free, `free_completed` reads as
    /// `free`, and both take only an id.
    #[test]
    fn free_requested_and_free_completed_ops() {
        let t = read(
            "events:\n  - {op: alloc, id: 1, bytes: 8}\n  - {op: free_requested, id: 1}\n  - {op: free_completed, id: 1}\n",
        )
        .unwrap();
        assert_eq!(
            t.events[1..],
            [
                Event::FreeRequested { id: AllocId(1) },
                Event::Free { id: AllocId(1) }
            ]
        );
        assert!(write(&t).ends_with("  - {op: free_requested, id: 1}\n  - {op: free, id: 1}\n"));
        assert_eq!(t.meta.format, Some(Format::Yaml));
        let e = read_err("events:\n  - {op: free_requested, id: 1, stream: 2}\n");
        assert!(
            e.contains("event 1: unknown key 'stream' for op free_requested (allowed: op, id)"),
            "{e}"
        );
    }

    /// Event problems name `event N` and say what is wrong, on one line.
    #[test]
    fn bad_events_name_their_position() {
        let cases = [
            ("{op: allocate, id: 1}", "event 2: unknown op 'allocate'"),
            (
                "{op: alloc, id: 1, bytes: 5, strem: 1}",
                "event 2: unknown key 'strem' for op alloc (allowed: op, id, bytes, stream)",
            ),
            (
                "{op: free, id: 1, bytes: 5}",
                "event 2: unknown key 'bytes' for op free (allowed: op, id)",
            ),
            ("{op: alloc, id: 1}", "event 2: alloc needs 'bytes'"),
            ("{id: 1}", "event 2: missing 'op'"),
            (
                "{op: alloc, id: -1, bytes: 5}",
                "event 2: alloc: id must be an unsigned integer, found -1",
            ),
            (
                "{op: alloc, id: 1, bytes: 4XB}",
                "event 2: alloc: bytes: '4XB' has an unknown unit",
            ),
            (
                "{op: alloc, id: 1, bytes: 1.5}",
                "event 2: alloc: bytes must be a whole number of bytes",
            ),
            (
                "{op: alloc, id: 1, bytes: [1]}",
                "event 2: alloc: bytes must be an integer or a size like 4KiB, found a list",
            ),
            (
                "{op: free, id: '1'}",
                "event 2: free: id must be an unsigned integer, found '1'",
            ),
            ("{op: mark}", "event 2: mark needs 'label'"),
            ("free 1", "event 2: an event is a mapping"),
        ];
        for (event, want) in cases {
            let got = read_err(&format!("events:\n  - {{op: empty_cache}}\n  - {event}\n"));
            assert!(
                got.starts_with(&format!("dir/t.yaml: {want}")),
                "{event}: {got}"
            );
            assert!(!got.contains('\n'), "{got}");
        }
    }

    /// YAML syntax errors and wrong top-level shapes give the parser's line and column.
    #[test]
    fn syntax_errors_give_line_and_column() {
        let e = read_err("events:\n  - {op: free, id: 1\n");
        assert!(e.starts_with("dir/t.yaml: line "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = read_err("name: x\nevent:\n  - {op: empty_cache}\n");
        assert!(
            e.starts_with("dir/t.yaml: line 2 column 1: not a YAML trace: unknown field `event`"),
            "{e}"
        );
        assert!(read_err("").contains("not a YAML trace"));
        assert!(read_err("events: 5").contains("not a YAML trace"));
    }

    /// Labels and names with quotes, escapes, line breaks and odd Unicode read back.
    #[test]
    fn strings_survive_quoting() {
        for s in [
            "",
            "plain",
            "a: b",
            "\"q\" \\ x",
            "tab\tnl\ncr\r",
            "\u{85}\u{2028}\u{feff}\u{0}\u{7f}\u{1F600}",
            "yes",
            "1.0",
            "~",
            "- x",
            "#c",
        ] {
            let t = Trace::new(s, vec![Event::Mark { label: s.into() }]);
            let back = read(&write(&t)).unwrap();
            assert_eq!(back.name, s);
            assert_eq!(back.events, t.events, "{s:?}");
        }
    }

    fn event_strategy() -> impl Strategy<Value = Event> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(id, size_bytes, stream)| {
                Event::Alloc {
                    id: AllocId(id),
                    size_bytes,
                    stream,
                }
            }),
            any::<u64>().prop_map(|id| Event::Free { id: AllocId(id) }),
            any::<u64>().prop_map(|id| Event::FreeRequested { id: AllocId(id) }),
            Just(Event::EmptyCache),
            any::<String>().prop_map(|label| Event::Mark { label }),
        ]
    }

    proptest! {
        /// Writing then reading gives the same name and events; writing is deterministic.
        #[test]
        fn round_trip(name in any::<String>(), events in proptest::collection::vec(event_strategy(), 0..30)) {
            let t = Trace::new(name, events);
            let text = write(&t);
            prop_assert_eq!(&text, &write(&t));
            let back = read(&text).unwrap();
            prop_assert_eq!(back.name, t.name);
            prop_assert_eq!(back.events, t.events);
        }

        /// No input makes the reader panic.
        #[test]
        fn never_panics(body in "(events:\n)?[-a-z0-9{}:, \n\\[\\]'\"]{0,80}") {
            let _ = read(&body);
        }
    }
}
