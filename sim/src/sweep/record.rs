//! A sweep's CSV row, what is derived from the rows (savings, ranks, the
//! recommendation), and joining the CSVs of shards.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::compare::Row;
use crate::report::format_ratio;

/// One row of a sweep's CSV (`docs/metrics.md`): one (trace, configuration, device).
/// The columns up to `margin` are the replay's; `saved_vs_default_bytes`, `rank` and
/// `recommended` are derived from all the rows ([`finish`]) and are empty (false) in a
/// shard's CSV.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepRecord {
    /// The row's index in the whole sweep: (trace × configurations + configuration) ×
    /// devices + device, from 0.
    pub combination: u64,
    /// Trace name (unique in the sweep).
    pub trace: String,
    /// The configuration: `policy:key=value,...` with the options the grid sets.
    pub policy: String,
    /// The device: a capacity, `profile@capacity`, or a GPU as named in the file.
    pub device: String,
    /// Whether this configuration is the default the savings are measured against.
    pub default: bool,
    /// The device's total memory.
    pub total_bytes: u64,
    /// What the CUDA context and the driver leave of it.
    pub capacity_bytes: u64,
    /// Events in the trace.
    pub events: u64,
    /// Peak of requested bytes.
    pub requested_bytes_peak: u64,
    /// Peak of allocated bytes.
    pub allocated_bytes_peak: u64,
    /// Peak of reserved bytes.
    pub reserved_bytes_peak: u64,
    /// Peak of charged bytes.
    pub charged_bytes_peak: u64,
    /// Allocated peak ÷ reserved peak, six decimals; empty when nothing was reserved.
    pub utilization: String,
    /// Reserved peak − requested peak: what the allocator held beyond the program's
    /// largest need.
    pub overhead_bytes: u64,
    /// Index of the first event whose request failed; empty without an out-of-memory
    /// or before the first event (`oom_requested_bytes` set, `oom_cause` `starting
    /// state`).
    pub oom_event_index: Option<u64>,
    /// Bytes that request asked for (before the first event, the starting state's);
    /// set on every row that ran out of memory.
    pub oom_requested_bytes: Option<u64>,
    /// Why it ran out (`fragmentation`, `stream cache`, `pending frees`, `too little
    /// memory`, `starting state`).
    pub oom_cause: String,
    /// The setting that avoids the OOM, checked by replaying; empty if none.
    pub oom_fix: String,
    /// `marginal` where the outcome could change within the device's variation between
    /// processes ([`crate::boundary::Margin`]); empty otherwise.
    pub margin: String,
    /// The default's reserved peak − this row's, on the same trace and device (negative:
    /// it reserves more); empty when either runs out of memory.
    pub saved_vs_default_bytes: Option<i64>,
    /// Place among the rows of the same trace and device that do not run out of memory,
    /// by reserved peak (ties: the earlier row), from 1; empty for rows that run out.
    pub rank: Option<u64>,
    /// `true` on one row per trace: the least reserved peak among all its rows that do
    /// not run out of memory, those that fit in every process on their card
    /// ([`SweepRecord::is_marginal`] false) before the others (ties: the smaller device,
    /// the default, the earlier row).
    pub recommended: bool,
}

impl SweepRecord {
    /// The record of a replayed row on the device labelled `device` (not yet ranked).
    pub fn of(combination: u64, row: &Row, device: &str, default: bool) -> SweepRecord {
        let s = &row.summary;
        let explanation = row.explanation.as_ref();
        SweepRecord {
            combination,
            trace: row.trace.clone(),
            policy: row.policy.clone(),
            device: device.to_string(),
            default,
            total_bytes: row.total_bytes,
            capacity_bytes: row.capacity_bytes,
            events: row.events,
            requested_bytes_peak: s.requested_bytes_peak,
            allocated_bytes_peak: s.allocated_bytes_peak,
            reserved_bytes_peak: s.reserved_bytes_peak,
            charged_bytes_peak: s.charged_bytes_peak,
            utilization: format_ratio(s.utilization()),
            overhead_bytes: s.reserved_bytes_peak.saturating_sub(s.requested_bytes_peak),
            oom_event_index: row.oom.as_ref().and_then(|o| o.event_index),
            oom_requested_bytes: row.oom.as_ref().map(|o| o.requested_bytes),
            oom_cause: crate::explain::cause_name(row.oom.as_ref(), explanation).to_string(),
            oom_fix: explanation
                .and_then(|e| e.fix())
                .map_or(String::new(), |f| f.setting.clone()),
            margin: row.margin.csv().to_string(),
            saved_vs_default_bytes: None,
            rank: None,
            recommended: false,
        }
    }

    /// Whether the row ran to the end without running out of memory (before the first
    /// event included: `oom_requested_bytes` is set on every row that ran out).
    pub fn fits(&self) -> bool {
        self.oom_requested_bytes.is_none()
    }

    /// Whether its outcome could change within the device's variation between processes.
    pub fn is_marginal(&self) -> bool {
        !self.margin.is_empty()
    }

    /// Allocated peak ÷ reserved peak (exact, not the six decimals of the column).
    pub fn utilization_value(&self) -> Option<f64> {
        (self.reserved_bytes_peak > 0)
            .then(|| self.allocated_bytes_peak as f64 / self.reserved_bytes_peak as f64)
    }
}

