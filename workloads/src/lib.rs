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
//! Formats ([`Format`]; `docs/trace-format.md` describes them field by field):
//!
//! | format | extensions | read | write |
//! | --- | --- | --- | --- |
//! | YAML, hand-written traces | `.yaml`, `.yml` | [`read_yaml`] | [`write_yaml`] |
//! | CSV, generated traces | `.csv` | [`read_csv`] | [`write_csv`] |
//! | `record_torch.py` JSON | `.json` | [`read_recorded_json`] | - |
//! | PyTorch snapshot pickle | `.pickle`, `.pkl` | [`read_snapshot_pickle`] | - |

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod csv;
pub mod generate;
pub mod recorded;
pub mod size;
pub mod snapshot;
mod trace;
pub mod validate;
pub mod yaml;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub use crate::csv::{read_csv, read_csv_from, write_csv};
pub use generate::{random, InvalidOptions, RandomOptions, SizeDistribution};
pub use recorded::{
    read_recorded_json, read_recorded_json_from, Action, BlockState, Checkpoint, RecordedBlock,
    RecordedEntry, RecordedOom, RecordedRun, RecordedSegment,
};
pub use snapshot::{read_snapshot_pickle, read_snapshot_pickle_from};
pub use trace::{AllocId, Event, LocationKind, Trace, TraceMeta};
pub use validate::{has_errors, validate, IssueKind, Severity, TraceIssue};
pub use yaml::{read_yaml, read_yaml_from, write_yaml};

/// A trace file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Hand-written YAML traces (`.yaml`, `.yml`).
    Yaml,
    /// CSV traces (`.csv`).
    Csv,
    /// Recorded PyTorch runs written by `record_torch.py` (`.json`).
    RecordedJson,
    /// PyTorch memory snapshot pickles from `torch.cuda.memory._dump_snapshot`
    /// (`.pickle`, `.pkl`).
    TorchPickle,
}

impl Format {
    /// Every format, in the order of the docs.
    pub const ALL: [Format; 4] = [
        Format::Yaml,
        Format::Csv,
        Format::RecordedJson,
        Format::TorchPickle,
    ];

    /// The format of a file, from its extension (case-insensitive).
    ///
    /// # Errors
    /// An [`ReadErrorKind::UnknownFormat`] error listing the known extensions.
    pub fn from_path(path: &Path) -> Result<Format, ReadError> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        match ext.as_str() {
            "yaml" | "yml" => Ok(Format::Yaml),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::RecordedJson),
            "pickle" | "pkl" => Ok(Format::TorchPickle),
            _ => Err(ReadError::unknown_format(
                path,
                format!(
                    "cannot tell the trace format from {} (known: .yaml/.yml, .csv, .json, .pickle/.pkl; \
                     use --format yaml|csv|json|pickle to force one)",
                    if ext.is_empty() { "a file without extension".to_string() } else { format!("the extension .{ext}") }
                ),
            )),
        }
    }

    /// The format of a `--format` flag value: `yaml`, `csv`, `json` or `pickle`.
    ///
    /// # Errors
    /// A message listing the accepted names.
    pub fn from_name(name: &str) -> Result<Format, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                format!("unknown trace format '{name}' (expected yaml, csv, json or pickle)")
            })
    }

    /// The name [`Format::from_name`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            Format::Yaml => "yaml",
            Format::Csv => "csv",
            Format::RecordedJson => "json",
            Format::TorchPickle => "pickle",
        }
    }

    /// Whether [`write()`] can write this format (YAML and CSV).
    pub fn is_writable(self) -> bool {
        matches!(self, Format::Yaml | Format::Csv)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads a trace in `format`, or in the format its extension names. Recorded runs
/// (JSON, pickles) become traces through [`RecordedRun::to_trace`]; pickles are read
/// for device 0 (use [`read_recorded`] for another device).
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
    let format = match format {
        Some(f) => f,
        None => Format::from_path(path)?,
    };
    match format {
        Format::Yaml => Ok((read_yaml(path)?, None)),
        Format::Csv => Ok((read_csv(path)?, None)),
        Format::RecordedJson | Format::TorchPickle => {
            let run = read_recorded(path, Some(format), device)?;
            Ok((run.to_trace()?, Some(run)))
        }
    }
}

