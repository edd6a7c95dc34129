//! Allocation traces: the model, its file formats, validation and generators.
//!
//! Design choices, and why:
//!
//! - **One small model.** A [`Trace`] is a list of [`Event`]s: `alloc`,
//!   `free_requested`, `free`, `empty_cache`, `mark`, with the source's metadata
//!   ([`TraceMeta`]: format, recorded configuration, cap, device). Every source (hand-written YAML, CSV, PyTorch snapshot
//!   pickles, recorded runs, generators) becomes this model, and every consumer reads
//!   only it.
//! - **Formats are a boundary.** This is the only crate that derives `Serialize` /
//!   `Deserialize` for trace data; policies and the simulator never see a file.
//! - **Errors name the place.** A [`ReadError`] carries the file and the line, event or
//!   entry; [`validate()`] reports every problem, not just the first.
//! - **Knows nothing about policies.** Streams are plain `u64`s here; sizes are bytes.
//! - **Strict readers.** Unknown ops, keys and extra fields are errors, never skipped:
//!   a silently ignored field gives a plausible but wrong replay. No input makes a
//!   reader panic.
//! - **Recorded runs refuse what they cannot replay.** A PyTorch recording that started
//!   late or whose ring buffer wrapped is refused with advice, not patched up.
//! - **Deterministic writers and generators.** The same trace writes the same bytes; the
//!   same [`RandomOptions`] give the same trace on every platform.
//!
//! Formats: one table, [`Format::spec`] (name, extensions, content sniffer, reader,
//! writer), from which detection ([`detect`]: by content, with the extension as a hint),
//! [`read`], [`write()`] and the command line's `--format` values are derived; adding a
//! format touches that table and its reader module. `docs/trace-format.md` describes
//! them field by field:
//!
//! | format | extensions | read | write |
//! | --- | --- | --- | --- |
//! | YAML, hand-written traces | `.yaml`, `.yml` | [`read_yaml`] | [`write_yaml`] |
//! | CSV, generated traces | `.csv` | [`read_csv`] | [`write_csv`] |
//! | `record_torch.py` JSON | `.json` | [`read_recorded_json`] | - |
//! | PyTorch snapshot pickle | `.pickle`, `.pkl` | [`read_snapshot_pickle`] | - |
//! | RAPIDS RMM log | (found by its header) | [`rmm::read_rmm_from`] | - |
//!
//! Ids in YAML and CSV may be names ([`ids`]), interned to dense integers on reading
//! and kept in [`Trace::id_names`] for writers and messages.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod ahead;
pub mod csv;
pub mod feed;
mod format;
pub mod generate;
pub mod hash;
pub mod id_map;
pub mod ids;
pub mod nodes;
pub mod recorded;
pub mod rmm;
pub mod size;
pub mod snapshot;
pub mod start;
mod trace;
pub mod validate;
pub mod yaml;

use std::fmt;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

pub use crate::csv::{read_csv, read_csv_from, write_csv};
pub use format::{
    detect, Format, FormatError, FormatSpec, Input, Reader, Sniff, Writer, SNIFF_BYTES,
};
pub use generate::{random, InvalidOptions, RandomOptions, SizeDistribution};
pub use recorded::{
    read_recorded_json, read_recorded_json_from, Action, BlockState, Checkpoint, RecordedBlock,
    RecordedEntry, RecordedOom, RecordedRun, RecordedSegment,
};
pub use snapshot::{read_snapshot_pickle, read_snapshot_pickle_from};
pub use start::{StartBlock, StartPool, StartPrivatePool, StartSegment, StartState};
pub use trace::{
    AllocId, Event, IdName, LocationKind, PoolId, PoolStreams, RecordedAddresses, Trace, TraceMeta,
    OP_NAMES,
};
pub use validate::{has_errors, validate, IssueKind, Severity, TraceIssue};
pub use yaml::{read_yaml, read_yaml_from, write_yaml};

/// Reads a trace in `format`, or in the format [`detect`] finds (from the content, with
/// the extension as a hint). Recorded runs (JSON, pickles) become traces through
/// [`RecordedRun::to_trace`]; pickles are read for device 0 (use [`read_source`] for
/// another device).
///
/// # Errors
/// Unknown formats, and the errors of the format's reader.
pub fn read(path: &Path, format: Option<Format>) -> Result<Trace, ReadError> {
    read_source(path, format, 0).map(|(trace, _)| trace)
}

