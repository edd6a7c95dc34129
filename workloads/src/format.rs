//! The one table of trace formats: for each, its name (`--format NAME`), extensions,
//! content sniffer, reader and (optional) writer. Detecting, reading, writing, the
//! command line's `--format` values and its help all come from [`Format::spec`];
//! adding a format is a variant of [`Format`] (listed in [`Format::ALL`]) and its entry
//! there, next to its reader module.
//!
//! **Detection** ([`detect`]), when no format is forced: the first
//! [`SNIFF_BYTES`] bytes are shown to every format's sniffer, which answers
//! [`Sniff::Certain`] (a signature only that format has: a pickle's protocol header, a
//! CSV header line), [`Sniff::Likely`] (its shape: a JSON object, YAML's top-level
//! `events:`), [`Sniff::Unknown`] or [`Sniff::No`]. Then, in order:
//!
//! 1. the one format that is certain;
//! 2. else the format the extension names, unless its sniffer says no;
//! 3. else the one format that is likely;
//! 4. else the format the extension names (its reader says what is wrong);
//! 5. else an error naming the known extensions and `--format`.
//!
//! So content wins over a wrong extension when it is unmistakable, and the extension
//! settles what content alone cannot (JSON is also YAML).

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Read};
use std::path::Path;
use std::str::FromStr;

use crate::recorded::RecordedRun;
use crate::trace::{Event, Trace};
use crate::ReadError;

/// How many leading bytes of a file the sniffers see.
pub const SNIFF_BYTES: usize = 8192;

/// A trace file format: an entry of the table in [`Format::spec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Hand-written YAML traces (`.yaml`, `.yml`).
    Yaml,
    /// CSV traces (`.csv`) with the header `op,id,bytes,stream`.
    Csv,
    /// Recorded PyTorch runs written by `record_torch.py` (`.json`).
    RecordedJson,
    /// PyTorch memory snapshot pickles from `torch.cuda.memory._dump_snapshot`
    /// (`.pickle`, `.pkl`).
    TorchPickle,
    /// RAPIDS RMM `logging_resource_adaptor` logs (found by their header; no extension
    /// of their own, they are usually `.csv`).
    Rmm,
}

/// What a format's sniffer makes of the first bytes of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sniff {
    /// The content cannot be this format.
    No,
    /// The content does not say.
    Unknown,
    /// The content has this format's shape, which another format may share.
    Likely,
    /// The content carries a signature no other format has.
    Certain,
}

/// What a reader reads: the source and the reading options.
pub struct Input<'a> {
    /// The bytes, from the start of the file.
    pub reader: &'a mut dyn Read,
    /// The file, for messages and the trace's name.
    pub path: &'a Path,
    /// The file's size when it is a regular file (a bound on what it can hold).
    pub len: Option<u64>,
    /// Which GPU's trace to take from a source that holds several (snapshot pickles).
    pub device: usize,
}

