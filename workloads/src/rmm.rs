//! RAPIDS RMM memory event logs: the CSV that `rmm::mr::logging_resource_adaptor`
//! (Python: `rmm.mr.LoggingResourceAdaptor`) writes, one line per allocation and
//! deallocation through the resource.
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140573312345856,10:17:36.614829,allocate,0x7f8a40000000,1024,0x7f8a38001020
//! 140573312345856,10:17:36.615011,free,0x7f8a40000000,1024,0x7f8a38001020
//! 140573312345856,10:17:36.616000,allocate failure,(nil),68719476736,0
//! ```
//!
//! The header is written as is; then the logger's pattern `%t,%H:%M:%S.%f,%v`
//! prefixes each message with the thread id and the time of day (microseconds). The
//! message is `allocate,PTR,BYTES,STREAM`, `allocate failure,PTR,BYTES,STREAM` (the
//! pointer is null) or `free,PTR,BYTES,STREAM`; RMM versions spelled pointers and
//! streams differently (`{}` of fmt: `0x7f8a40000000`, null `0x0`; `%llx`:
//! `7f8a40000000`, null `0`; `%p`: `0x7f8a40000000`, null `(nil)`; a stream through
//! `std::hex`: `0x...` or `0` for the default stream), and older logs say
//! `deallocate`; all are read.
//!
//! What becomes of each line:
//!
//! | action | event |
//! | --- | --- |
//! | `allocate` | `alloc` of `BYTES` on `STREAM`, its id named by the pointer (`0x7f8a40000000`) |
//! | `free`, `deallocate` | `free` of the allocation at the pointer |
//! | `allocate failure` | `alloc` of `BYTES` on `STREAM` that RMM could not serve, with an id of its own (`failed@line N`), never freed |
//!
//! A pointer is an allocation's id until its free; RMM may hand the same pointer out
//! again afterwards, which is the same id reused (ids are interned per pointer, so
//! the trace's [`Trace::id_names`] are the pointers). Times become
//! [`Trace::times_us`]: microseconds since midnight of the first line, a day added
//! each time the clock goes back by more than twelve hours (a log past midnight).
//!
//! Detected by its header (`Thread,Time,Action,Pointer,Size,Stream`), whatever the
//! file's extension. Strict like the other readers: every malformed line is reported
//! with its line number; a free whose size differs from its allocation's is an error
//! (RMM requires the same size back). Frees of pointers the log never allocated and
//! pointers allocated twice are left to validation (`allocsim check`), which names
//! their lines.

use std::collections::hash_map::Entry;
use std::io::{self, BufRead, Read};
use std::path::Path;

use crate::hash::FastMap;

use crate::csv::{file_stem, shorten, EventStream, Unstreamable, MAX_ROW_BYTES};
use crate::trace::{AllocId, Event, LocationKind, Trace, TraceMeta};
use crate::{Format, Problems, ReadError};

/// The header every RMM log starts with.
pub const RMM_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Microseconds in a day.
const DAY_US: u64 = 86_400_000_000;

/// Reads an RMM log from any reader; `path` names the source in messages and in the
/// trace (named after its stem).
///
/// Streamed: one line is held at a time, and a line longer than
/// [`MAX_ROW_BYTES`] (a real one is under 100 bytes; `/dev/zero` has no line break) is
/// refused where it starts; of the malformed lines the first
/// [`crate::MAX_LISTED_PROBLEMS`] are kept and the rest counted.
///
/// # Errors
/// I/O errors, a missing header, a line without end, and every malformed line, each
/// with its line.
pub fn read_rmm_from(reader: impl io::Read, path: &Path) -> Result<Trace, ReadError> {
    let mut reader = io::BufReader::new(reader);
    let mut log = Log {
        lines: Lines {
            names: Some(Vec::new()),
            ..Lines::default()
        },
        ..Log::default()
    };
    let mut buf = Vec::new();
    let mut line = 0u64;
    let mut problems = Problems::default();
    let mut header_seen = false;
    // A line's place, written only for a problem (a `format!` a line was a sixth of
    // the reading).
    let at = |line: u64| Some(format!("line {line}"));
    loop {
        // The usual line, wholly in the reader's buffer, is read there (no copy, no
        // UTF-8 check: it is ASCII); the header, any other line, a line past the
        // buffer's end and a last line without a break through `read_until` below.
        if header_seen {
            let avail = reader.fill_buf().map_err(|e| ReadError::io(path, &e))?;
            if let Some((fields, end)) = Fields::usual_line(avail) {
                line += 1;
                if let Err(message) = log.fields(fields, line) {
                    problems.push(ReadError::syntax(path, at(line), message));
                }
                reader.consume(end + 1);
                continue;
            }
        }
        buf.clear();
        let n = (&mut reader)
            .take(MAX_ROW_BYTES + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| ReadError::io(path, &e))?;
        if n == 0 {
            break;
        }
        line += 1;
        if n as u64 > MAX_ROW_BYTES {
            return Err(ReadError::syntax(
                path,
                at(line),
                format!(
                    "not an RMM log: a line longer than {MAX_ROW_BYTES} bytes starts here (no line break?)"
                ),
            ));
        }
        let Ok(text) = std::str::from_utf8(&buf) else {
            problems.push(ReadError::syntax(path, at(line), "not valid UTF-8 text"));
            continue;
        };
        let text = text.trim_end_matches(['\n', '\r']);
        if !header_seen {
            let first = text.trim_start_matches('\u{feff}');
            if first != RMM_HEADER {
                return Err(ReadError::syntax(
                    path,
                    at(line),
                    format!(
                        "expected the RMM log header '{RMM_HEADER}', found '{}'",
                        shorten(first)
                    ),
                ));
            }
            header_seen = true;
            continue;
        }
        if text.is_empty() {
            continue;
        }
        if let Err(message) = log.line(text, line) {
            problems.push(ReadError::syntax(path, at(line), message));
        }
    }
    if !header_seen {
        return Err(ReadError::syntax(
            path,
            Some("line 1".into()),
            format!("empty file: an RMM log starts with the header '{RMM_HEADER}'"),
        ));
    }
    if let Some(e) = problems.into_error() {
        return Err(e);
    }
    Ok(Trace {
        name: file_stem(path),
        path: Some(path.to_path_buf()),
        events: log.events,
        locations: log.locations,
        location_kind: LocationKind::Line,
        meta: TraceMeta::of_format(Format::Rmm),
        id_names: log.lines.names.unwrap_or_default(),
        times_us: log.times_us,
        start: None,
    })
}