/// Reads a trace in any format, like [`read`], taking `device`'s trace from a snapshot
/// pickle, and also returns the recorded run it came from (recorded formats only), whose
/// segment decisions and addresses a caller may want.
///
/// # Errors
/// See [`read`]; also a device the file does not hold.
pub fn read_source(
    path: &Path,
    format: Option<Format>,
    device: usize,
) -> Result<(Trace, Option<RecordedRun>), ReadError> {
    open(path, format, device, |input, format| {
        match format.spec().read {
            Reader::Trace(read) => Ok((read(input)?, None)),
            Reader::Recorded(read) => {
                let run = read(input)?;
                Ok((run.to_trace()?, Some(run)))
            }
        }
    })
}

/// Reads a recorded PyTorch run (`record_torch.py` JSON or a snapshot pickle) with
/// everything it records, for `device` (JSON files hold device 0 only).
///
/// # Errors
/// Formats that hold no recorded run (YAML, CSV: [`ReadErrorKind::UnknownFormat`]), a
/// device the file does not hold, and the errors of the format's reader.
pub fn read_recorded(
    path: &Path,
    format: Option<Format>,
    device: usize,
) -> Result<RecordedRun, ReadError> {
    open(path, format, device, |input, format| {
        match format.spec().read {
            Reader::Recorded(read) => read(input),
            Reader::Trace(_) => Err(ReadError::unknown_format(
                input.path,
                format!(
                    "a {format} trace is not a recorded PyTorch run (use a record_torch.py .json \
                 or a torch.cuda.memory._dump_snapshot .pickle)"
                ),
            )),
        }
    })
}

/// Opens `path`, finds its format (forced, or [`detect`]ed from its first bytes), and
/// hands the whole content and the format to `read`.
fn open<T>(
    path: &Path,
    format: Option<Format>,
    device: usize,
    read: impl FnOnce(Input<'_>, Format) -> Result<T, ReadError>,
) -> Result<T, ReadError> {
    let mut file = std::fs::File::open(path).map_err(|e| ReadError::io(path, &e))?;
    let len = file
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len());
    let mut prefix = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut prefix)
        .map_err(|e| ReadError::io(path, &e))?;
    let format = match format {
        Some(f) => f,
        None => detect(path, &prefix)?,
    };
    let mut reader = io::Cursor::new(prefix).chain(io::BufReader::new(file));
    let input = Input {
        reader: &mut reader,
        path,
        len,
        device,
    };
    read(input, format)
}

/// Writes `trace` in `format` (YAML or CSV).
///
/// # Errors
/// Errors of `out`, and [`io::ErrorKind::Unsupported`] for JSON and pickles, which are
/// PyTorch's formats and only read.
pub fn write(trace: &Trace, format: Format, out: impl io::Write) -> io::Result<()> {
    write_with(
        trace,
        &mut trace.events.iter().map(std::borrow::Cow::Borrowed),
        format,
        out,
    )
}

/// Writes in `format` the trace whose name, recorded facts and id names `head` has
/// (its events are not read) and whose events `events` gives, each written as it
/// comes: events made on the fly (a generator's) are never held, so memory does not
/// grow with the trace's length. Returns how many events were written. The bytes are
/// those [`write()`] writes of the trace with these events.
///
/// # Errors
/// As [`write()`].
pub fn write_events(
    head: &Trace,
    events: impl Iterator<Item = Event>,
    format: Format,
    out: impl io::Write,
) -> io::Result<u64> {
    let mut count = 0u64;
    let mut counted = events.inspect(|_| count += 1).map(std::borrow::Cow::Owned);
    write_with(head, &mut counted, format, out)?;
    Ok(count)
}

fn write_with<'e>(
    head: &Trace,
    events: &mut dyn Iterator<Item = std::borrow::Cow<'e, Event>>,
    format: Format,
    mut out: impl io::Write,
) -> io::Result<()> {
    match format.spec().write {
        Some(write) => write(head, events, &mut out),
        None => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{format} traces are read, not written"),
        )),
    }
}

/// What kind of problem a [`ReadError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadErrorKind {
    /// The file could not be read.
    Io,
    /// The file is not in the expected format.
    Syntax,
    /// A field has a value that is not allowed.
    Invalid,
    /// The format could not be determined.
    UnknownFormat,
}

/// A trace that could not be read: one line naming the file and the place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// Where in the file (`line 17`, `event 3`, `entry 120`), if known.
    pub location: Option<String>,
    /// What is wrong.
    pub message: String,
    kind: ReadErrorKind,
    /// Further problems found in the same file (malformed rows or events after the
    /// first), the first [`MAX_LISTED_PROBLEMS`] of them; readers report every one they
    /// can.
    pub more: Vec<ReadError>,
    /// Further problems found and counted but not kept (a file of a million bad rows
    /// keeps a few, not a million messages).
    unlisted: u64,
}