/// How a format is read.
#[derive(Clone, Copy)]
pub enum Reader {
    /// The format holds a trace.
    Trace(fn(Input<'_>) -> Result<Trace, ReadError>),
    /// The format holds a recorded PyTorch run: the requests and PyTorch's own
    /// decisions, which [`RecordedRun::to_trace`] turns into a trace.
    Recorded(fn(Input<'_>) -> Result<RecordedRun, ReadError>),
}

/// A writer of a format: the trace's name, recorded facts and id names from the first
/// argument (whose events are not read), the events from the second, written as they
/// come, so events made on the fly are never held.
pub type Writer = for<'e> fn(
    &Trace,
    &mut dyn Iterator<Item = Cow<'e, Event>>,
    &mut dyn io::Write,
) -> io::Result<()>;

/// One entry of the format table.
#[derive(Clone, Copy)]
pub struct FormatSpec {
    /// The name `--format` takes and messages use.
    pub name: &'static str,
    /// One line for help.
    pub about: &'static str,
    /// Extensions, lower case, without the dot; the first is the one to suggest.
    pub extensions: &'static [&'static str],
    /// What the first [`SNIFF_BYTES`] bytes of a file say about it.
    pub sniff: fn(&[u8]) -> Sniff,
    /// The reader.
    pub read: Reader,
    /// The writer, for formats allocsim writes.
    pub write: Option<Writer>,
}

impl Format {
    /// Every format, in the order of the docs (and of ties in detection).
    pub const ALL: [Format; 5] = [
        Format::Yaml,
        Format::Csv,
        Format::RecordedJson,
        Format::TorchPickle,
        Format::Rmm,
    ];

    /// The table: this format's entry.
    pub fn spec(self) -> &'static FormatSpec {
        match self {
            Format::Yaml => {
                static SPEC: FormatSpec = FormatSpec {
                    name: "yaml",
                    about: "YAML trace (hand-written)",
                    extensions: &["yaml", "yml"],
                    sniff: sniff_yaml,
                    read: Reader::Trace(|i| crate::yaml::read_yaml_from(i.reader, i.path)),
                    write: Some(|t, events, out| crate::yaml::write_yaml_events(t, events, out)),
                };
                &SPEC
            }
            Format::Csv => {
                static SPEC: FormatSpec = FormatSpec {
                    name: "csv",
                    about: "CSV trace with the header op,id,bytes,stream",
                    extensions: &["csv"],
                    sniff: sniff_csv,
                    read: Reader::Trace(crate::csv::read_csv_input),
                    write: Some(|t, events, out| crate::csv::write_csv_events(t, events, out)),
                };
                &SPEC
            }
            Format::RecordedJson => {
                static SPEC: FormatSpec = FormatSpec {
                    name: "json",
                    about: "recorded PyTorch run (tools/record_torch.py JSON)",
                    extensions: &["json"],
                    sniff: sniff_json,
                    read: Reader::Recorded(read_recorded_json),
                    write: None,
                };
                &SPEC
            }
            Format::TorchPickle => {
                static SPEC: FormatSpec = FormatSpec {
                    name: "pickle",
                    about: "PyTorch memory snapshot (torch.cuda.memory._dump_snapshot)",
                    extensions: &["pickle", "pkl"],
                    sniff: sniff_pickle,
                    read: Reader::Recorded(crate::snapshot::read_input),
                    write: None,
                };
                &SPEC
            }
            Format::Rmm => {
                static SPEC: FormatSpec = FormatSpec {
                    name: "rmm",
                    about: "RAPIDS RMM memory event log (logging_resource_adaptor CSV)",
                    extensions: &[],
                    sniff: sniff_rmm,
                    read: Reader::Trace(|i| crate::rmm::read_rmm_from(i.reader, i.path)),
                    write: None,
                };
                &SPEC
            }
        }
    }

    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Whether [`crate::write()`] can write this format.
    pub fn is_writable(self) -> bool {
        self.spec().write.is_some()
    }

    /// Whether the format holds a recorded PyTorch run.
    pub fn is_recorded(self) -> bool {
        matches!(self.spec().read, Reader::Recorded(_))
    }

    /// The format whose extension `path` has (case-insensitive), if any.
    pub fn from_extension(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_string_lossy().to_ascii_lowercase();
        Format::ALL
            .into_iter()
            .find(|f| f.spec().extensions.contains(&ext.as_str()))
    }

    /// The format to write `path` in, from its extension.
    ///
    /// # Errors
    /// [`FormatError::UnknownExtension`], or [`FormatError::NotWritable`] for the
    /// formats that are only read.
    pub fn for_output(path: &Path) -> Result<Format, FormatError> {
        match Format::from_extension(path) {
            Some(f) if f.is_writable() => Ok(f),
            Some(f) => Err(FormatError::NotWritable {
                path: path.display().to_string(),
                format: f.name(),
                writable: writable_list(),
            }),
            None => Err(FormatError::UnknownExtension {
                path: path.display().to_string(),
                what: extension_text(path),
                writable: writable_list(),
            }),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = FormatError;

    /// A `--format` name: `yaml`, `csv`, `json`, `pickle`.
    fn from_str(name: &str) -> Result<Format, FormatError> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| FormatError::UnknownName {
                name: name.to_string(),
                known: names(),
            })
    }
}

#[cfg(feature = "clap")]
impl clap::ValueEnum for Format {
    fn value_variants<'a>() -> &'a [Self] {
        &Format::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.spec().about))
    }
}