/// The events of an RMM log one at a time, as [`read_rmm_from`] reads them, for a
/// replay that does not hold the log: memory follows the live pointers, not the log's
/// length. The events are the same but for their ids: a freed pointer's id is given
/// to a later allocation (of any pointer) rather than kept for the pointer, so ids
/// stay as few as the live allocations; a replay decides the same either way (ids
/// only name allocations), and validation finds the same problems. It gives up ([`RmmEvents::stopped`]) where the whole-trace
/// reader is needed: any problem (which it lists in full, with lines) or a blank line
/// (events are numbered from their lines only when each event is the line after the
/// previous one). Event `i` is on line `i + 2`.
pub struct RmmEvents<R: io::Read> {
    reader: io::BufReader<R>,
    buf: Vec<u8>,
    path: std::path::PathBuf,
    /// Lines read.
    line: u64,
    header_seen: bool,
    lines: Lines,
    events: u64,
    allocs: u64,
    stopped: Option<Unstreamable>,
    /// The end of the file was reached, or the events stopped.
    done: bool,
}

impl RmmEvents<std::fs::File> {
    /// The events of the RMM log at `path`.
    ///
    /// # Errors
    /// The file does not open.
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        let file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
        Ok(RmmEvents::new(file, path))
    }
}

impl<R: io::Read> RmmEvents<R> {
    /// The events of the RMM log `reader` holds; `path` names it.
    pub fn new(reader: R, path: &Path) -> Self {
        RmmEvents {
            reader: io::BufReader::with_capacity(1 << 18, reader),
            buf: Vec::new(),
            path: path.to_path_buf(),
            line: 0,
            header_seen: false,
            lines: Lines {
                free_ids: Some(Vec::new()),
                ..Lines::default()
            },
            events: 0,
            allocs: 0,
            stopped: None,
            done: false,
        }
    }

    /// The line of event `index` (every event one line, after the header).
    pub fn line_of(index: usize) -> u64 {
        index as u64 + 2
    }

    fn stop(&mut self, why: Unstreamable) -> Option<Event> {
        self.stopped = Some(why);
        self.done = true;
        None
    }

    /// A line's outcome: its event, counted, or the stream stopped.
    fn took(&mut self, outcome: Result<(Event, u64), Unstreamable>) -> Option<Event> {
        match outcome {
            Ok((event, _)) => {
                self.events += 1;
                self.allocs += u64::from(matches!(event, Event::Alloc { .. }));
                Some(event)
            }
            Err(why) => self.stop(why),
        }
    }
}

impl<R: io::Read> EventStream for RmmEvents<R> {
    fn stopped(&self) -> Option<Unstreamable> {
        self.stopped
    }

    fn events_read(&self) -> u64 {
        self.events
    }

    /// Allocations (`allocate` and `allocate failure`) given so far.
    fn allocs_read(&self) -> u64 {
        self.allocs
    }

    /// The trace [`read_rmm_from`] would give, without its events, ids' names and
    /// times; its events' places are [`RmmEvents::line_of`].
    fn shell(&self) -> Trace {
        crate::csv::shell_of(&self.path, Format::Rmm)
    }

    type Source<'a>
        = &'a mut Self
    where
        R: 'a;

    /// The iterator itself.
    fn source(&mut self) -> &mut Self {
        self
    }
}

impl<R: io::Read> Iterator for RmmEvents<R> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        // The usual case: the whole line is in the reader's buffer, and is read there
        // (no copy); a line that is not (it runs past the buffer's end, or is the last
        // one without a line break) and the header are read into `buf` below.
        if self.header_seen {
            if let Ok(avail) = self.reader.fill_buf() {
                // The usual line, read as its end is found.
                if let Some((fields, end)) = Fields::usual_line(avail) {
                    self.line += 1;
                    let outcome = self
                        .lines
                        .event(fields, self.line)
                        .map_err(|_| Unstreamable::Problem);
                    self.reader.consume(end + 1);
                    return self.took(outcome);
                }
                if let Some(end) = memchr::memchr(b'\n', avail) {
                    self.line += 1;
                    let outcome = read_line(&mut self.lines, &avail[..end], self.line);
                    self.reader.consume(end + 1);
                    return self.took(outcome);
                }
            }
        }
        self.buf.clear();
        let read = (&mut self.reader)
            .take(MAX_ROW_BYTES + 1)
            .read_until(b'\n', &mut self.buf);
        let n = match read {
            Ok(n) => n,
            Err(_) => return self.stop(Unstreamable::Problem),
        };
        if n == 0 {
            if !self.header_seen {
                return self.stop(Unstreamable::Problem);
            }
            self.done = true;
            return None;
        }
        self.line += 1;
        if n as u64 > MAX_ROW_BYTES {
            return self.stop(Unstreamable::Problem);
        }
        if !self.header_seen {
            let header = std::str::from_utf8(&self.buf).map(|text| {
                text.trim_end_matches(['\n', '\r'])
                    .trim_start_matches('\u{feff}')
            });
            if header != Ok(RMM_HEADER) {
                return self.stop(Unstreamable::Problem);
            }
            self.header_seen = true;
            return self.next();
        }
        let outcome = read_line(&mut self.lines, &self.buf, self.line);
        self.took(outcome)
    }
}

/// A line after the header that is not a usual line in the reader's buffer
/// ([`Fields::usual_line`] took those: this one is not usual, runs past the buffer's
/// end, or is the last one without a line break), with its line break or without:
/// its event and time, or why the stream stops (not UTF-8, a blank line, a problem).
/// Checked as UTF-8 and read as the whole-trace reader reads it ([`Lines::line`],
/// which still reads a usual line from its bytes).
fn read_line(lines: &mut Lines, bytes: &[u8], line: u64) -> Result<(Event, u64), Unstreamable> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Err(Unstreamable::Problem);
    };
    match text.trim_end_matches(['\n', '\r']) {
        "" => Err(Unstreamable::LineBreaks),
        text => lines.line(text, line).map_err(|_| Unstreamable::Problem),
    }
}

/// The trace being read whole: the events of [`Lines`] with their lines and times.
#[derive(Default)]
struct Log {
    events: Vec<Event>,
    locations: Vec<u64>,
    times_us: Vec<u64>,
    lines: Lines,
}

impl Log {
    /// Reads one line (not the header).
    fn line(&mut self, text: &str, line: u64) -> Result<(), String> {
        let read = self.lines.line(text, line)?;
        self.push(read, line);
        Ok(())
    }

    /// Takes the fields of a usual line ([`Fields::usual`]).
    fn fields(&mut self, fields: Fields<'_>, line: u64) -> Result<(), String> {
        let read = self.lines.event(fields, line)?;
        self.push(read, line);
        Ok(())
    }

    /// Keeps a line's event and time.
    fn push(&mut self, (event, t): (Event, u64), line: u64) {
        self.events.push(event);
        self.locations.push(line);
        self.times_us.push(t);
    }
}

