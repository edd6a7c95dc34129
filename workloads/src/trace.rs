//! The trace model: what a program asked of its allocator, in order.

use std::fmt;
use std::path::PathBuf;

use crate::Format;

/// Identifies one allocation within a trace, from its `alloc` to its `free`.
/// An id may be reused after its allocation was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocId(pub u64);

impl fmt::Display for AllocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One trace line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The program asks for `size_bytes` on `stream` (0 = the default stream; other
    /// values are opaque ids, such as PyTorch's raw `cudaStream_t`).
    Alloc {
        /// Names the allocation for its later `Free`.
        id: AllocId,
        /// Bytes asked for.
        size_bytes: u64,
        /// The stream it is used on.
        stream: u64,
    },
    /// The program dropped an allocation that other streams may still use
    /// (`record_stream`): PyTorch's `free_requested` when its `free_completed` comes
    /// later. The memory is not reusable until the allocation's [`Event::Free`]; a
    /// policy that tracks streams stops counting it as allocated from here, others
    /// ignore it. Written `free_requested` in YAML and CSV.
    FreeRequested {
        /// The allocation, still live until its `Free`.
        id: AllocId,
    },
    /// The allocation's memory may be reused from here: the completed free (PyTorch's
    /// `free_completed`; also ends an allocation whose free was requested earlier).
    /// Written `free` in YAML and CSV (`free_completed` is read as the same).
    Free {
        /// The allocation.
        id: AllocId,
    },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A label with no effect on memory, e.g. an iteration boundary.
    Mark {
        /// Free text.
        label: String,
    },
}

/// How the positions in [`Trace::locations`] are counted, for messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocationKind {
    /// Line numbers in a text file, from 1 (CSV).
    #[default]
    Line,
    /// Position in the trace's event list, from 1 (YAML, generated traces).
    Event,
    /// Index of the entry in a recorded PyTorch trace, from 0 as PyTorch counts them
    /// (recorded-run JSON, snapshot pickles).
    Entry,
}

/// A workload: a named sequence of events and where each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Short name used in reports (the file stem, or the generator's name).
    pub name: String,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// The events, in order.
    pub events: Vec<Event>,
    /// For each event, its position in the source (same length as `events`, or empty
    /// when positions are simply 1, 2, 3, ...).
    pub locations: Vec<u64>,
    /// How `locations` count.
    pub location_kind: LocationKind,
    /// What the source says about how and where it was recorded.
    pub meta: TraceMeta,
}

/// What a trace's source records about the run behind it, filled by the readers (all
/// of it only by the recorded-run readers: YAML and CSV name only their format). One
/// struct, so that no consumer re-derives a recorded setting from a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceMeta {
    /// The format the trace was read from; `None` for traces built in code (generators).
    pub format: Option<Format>,
    /// The recording script's workload name.
    pub workload: Option<String>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string the run had (`Some("")`: PyTorch's defaults);
    /// `None` when the source does not record one.
    pub alloc_conf: Option<String>,
    /// The cap given to `torch.cuda.set_per_process_memory_fraction(cap / total)`.
    pub cap_bytes: Option<u64>,
    /// The device's total memory as `cudaMemGetInfo` reported it.
    pub total_bytes: Option<u64>,
    /// The device's name.
    pub device: Option<String>,
    /// The PyTorch version that recorded it.
    pub torch_version: Option<String>,
}

impl TraceMeta {
    /// The metadata of a trace read from a `format` file that records nothing else.
    pub fn of_format(format: Format) -> TraceMeta {
        TraceMeta {
            format: Some(format),
            ..TraceMeta::default()
        }
    }

    /// The fraction the run passed to `set_per_process_memory_fraction`, `cap / total`
    /// (PyTorch's limit is then `floor(fraction × total)` in double arithmetic), when
    /// both are recorded.
    pub fn memory_fraction(&self) -> Option<f64> {
        match (self.cap_bytes, self.total_bytes) {
            (Some(cap), Some(total)) if total > 0 => Some(cap as f64 / total as f64),
            _ => None,
        }
    }
}

impl Trace {
    /// A trace with no source file; locations are event numbers.
    pub fn new(name: impl Into<String>, events: Vec<Event>) -> Trace {
        Trace {
            name: name.into(),
            path: None,
            events,
            locations: Vec::new(),
            location_kind: LocationKind::Event,
            meta: TraceMeta::default(),
        }
    }

    /// Where event `index` came from, e.g. `line 17`, `event 3` or `entry 120`.
    pub fn location(&self, index: usize) -> String {
        let n = self
            .locations
            .get(index)
            .copied()
            .unwrap_or(match self.location_kind {
                LocationKind::Entry => index as u64,
                _ => index as u64 + 1,
            });
        match self.location_kind {
            LocationKind::Line => format!("line {n}"),
            LocationKind::Event => format!("event {n}"),
            LocationKind::Entry => format!("entry {n}"),
        }
    }

    /// `path:line 17`-style prefix for messages about event `index`.
    pub fn describe(&self, index: usize) -> String {
        match &self.path {
            Some(p) => format!("{}: {}", p.display(), self.location(index)),
            None => format!("{}: {}", self.name, self.location(index)),
        }
    }

    /// Number of `Alloc` events.
    pub fn alloc_count(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    }
}