/// Reads a recorded PyTorch run (`record_torch.py` JSON or a snapshot pickle) with
/// everything it records, for `device` (JSON files hold device 0 only).
///
/// # Errors
/// YAML and CSV files ([`ReadErrorKind::UnknownFormat`]: they hold no recorded run), a
/// device other than 0 for JSON, and the errors of the format's reader.
pub fn read_recorded(
    path: &Path,
    format: Option<Format>,
    device: usize,
) -> Result<RecordedRun, ReadError> {
    let format = match format {
        Some(f) => f,
        None => Format::from_path(path)?,
    };
    match format {
        Format::RecordedJson if device != 0 => Err(ReadError::invalid(
            path,
            None,
            format!("device {device} is not in the file: record_torch.py JSON holds device 0 only"),
        )),
        Format::RecordedJson => read_recorded_json(path),
        Format::TorchPickle => read_snapshot_pickle(path, device),
        Format::Yaml | Format::Csv => Err(ReadError::unknown_format(
            path,
            format!(
                "a {format} trace is not a recorded PyTorch run (use a record_torch.py .json or a \
                 torch.cuda.memory._dump_snapshot .pickle)"
            ),
        )),
    }
}

/// Writes `trace` in `format` (YAML or CSV).
///
/// # Errors
/// Errors of `out`, and [`io::ErrorKind::Unsupported`] for JSON and pickles, which are
/// PyTorch's formats and only read.
pub fn write(trace: &Trace, format: Format, out: impl io::Write) -> io::Result<()> {
    match format {
        Format::Yaml => write_yaml(trace, out),
        Format::Csv => write_csv(trace, out),
        Format::RecordedJson | Format::TorchPickle => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("traces can be written as yaml or csv, not {format}"),
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
    /// first); readers report every one they can.
    pub more: Vec<ReadError>,
}

impl ReadError {
    /// The kind of problem.
    pub fn kind(&self) -> ReadErrorKind {
        self.kind
    }

    /// This problem and every further one found in the same file, in file order.
    pub fn all(&self) -> impl Iterator<Item = &ReadError> {
        std::iter::once(self).chain(self.more.iter())
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
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.one())?;
        match self.more.len() {
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

    /// Extensions map to formats case-insensitively; others are refused with the list
    /// of known extensions and the --format hint.
    #[test]
    fn format_from_path() {
        for (name, f) in [
            ("a.yaml", Format::Yaml),
            ("a.YML", Format::Yaml),
            ("dir.x/a.csv", Format::Csv),
            ("a.json", Format::RecordedJson),
            ("a.pickle", Format::TorchPickle),
            ("a.pkl", Format::TorchPickle),
        ] {
            assert_eq!(Format::from_path(Path::new(name)), Ok(f), "{name}");
        }
        let e = Format::from_path(Path::new("t.txt")).unwrap_err();
        assert_eq!(e.kind(), ReadErrorKind::UnknownFormat);
        assert_eq!(
            e.to_string(),
            "t.txt: cannot tell the trace format from the extension .txt (known: .yaml/.yml, .csv, .json, .pickle/.pkl; use --format yaml|csv|json|pickle to force one)"
        );
        assert!(Format::from_path(Path::new("trace"))
            .unwrap_err()
            .to_string()
            .contains("a file without extension"));
    }

    /// Flag names map to formats and back; unknown names are refused.
    #[test]
    fn format_from_name() {
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Ok(f));
        }
        assert!(Format::from_name("xml")
            .unwrap_err()
            .contains("expected yaml, csv, json or pickle"));
    }

    /// `read` dispatches on the extension or the forced format, and the same run read
    /// from its JSON and its pickle gives the same trace.
    #[test]
    fn read_dispatches() {
        let yaml = read(&repo().join("examples/seed000.yaml"), None).unwrap();
        assert_eq!(yaml.location_kind, LocationKind::Event);
        let csv = read(&repo().join("examples/random_small.csv"), Some(Format::Csv)).unwrap();
        assert_eq!(csv.location_kind, LocationKind::Line);
        let from_json = read(&oracle("seed002_retain.json"), None).unwrap();
        let from_pickle = read(&oracle("seed002_retain.pickle"), None).unwrap();
        assert_eq!(from_json.events, from_pickle.events);
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
                    Event::Mark { .. } => None,
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