/// Sorts the rows by `combination` and derives, from them alone, the savings against
/// the default, the ranks and the recommendation (see [`SweepRecord`]'s columns); what
/// was derived before is replaced.
pub fn finish(records: &mut [SweepRecord]) {
    records.sort_by_key(|r| r.combination);
    let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    let keys: Vec<(String, String)> = records
        .iter()
        .map(|r| (r.trace.clone(), r.device.clone()))
        .collect();
    for (i, (t, d)) in keys.iter().enumerate() {
        groups.entry((t, d)).or_default().push(i);
    }
    for r in records.iter_mut() {
        r.saved_vs_default_bytes = None;
        r.rank = None;
        r.recommended = false;
    }
    for rows in groups.values() {
        let default = rows
            .iter()
            .find(|&&i| records[i].default)
            .map(|&i| (records[i].fits(), records[i].reserved_bytes_peak));
        let mut fitting: Vec<usize> = rows
            .iter()
            .copied()
            .filter(|&i| records[i].fits())
            .collect();
        fitting.sort_by_key(|&i| (records[i].reserved_bytes_peak, records[i].combination));
        for (place, &i) in fitting.iter().enumerate() {
            let r = &mut records[i];
            r.rank = Some(place as u64 + 1);
            if let Some((true, base)) = default {
                r.saved_vs_default_bytes = Some(base as i64 - r.reserved_bytes_peak as i64);
            }
        }
    }
    let mut best: BTreeMap<&str, usize> = BTreeMap::new();
    // A row that fits in every process on its card before one that may run out.
    let order = |r: &SweepRecord| {
        (
            r.is_marginal(),
            r.reserved_bytes_peak,
            r.total_bytes,
            !r.default,
            r.combination,
        )
    };
    for (i, r) in records.iter().enumerate() {
        if !r.fits() {
            continue;
        }
        let slot = best.entry(&keys[i].0).or_insert(i);
        if order(r) < order(&records[*slot]) {
            *slot = i;
        }
    }
    let picks: Vec<usize> = best.into_values().collect();
    for i in picks {
        records[i].recommended = true;
    }
}

/// Shard CSVs that do not join into one sweep.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A file that cannot be read or is not a sweep's CSV.
    #[error("{path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What is wrong, with the line when it is about one.
        message: String,
    },
    /// No file was given.
    #[error("no shard given")]
    Empty,
    /// Two shards hold the same row.
    #[error(
        "combination {combination} is in {first} and in {second} (the same shard given twice?)"
    )]
    Duplicate {
        /// The row.
        combination: u64,
        /// The first file holding it.
        first: String,
        /// The second.
        second: String,
    },
    /// A row is missing.
    #[error(
        "combination {0} is missing: a shard was not given, or the shards are of different sweeps"
    )]
    Missing(u64),
}

/// Reads the CSVs of a sweep's shards (`allocsim sweep --shard K/N -o ...`, any order)
/// and joins them into the rows one run of the whole sweep gives, [`finish`]ed.
///
/// # Errors
/// An unreadable file, a header that is not a sweep's, a row that does not read
/// (naming the file and the line), a row in two files, or a gap in the rows.
pub fn merge(paths: &[PathBuf]) -> Result<Vec<SweepRecord>, MergeError> {
    let mut shards = Vec::with_capacity(paths.len());
    for p in paths {
        let file = std::fs::File::open(p).map_err(|e| MergeError::Read {
            path: p.display().to_string(),
            message: e.to_string(),
        })?;
        shards.push((p.display().to_string(), file));
    }
    merge_from(shards)
}

/// [`merge`] over shard CSVs from any readers, each with the name messages give it
/// (the Python package joins the CSVs its cluster's tasks return, in memory).
///
/// # Errors
/// As [`merge`].
pub fn merge_from<R: std::io::Read>(
    shards: Vec<(String, R)>,
) -> Result<Vec<SweepRecord>, MergeError> {
    if shards.is_empty() {
        return Err(MergeError::Empty);
    }
    let want = crate::report::columns::<SweepRecord>();
    let names: Vec<String> = shards.iter().map(|(n, _)| n.clone()).collect();
    let mut all: Vec<(SweepRecord, usize)> = Vec::new();
    for (f, (name, reader)) in shards.into_iter().enumerate() {
        let read_err = |message: String| MergeError::Read {
            path: name.clone(),
            message,
        };
        let mut r = csv::Reader::from_reader(reader);
        let header = r.headers().map_err(|e| read_err(csv_message(&e)))?.clone();
        if !header.iter().eq(want.iter().map(String::as_str)) {
            return Err(read_err(format!(
                "line 1: not the CSV of `allocsim sweep` (its header is {})",
                want.join(",")
            )));
        }
        for rec in r.deserialize::<SweepRecord>() {
            all.push((rec.map_err(|e| read_err(csv_message(&e)))?, f));
        }
    }
    all.sort_by_key(|(r, _)| r.combination);
    for w in all.windows(2) {
        if w[0].0.combination == w[1].0.combination {
            return Err(MergeError::Duplicate {
                combination: w[0].0.combination,
                first: names[w[0].1].clone(),
                second: names[w[1].1].clone(),
            });
        }
    }
    for (i, (r, _)) in all.iter().enumerate() {
        if r.combination != i as u64 {
            return Err(MergeError::Missing(i as u64));
        }
    }
    let mut records: Vec<SweepRecord> = all.into_iter().map(|(r, _)| r).collect();
    finish(&mut records);
    Ok(records)
}

/// A CSV error as `line N: message`.
fn csv_message(e: &csv::Error) -> String {
    let at = e
        .position()
        .map_or(String::new(), |p| format!("line {}: ", p.line()));
    let what = match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(f) => format!("column {}: {}", f + 1, err.kind()),
            None => err.kind().to_string(),
        },
        csv::ErrorKind::Io(io) => io.to_string(),
        _ => e.to_string(),
    };
    format!("{at}{what}")
}