/// A format name or an output path that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not the name of a format.
    #[error("unknown trace format '{name}' (known: {known})")]
    UnknownName {
        /// The name given.
        name: String,
        /// The known names.
        known: String,
    },
    /// An output path whose extension names no format.
    #[error("{path}: cannot tell the output format from {what} (allocsim writes {writable})")]
    UnknownExtension {
        /// The path.
        path: String,
        /// `the extension .x` or `a file without extension`.
        what: String,
        /// The writable formats and their extensions.
        writable: String,
    },
    /// An output in a format allocsim only reads.
    #[error(
        "{path}: allocsim reads {format} traces but does not write them (it writes {writable})"
    )]
    NotWritable {
        /// The path.
        path: String,
        /// The format the extension names.
        format: &'static str,
        /// The writable formats and their extensions.
        writable: String,
    },
}

/// The format of the file at `path` whose first bytes are `prefix` (see the module
/// docs for the rules).
///
/// # Errors
/// A [`ReadErrorKind::UnknownFormat`](crate::ReadErrorKind::UnknownFormat) error when
/// neither the content nor the extension tells.
pub fn detect(path: &Path, prefix: &[u8]) -> Result<Format, ReadError> {
    let sniffs: Vec<(Format, Sniff)> = Format::ALL
        .into_iter()
        .map(|f| (f, (f.spec().sniff)(prefix)))
        .collect();
    let only = |level: Sniff| {
        let mut hits = sniffs.iter().filter(|(_, s)| *s >= level);
        match (hits.next(), hits.next()) {
            (Some(&(f, _)), None) => Some(f),
            _ => None,
        }
    };
    let by_extension = Format::from_extension(path);
    if let Some(f) = only(Sniff::Certain) {
        return Ok(f);
    }
    if let Some(f) = by_extension {
        if (f.spec().sniff)(prefix) != Sniff::No {
            return Ok(f);
        }
    }
    if let Some(f) = only(Sniff::Likely) {
        return Ok(f);
    }
    if let Some(f) = by_extension {
        return Ok(f);
    }
    Err(ReadError::unknown_format(
        path,
        format!(
            "cannot tell the trace format: {} names none and the content is not recognized \
             (known: {}; use --trace-format {} to force one)",
            extension_text(path),
            extension_list(Format::ALL),
            Format::ALL.map(Format::name).join("|"),
        ),
    ))
}

/// `the extension .x` or `a file without extension` (for `-`, standard output and the
/// format flag that names its format).
fn extension_text(path: &Path) -> String {
    if path.as_os_str() == "-" {
        return "standard output, which has no extension: name it with the command's format \
                flag"
            .to_string();
    }
    match path.extension() {
        Some(e) => format!("the extension .{}", e.to_string_lossy()),
        None => "a file without extension".to_string(),
    }
}

