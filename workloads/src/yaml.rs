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
//! `free_completed`) and `free_requested` take `id`; `empty_cache` takes nothing, or a
//! `pool` (that private pool's cache only); `mark` takes `label`.
//!
//! PyTorch's other allocator calls (`docs/trace-format.md`): `create_pool` takes `pool`
//! and optionally `use_on_oom` and `no_split` (booleans, default false);
//! `begin_allocate_to_pool` takes `pool` and optionally `streams` (a list; absent: every
//! stream); `end_allocate_to_pool` and `release_pool` take `pool`;
//! `set_allocator_settings` takes `conf`; `reset_peak_memory_stats` and
//! `reset_accumulated_memory_stats` take nothing; `caching_allocator_enable` takes
//! `enabled`. A pool is PyTorch's id pair, `[1, 0]`. Requests captured into a CUDA graph
//! on stream 7:
//!
//! ```yaml
//!   - {op: begin_allocate_to_pool, pool: [1, 0], streams: [7]}
//!   - {op: alloc, id: 9, bytes: 64MiB, stream: 7}
//!   - {op: end_allocate_to_pool, pool: [1, 0]}
//!   - {op: release_pool, pool: [1, 0]}
//! ``` `bytes` is an integer or a size
//! string (`512`, `4KiB`, `20MiB`, `1.5GiB`; see [`crate::size::parse_size`]); `id` and
//! `stream` are unsigned integers. Unknown keys and ops are refused rather than
//! ignored, because a misspelt `strem:` would otherwise silently replay on stream 0.
//!
//! Errors name `event N` (position in the `events` list from 0, the numbering of every
//! replay output) for problems inside
//! an event, and the YAML parser's line and column for syntax errors. Events of the
//! returned trace are located by the same `event N` ([`LocationKind::Event`]).
//!
//! The writer emits one event per line in flow style, exactly like the example, with
//! plain integers for sizes and every string double-quoted (so any label reads back
//! unchanged); its output depends only on the trace, so it is deterministic.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, BufRead};
use std::path::Path;
use std::rc::Rc;

use saphyr_parser::{Event as YamlEvent, Parser, ScalarStyle, ScanError, Span};

use crate::csv::{file_stem, shorten};
use crate::ids::{is_number, IdTable, IdToken};
use crate::size::parse_size;
use crate::trace::{AllocId, Event, LocationKind, PoolId, PoolStreams, Trace, TraceMeta, OP_NAMES};
use crate::{Format, Problems, ReadError};

/// Collections nested deeper than this are refused at once: a trace needs three levels
/// (the document, `events`, an event), and a hostile file of a million `[` must not
/// cost time before it is refused.
pub const MAX_NESTING: usize = 16;

/// The most characters the reader takes between two YAML events (one scalar, comment
/// or run of blanks): bounds what a file with no structure (`/dev/zero`, a giant
/// scalar) can cost before it is refused.
pub const MAX_TOKEN_CHARS: usize = 1 << 20;

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
/// The file is read as a stream of YAML events, never held whole: memory is the trace
/// itself plus one token ([`MAX_TOKEN_CHARS`]), nesting is bounded ([`MAX_NESTING`]),
/// and the first few malformed events are kept with a count of the rest
/// ([`Problems`]). Scalars resolve as in YAML 1.2's core schema: plain `~`/`null`/empty
/// are null, `true`/`false` booleans, decimal, `0x` and `0o` integers and decimal
/// floats numbers, anything else and every quoted scalar text. Anchors and aliases are
/// followed for scalars and whole events.
///
/// # Errors
/// As [`read_yaml`].
pub fn read_yaml_from(reader: impl io::Read, path: &Path) -> Result<Trace, ReadError> {
    let state = Rc::new(RefCell::new(InputState::default()));
    let chars = Utf8Chars {
        reader: io::BufReader::with_capacity(64 << 10, reader),
        text: String::new(),
        pos: 0,
        pending: Vec::new(),
        state: Rc::clone(&state),
    };
    let mut reader = YamlReader {
        path,
        parser: Parser::new_from_iter(chars),
        state,
        anchors: HashMap::new(),
        last: Span::default(),
    };
    reader.document()
}

/// Where the character stream stopped early, and how far it is into the current
/// token.
#[derive(Default)]
struct InputState {
    failure: Option<InputFailure>,
    since_event: usize,
}

enum InputFailure {
    Io(io::Error),
    Utf8,
    TokenTooLong,
}

/// The characters of a byte stream, decoded as UTF-8 64 KiB at a time; stops (and says
/// why in the shared state) at an I/O error, invalid UTF-8, or a token longer than
/// [`MAX_TOKEN_CHARS`].
struct Utf8Chars<R> {
    reader: io::BufReader<R>,
    text: String,
    pos: usize,
    /// The bytes of a character cut at the end of the last chunk.
    pending: Vec<u8>,
    state: Rc<RefCell<InputState>>,
}

impl<R: io::Read> Utf8Chars<R> {
    fn stop(&mut self, why: InputFailure) -> Option<char> {
        let mut state = self.state.borrow_mut();
        if state.failure.is_none() {
            state.failure = Some(why);
        }
        None
    }