/// What reading the lines of a log keeps from one line to the next: the id of each
/// pointer, the live pointers, the clock. Shared by the whole-trace reader and the
/// streamed one ([`RmmEvents`]), so that both give the same events and ids.
#[derive(Default)]
struct Lines {
    /// Each id's name (a pointer, or `failed@line N`), kept only by the whole-trace
    /// reader; the streamed one only counts ids (`next_id`).
    names: Option<Vec<String>>,
    /// Ids given so far.
    next_id: u64,
    /// Pointer -> its id and, while it is live, its allocation: every pointer seen
    /// (the whole-trace reader, whose ids are the trace's), or only the live ones (the
    /// streamed reader, whose ids are reused). One map, so that a line looks its
    /// pointer up once.
    pointers: FastMap<u64, Pointer>,
    /// The streamed reader's ids of freed pointers, given again to later allocations
    /// (so that memory follows the live pointers); `None` in the whole-trace reader,
    /// where a pointer keeps its id.
    free_ids: Option<Vec<u64>>,
    /// Days added to the time of day (the log went past midnight).
    day: u64,
    /// The previous line's time of day.
    last_time: Option<u64>,
    /// The previous event's time in the trace.
    last_t: u64,
}

/// A pointer as [`Lines`] keeps it.
#[derive(Clone, Copy)]
struct Pointer {
    id: u64,
    /// While it is live: its bytes and the line of its allocation.
    live: Option<(u64, u64)>,
}

impl Lines {
    /// Reads one line (not the header): its event and its time in microseconds.
    fn line(&mut self, text: &str, line: u64) -> Result<(Event, u64), String> {
        let fields = match Fields::usual(text.as_bytes()) {
            Some(fields) => fields,
            None => Fields::read(text)?,
        };
        self.event(fields, line)
    }

    /// The event of a line's fields and its time in microseconds.
    fn event(&mut self, fields: Fields<'_>, line: u64) -> Result<(Event, u64), String> {
        let Fields {
            time,
            action,
            pointer,
            size,
            stream,
        } = fields;
        let event = match action {
            Action::Allocate => {
                if pointer == 0 {
                    return Err(
                        "allocate of a null pointer (a failed allocation is 'allocate failure')"
                            .into(),
                    );
                }
                let live = Some((size, line));
                let id = match self.pointers.entry(pointer) {
                    // The same id for each of its allocations.
                    Entry::Occupied(known) => {
                        let known = known.into_mut();
                        known.live = live;
                        known.id
                    }
                    Entry::Vacant(new) => {
                        let id = pointer_id(
                            &mut self.free_ids,
                            &mut self.next_id,
                            &mut self.names,
                            pointer,
                        );
                        new.insert(Pointer { id, live });
                        id
                    }
                };
                Event::Alloc {
                    id: AllocId(id),
                    size_bytes: size,
                    stream,
                }
            }
            Action::Free | Action::Deallocate => {
                // The streamed reader forgets a freed pointer; the whole-trace reader
                // keeps its id.
                let known = if self.free_ids.is_some() {
                    self.pointers.remove(&pointer)
                } else {
                    self.pointers.get_mut(&pointer).map(|p| Pointer {
                        id: p.id,
                        live: p.live.take(),
                    })
                };
                let was_live = known.and_then(|p| p.live);
                if let Some((bytes, at)) = was_live {
                    if bytes != size {
                        return Err(format!(
                            "{} of 0x{pointer:x} with {size} bytes, but it was allocated with {bytes} bytes at line {at} (RMM frees with the size allocated)",
                            action.name()
                        ));
                    }
                }
                let id = match known {
                    Some(p) => p.id,
                    None => {
                        let id = pointer_id(
                            &mut self.free_ids,
                            &mut self.next_id,
                            &mut self.names,
                            pointer,
                        );
                        if self.free_ids.is_none() {
                            self.pointers.insert(pointer, Pointer { id, live: None });
                        }
                        id
                    }
                };
                // The pointer's id goes back for reuse once freed; a free of a pointer
                // that is not live took an id no allocation has, so the replay's
                // validation still sees it as one.
                if let (Some(free_ids), Some(_)) = (&mut self.free_ids, was_live) {
                    free_ids.push(id);
                }
                Event::Free { id: AllocId(id) }
            }
            Action::AllocateFailure => {
                let id = AllocId(new_id(&mut self.next_id, &mut self.names, || {
                    format!("failed@line {line}")
                }));
                Event::Alloc {
                    id,
                    size_bytes: size,
                    stream,
                }
            }
            Action::Other(other) => {
                return Err(format!(
                    "unknown action '{}' (expected allocate, allocate failure, free or deallocate)",
                    shorten(other)
                ))
            }
        };
        // Past midnight the time of day starts again from 0.
        if self.last_time.is_some_and(|last| time + DAY_US / 2 < last) {
            self.day += 1;
        }
        self.last_time = Some(time);
        // Threads may log slightly out of order; times never go back in the trace.
        let t = (self.day * DAY_US + time).max(self.last_t);
        self.last_t = t;
        Ok((event, t))
    }
}

/// The id of a pointer [`Lines`] does not know: a freed pointer's id (the streamed
/// reader), or a new one named by the pointer.
fn pointer_id(
    free_ids: &mut Option<Vec<u64>>,
    next_id: &mut u64,
    names: &mut Option<Vec<String>>,
    pointer: u64,
) -> u64 {
    match free_ids.as_mut().and_then(Vec::pop) {
        Some(id) => id,
        None => new_id(next_id, names, || pointer_name(pointer)),
    }
}

/// A pointer's name, `0x` and its lower-case hexadecimal digits without leading zeros,
/// as `format!("0x{pointer:x}")` writes it, without the formatting machinery (which
/// cost about 900 instructions a pointer: a quarter of reading a log whole).
fn pointer_name(pointer: u64) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // At least one digit (for 0).
    let n = (64 - (pointer | 1).leading_zeros()).div_ceil(4);
    let mut name = String::with_capacity(2 + n as usize);
    name.push_str("0x");
    for k in (0..n).rev() {
        name.push(char::from(DIGITS[((pointer >> (4 * k)) & 0xf) as usize]));
    }
    name
}

/// A new id, named `name()` where names are kept.
fn new_id(
    next_id: &mut u64,
    names: &mut Option<Vec<String>>,
    name: impl FnOnce() -> String,
) -> u64 {
    let id = *next_id;
    *next_id += 1;
    if let Some(names) = names {
        names.push(name());
    }
    id
}

/// A line's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action<'a> {
    Allocate,
    AllocateFailure,
    Free,
    Deallocate,
    /// Any other text (an error where it is read).
    Other(&'a str),
}

impl<'a> Action<'a> {
    fn of(text: &'a str) -> Action<'a> {
        match text {
            "allocate" => Action::Allocate,
            "allocate failure" => Action::AllocateFailure,
            "free" => Action::Free,
            "deallocate" => Action::Deallocate,
            other => Action::Other(other),
        }
    }

    /// As the log spells it.
    fn name(self) -> &'a str {
        match self {
            Action::Allocate => "allocate",
            Action::AllocateFailure => "allocate failure",
            Action::Free => "free",
            Action::Deallocate => "deallocate",
            Action::Other(other) => other,
        }
    }
}

/// A line's fields as numbers (the thread only checked present).
#[derive(Debug, PartialEq, Eq)]
struct Fields<'a> {
    /// Microseconds since midnight.
    time: u64,
    action: Action<'a>,
    pointer: u64,
    size: u64,
    stream: u64,
}