/// How many problems of one file a [`ReadError`] keeps (the first and the next ones);
/// the rest are only counted ([`ReadError::count`]).
pub const MAX_LISTED_PROBLEMS: usize = 100;

/// The problems a reader finds in one file, in file order: keeps the first
/// [`MAX_LISTED_PROBLEMS`] and counts the rest, so memory does not grow with them.
#[derive(Debug, Default)]
pub struct Problems {
    kept: Vec<ReadError>,
    unlisted: u64,
}

impl Problems {
    /// How many problems were recorded (kept and counted).
    pub fn len(&self) -> usize {
        self.kept.len() + usize::try_from(self.unlisted).unwrap_or(usize::MAX)
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records one more problem.
    pub fn push(&mut self, problem: ReadError) {
        if self.kept.len() < MAX_LISTED_PROBLEMS {
            self.kept.push(problem);
        } else {
            self.unlisted += 1;
        }
    }

    /// The first problem, carrying the others and the count of those not kept; `None`
    /// if there were none.
    pub fn into_error(self) -> Option<ReadError> {
        let mut first = ReadError::collect(self.kept)?;
        first.unlisted = self.unlisted;
        Some(first)
    }
}

impl ReadError {
    /// The kind of problem.
    pub fn kind(&self) -> ReadErrorKind {
        self.kind
    }

    /// This problem and the further ones kept (the first [`MAX_LISTED_PROBLEMS`] found
    /// in the same file), in file order.
    pub fn all(&self) -> impl Iterator<Item = &ReadError> {
        std::iter::once(self).chain(self.more.iter())
    }

    /// How many problems were found in the file: those of [`ReadError::all`] and those
    /// only counted.
    pub fn count(&self) -> u64 {
        1 + self.more.len() as u64 + self.unlisted
    }

    /// The first of `errors`, carrying the others; `None` if there are none.
    pub fn collect(mut errors: Vec<ReadError>) -> Option<ReadError> {
        if errors.is_empty() {
            return None;
        }
        let mut first = errors.remove(0);
        first.more = errors;
        Some(first)
    }

    /// The message of this problem alone, `path: location: message`.
    pub fn one(&self) -> String {
        match &self.location {
            Some(loc) => format!("{}: {loc}: {}", self.path.display(), self.message),
            None => format!("{}: {}", self.path.display(), self.message),
        }
    }

    /// The file could not be read.
    pub fn io(path: &Path, error: &std::io::Error) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location: None,
            message: error.to_string(),
            kind: ReadErrorKind::Io,
            more: Vec::new(),
            unlisted: 0,
        }
    }

    /// The file is not in the expected format.
    pub fn syntax(path: &Path, location: Option<String>, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location,
            message: message.into(),
            kind: ReadErrorKind::Syntax,
            more: Vec::new(),
            unlisted: 0,
        }
    }

    /// A value is not allowed.
    pub fn invalid(path: &Path, location: Option<String>, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location,
            message: message.into(),
            kind: ReadErrorKind::Invalid,
            more: Vec::new(),
            unlisted: 0,
        }
    }

    /// The format could not be determined.
    pub fn unknown_format(path: &Path, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location: None,
            message: message.into(),
            kind: ReadErrorKind::UnknownFormat,
            more: Vec::new(),
            unlisted: 0,
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.one())?;
        match self.count() - 1 {
            0 => Ok(()),
            1 => write!(f, " (and 1 more problem in this file)"),
            n => write!(f, " (and {n} more problems in this file)"),
        }
    }
}