    /// The next chunk of text; `false` at the end of the input or a failure.
    fn refill(&mut self) -> bool {
        self.text.clear();
        self.pos = 0;
        let chunk = match self.reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return true,
            Err(e) => {
                self.stop(InputFailure::Io(e));
                return false;
            }
        };
        if chunk.is_empty() {
            if !self.pending.is_empty() {
                self.stop(InputFailure::Utf8);
            }
            return false;
        }
        let n = chunk.len();
        self.pending.extend_from_slice(chunk);
        self.reader.consume(n);
        let bytes = std::mem::take(&mut self.pending);
        match std::str::from_utf8(&bytes) {
            Ok(text) => self.text.push_str(text),
            Err(e) if e.error_len().is_none() => {
                // A character cut at the chunk's end: keep its bytes for the next one.
                let valid = e.valid_up_to();
                self.text
                    .push_str(std::str::from_utf8(&bytes[..valid]).expect("valid prefix"));
                self.pending.extend_from_slice(&bytes[valid..]);
            }
            Err(_) => {
                self.stop(InputFailure::Utf8);
                return false;
            }
        }
        true
    }
}

impl<R: io::Read> Iterator for Utf8Chars<R> {
    type Item = char;

    fn next(&mut self) -> Option<char> {
        if self.state.borrow().failure.is_some() {
            return None;
        }
        while self.pos >= self.text.len() {
            if !self.refill() {
                return None;
            }
        }
        {
            let mut state = self.state.borrow_mut();
            state.since_event += 1;
            if state.since_event > MAX_TOKEN_CHARS {
                drop(state);
                return self.stop(InputFailure::TokenTooLong);
            }
        }
        let c = self.text[self.pos..].chars().next()?;
        self.pos += c.len_utf8();
        Some(c)
    }
}

/// A scalar as written, and whether it was plain (unquoted), which decides how it
/// resolves.
#[derive(Clone, Debug)]
struct Scalar {
    text: String,
    plain: bool,
}

/// An event field's value: a scalar resolved by the core schema, or a collection
/// (which no field takes; only its kind is kept for the message).
#[derive(Clone, Debug)]
enum Value {
    Null,
    Bool(bool),
    /// An integer as written, and its value when it fits.
    Int(String, Option<i128>),
    Float(String),
    Text(String),
    /// A sequence: its scalar items (a nested collection is an item `Map`).
    List(Vec<Value>),
    Map,
}