impl<'a> Fields<'a> {
    /// Every field read and checked, the first problem in field order as the error.
    fn read(text: &'a str) -> Result<Fields<'a>, String> {
        let mut split = text.split(',');
        let (Some(thread), Some(time), Some(action), Some(pointer), Some(size), Some(stream), None) = (
            split.next(),
            split.next(),
            split.next(),
            split.next(),
            split.next(),
            split.next(),
            split.next(),
        ) else {
            return Err(format!(
                "a line has 6 fields ({RMM_HEADER}), found {}",
                text.split(',').count()
            ));
        };
        if thread.is_empty() {
            return Err("Thread is missing".into());
        }
        let time = time_of_day(time)?;
        let size: u64 = parse_decimal(size).ok_or_else(|| {
            format!(
                "Size '{}' is not a number of bytes (a decimal integer)",
                shorten(size)
            )
        })?;
        let stream = parse_hex(stream).ok_or_else(|| {
            format!(
                "Stream '{}' is not a hexadecimal stream handle",
                shorten(stream)
            )
        })?;
        let pointer = parse_hex(pointer).ok_or_else(|| {
            format!(
                "Pointer '{}' is not a hexadecimal address",
                shorten(pointer)
            )
        })?;
        Ok(Fields {
            time,
            action: Action::of(action),
            pointer,
            size,
            stream,
        })
    }

    /// The usual line straight from its bytes, with no allocation, in one pass from
    /// its start: a thread of ASCII, the time `HH:MM:SS.ffffff`, one of the four
    /// actions, a size of at most 20 digits, pointer and stream `0x` (or `0X`, or
    /// nothing) and 1 to 16 hexadecimal digits, six fields: ASCII throughout, so UTF-8.
    /// `None` for anything else, which [`Fields::read`] takes (after a UTF-8 check):
    /// where this gives fields, that gives the same.
    #[inline]
    fn usual(b: &[u8]) -> Option<Fields<'static>> {
        match Fields::usual_until(b)? {
            (fields, end) if end == b.len() => Some(fields),
            _ => None,
        }
    }

    /// The usual line at the start of `buf` (a reader's buffer) and the place of its
    /// line break: the line is read in the same pass that finds its end (no search
    /// for the break first). `None` where [`Fields::usual`] of the line is, or where
    /// the line does not end within `buf` with `\n`.
    #[inline]
    fn usual_line(buf: &[u8]) -> Option<(Fields<'static>, usize)> {
        match Fields::usual_until(buf)? {
            (fields, end) if buf.get(end) == Some(&b'\n') => Some((fields, end)),
            _ => None,
        }
    }

    /// [`Fields::usual`] of the line at the start of `b`, whatever follows the
    /// stream's digits, and the place after them. The thread stops at a line break.
    #[inline(always)]
    fn usual_until(b: &[u8]) -> Option<(Fields<'static>, usize)> {
        let thread_end = ascii_to_comma(b)?;
        if thread_end == 0 {
            return None;
        }
        let at = thread_end + 1;
        let time = usual_time(b, at)?;
        // The time's 15 bytes and its comma.
        let (action, at) = usual_action(b, at + 16)?;
        let (pointer, at) = usual_hex(b, at)?;
        if b.get(at) != Some(&b',') {
            return None;
        }
        let at = at + 1;
        // 1 to 20 digits within 64 bits, as `parse_decimal` reads them: eight at a
        // time (the CSV reader's scan) where the scan reads the whole field, else (a
        // field that is not all digits, more than 16 digits, digits too near the
        // line's end for a word of eight bytes) one at a time up to the comma.
        let (size, at) = match crate::csv::scan_number(b, at) {
            Some((size, end)) if b.get(end) == Some(&b',') => (size, end),
            _ => {
                let end = at + memchr::memchr(b',', b.get(at..)?)?;
                (crate::csv::digits(&b[at..end])?, end)
            }
        };
        let (stream, end) = usual_hex(b, at + 1)?;
        let fields = Fields {
            time,
            action,
            pointer,
            size,
            stream,
        };
        Some((fields, end))
    }
}