impl std::error::Error for ReadError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn oracle(name: &str) -> PathBuf {
        repo()
            .join("tests/data/oracle/h100-torch2.11-pickles")
            .join(name)
    }

    /// `read` dispatches on the detected or the forced format, and the same run read
    /// from its JSON and its pickle gives the same trace; a recorded run is read only
    /// from a recorded format.
    #[test]
    fn read_dispatches() {
        let yaml = read(&repo().join("examples/seed000.yaml"), None).unwrap();
        assert_eq!(yaml.location_kind, LocationKind::Event);
        let csv = read(&repo().join("examples/random_small.csv"), Some(Format::Csv)).unwrap();
        assert_eq!(csv.location_kind, LocationKind::Line);
        let from_json = read(&oracle("seed002_retain.json"), None).unwrap();
        let from_pickle = read(&oracle("seed002_retain.pickle"), None).unwrap();
        assert_eq!(from_json.events, from_pickle.events);
        // Both record when each entry happened; the trace keeps it per event.
        assert_eq!(from_json.times_us.len(), from_json.events.len());
        assert!(from_json.times_us.windows(2).all(|w| w[0] <= w[1]));
        // (An empty_cache takes the next entry's time: the JSON's marker and the
        // pickle's inferred call may have different next entries.)
        let requests = |t: &Trace| -> Vec<u64> {
            t.events
                .iter()
                .zip(&t.times_us)
                .filter(|(e, _)| **e != Event::EmptyCache)
                .map(|(_, &t)| t)
                .collect()
        };
        assert_eq!(requests(&from_json), requests(&from_pickle));
        assert!(yaml.times_us.is_empty());
        let forced = read(&oracle("seed002_retain.pickle"), Some(Format::Yaml)).unwrap_err();
        assert_eq!(forced.kind(), ReadErrorKind::Syntax);
        let e = read_recorded(&repo().join("examples/seed000.yaml"), None, 0).unwrap_err();
        assert_eq!(e.kind(), ReadErrorKind::UnknownFormat);
        assert!(read_recorded(&oracle("seed000.json"), None, 1)
            .unwrap_err()
            .to_string()
            .contains("device 0 only"));
        assert!(read_recorded(&oracle("seed000.pickle"), None, 1)
            .unwrap_err()
            .to_string()
            .contains("device 1 is not in the snapshot"));
    }

    /// A file is read in the format its content shows, whatever its name: a snapshot
    /// pickle named `.json` and a recorded JSON named `.data` read as what they are
    /// (content read past the sniffed prefix included), and the trace says which.
    #[test]
    fn reads_by_content() {
        let dir = std::env::temp_dir().join(format!("allocsim-detect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pickle = oracle("multistream.pickle");
        let json = oracle("multistream.json");
        assert!(std::fs::metadata(&pickle).unwrap().len() > SNIFF_BYTES as u64);
        let misnamed_pickle = dir.join("run.json");
        let unnamed_json = dir.join("run.data");
        std::fs::copy(&pickle, &misnamed_pickle).unwrap();
        std::fs::copy(&json, &unnamed_json).unwrap();
        let want = read(&json, None).unwrap();
        let a = read(&misnamed_pickle, None).unwrap();
        let b = read(&unnamed_json, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(a.events, want.events);
        assert_eq!(a.meta.format, Some(Format::TorchPickle));
        assert_eq!(b.events, want.events);
        assert_eq!(b.meta.format, Some(Format::RecordedJson));
    }

    /// `write` writes YAML and CSV that read back to the same events, and refuses the
    /// read-only formats.
    #[test]
    fn write_dispatches() {
        let t = read(&repo().join("examples/training_loop.yaml"), None).unwrap();
        for f in [Format::Yaml, Format::Csv] {
            let mut out = Vec::new();
            write(&t, f, &mut out).unwrap();
            let back = match f {
                Format::Yaml => read_yaml_from(&out[..], Path::new("x.yaml")),
                _ => read_csv_from(&out[..], Path::new("x.csv")),
            }
            .unwrap();
            assert_eq!(back.events, t.events);
        }
        let e = write(&t, Format::TorchPickle, Vec::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
    }

    /// The hand-written examples are valid: no errors and no allocation left live,
    /// except what the scenario keeps on purpose.
    #[test]
    fn examples_are_valid() {
        for name in ["seed000.yaml", "training_loop.yaml", "random_small.csv"] {
            let t = read(&repo().join("examples").join(name), None).unwrap();
            let issues = validate(&t);
            assert!(!has_errors(&issues), "{name}: {:?}", issues);
        }
    }

    /// examples/seed000.yaml asks PyTorch's allocator for exactly what the recorded
    /// seed000 run asked (same sizes, frees and empty_cache, in order).
    #[test]
    fn seed000_example_matches_recording() {
        let requests = |t: &Trace| -> Vec<String> {
            // Ids differ between the two; compare by allocation order instead.
            let mut order = std::collections::HashMap::new();
            t.events
                .iter()
                .filter_map(|e| match e {
                    Event::Alloc {
                        id,
                        size_bytes,
                        stream,
                    } => {
                        let n = order.len();
                        order.insert(*id, n);
                        Some(format!("alloc #{n} {size_bytes} on {stream}"))
                    }
                    Event::Free { id } => Some(format!("free #{}", order[id])),
                    Event::FreeRequested { id } => Some(format!("free_requested #{}", order[id])),
                    Event::EmptyCache => Some("empty_cache".into()),
                    _ => None,
                })
                .collect()
        };
        let example = read(&repo().join("examples/seed000.yaml"), None).unwrap();
        let recorded = read(&oracle("seed000.json"), None).unwrap();
        let want = requests(&recorded);
        // The recording goes on with the frees of the program's exit; the example stops
        // at the scenario's end.
        assert_eq!(
            requests(&example),
            want[..requests(&example).len()].to_vec()
        );
    }
}