impl Value {
    fn of(s: &Scalar) -> Value {
        if !s.plain {
            return Value::Text(s.text.clone());
        }
        let t = s.text.as_str();
        match t {
            "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
            "true" | "True" | "TRUE" => return Value::Bool(true),
            "false" | "False" | "FALSE" => return Value::Bool(false),
            _ => {}
        }
        if let Some(v) = parse_int(t) {
            return Value::Int(t.to_string(), v);
        }
        let digits = t.trim_start_matches(['+', '-']);
        let is_float = matches!(digits, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN")
            || (digits.bytes().any(|b| b.is_ascii_digit())
                && digits
                    .bytes()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
                && t.parse::<f64>().is_ok());
        if is_float {
            Value::Float(t.to_string())
        } else {
            Value::Text(t.to_string())
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(_, Some(v)) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// A short description for messages.
    fn describe(&self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(t, _) | Value::Float(t) => shorten(t),
            Value::Text(t) => format!("'{}'", shorten(t)),
            Value::List(_) => "a list".into(),
            Value::Map => "a mapping".into(),
        }
    }
}

/// An integer in the core schema's forms: decimal with an optional sign, `0x` hex,
/// `0o` octal. `Some(None)` for one too large for any field.
fn parse_int(t: &str) -> Option<Option<i128>> {
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (radix, digits) = if let Some(h) = body.strip_prefix("0x") {
        (16, h)
    } else if let Some(o) = body.strip_prefix("0o") {
        (8, o)
    } else {
        (10, body)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let value = i128::from_str_radix(digits, radix)
        .ok()
        .map(|v| if negative { -v } else { v });
    Some(value)
}

/// An event and its id as written (the event's own id is a placeholder until
/// [`IdTable::finish`]), or why the mapping is not an event.
type Parsed = Result<(Event, Option<IdToken>), String>;

/// What an anchor names: a scalar, or a whole event (or a malformed one's message).
#[derive(Clone)]
enum Anchored {
    Scalar(Scalar),
    Event(Parsed),
    Other(Value),
}

struct YamlReader<'p, 'i, I: Iterator<Item = char> + 'i> {
    path: &'p Path,
    parser: Parser<'i, saphyr_parser::BufferedInput<I>>,
    state: Rc<RefCell<InputState>>,
    anchors: HashMap<usize, Anchored>,
    /// Where the last event was, for messages about it.
    last: Span,
}

impl<'i, I: Iterator<Item = char> + 'i> YamlReader<'_, 'i, I> {
    fn error_at(&self, span: Span, message: impl std::fmt::Display) -> ReadError {
        ReadError::syntax(
            self.path,
            Some(format!(
                "line {} column {}",
                span.start.line(),
                span.start.col() + 1
            )),
            format!("not a YAML trace: {message}"),
        )
    }

    /// Why the input stopped, if it did; else the parser's error.
    fn input_error(&self, scan: Option<ScanError>) -> ReadError {
        let failure = self.state.borrow_mut().failure.take();
        match failure {
            Some(InputFailure::Io(e)) => ReadError::io(self.path, &e),
            Some(InputFailure::Utf8) => ReadError::syntax(self.path, None, "not valid UTF-8 text"),
            Some(InputFailure::TokenTooLong) => self.error_at(
                self.last,
                format!(
                    "more than {MAX_TOKEN_CHARS} characters without YAML structure after this place \
                     (a trace's scalars are short)"
                ),
            ),
            None => match scan {
                Some(e) => {
                    let m = e.marker();
                    ReadError::syntax(
                        self.path,
                        Some(format!("line {} column {}", m.line(), m.col() + 1)),
                        format!("not a YAML trace: {}", e.info()),
                    )
                }
                None => self.error_at(self.last, "the file ends inside the document"),
            },
        }
    }

    /// The next event; the end of the stream and every failure are errors (a
    /// well-formed trace is read to its `StreamEnd` explicitly).
    fn next(&mut self) -> Result<(YamlEvent<'i>, Span), ReadError> {
        match self.parser.next_event() {
            Some(Ok((event, span))) => {
                if self.state.borrow().failure.is_some() {
                    return Err(self.input_error(None));
                }
                self.state.borrow_mut().since_event = 0;
                self.last = span;
                Ok((event, span))
            }
            Some(Err(e)) => Err(self.input_error(Some(e))),
            None => Err(self.input_error(None)),
        }
    }

    fn document(&mut self) -> Result<Trace, ReadError> {
        let mut name = None;
        let mut events = Vec::new();
        let mut problems = Problems::default();
        let mut ids = IdTable::new();
        let mut seen_events = false;
        let mut meta = TraceMeta::of_format(Format::Yaml);
        let mut seen_recorded = false;
        loop {
            let (event, span) = self.next()?;
            match event {
                YamlEvent::StreamStart | YamlEvent::DocumentStart(_) | YamlEvent::Nothing => {}
                YamlEvent::MappingStart(..) => break,
                YamlEvent::StreamEnd => {
                    return Err(
                        self.error_at(span, "empty document (a trace is a mapping with `events`)")
                    )
                }
                _ => {
                    return Err(self.error_at(
                        span,
                        "a trace is a mapping with `events` (and optionally `name`)",
                    ))
                }
            }
        }
        loop {
            let (event, span) = self.next()?;
            let key = match event {
                YamlEvent::MappingEnd => break,
                YamlEvent::Scalar(text, ..) => text.into_owned(),
                _ => {
                    return Err(
                        self.error_at(span, "a key of the trace is `name`, `recorded` or `events`")
                    )
                }
            };
            match key.as_str() {
                "name" if name.is_none() => {
                    let (event, span) = self.next()?;
                    name = Some(match event {
                        YamlEvent::Scalar(text, ..) => text.into_owned(),
                        _ => return Err(self.error_at(span, "name: expected text")),
                    });
                }
                "events" if !seen_events => {
                    seen_events = true;
                    let (event, span) = self.next()?;
                    match event {
                        YamlEvent::SequenceStart(..) => {}
                        _ => return Err(self.error_at(span, "events: expected a list of events")),
                    }
                    self.events(&mut events, &mut ids, &mut problems)?;
                }
                "recorded" if !seen_recorded => {
                    seen_recorded = true;
                    self.recorded(&mut meta)?;
                }
                "name" | "events" | "recorded" => {
                    return Err(self.error_at(span, format!("duplicate field `{key}`")))
                }
                other => {
                    return Err(self.error_at(
                        span,
                        format!(
                            "unknown field `{}`, expected `name`, `recorded` or `events`",
                            shorten(other)
                        ),
                    ))
                }
            }
        }
        loop {
            let (event, span) = self.next()?;
            match event {
                YamlEvent::DocumentEnd => {}
                YamlEvent::StreamEnd => break,
                _ => {
                    return Err(
                        self.error_at(span, "a trace file holds one YAML document, found a second")
                    )
                }
            }
        }
        if !seen_events {
            return Err(self.error_at(self.last, "missing field `events`"));
        }
        if let Some(e) = problems.into_error() {
            return Err(e);
        }
        let id_names = ids.finish(&mut events);
        Ok(Trace {
            name: name.unwrap_or_else(|| file_stem(self.path)),
            path: Some(self.path.to_path_buf()),
            events,
            locations: Vec::new(),
            location_kind: LocationKind::Event,
            meta,
            id_names,
            times_us: Vec::new(),
            start: None,
        })
    }

    /// The items of `events` up to its end.
    fn events(
        &mut self,
        out: &mut Vec<Event>,
        ids: &mut IdTable,
        problems: &mut Problems,
    ) -> Result<(), ReadError> {
        loop {
            let (event, span) = self.next()?;
            let parsed = match event {
                YamlEvent::SequenceEnd => return Ok(()),
                YamlEvent::MappingStart(anchor, _) => {
                    let parsed = self.event_mapping()?;
                    if anchor > 0 {
                        self.anchors.insert(anchor, Anchored::Event(parsed.clone()));
                    }
                    parsed
                }
                YamlEvent::Alias(id) => match self.anchors.get(&id) {
                    Some(Anchored::Event(e)) => e.clone(),
                    Some(Anchored::Scalar(s)) => Err(not_a_mapping(&Value::of(s))),
                    Some(Anchored::Other(v)) => Err(not_a_mapping(v)),
                    None => return Err(self.error_at(span, "an alias to an unknown anchor")),
                },
                other => {
                    let value = self.value(other, 2)?;
                    Err(not_a_mapping(&value))
                }
            };
            match parsed {
                Ok((event, token)) => ids.push(out, event, token),
                // A malformed event is reported with the others, not only the first.
                Err(message) => problems.push(ReadError::syntax(
                    self.path,
                    Some(format!("event {}", out.len() + problems.len())),
                    message,
                )),
            }
        }
    }

    /// The `recorded` mapping: what the run a converted trace came from recorded
    /// (`TraceMeta`'s fields, as `write_yaml` writes them).
    fn recorded(&mut self, meta: &mut TraceMeta) -> Result<(), ReadError> {
        let (event, span) = self.next()?;
        if !matches!(event, YamlEvent::MappingStart(..)) {
            return Err(self.error_at(span, "recorded: expected a mapping"));
        }
        loop {
            let (event, span) = self.next()?;
            let key = match event {
                YamlEvent::MappingEnd => return Ok(()),
                YamlEvent::Scalar(text, ..) => text.into_owned(),
                _ => return Err(self.error_at(span, "recorded: a key is text")),
            };
            let (event, vspan) = self.next()?;
            let value = self.value(event, 2)?;
            let text = |v: &Value| match v {
                Value::Text(t) | Value::Int(t, _) | Value::Float(t) => Some(t.clone()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            };
            let bad =
                |what: &str| self.error_at(vspan, format!("recorded: {key}: expected {what}"));
            match key.as_str() {
                "workload" => meta.workload = Some(text(&value).ok_or_else(|| bad("text"))?),
                "alloc_conf" => {
                    meta.alloc_conf = Some(match value {
                        Value::Null => String::new(),
                        v => text(&v).ok_or_else(|| bad("text"))?,
                    })
                }
                "device" => meta.device = Some(text(&value).ok_or_else(|| bad("text"))?),
                "torch_version" => {
                    meta.torch_version = Some(text(&value).ok_or_else(|| bad("text"))?)
                }
                "cap_bytes" | "total_bytes" => {
                    let bytes = match &value {
                        Value::Int(_, Some(v)) => u64::try_from(*v).ok(),
                        _ => None,
                    }
                    .ok_or_else(|| bad("a whole number of bytes"))?;
                    if key == "cap_bytes" {
                        meta.cap_bytes = Some(bytes);
                    } else {
                        meta.total_bytes = Some(bytes);
                    }
                }
                "caveats" => {
                    let Value::List(items) = value else {
                        return Err(bad("a list of text"));
                    };
                    meta.caveats = items
                        .iter()
                        .map(|v| text(v).ok_or_else(|| bad("a list of text")))
                        .collect::<Result<_, _>>()?;
                }
                "segments" | "ranges" => {
                    let what = if key == "segments" {
                        "a list of \"ADDRESS:BYTES\" (hex address, decimal bytes)"
                    } else {
                        "a list of hex addresses"
                    };
                    let Value::List(items) = value else {
                        return Err(bad(what));
                    };
                    let addresses = meta.addresses.get_or_insert_with(Default::default);
                    for item in &items {
                        let t = text(item).ok_or_else(|| bad(what))?;
                        if key == "segments" {
                            let pair = t.split_once(':').and_then(|(a, b)| {
                                Some((parse_hex(a)?, b.parse::<u64>().ok().filter(|&b| b > 0)?))
                            });
                            let (addr, bytes) = pair.ok_or_else(|| {
                                self.error_at(
                                    vspan,
                                    format!(
                                        "recorded: segments: '{}': expected {what}",
                                        shorten(&t)
                                    ),
                                )
                            })?;
                            addresses.segments.push((bytes, addr));
                        } else {
                            let addr = parse_hex(&t).ok_or_else(|| {
                                self.error_at(
                                    vspan,
                                    format!("recorded: ranges: '{}': expected {what}", shorten(&t)),
                                )
                            })?;
                            addresses.ranges.push(addr);
                        }
                    }
                }
                other => {
                    return Err(self.error_at(
                        span,
                        format!(
                            "recorded: unknown key `{}` (known: workload, alloc_conf, cap_bytes, \
                             total_bytes, device, torch_version, caveats, segments, ranges)",
                            shorten(other)
                        ),
                    ))
                }
            }
        }
    }

    /// The value an event or field starts with `event`: a scalar (or alias), or a
    /// collection skipped to its end (nested at `depth`).
    fn value(&mut self, event: YamlEvent<'i>, depth: usize) -> Result<Value, ReadError> {
        Ok(match event {
            YamlEvent::Scalar(text, style, anchor, tag) => {
                let plain =
                    style == ScalarStyle::Plain && tag.as_ref().is_none_or(|t| t.suffix != "str");
                let scalar = Scalar {
                    text: text.into_owned(),
                    plain,
                };
                let value = Value::of(&scalar);
                if anchor > 0 {
                    self.anchors.insert(anchor, Anchored::Scalar(scalar));
                }
                value
            }
            YamlEvent::Alias(id) => match self.anchors.get(&id) {
                Some(Anchored::Scalar(s)) => Value::of(s),
                Some(Anchored::Event(_)) => Value::Map,
                Some(Anchored::Other(v)) => v.clone(),
                None => return Err(self.error_at(self.last, "an alias to an unknown anchor")),
            },
            YamlEvent::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    match event {
                        YamlEvent::SequenceEnd => break,
                        YamlEvent::SequenceStart(..) | YamlEvent::MappingStart(..) => {
                            if depth + 2 > MAX_NESTING {
                                return Err(self.error_at(
                                    span,
                                    format!("collections nested more than {MAX_NESTING} deep"),
                                ));
                            }
                            self.skip(depth + 1)?;
                            items.push(Value::Map);
                        }
                        other => items.push(self.value(other, depth + 1)?),
                    }
                }
                let value = Value::List(items);
                if anchor > 0 {
                    self.anchors.insert(anchor, Anchored::Other(value.clone()));
                }
                value
            }
            YamlEvent::MappingStart(anchor, _) => {
                let value = Value::Map;
                self.skip(depth)?;
                if anchor > 0 {
                    self.anchors.insert(anchor, Anchored::Other(value.clone()));
                }
                value
            }
            _ => return Err(self.error_at(self.last, "unexpected YAML structure")),
        })
    }

    /// Skips a collection whose start was just read, nested at `depth`.
    fn skip(&mut self, depth: usize) -> Result<(), ReadError> {
        let mut level = 1usize;
        while level > 0 {
            let (event, span) = self.next()?;
            match event {
                YamlEvent::SequenceStart(..) | YamlEvent::MappingStart(..) => {
                    level += 1;
                    if depth + level > MAX_NESTING {
                        return Err(self.error_at(
                            span,
                            format!("collections nested more than {MAX_NESTING} deep"),
                        ));
                    }
                }
                YamlEvent::SequenceEnd | YamlEvent::MappingEnd => level -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    /// The keys and values of an event mapping up to its end, then the event they
    /// make (or the message saying why they make none).
    fn event_mapping(&mut self) -> Result<Parsed, ReadError> {
        let mut fields: Vec<(Value, Value)> = Vec::new();
        loop {
            let (event, _) = self.next()?;
            if matches!(event, YamlEvent::MappingEnd) {
                break;
            }
            let key = self.value(event, 3)?;
            let (event, _) = self.next()?;
            let value = self.value(event, 3)?;
            fields.push((key, value));
        }
        Ok(parse_event(&fields))
    }
}

fn not_a_mapping(v: &Value) -> String {
    format!(
        "an event is a mapping like {{op: free, id: 1}}, found {}",
        v.describe()
    )
}

/// Writes `trace` as YAML: `name`, then `events` with one flow mapping per line.
/// Sizes are written as integers (exact), streams always, strings double-quoted.
///
/// # Errors
/// Errors of `out`.
pub fn write_yaml(trace: &Trace, out: impl io::Write) -> io::Result<()> {
    write_yaml_events(trace, &mut trace.events.iter().map(Cow::Borrowed), out)
}

/// [`write_yaml`] of `head`'s name and recorded facts and of the events `events`
/// gives, written as they come (a generator's, made as they are asked for), with
/// `head`'s id names; `head`'s own events are not read. Nothing is kept per event.
///
/// # Errors
/// Errors of `out`.
pub fn write_yaml_events<'e>(
    head: &Trace,
    events: &mut dyn Iterator<Item = Cow<'e, Event>>,
    mut out: impl io::Write,
) -> io::Result<()> {
    let trace = head;
    writeln!(out, "name: {}", quote(&trace.name))?;
    let m = &trace.meta;
    let recorded: Vec<(&str, String)> = [
        ("workload", m.workload.as_deref().map(quote)),
        ("alloc_conf", m.alloc_conf.as_deref().map(quote)),
        ("cap_bytes", m.cap_bytes.map(|b| b.to_string())),
        ("total_bytes", m.total_bytes.map(|b| b.to_string())),
        ("device", m.device.as_deref().map(quote)),
        ("torch_version", m.torch_version.as_deref().map(quote)),
        (
            "caveats",
            (!m.caveats.is_empty()).then(|| {
                let items: Vec<String> = m.caveats.iter().map(|c| quote(c)).collect();
                format!("[{}]", items.join(", "))
            }),
        ),
    ]
    .into_iter()
    .chain(m.addresses.iter().flat_map(|a| {
        let segments: Vec<String> = a
            .segments
            .iter()
            .map(|&(bytes, addr)| format!("\"{addr:#x}:{bytes}\""))
            .collect();
        let ranges: Vec<String> = a.ranges.iter().map(|r| format!("\"{r:#x}\"")).collect();
        [
            (
                "segments",
                (!segments.is_empty()).then(|| format!("[{}]", segments.join(", "))),
            ),
            (
                "ranges",
                (!ranges.is_empty()).then(|| format!("[{}]", ranges.join(", "))),
            ),
        ]
    }))
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    if !recorded.is_empty() {
        writeln!(out, "recorded:")?;
        for (k, v) in recorded {
            writeln!(out, "  {k}: {v}")?;
        }
    }
    let mut events = events.peekable();
    if events.peek().is_none() {
        return writeln!(out, "events: []");
    }
    writeln!(out, "events:")?;
    // Ids as read: numbers bare, names quoted.
    let id_text = |id: AllocId| -> String {
        let name = trace.id_name(id).to_string();
        if is_number(&name) {
            name
        } else {
            quote(&name)
        }
    };
    for event in events {
        match &*event {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => writeln!(
                out,
                "  - {{op: alloc, id: {}, bytes: {size_bytes}, stream: {stream}}}",
                id_text(*id)
            )?,
            Event::FreeRequested { id } => {
                writeln!(out, "  - {{op: free_requested, id: {}}}", id_text(*id))?
            }
            Event::Free { id } => writeln!(out, "  - {{op: free, id: {}}}", id_text(*id))?,
            Event::EmptyCache => writeln!(out, "  - {{op: empty_cache}}")?,
            Event::Mark { label } => writeln!(out, "  - {{op: mark, label: {}}}", quote(label))?,
            Event::CreatePool {
                pool,
                use_on_oom,
                no_split,
            } => writeln!(
                out,
                "  - {{op: create_pool, pool: {}, use_on_oom: {use_on_oom}, no_split: {no_split}}}",
                pool_text(*pool)
            )?,
            Event::BeginAllocateToPool { pool, streams } => match streams {
                PoolStreams::All => writeln!(
                    out,
                    "  - {{op: begin_allocate_to_pool, pool: {}}}",
                    pool_text(*pool)
                )?,
                PoolStreams::Only(list) => writeln!(
                    out,
                    "  - {{op: begin_allocate_to_pool, pool: {}, streams: [{}]}}",
                    pool_text(*pool),
                    list.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )?,
            },
            Event::EndAllocateToPool { pool } => writeln!(
                out,
                "  - {{op: end_allocate_to_pool, pool: {}}}",
                pool_text(*pool)
            )?,
            Event::ReleasePool { pool } => {
                writeln!(out, "  - {{op: release_pool, pool: {}}}", pool_text(*pool))?
            }
            Event::EmptyPoolCache { pool } => {
                writeln!(out, "  - {{op: empty_cache, pool: {}}}", pool_text(*pool))?
            }
            Event::SetAllocatorSettings { conf } => writeln!(
                out,
                "  - {{op: set_allocator_settings, conf: {}}}",
                quote(conf)
            )?,
            Event::ResetPeakStats => writeln!(out, "  - {{op: reset_peak_memory_stats}}")?,
            Event::ResetAccumulatedStats => {
                writeln!(out, "  - {{op: reset_accumulated_memory_stats}}")?
            }
            Event::SetEnabled { enabled } => writeln!(
                out,
                "  - {{op: caching_allocator_enable, enabled: {enabled}}}"
            )?,
            Event::RestoreBlock { pool, addr } => writeln!(
                out,
                "  - {{op: restore_block, pool: {}, addr: {addr}}}",
                pool_text(*pool)
            )?,
        }
    }
    Ok(())
}

/// The keys each op takes, `op` first.
fn allowed_keys(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "alloc" => &["op", "id", "bytes", "stream"],
        "free" | "free_completed" | "free_requested" => &["op", "id"],
        "empty_cache" => &["op", "pool"],
        "mark" => &["op", "label"],
        "create_pool" => &["op", "pool", "use_on_oom", "no_split"],
        "begin_allocate_to_pool" => &["op", "pool", "streams"],
        "end_allocate_to_pool" | "release_pool" => &["op", "pool"],
        "set_allocator_settings" => &["op", "conf"],
        "reset_peak_memory_stats" | "reset_accumulated_memory_stats" => &["op"],
        "caching_allocator_enable" => &["op", "enabled"],
        "restore_block" => &["op", "pool", "addr"],
        _ => return None,
    })
}

fn key_name(key: &Value) -> Option<&str> {
    match key {
        Value::Text(k) => Some(k),
        _ => None,
    }
}

/// One event, and its id as written (the event's own id is a placeholder until
/// [`IdTable::finish`]).
fn parse_event(fields: &[(Value, Value)]) -> Parsed {
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| key_name(k) == Some(key))
            .map(|(_, v)| v)
    };
    let op = match get("op") {
        Some(Value::Text(op)) => op.as_str(),
        Some(other) => return Err(format!("op must be a name, found {}", other.describe())),
        None => return Err(format!("missing 'op' ({OP_NAMES})")),
    };
    let Some(allowed) = allowed_keys(op) else {
        return Err(format!(
            "unknown op '{}' (expected {OP_NAMES})",
            shorten(op)
        ));
    };
    for (i, (key, _)) in fields.iter().enumerate() {
        let Some(k) = key_name(key).filter(|k| allowed.contains(k)) else {
            return Err(format!(
                "unknown key {} for op {op} (allowed: {})",
                key.describe(),
                allowed.join(", ")
            ));
        };
        if fields[..i]
            .iter()
            .any(|(earlier, _)| key_name(earlier) == Some(k))
        {
            return Err(format!("duplicate key '{k}' for op {op}"));
        }
    }
    let required = |key: &str| get(key).ok_or_else(|| format!("{op} needs '{key}'"));
    let uint = |key: &str, v: &Value| {
        v.as_u64().ok_or_else(|| {
            format!(
                "{op}: {key} must be an unsigned integer, found {}",
                v.describe()
            )
        })
    };
    // An id is any token: decimal digits are a number, anything else (`weights`,
    // `0x7f3a`, `-1`) a name kept as written.
    let token = || -> Result<IdToken, String> {
        match required("id")? {
            Value::Int(t, _) | Value::Float(t) | Value::Text(t) => {
                IdToken::parse(t).map_err(|why| format!("{op}: id '{}' {why}", shorten(t)))
            }
            v => Err(format!(
                "{op}: id must be a name or an unsigned integer, found {}",
                v.describe()
            )),
        }
    };
    let id = AllocId(0);
    let mut id_token = None;
    let event = match op {
        "alloc" => {
            id_token = Some(token()?);
            Event::Alloc {
                id,
                size_bytes: bytes(op, required("bytes")?)?,
                stream: match get("stream") {
                    Some(v) => uint("stream", v)?,
                    None => 0,
                },
            }
        }
        "free" | "free_completed" => {
            id_token = Some(token()?);
            Event::Free { id }
        }
        "free_requested" => {
            id_token = Some(token()?);
            Event::FreeRequested { id }
        }
        "empty_cache" => match get("pool") {
            None => Event::EmptyCache,
            Some(v) => Event::EmptyPoolCache {
                pool: pool_id(op, v)?,
            },
        },
        "create_pool" => Event::CreatePool {
            pool: pool_id(op, required("pool")?)?,
            use_on_oom: flag(op, "use_on_oom", get("use_on_oom"))?,
            no_split: flag(op, "no_split", get("no_split"))?,
        },
        "begin_allocate_to_pool" => Event::BeginAllocateToPool {
            pool: pool_id(op, required("pool")?)?,
            streams: match get("streams") {
                None => PoolStreams::All,
                Some(Value::List(items)) => PoolStreams::only(
                    items
                        .iter()
                        .map(|v| uint("streams", v))
                        .collect::<Result<_, _>>()?,
                ),
                Some(v) => {
                    return Err(format!(
                        "{op}: streams must be a list of streams like [7], found {}",
                        v.describe()
                    ))
                }
            },
        },
        "end_allocate_to_pool" => Event::EndAllocateToPool {
            pool: pool_id(op, required("pool")?)?,
        },
        "release_pool" => Event::ReleasePool {
            pool: pool_id(op, required("pool")?)?,
        },
        "set_allocator_settings" => Event::SetAllocatorSettings {
            conf: match required("conf")? {
                Value::Text(s) => s.clone(),
                v => return Err(format!("{op}: conf must be text, found {}", v.describe())),
            },
        },
        "reset_peak_memory_stats" => Event::ResetPeakStats,
        "reset_accumulated_memory_stats" => Event::ResetAccumulatedStats,
        "restore_block" => Event::RestoreBlock {
            pool: pool_id(op, required("pool")?)?,
            addr: uint("addr", required("addr")?)?,
        },
        "caching_allocator_enable" => Event::SetEnabled {
            enabled: match required("enabled")? {
                Value::Bool(b) => *b,
                v => {
                    return Err(format!(
                        "{op}: enabled must be true or false, found {}",
                        v.describe()
                    ))
                }
            },
        },
        _ => Event::Mark {
            label: match required("label")? {
                Value::Text(s) => s.clone(),
                // `label: 3` or `label: true` mean the text as written.
                Value::Int(t, _) | Value::Float(t) => t.clone(),
                Value::Bool(b) => b.to_string(),
                v => return Err(format!("mark: label must be text, found {}", v.describe())),
            },
        },
    };
    Ok((event, id_token))
}