/// Eight bytes of `b` from `at` as a little-endian word (the first byte lowest), if
/// there are eight.
#[inline(always)]
fn word(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The high bit of each byte.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that equals each byte of `pattern`, exactly:
/// for `x = w ^ pattern`, `(y & 0x7f) + 0x7f` carries into a byte's high bit, never
/// past it, where y's low bits are not all 0.
#[inline(always)]
fn bytes_equal(w: u64, pattern: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = w ^ pattern;
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// The place of the first comma of `b` if every byte before it is ASCII and none is
/// a line break, read eight bytes at a time; `None` without one within the line's
/// words (a thread so near the end leaves no room for the other fields), or with a
/// byte before it that is not ASCII or is a line break.
#[inline(always)]
fn ascii_to_comma(b: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let w = word(b, at)?;
        let commas = bytes_equal(w, 0x2c2c_2c2c_2c2c_2c2c);
        // Bytes that are not ASCII, or are a line break (both end the thread).
        let stops = (w & HIGH) | bytes_equal(w, 0x0a0a_0a0a_0a0a_0a0a);
        if commas != 0 {
            let k = commas.trailing_zeros() / 8;
            // The bytes before the comma (none where it is the first).
            let before = (1u64 << (8 * k)) - 1;
            return (stops & before == 0).then_some(at + k as usize);
        }
        if stops != 0 {
            return None;
        }
        at += 8;
    }
}

/// Each byte of `x` whose bit is set in `mask` is at most 9 (`x` a word of bytes
/// less `b'0'` by xor, so exactly the digits): no byte's high bit set, and none set
/// by adding 0x76 (a carry out of a byte comes only from one whose high bit is set).
#[inline(always)]
fn all_digits(x: u64, mask: u64) -> bool {
    (x.wrapping_add(0x7676_7676_7676_7676) | x) & mask == 0
}

/// `HH:MM:SS.ffffff` and a comma at `b[at..]` (exactly six digits of fraction), as
/// [`time_of_day`] reads the time; `None` for any other shape, or a value it refuses.
/// Two words: `HH:MM:SS` and `.ffffff,`.
#[inline(always)]
fn usual_time(b: &[u8], at: usize) -> Option<u64> {
    let (w1, w2) = (word(b, at)?, word(b, at + 8)?);
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let colons = u64::from_le_bytes(*b"\0\0:\0\0:\0\0");
    let ends = u64::from_le_bytes(*b".\0\0\0\0\0\0,");
    if w1 & 0x0000_ff00_00ff_0000 != colons || w2 & 0xff00_0000_0000_00ff != ends {
        return None;
    }
    let (x1, x2) = (w1 ^ ZEROS, w2 ^ ZEROS);
    if !all_digits(x1, 0x8080_0080_8000_8080) || !all_digits(x2, 0x0080_8080_8080_8000) {
        return None;
    }
    // Each byte i of `pairs` is 10 x1[i] + x1[i + 1] (every byte of x1 at most 10: no
    // carry between bytes): the hours at byte 0, the minutes at 3, the seconds at 6.
    let pairs = x1.wrapping_mul(10).wrapping_add(x1 >> 8);
    let (h, m, s) = (pairs & 0xff, (pairs >> 24) & 0xff, (pairs >> 48) & 0xff);
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let micros = crate::csv::digits_value(x2 >> 8, 6);
    Some(((h * 60 + m) * 60 + s) * 1_000_000 + micros)
}

/// One of the four actions and its comma at `b[at..]`, and the place after the comma.
#[inline(always)]
fn usual_action(b: &[u8], at: usize) -> Option<(Action<'static>, usize)> {
    const ALLOCATE: u64 = u64::from_le_bytes(*b"allocate");
    const DEALLOCA: u64 = u64::from_le_bytes(*b"dealloca");
    const FREE: u64 = u64::from_le_bytes(*b"free,\0\0\0");
    let w = word(b, at)?;
    if w & 0xff_ffff_ffff == FREE {
        return Some((Action::Free, at + 5));
    }
    let rest = b.get(at + 8..)?;
    match w {
        ALLOCATE if rest.first() == Some(&b',') => Some((Action::Allocate, at + 9)),
        ALLOCATE if rest.starts_with(b" failure,") => Some((Action::AllocateFailure, at + 17)),
        DEALLOCA if rest.starts_with(b"te,") => Some((Action::Deallocate, at + 11)),
        _ => None,
    }
}

/// `0x`, `0X` or nothing, then 1 to 16 hexadecimal digits at `b[at..]`, as
/// [`parse_hex`] reads them, and the place after the digits. Two digits a step.
#[inline(always)]
fn usual_hex(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let from = match b.get(at..at + 2) {
        Some([b'0', b'x' | b'X']) => at + 2,
        _ => at,
    };
    let mut v = 0u64;
    let mut i = from;
    // At most 17 bytes looked at: a seventeenth digit refuses the field.
    while i < from + 16 {
        let Some(&[c0, c1]) = b.get(i..i + 2) else {
            break;
        };
        let (d0, d1) = (HEX_DIGITS[usize::from(c0)], HEX_DIGITS[usize::from(c1)]);
        if d0 | d1 > 15 {
            break;
        }
        v = v << 8 | u64::from(d0) << 4 | u64::from(d1);
        i += 2;
    }
    // One more digit (an odd count, or the line's last byte), or a seventeenth.
    if let Some(&c) = b.get(i) {
        let d = HEX_DIGITS[usize::from(c)];
        if d <= 15 {
            v = v << 4 | u64::from(d);
            i += 1;
        }
    }
    (i > from && i - from <= 16).then_some((v, i))
}

/// Each byte's value as a hexadecimal digit (`0-9`, `a-f`, `A-F`); 255 for a byte that
/// is not one.
static HEX_DIGITS: [u8; 256] = {
    let mut table = [255u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        table[c] = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => 255,
        };
        c += 1;
    }
    table
};