/// `.yaml/.yml, .csv, ...` for `formats` (those with extensions).
fn extension_list(formats: impl IntoIterator<Item = Format>) -> String {
    formats
        .into_iter()
        .filter(|f| !f.spec().extensions.is_empty())
        .map(|f| {
            f.spec()
                .extensions
                .iter()
                .map(|e| format!(".{e}"))
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `yaml (.yaml/.yml) or csv (.csv)`.
fn writable_list() -> String {
    Format::ALL
        .into_iter()
        .filter(|f| f.is_writable())
        .map(|f| format!("{f} ({})", extension_list([f])))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `yaml, csv, json, pickle`.
fn names() -> String {
    Format::ALL.map(Format::name).join(", ")
}

/// The recorded-run JSON reader, which holds device 0 only.
fn read_recorded_json(i: Input<'_>) -> Result<RecordedRun, ReadError> {
    if i.device != 0 {
        return Err(ReadError::invalid(
            i.path,
            None,
            format!(
                "device {} is not in the file: record_torch.py JSON holds device 0 only",
                i.device
            ),
        ));
    }
    crate::recorded::read_recorded_json_from(i.reader, i.path)
}

/// `prefix` without a UTF-8 byte order mark.
fn without_bom(prefix: &[u8]) -> &[u8] {
    prefix.strip_prefix(b"\xef\xbb\xbf").unwrap_or(prefix)
}

/// `prefix` as text: UTF-8 (a character cut at the end of the prefix is allowed) with
/// no NUL byte; `None` for binary content.
fn as_text(prefix: &[u8]) -> Option<&str> {
    let prefix = without_bom(prefix);
    if prefix.contains(&0) {
        return None;
    }
    match std::str::from_utf8(prefix) {
        Ok(text) => Some(text),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&prefix[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
}

/// YAML: text; likely with a top-level `events:` or `name:` line.
fn sniff_yaml(prefix: &[u8]) -> Sniff {
    let Some(text) = as_text(prefix) else {
        return Sniff::No;
    };
    if text
        .lines()
        .any(|l| l.starts_with("events:") || l.starts_with("name:"))
    {
        Sniff::Likely
    } else {
        Sniff::Unknown
    }
}

/// CSV: certain with the header line `op,id,bytes,stream` (fields may be quoted).
fn sniff_csv(prefix: &[u8]) -> Sniff {
    let Some(text) = as_text(prefix) else {
        return Sniff::No;
    };
    let first = text.lines().next().unwrap_or("");
    let fields: Vec<&str> = first.split(',').map(|f| f.trim_matches('"')).collect();
    if fields.join(",") == crate::csv::CSV_HEADER {
        Sniff::Certain
    } else {
        Sniff::Unknown
    }
}

/// RMM log: certain with its header line `Thread,Time,Action,Pointer,Size,Stream`.
fn sniff_rmm(prefix: &[u8]) -> Sniff {
    let Some(text) = as_text(prefix) else {
        return Sniff::No;
    };
    let first = text.lines().next().unwrap_or("");
    if first == crate::rmm::RMM_HEADER {
        Sniff::Certain
    } else {
        Sniff::Unknown
    }
}

/// JSON: a recorded run is an object; likely when it opens with a quoted key.
fn sniff_json(prefix: &[u8]) -> Sniff {
    let mut rest = without_bom(prefix)
        .iter()
        .skip_while(|b| b.is_ascii_whitespace());
    match rest.next() {
        None => Sniff::Unknown,
        Some(b'{') => match rest.find(|b| !b.is_ascii_whitespace()) {
            Some(b'"' | b'}') => Sniff::Likely,
            _ => Sniff::Unknown,
        },
        Some(_) => Sniff::No,
    }
}

/// Pickle: certain with the protocol opcode of protocols 2 to 5, which PyTorch writes.
fn sniff_pickle(prefix: &[u8]) -> Sniff {
    match prefix {
        [0x80, 2..=5, ..] => Sniff::Certain,
        [0x80, ..] => Sniff::Likely,
        _ => Sniff::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect_text(name: &str, content: &[u8]) -> Result<Format, ReadError> {
        detect(Path::new(name), content)
    }

    /// The table is consistent: names and extensions are unique, `ALL` lists each
    /// variant once, and every name reads back through `FromStr`.
    #[test]
    fn table_is_consistent() {
        let mut names = std::collections::BTreeSet::new();
        let mut exts = std::collections::BTreeSet::new();
        for f in Format::ALL {
            assert!(names.insert(f.name()), "{f}: name twice");
            for e in f.spec().extensions {
                assert!(exts.insert(*e), "{e}: extension twice");
                assert_eq!(
                    Format::from_extension(Path::new(&format!("x.{}", e.to_uppercase()))),
                    Some(f)
                );
            }
            assert_eq!(f.name().parse::<Format>(), Ok(f));
        }
        assert_eq!(
            "xml".parse::<Format>().unwrap_err().to_string(),
            "unknown trace format 'xml' (known: yaml, csv, json, pickle, rmm)"
        );
    }

    /// Content that only one format has wins over the extension; the extension settles
    /// the rest; likely content decides without an extension; neither is an error
    /// naming the extensions and --format.
    #[test]
    fn detection_rules() {
        let csv = b"op,id,bytes,stream\nalloc,1,10,0\n";
        let pickle = b"\x80\x04\x95\x10\x00";
        let json = b"  {\"workload\": \"x\", \"events\": []}";
        let yaml = b"name: t\nevents:\n  - {op: alloc, id: 1, bytes: 1}\n";
        // 1: certain content, whatever the extension.
        assert_eq!(detect_text("a.json", csv), Ok(Format::Csv));
        assert_eq!(detect_text("a.yaml", pickle), Ok(Format::TorchPickle));
        assert_eq!(
            detect_text("a", b"\xef\xbb\xbfop,id,bytes,stream\r\n"),
            Ok(Format::Csv)
        );
        let rmm = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000000,free,0x10,8,0\n";
        assert_eq!(detect_text("log.csv", rmm), Ok(Format::Rmm));
        assert_eq!(detect_text("log.txt", rmm), Ok(Format::Rmm));
        assert_eq!(detect_text("log", rmm), Ok(Format::Rmm));
        // 2: the extension, unless its sniffer says no.
        assert_eq!(detect_text("a.yaml", json), Ok(Format::Yaml));
        assert_eq!(
            detect_text("a.csv", b"op,id,size,stream\n"),
            Ok(Format::Csv)
        );
        // 3: likely content when the extension's format cannot be.
        assert_eq!(detect_text("a.json", yaml), Ok(Format::Yaml));
        assert_eq!(detect_text("a.txt", json), Ok(Format::RecordedJson));
        assert_eq!(detect_text("trace", yaml), Ok(Format::Yaml));
        // 4: the extension, whose reader then says what is wrong.
        assert_eq!(detect_text("a.json", b"[1, 2]"), Ok(Format::RecordedJson));
        assert_eq!(detect_text("a.yaml", b"\xff\xfe"), Ok(Format::Yaml));
        // 5: nothing tells.
        let e = detect_text("t.txt", b"hello\n").unwrap_err();
        assert_eq!(e.kind(), crate::ReadErrorKind::UnknownFormat);
        assert_eq!(
            e.to_string(),
            "t.txt: cannot tell the trace format: the extension .txt names none and the \
             content is not recognized (known: .yaml/.yml, .csv, .json, .pickle/.pkl; use \
             --trace-format yaml|csv|json|pickle|rmm to force one)"
        );
        assert!(detect_text("zeros", &[0; 64])
            .unwrap_err()
            .to_string()
            .contains("a file without extension"));
    }

    /// Outputs take their format from the extension, and only writable ones.
    #[test]
    fn output_formats() {
        assert_eq!(Format::for_output(Path::new("o.YML")), Ok(Format::Yaml));
        assert_eq!(Format::for_output(Path::new("o.csv")), Ok(Format::Csv));
        assert_eq!(
            Format::for_output(Path::new("o.json"))
                .unwrap_err()
                .to_string(),
            "o.json: allocsim reads json traces but does not write them (it writes yaml \
             (.yaml/.yml) or csv (.csv))"
        );
        assert_eq!(
            Format::for_output(Path::new("o.docx"))
                .unwrap_err()
                .to_string(),
            "o.docx: cannot tell the output format from the extension .docx (allocsim \
             writes yaml (.yaml/.yml) or csv (.csv))"
        );
    }
}
