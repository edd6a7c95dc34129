//! Allocation traces: the model, its file formats, validation and generators.
//!
//! Design choices, and why:
//!
//! - **One small model.** A [`Trace`] is a list of [`Event`]s: `alloc`, `free`,
//!   `empty_cache`, `mark`. Every source (hand-written YAML, CSV, PyTorch snapshot
//!   pickles, recorded runs, generators) becomes this model, and every consumer reads
//!   only it.
//! - **Formats are a boundary.** This is the only crate that derives `Serialize` /
//!   `Deserialize` for trace data; policies and the simulator never see a file.
//! - **Errors name the place.** A [`ReadError`] carries the file and the line, event or
//!   entry; [`validate`](crate::validate) reports every problem, not just the first.
//! - **Knows nothing about policies.** Streams are plain `u64`s here; sizes are bytes.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod recorded;
pub mod size;
mod trace;

use std::fmt;
use std::path::{Path, PathBuf};

pub use recorded::{read_recorded_json, Action, Checkpoint, RecordedEntry, RecordedRun};
pub use trace::{AllocId, Event, LocationKind, Trace};

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
}

impl ReadError {
    /// The kind of problem.
    pub fn kind(&self) -> ReadErrorKind {
        self.kind
    }

    /// The file could not be read.
    pub fn io(path: &Path, error: &std::io::Error) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location: None,
            message: error.to_string(),
            kind: ReadErrorKind::Io,
        }
    }

    /// The file is not in the expected format.
    pub fn syntax(path: &Path, location: Option<String>, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location,
            message: message.into(),
            kind: ReadErrorKind::Syntax,
        }
    }

    /// A value is not allowed.
    pub fn invalid(path: &Path, location: Option<String>, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location,
            message: message.into(),
            kind: ReadErrorKind::Invalid,
        }
    }

    /// The format could not be determined.
    pub fn unknown_format(path: &Path, message: impl Into<String>) -> ReadError {
        ReadError {
            path: path.to_path_buf(),
            location: None,
            message: message.into(),
            kind: ReadErrorKind::UnknownFormat,
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(loc) => write!(f, "{}: {loc}: {}", self.path.display(), self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for ReadError {}