/// `HH:MM:SS.ffffff` (the fraction 1 to 9 digits, kept to microseconds) as
/// microseconds since midnight.
fn time_of_day(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "Time '{}' is not a time of day HH:MM:SS.ffffff",
            shorten(text)
        )
    };
    let (hms, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut parts = hms.split(':');
    let (Some(h), Some(m), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let two = |t: &str, max: u64| -> Option<u64> {
        (t.len() == 2)
            .then(|| parse_decimal(t))
            .flatten()
            .filter(|v| *v <= max)
    };
    let (Some(h), Some(m), Some(s)) = (two(h, 23), two(m, 59), two(s, 60)) else {
        return Err(bad());
    };
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if text.contains('.') && fraction.is_empty() {
        return Err(bad());
    }
    let mut micros = 0u64;
    for i in 0..6 {
        let digit = fraction
            .as_bytes()
            .get(i)
            .map_or(0, |b| u64::from(b - b'0'));
        micros = micros * 10 + digit;
    }
    Ok(((h * 60 + m) * 60 + s) * 1_000_000 + micros)
}

/// Digits only.
fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A hexadecimal handle with or without `0x`; `(nil)` is null.
fn parse_hex(text: &str) -> Option<u64> {
    if text == "(nil)" {
        return Some(0);
    }
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    crate::ids::hex_u64(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Trace, ReadError> {
        read_rmm_from(text.as_bytes(), Path::new("rmm.csv"))
    }

    /// The one-pass reading of the usual line gives what the field-by-field reading
    /// gives, on every line it takes, and leaves the others (spellings of each field,
    /// boundaries of each number, malformed lines) to it.
    #[test]
    fn usual_lines_read_as_field_by_field() {
        let times = [
            "10:17:36.614829",
            "00:00:00.000000",
            "23:59:60.999999",
            "24:00:00.000000",
            "10:60:00.000000",
            "10:17:36.61482",
            "10:17:36.6148290",
            "10:17:36.5",
            "10:17:36",
            "10:17:36.",
            "1:17:36.614829",
            "10:17:36.61482x",
            "10-17-36.614829",
        ];
        let hexes = [
            "0x7f8a40000000",
            "7f8a40000000",
            "0X7F8A40000000",
            "0x0",
            "0",
            "(nil)",
            "0x",
            "",
            "0xffffffffffffffff",
            "0x10000000000000000",
            "0x0000000000000000001",
            "ffffffffffffffff",
            "0xg1",
            "0x0x1",
            "-0x1",
        ];
        let sizes = [
            "1024",
            "0",
            "9999999999999999999",
            "18446744073709551615",
            "18446744073709551616",
            "00000000000000000001",
            "12345678",
            "123456789",
            "1234567890123456",
            "12345678901234567",
            "1234567x",
            "123456789x",
            "",
            "1e3",
            "-1",
            " 1",
        ];
        let actions = [
            "allocate",
            "free",
            "deallocate",
            "allocate failure",
            "frob",
            "",
        ];
        let mut lines = Vec::new();
        // One field changed at a time from a usual line, then all at once.
        let base = [
            "140573312345856",
            "10:17:36.614829",
            "allocate",
            "0x7f8a40000000",
            "1024",
            "0x0",
        ];
        for (k, variants) in [&times[..], &actions[..], &hexes[..], &sizes[..], &hexes[..]]
            .into_iter()
            .enumerate()
        {
            for v in variants {
                let mut fields = base;
                fields[k + 1] = v;
                lines.push(fields.join(","));
            }
        }
        for thread in ["7", "", "thréad", "1 ", "0x1f"] {
            let mut fields = base;
            fields[0] = thread;
            lines.push(fields.join(","));
        }
        for (i, time) in times.iter().enumerate() {
            for (j, pointer) in hexes.iter().enumerate() {
                let size = sizes[(i + j) % sizes.len()];
                let stream = hexes[(i * 7 + j) % hexes.len()];
                let action = actions[(i + 3 * j) % actions.len()];
                lines.push(format!(
                    "140573312345856,{time},{action},{pointer},{size},{stream}"
                ));
            }
        }
        lines.extend(
            [
                ",10:17:36.614829,allocate,0x1,1,0x0",
                "1,10:17:36.614829,allocate,0x1,1,0x0,",
                "1,10:17:36.614829,allocate,0x1,1",
                "1,10:17:36.614829,allocate,0x1,1,0x0\r",
                "",
            ]
            .map(String::from),
        );
        let mut usual = 0;
        for line in &lines {
            if let Some(fields) = Fields::usual(line.as_bytes()) {
                usual += 1;
                assert_eq!(Ok(fields), Fields::read(line), "{line}");
            }
        }
        // Both kinds were seen.
        assert!(
            usual > 20 && usual < lines.len() - 20,
            "{usual} of {}",
            lines.len()
        );
    }

    fn read_err(text: &str) -> String {
        read(text).unwrap_err().to_string()
    }

    /// A line as `logging_resource_adaptor` formats it: the pattern
    /// `%t,%H:%M:%S.%f,%v` and the message `ACTION,PTR,BYTES,STREAM`.
    fn line(thread: u64, time: &str, message: &str) -> String {
        format!("{thread},{time},{message}\n")
    }

    /// A log as RMM writes it through fmt's `{}` (pointers `0x...`, null `0x0`,
    /// `fmt::ptr` streams): allocations, frees, a failure, a pointer handed out again
    /// after its free, two streams; ids are the pointers, times microseconds since
    /// midnight, locations lines.
    #[test]
    fn reads_a_log_with_pointer_reuse_and_a_failure() {
        let text = [
            format!("{RMM_HEADER}\n"),
            line(
                140573312345856,
                "10:17:36.614829",
                "allocate,0x7f8a40000000,1024,0x0",
            ),
            line(
                140573312345856,
                "10:17:36.614900",
                "allocate,0x7f8a40000400,2048,0x5604a3c0",
            ),
            line(
                140573312345856,
                "10:17:36.615011",
                "free,0x7f8a40000000,1024,0x0",
            ),
            line(
                140573312345856,
                "10:17:36.615100",
                "allocate failure,0x0,68719476736,0x0",
            ),
            line(
                140573312345857,
                "10:17:36.616000",
                "allocate,0x7f8a40000000,512,0x0",
            ),
            line(
                140573312345857,
                "10:17:36.617",
                "free,0x7f8a40000000,512,0x0",
            ),
        ]
        .concat();
        let t = read(&text).unwrap();
        let alloc = |id, size_bytes, stream| Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream,
        };
        assert_eq!(
            t.events,
            [
                alloc(0, 1024, 0),
                alloc(1, 2048, 0x5604a3c0),
                Event::Free { id: AllocId(0) },
                alloc(2, 68719476736, 0),
                alloc(0, 512, 0),
                Event::Free { id: AllocId(0) },
            ]
        );
        assert_eq!(
            t.id_names,
            ["0x7f8a40000000", "0x7f8a40000400", "failed@line 5"]
        );
        let base = (10 * 3600 + 17 * 60 + 36) * 1_000_000;
        assert_eq!(
            t.times_us,
            [614829, 614900, 615011, 615100, 616000, 617000].map(|us| base + us)
        );
        assert_eq!(t.locations, [2, 3, 4, 5, 6, 7]);
        assert_eq!(t.meta.format, Some(Format::Rmm));
        assert_eq!(t.describe(2), "rmm.csv: line 4");
        // Validation sees a replayable trace, the failed request live at the end.
        let issues = crate::validate(&t);
        assert!(!crate::has_errors(&issues), "{issues:?}");
        assert_eq!(
            issues[0].display_with(&t).to_string(),
            "rmm.csv: line 3: 2 allocations (64.00 GiB) are still live at the end of the trace: ids 0x7f8a40000400 (allocated here), failed@line 5"
        );
    }

    /// The streamed reader gives the whole reader's events, with a freed pointer's id
    /// given to the next new pointer (here the failed request's and the second
    /// pointer's allocation take the first pointer's freed id) and counts them.
    #[test]
    fn streamed_events_reuse_freed_ids() {
        let text = [
            format!("{RMM_HEADER}\n"),
            line(1, "10:00:00.000001", "allocate,0x1000,1024,0x0"),
            line(1, "10:00:00.000002", "free,0x1000,1024,0x0"),
            line(
                1,
                "10:00:00.000003",
                "allocate failure,(nil),68719476736,0x0",
            ),
            line(1, "10:00:00.000004", "allocate,0x2000,512,0x0"),
            line(1, "10:00:00.000005", "allocate,0x1000,256,0x0"),
            line(1, "10:00:00.000006", "free,0x2000,512,0x0"),
        ]
        .concat();
        let whole = read(&text).unwrap();
        let mut streamed = RmmEvents::new(text.as_bytes(), Path::new("rmm.csv"));
        let events: Vec<Event> = streamed.by_ref().collect();
        assert_eq!(streamed.stopped(), None);
        assert_eq!((streamed.events_read(), streamed.allocs_read()), (6, 4));
        let alloc = |id, size_bytes| Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        };
        let free = |id| Event::Free { id: AllocId(id) };
        // Whole: one id per pointer (0x1000 is 0, the failure 1, 0x2000 2).
        assert_eq!(
            whole.events,
            [
                alloc(0, 1024),
                free(0),
                alloc(1, 68719476736),
                alloc(2, 512),
                alloc(0, 256),
                free(2)
            ]
        );
        // Streamed: the failure has an id of its own; 0x2000 takes 0x1000's freed id 0,
        // and 0x1000 again a new one.
        assert_eq!(
            events,
            [
                alloc(0, 1024),
                free(0),
                alloc(1, 68719476736),
                alloc(0, 512),
                alloc(2, 256),
                free(0)
            ]
        );
        assert_eq!(streamed.shell().meta.format, Some(Format::Rmm));
        assert_eq!(RmmEvents::<&[u8]>::line_of(2), 4);
    }

    /// A pointer's name is what `format!("0x{:x}")` writes, at every length.
    #[test]
    fn pointer_names_are_formatted_hexadecimal() {
        let mut pointers = vec![0, 1, 0xf, 0x10, 0xff, 0x100, u64::MAX, 0x7f8a_4000_0000];
        pointers.extend((0..64).map(|k| 1u64 << k));
        pointers.extend((1..64).map(|k| (1u64 << k) - 1));
        for pointer in pointers {
            assert_eq!(pointer_name(pointer), format!("0x{pointer:x}"));
        }
    }

    /// The usual lines RMM writes are read as usual lines (the fast path), however
    /// long their fields: every spelling of pointer and stream, sizes of 1 to 20
    /// digits, threads of 1 to 20 digits, each action; and in a reader's buffer,
    /// ended by a line break with more text after it.
    #[test]
    fn usual_lines_take_the_usual_path() {
        let hexes = [
            "0x7f8a40000000",
            "7f8a40000000",
            "0X7F8A40000000",
            "0x0",
            "0",
            "0xffffffffffffffff",
            "fedcba9876543210",
        ];
        let actions = ["allocate", "free", "deallocate", "allocate failure"];
        let mut count = 0;
        for digits in 1..=20usize {
            let size: String = (0..digits)
                .map(|i| char::from(b'1' + (i % 9) as u8))
                .collect();
            let thread = &"14057331234585612345"[..digits];
            for (i, pointer) in hexes.iter().enumerate() {
                let stream = hexes[(i + digits) % hexes.len()];
                let action = actions[(i + digits) % actions.len()];
                let line = format!("{thread},10:17:36.614829,{action},{pointer},{size},{stream}");
                let read = Fields::read(&line).unwrap();
                assert_eq!(Fields::usual(line.as_bytes()), Some(read), "{line}");
                let buffered = format!("{line}\n1,10:17:36.614830,free,0x1,1,0x0\n");
                let Some((fields, end)) = Fields::usual_line(buffered.as_bytes()) else {
                    panic!("{line}");
                };
                assert_eq!((fields, end), (Fields::read(&line).unwrap(), line.len()));
                count += 1;
            }
        }
        assert_eq!(count, 140);
    }

    /// A usual line with one byte changed, added or taken away anywhere reads by the
    /// fast path as field by field, or not by the fast path: every position, bytes
    /// that are field separators, line breaks, digits, hexadecimal letters, the
    /// time's punctuation and not ASCII; in a buffer too, followed by a line break.
    #[test]
    fn changed_usual_lines_read_as_field_by_field() {
        let bases = [
            "140573312345856,10:17:36.614829,allocate,0x7f8a40000000,123456789,0x7f8a38001020",
            "7,23:59:60.999999,free,7f8a40000000,1,0",
            "12,00:00:00.000000,allocate failure,0x0,68719476736,0X0",
        ];
        let others = *b",\n\r:.x X0959aAfFgG/\x80\xff\x00-";
        let mut lines: Vec<Vec<u8>> = Vec::new();
        for base in bases {
            let base = base.as_bytes();
            for at in 0..=base.len() {
                if at < base.len() {
                    let mut cut = base.to_vec();
                    cut.remove(at);
                    lines.push(cut);
                }
                for &c in &others {
                    if at < base.len() {
                        let mut changed = base.to_vec();
                        changed[at] = c;
                        lines.push(changed);
                    }
                    let mut added = base.to_vec();
                    added.insert(at, c);
                    lines.push(added);
                }
            }
        }
        let (mut usual, mut not) = (0, 0);
        for line in &lines {
            let fast = Fields::usual(line);
            if let Some(fields) = &fast {
                let text = std::str::from_utf8(line).expect("a usual line is ASCII");
                assert_eq!(Ok(fields), Fields::read(text).as_ref(), "{text}");
                usual += 1;
            } else {
                not += 1;
            }
            let mut buffered = line.clone();
            buffered.extend_from_slice(b"\n1,10:17:36.614830,free,0x1,1,0x0\n");
            // In a buffer, the line up to its first break is read, as it would be
            // alone.
            let end = buffered.iter().position(|&c| c == b'\n').expect("a break");
            let alone = Fields::usual(&buffered[..end]).map(|f| (f, end));
            assert_eq!(Fields::usual_line(&buffered), alone, "{line:?}");
        }
        assert!(usual > 100 && not > 100, "{usual} usual, {not} not");
    }

    /// The streamed reader reads the usual line from its bytes without a UTF-8 check,
    /// so a line that is not UTF-8 must not pass as usual: a thread field of bytes
    /// that are not UTF-8 stops the stream (the whole-trace reader names the line), a
    /// thread of other UTF-8 text reads as the whole-trace reader reads it.
    #[test]
    fn streamed_lines_that_are_not_ascii() {
        let head = format!("{RMM_HEADER}\n");
        let mut bad = head.clone().into_bytes();
        bad.extend_from_slice(b"\xff,10:00:00.000001,allocate,0x1000,8,0x0\n");
        let mut streamed = RmmEvents::new(&bad[..], Path::new("rmm.csv"));
        assert_eq!(streamed.by_ref().count(), 0);
        assert_eq!(streamed.stopped(), Some(Unstreamable::Problem));
        let e = read_rmm_from(&bad[..], Path::new("rmm.csv")).unwrap_err();
        assert_eq!(e.to_string(), "rmm.csv: line 2: not valid UTF-8 text");
        let text = head + "thréad,10:00:00.000001,allocate,0x1000,8,0x0\n";
        let mut streamed = RmmEvents::new(text.as_bytes(), Path::new("rmm.csv"));
        let events: Vec<Event> = streamed.by_ref().collect();
        assert_eq!(streamed.stopped(), None);
        assert_eq!(events, read(&text).unwrap().events);
    }

    /// Lines read where they lie in the reader's buffer and lines that run past its end
    /// or arrive in pieces (a pipe) give the same events, streamed and whole: a log of
    /// 20 001 lines (about 1 MB: four of the reader's buffers), the last without a line
    /// break, read from a slice and through a reader that hands out 7 bytes at a time.
    #[test]
    fn streamed_lines_across_buffer_ends_read_alike() {
        struct Trickle<'a>(&'a [u8]);
        impl io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(7).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut text = format!("{RMM_HEADER}\n");
        for i in 0..10_000u64 {
            let ptr = 0x7f00_0000_0000u64 + i * 4096;
            let size = (i + 1) * 256;
            text += &line(
                1,
                "10:00:00.000001",
                &format!("allocate,{ptr:#x},{size},0x0"),
            );
            text += &line(1, "10:00:00.000002", &format!("free,{ptr:#x},{size},0x0"));
        }
        text += "1,10:00:00.000003,allocate,0x1000,8,0x0";
        let whole = read(&text).unwrap();
        let sizes = |events: &[Event]| -> Vec<u64> {
            events
                .iter()
                .filter_map(|e| match e {
                    Event::Alloc { size_bytes, .. } => Some(*size_bytes),
                    _ => None,
                })
                .collect()
        };
        let mut from_slice = RmmEvents::new(text.as_bytes(), Path::new("rmm.csv"));
        let mut trickled = RmmEvents::new(Trickle(text.as_bytes()), Path::new("rmm.csv"));
        let a: Vec<Event> = from_slice.by_ref().collect();
        let b: Vec<Event> = trickled.by_ref().collect();
        // The whole-log reader too (its usual lines read in its buffer as well).
        let whole_trickled = read_rmm_from(Trickle(text.as_bytes()), Path::new("rmm.csv")).unwrap();
        assert_eq!(whole_trickled.events, whole.events);
        assert_eq!(whole_trickled.locations, whole.locations);
        assert_eq!(whole_trickled.id_names, whole.id_names);
        assert_eq!((from_slice.stopped(), trickled.stopped()), (None, None));
        assert_eq!(a.len(), 20_001);
        assert_eq!(a, b);
        assert_eq!(sizes(&a), sizes(&whole.events));
        assert_eq!(from_slice.events_read(), 20_001);
        assert_eq!(from_slice.allocs_read(), 10_001);
    }

    /// The spellings of other RMM versions: `%llx` (no `0x`, null `0`), `%p` (null
    /// `(nil)`), `std::hex` streams, `deallocate`, a CRLF log with a byte order mark.
    #[test]
    fn reads_every_spelling() {
        let text = [
            format!("\u{feff}{RMM_HEADER}\r\n"),
            line(7, "23:59:59.999999", "allocate,7f8a40000000,256,0"),
            line(
                7,
                "23:59:59.999999",
                "allocate failure,(nil),1099511627776,7f00aa00",
            ),
            line(
                7,
                "00:00:00.000001",
                "deallocate,0x7F8A40000000,256,0x7f00aa00",
            ),
            line(7, "00:00:00.000002", "allocate,0x7f8a40000000,256,0"),
        ]
        .concat()
        .replace('\n', "\r\n");
        let t = read(&text).unwrap();
        assert_eq!(t.events.len(), 4);
        assert_eq!(
            t.events[1],
            Event::Alloc {
                id: AllocId(1),
                size_bytes: 1 << 40,
                stream: 0x7f00aa00
            }
        );
        assert_eq!(t.events[2], Event::Free { id: AllocId(0) });
        assert_eq!(
            t.events[3],
            Event::Alloc {
                id: AllocId(0),
                size_bytes: 256,
                stream: 0
            }
        );
        // Past midnight, a day is added.
        assert_eq!(t.times_us[2], DAY_US + 1);
        assert_eq!(t.times_us[3], DAY_US + 2);
    }

    /// Every bad line is one problem naming its line and what is wrong; the error is
    /// one line that names the first and counts the rest.
    #[test]
    fn bad_lines_name_their_line() {
        let h = format!("{RMM_HEADER}\n");
        let cases = [
            ("1,10:00:00.0,allocate,0x10,8", "line 2: a line has 6 fields"),
            (
                "1,10:00:00.0,reallocate,0x10,8,0",
                "line 2: unknown action 'reallocate' (expected allocate, allocate failure, free or deallocate)",
            ),
            ("1,10:00:00.0,allocate,0xZZ,8,0", "line 2: Pointer '0xZZ' is not"),
            ("1,10:00:00.0,allocate,0x10,-8,0", "line 2: Size '-8' is not"),
            ("1,10:00:00.0,allocate,0x10,8KiB,0", "line 2: Size '8KiB' is not"),
            ("1,10:00:00.0,allocate,0x10,8,stream", "line 2: Stream 'stream' is not"),
            ("1,25:00:00.0,allocate,0x10,8,0", "line 2: Time '25:00:00.0' is not"),
            ("1,1634567890.123456,allocate,0x10,8,0", "line 2: Time '1634567890.123456'"),
            ("1,10:00:00.,allocate,0x10,8,0", "line 2: Time '10:00:00.' is not"),
            (",10:00:00.0,allocate,0x10,8,0", "line 2: Thread is missing"),
            ("1,10:00:00.0,allocate,(nil),8,0", "line 2: allocate of a null pointer"),
            (
                "1,10:00:00.0,allocate,0x10,8,0\n1,10:00:00.1,free,0x10,16,0",
                "line 3: free of 0x10 with 16 bytes, but it was allocated with 8 bytes at line 2",
            ),
        ];
        for (rows, want) in cases {
            let e = read_err(&format!("{h}{rows}\n"));
            assert!(e.starts_with(&format!("rmm.csv: {want}")), "{rows}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = read_rmm_from(
            &b"Thread,Time,Action,Pointer,Size,Stream\nx\n1,bad,allocate,0x10,8,0\n\xff\n"[..],
            Path::new("rmm.csv"),
        )
        .unwrap_err();
        let places: Vec<_> = e.all().map(|p| p.location.clone().unwrap()).collect();
        assert_eq!(places, ["line 2", "line 3", "line 4"]);
        assert!(
            e.to_string()
                .ends_with("(and 2 more problems in this file)"),
            "{e}"
        );
    }

    /// Endless input is refused where its line starts, without reading it whole: a line
    /// without a break (zeros after the header, as `/dev/zero` gives, or no header at
    /// all), and `/dev/zero` itself; a log of a million bad lines keeps the first
    /// problems and counts the rest.
    #[test]
    fn endless_and_bad_input_stays_bounded() {
        let header = format!("{RMM_HEADER}\n");
        let zeros_after_header = header.as_bytes().chain(io::repeat(0).take(1 << 40));
        let e = read_rmm_from(zeros_after_header, Path::new("rmm.csv"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("rmm.csv: line 2: not an RMM log: a line longer than {MAX_ROW_BYTES} bytes starts here (no line break?)")
        );
        let e = read_rmm_from(io::repeat(b'x').take(1 << 40), Path::new("rmm.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rmm.csv: line 1: not an RMM log: a line longer"),
            "{e}"
        );
        if Path::new("/dev/zero").exists() {
            let zero = std::fs::File::open("/dev/zero").unwrap();
            let e = read_rmm_from(zero, Path::new("/dev/zero"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("/dev/zero: line 1: not an RMM log"), "{e}");
        }
        let mut text = format!("{RMM_HEADER}\n");
        for _ in 0..1_000_000 {
            text.push_str("x\n");
        }
        let e = read(&text).unwrap_err();
        assert_eq!(e.count(), 1_000_000);
        assert_eq!(e.all().count(), crate::MAX_LISTED_PROBLEMS);
    }

    /// A missing header is refused at line 1; an empty file says what it expects.
    #[test]
    fn header_is_required() {
        assert_eq!(
            read_err("Thread,Time,Action,Pointer,Size\n"),
            "rmm.csv: line 1: expected the RMM log header 'Thread,Time,Action,Pointer,Size,Stream', found 'Thread,Time,Action,Pointer,Size'"
        );
        assert!(read_err("").contains("empty file"));
    }

    /// Frees of pointers never allocated and pointers allocated twice are read, and
    /// validation names their lines by pointer.
    #[test]
    fn inconsistent_logs_are_left_to_validation() {
        let text = format!(
            "{RMM_HEADER}\n1,10:00:00.0,free,0x20,8,0\n1,10:00:00.1,allocate,0x10,8,0\n1,10:00:00.2,allocate,0x10,8,0\n"
        );
        let t = read(&text).unwrap();
        let lines: Vec<String> = crate::validate(&t)
            .iter()
            .filter(|i| i.severity == crate::Severity::Error)
            .map(|i| i.display_with(&t).to_string())
            .collect();
        assert_eq!(
            lines,
            [
                "rmm.csv: line 2: free of unknown id 0x20",
                "rmm.csv: line 4: alloc of id 0x10, which is still live (allocated at line 3)"
            ]
        );
    }
}