/// A pool written `[a, b]`, PyTorch's id pair; `[0, 0]` (the default pools) is refused.
fn pool_id(op: &str, v: &Value) -> Result<PoolId, String> {
    let bad = || {
        format!(
            "{op}: pool must be PyTorch's pool id, two unsigned integers like [1, 0], found {}",
            v.describe()
        )
    };
    let Value::List(items) = v else {
        return Err(bad());
    };
    let [a, b] = items.as_slice() else {
        return Err(bad());
    };
    let pool = PoolId(a.as_u64().ok_or_else(bad)?, b.as_u64().ok_or_else(bad)?);
    if pool.is_default() {
        return Err(format!(
            "{op}: pool [0, 0] is the default pools, not a private pool"
        ));
    }
    Ok(pool)
}

/// An optional boolean key (default false).
fn flag(op: &str, key: &str, v: Option<&Value>) -> Result<bool, String> {
    match v {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!(
            "{op}: {key} must be true or false, found {}",
            v.describe()
        )),
    }
}

/// A pool as YAML writes it.
fn pool_text(pool: PoolId) -> String {
    format!("[{}, {}]", pool.0, pool.1)
}

fn bytes(op: &str, v: &Value) -> Result<u64, String> {
    match v {
        Value::Int(t, n) => n.and_then(|n| u64::try_from(n).ok()).ok_or_else(|| {
            format!(
                "{op}: bytes must be a whole number of bytes or a size like 4KiB, found {}",
                shorten(t)
            )
        }),
        Value::Float(t) => Err(format!(
            "{op}: bytes must be a whole number of bytes or a size like 4KiB, found {}",
            shorten(t)
        )),
        Value::Text(s) => parse_size(s).map_err(|e| format!("{op}: bytes: {e}")),
        other => Err(format!(
            "{op}: bytes must be an integer or a size like 4KiB, found {}",
            other.describe()
        )),
    }
}

/// A `0x`-prefixed hexadecimal address of at most 16 digits.
fn parse_hex(text: &str) -> Option<u64> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    if digits.len() > 16 {
        return None;
    }
    crate::ids::hex_u64(digits)
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

#[cfg(test)]
/// Every allocator call (for round-trip tests), with any pool but the default one.
pub(crate) fn pool_event_strategy() -> impl proptest::strategy::Strategy<Value = Event> {
    use proptest::prelude::*;
    let pool = (any::<u64>(), 1..u64::MAX).prop_map(|(a, b)| PoolId(a, b));
    prop_oneof![
        (pool.clone(), any::<bool>(), any::<bool>()).prop_map(|(pool, use_on_oom, no_split)| {
            Event::CreatePool {
                pool,
                use_on_oom,
                no_split,
            }
        }),
        (
            pool.clone(),
            proptest::option::of(proptest::collection::vec(any::<u64>(), 0..4))
        )
            .prop_map(|(pool, streams)| Event::BeginAllocateToPool {
                pool,
                streams: streams.map_or(PoolStreams::All, PoolStreams::only),
            }),
        pool.clone()
            .prop_map(|pool| Event::EndAllocateToPool { pool }),
        pool.clone().prop_map(|pool| Event::ReleasePool { pool }),
        pool.clone().prop_map(|pool| Event::EmptyPoolCache { pool }),
        (pool, any::<u64>()).prop_map(|(pool, addr)| Event::RestoreBlock { pool, addr }),
        any::<String>().prop_map(|conf| Event::SetAllocatorSettings { conf }),
        Just(Event::ResetPeakStats),
        Just(Event::ResetAccumulatedStats),
        any::<bool>().prop_map(|enabled| Event::SetEnabled { enabled }),
    ]
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
        assert_eq!(places, ["event 0", "event 2"]);
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

    /// Ids may be names: they are interned to dense ids in order of first appearance
    /// (a number among names under its decimal text), messages show them, and the
    /// writer writes them back as read, so the file round-trips byte for byte.
    #[test]
    fn named_ids_round_trip() {
        let text = "name: \"named\"\nevents:\n  - {op: alloc, id: \"weights\", bytes: 1024, stream: 0}\n  - {op: alloc, id: 7, bytes: 8, stream: 0}\n  - {op: alloc, id: \"0x7f3a00000000\", bytes: 16, stream: 1}\n  - {op: free_requested, id: \"0x7f3a00000000\"}\n  - {op: free, id: \"0x7f3a00000000\"}\n  - {op: free, id: 7}\n  - {op: alloc, id: \"kv cache 3\", bytes: 4, stream: 0}\n";
        let t = read(text).unwrap();
        assert_eq!(t.id_names, ["weights", "7", "0x7f3a00000000", "kv cache 3"]);
        assert_eq!(
            t.events[..3],
            [
                Event::Alloc {
                    id: AllocId(0),
                    size_bytes: 1024,
                    stream: 0
                },
                Event::Alloc {
                    id: AllocId(1),
                    size_bytes: 8,
                    stream: 0
                },
                Event::Alloc {
                    id: AllocId(2),
                    size_bytes: 16,
                    stream: 1
                },
            ]
        );
        assert_eq!(write(&t), text);
        // A hex number, a negative one, a decimal: names as written.
        let odd = read("events:\n  - {op: alloc, id: 0x7f3a, bytes: 1}\n  - {op: alloc, id: -1, bytes: 1}\n  - {op: alloc, id: 1.5, bytes: 1}\n").unwrap();
        assert_eq!(odd.id_names, ["0x7f3a", "-1", "1.5"]);
        // Plain (unquoted) names read the same as quoted ones.
        let plain = read("events:\n  - {op: alloc, id: weights, bytes: 1}\n  - {op: free, id: weights}\n  - {op: free, id: bias}\n").unwrap();
        assert_eq!(plain.id_names, ["weights", "bias"]);
        let issues = crate::validate(&plain);
        assert_eq!(
            issues[0].display_with(&plain).to_string(),
            "dir/t.yaml: event 2: free of unknown id bias"
        );
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
        assert_eq!(t.describe(2), "dir/t.yaml: event 2");
    }

    /// Without `name` the trace is named after the file stem; block style works too.
    /// What a run recorded (`TraceMeta`) is written in a `recorded` block and read back
    /// as it was, PyTorch's defaults (`alloc_conf: ""`) included; a trace without one
    /// writes none.
    #[test]
    fn recorded_round_trips() {
        let mut t = Trace::new("r", vec![Event::EmptyCache]);
        t.meta = TraceMeta {
            format: Some(Format::Yaml),
            workload: Some("gpt \"small\"".into()),
            alloc_conf: Some(String::new()),
            cap_bytes: Some(5 << 30),
            total_bytes: Some(80 << 30),
            device: Some("NVIDIA H100 80GB HBM3".into()),
            torch_version: Some("2.11.0".into()),
            caveats: vec!["one".into(), "two, with a comma".into()],
            addresses: Some(crate::RecordedAddresses {
                segments: vec![
                    (2 << 20, 0x7fc3_0fe0_0000),
                    (20 << 20, 0xffff_ffff_ffe0_0000),
                ],
                ranges: vec![0x7f00_0000_0000],
            }),
        };
        let mut out = Vec::new();
        write_yaml(&t, &mut out).unwrap();
        let back = read(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(back.meta, t.meta);
        let mut plain = Vec::new();
        write_yaml(&Trace::new("p", vec![]), &mut plain).unwrap();
        assert!(!String::from_utf8(plain).unwrap().contains("recorded"));
    }

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
            e.contains("event 0: unknown key 'stream' for op free_requested (allowed: op, id)"),
            "{e}"
        );
    }

    /// Event problems name `event N` and say what is wrong, on one line.
    #[test]
    fn bad_events_name_their_position() {
        let cases = [
            ("{op: allocate, id: 1}", "event 1: unknown op 'allocate'"),
            (
                "{op: alloc, id: 1, bytes: 5, strem: 1}",
                "event 1: unknown key 'strem' for op alloc (allowed: op, id, bytes, stream)",
            ),
            (
                "{op: free, id: 1, bytes: 5}",
                "event 1: unknown key 'bytes' for op free (allowed: op, id)",
            ),
            ("{op: alloc, id: 1}", "event 1: alloc needs 'bytes'"),
            ("{id: 1}", "event 1: missing 'op'"),
            (
                "{op: alloc, id: 99999999999999999999, bytes: 5}",
                "event 1: alloc: id '99999999999999999999' is a number too large for 64 bits",
            ),
            (
                "{op: alloc, id: 1, bytes: 4XB}",
                "event 1: alloc: bytes: '4XB' has an unknown unit",
            ),
            (
                "{op: alloc, id: 1, bytes: 1.5}",
                "event 1: alloc: bytes must be a whole number of bytes",
            ),
            (
                "{op: alloc, id: 1, bytes: [1]}",
                "event 1: alloc: bytes must be an integer or a size like 4KiB, found a list",
            ),
            ("{op: free, id: ''}", "event 1: free: id '' is empty"),
            (
                "{op: free, id: [1]}",
                "event 1: free: id must be a name or an unsigned integer, found a list",
            ),
            (
                "{op: free, id: true}",
                "event 1: free: id must be a name or an unsigned integer, found true",
            ),
            (
                "{op: free, id: \"a\\tb\"}",
                "event 1: free: id 'a\\tb' has a control character",
            ),
            ("{op: mark}", "event 1: mark needs 'label'"),
            ("free 1", "event 1: an event is a mapping"),
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
            super::pool_event_strategy(),
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
