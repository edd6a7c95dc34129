//! CSV output. Each CSV is a `#[derive(Serialize)]` record struct whose fields are its
//! columns, in order (documented in `docs/metrics.md`): a column cannot drift from its
//! value, and the header is the struct's field names.

use std::io;

use serde::Serialize;

use crate::compare::Row;
use crate::metrics::Sample;

/// Formats a ratio with six decimals (empty when undefined), the same on every machine.
pub fn format_ratio(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.6}")).unwrap_or_default()
}

/// The column names of record type `R`: its field names, in order.
///
/// # Panics
/// If `R` does not serialize as a flat record of named fields (a bug in `R`).
pub fn columns<R: Serialize + Default>() -> Vec<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(R::default())
        .expect("a record struct serializes");
    let bytes = w.into_inner().expect("writing to memory does not fail");
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(&bytes[..]);
    let header = r
        .records()
        .next()
        .expect("a header was written")
        .expect("the header reads back");
    header.iter().map(str::to_string).collect()
}

/// Writes records of type `R` as CSV: the header (`R`'s field names) first, even when
/// no record follows, then one row per record.
pub struct RecordWriter<W: io::Write> {
    inner: csv::Writer<W>,
}

impl<W: io::Write> RecordWriter<W> {
    /// A writer to `writer`; the header is written at once.
    ///
    /// # Errors
    /// I/O errors of the writer.
    pub fn new<R: Serialize + Default>(writer: W) -> csv::Result<RecordWriter<W>> {
        let mut inner = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(writer);
        inner.write_record(columns::<R>())?;
        Ok(RecordWriter { inner })
    }

    /// Writes one record.
    ///
    /// # Errors
    /// I/O errors of the writer.
    pub fn write<R: Serialize>(&mut self, record: &R) -> csv::Result<()> {
        self.inner.serialize(record)
    }

    /// Flushes what was written.
    ///
    /// # Errors
    /// I/O errors of the writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The writer, once what was written is flushed.
    ///
    /// # Errors
    /// I/O errors of the writer.
    pub fn into_inner(self) -> io::Result<W> {
        self.inner
            .into_inner()
            .map_err(csv::IntoInnerError::into_error)
    }
}

/// Writes `records` as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_records<R: Serialize + Default, W: io::Write>(
    records: impl IntoIterator<Item = R>,
    writer: W,
) -> csv::Result<()> {
    let mut w = RecordWriter::new::<R>(writer)?;
    for r in records {
        w.write(&r)?;
    }
    Ok(w.flush()?)
}

/// One row of `allocsim compare`. The first ten columns are a stable contract.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CompareRecord<'a> {
    /// Trace name.
    pub trace: &'a str,
    /// Policy label as given.
    pub policy: &'a str,
    /// Capacity of the simulated device.
    pub capacity_bytes: u64,
    /// Events in the trace.
    pub events: u64,
    /// Peak of requested bytes.
    pub requested_bytes_peak: u64,
    /// Peak of allocated bytes.
    pub allocated_bytes_peak: u64,
    /// Peak of reserved bytes.
    pub reserved_bytes_peak: u64,
    /// Allocated peak ÷ reserved peak, six decimals; empty when nothing was reserved.
    pub utilization: String,
    /// Index of the first event whose request failed; empty without an out-of-memory
    /// or before the first event (`oom_requested_bytes` set, `oom_cause` `starting
    /// state`).
    pub oom_event_index: Option<u64>,
    /// Bytes that request asked for; before the first event, the starting state's
    /// ([`crate::Oom::requested_bytes`]). Set on every row that ran out of memory.
    pub oom_requested_bytes: Option<u64>,
    /// Peak of charged bytes.
    pub charged_bytes_peak: u64,
    /// Peak number of live segments.
    pub segment_count_peak: u64,
    /// Reserved − allocated where reserved first peaked.
    pub cached_bytes_at_reserved_peak: u64,
    /// Segment allocations and page mappings.
    pub device_alloc_count: u64,
    /// Segment frees and page unmappings.
    pub device_free_count: u64,
    /// Bytes the policy last tried to get at the OOM.
    pub oom_tried_bytes: Option<u64>,
    /// Allocated bytes at the OOM.
    pub allocated_bytes_at_oom: Option<u64>,
    /// Reserved bytes at the OOM.
    pub reserved_bytes_at_oom: Option<u64>,
    /// Events replayed.
    pub events_replayed: u64,
    /// Allocations live at the end.
    pub live_allocations_at_end: u64,
    /// The device's total memory (what `--capacity` names; `capacity_bytes` is what the
    /// context and the driver leave of it).
    pub total_bytes: u64,
    /// Why the OOM happened: `fragmentation`, `stream cache`, `pending frees`, `too
    /// little memory`, or `starting state` (before the first event).
    pub oom_cause: &'static str,
    /// The largest free block at the OOM.
    pub oom_largest_free_block_bytes: Option<u64>,
    /// The setting that avoids the OOM, checked by replaying with it; empty if none.
    pub oom_fix: String,
    /// `marginal` where the outcome could change within the device's variation between
    /// processes; empty otherwise.
    pub margin: &'static str,
}

impl<'a> From<&'a Row> for CompareRecord<'a> {
    fn from(r: &'a Row) -> CompareRecord<'a> {
        let s = &r.summary;
        let oom = r.oom.as_ref();
        CompareRecord {
            trace: &r.trace,
            policy: &r.policy,
            capacity_bytes: r.capacity_bytes,
            events: r.events,
            requested_bytes_peak: s.requested_bytes_peak,
            allocated_bytes_peak: s.allocated_bytes_peak,
            reserved_bytes_peak: s.reserved_bytes_peak,
            utilization: format_ratio(s.utilization()),
            oom_event_index: oom.and_then(|o| o.event_index),
            oom_requested_bytes: oom.map(|o| o.requested_bytes),
            charged_bytes_peak: s.charged_bytes_peak,
            segment_count_peak: s.segment_count_peak,
            cached_bytes_at_reserved_peak: s.cached_bytes_at_reserved_peak(),
            device_alloc_count: s.device_allocate_count,
            device_free_count: s.device_free_count,
            oom_tried_bytes: oom.map(|o| o.tried_bytes),
            allocated_bytes_at_oom: oom.map(|o| o.policy.allocated_bytes),
            reserved_bytes_at_oom: oom.map(|o| o.policy.reserved_bytes),
            events_replayed: s.event_count,
            live_allocations_at_end: r.live_allocation_count,
            total_bytes: r.total_bytes,
            oom_cause: crate::explain::cause_name(oom, r.explanation.as_ref()),
            oom_largest_free_block_bytes: r
                .explanation
                .as_ref()
                .map(|e| e.largest_free_block_bytes),
            oom_fix: r
                .explanation
                .as_ref()
                .and_then(|e| e.fix())
                .map(|f| f.setting.clone())
                .unwrap_or_default(),
            margin: r.margin.csv(),
        }
    }
}

/// Writes comparison rows as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_compare_csv<W: io::Write>(rows: &[Row], writer: W) -> csv::Result<()> {
    write_records(rows.iter().map(CompareRecord::from), writer)
}

/// One row of a `--timeline` file: the event, and the state after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TimelineRecord {
    /// Index of the event.
    pub event_index: u64,
    /// Its op.
    pub op: &'static str,
    /// The allocation it is about (empty for `empty_cache` and `mark`).
    pub id: Option<u64>,
    /// Bytes an `alloc` asked for (empty for other ops).
    pub bytes: Option<u64>,
    /// Requested bytes after it.
    pub requested_bytes: u64,
    /// Allocated bytes after it.
    pub allocated_bytes: u64,
    /// Reserved bytes after it.
    pub reserved_bytes: u64,
    /// Charged bytes after it.
    pub charged_bytes: u64,
    /// Live allocations after it.
    pub allocation_count: u64,
    /// Live segments after it.
    pub segment_count: u64,
}

impl From<&Sample> for TimelineRecord {
    fn from(s: &Sample) -> TimelineRecord {
        let p = &s.policy;
        TimelineRecord {
            event_index: s.event_index,
            op: s.op,
            id: s.id,
            bytes: s.bytes,
            requested_bytes: p.requested_bytes,
            allocated_bytes: p.allocated_bytes,
            reserved_bytes: p.reserved_bytes,
            charged_bytes: s.charged_bytes,
            allocation_count: p.allocation_count,
            segment_count: p.segment_count,
        }
    }
}

/// Writes a timeline as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_timeline_csv<W: io::Write>(samples: &[Sample], writer: W) -> csv::Result<()> {
    write_records(samples.iter().map(TimelineRecord::from), writer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fidelity::FidelityRow;
    use crate::metrics::{Oom, Summary};
    use policies::{DeviceStats, PolicyStats};

    /// The compare CSV's columns are CompareRecord's fields, in the documented order.
    #[test]
    fn compare_columns() {
        assert_eq!(
            columns::<CompareRecord<'_>>().join(","),
            "trace,policy,capacity_bytes,events,requested_bytes_peak,allocated_bytes_peak,\
             reserved_bytes_peak,utilization,oom_event_index,oom_requested_bytes,\
             charged_bytes_peak,segment_count_peak,cached_bytes_at_reserved_peak,\
             device_alloc_count,device_free_count,oom_tried_bytes,allocated_bytes_at_oom,\
             reserved_bytes_at_oom,events_replayed,live_allocations_at_end,total_bytes,\
             oom_cause,oom_largest_free_block_bytes,oom_fix,margin"
        );
    }

    /// The timeline CSV's columns are TimelineRecord's fields, in the documented order.
    #[test]
    fn timeline_columns() {
        assert_eq!(
            columns::<TimelineRecord>().join(","),
            "event_index,op,id,bytes,requested_bytes,allocated_bytes,reserved_bytes,\
             charged_bytes,allocation_count,segment_count"
        );
    }

    /// The fidelity CSV's columns are FidelityRow's fields, in the documented order.
    #[test]
    fn fidelity_columns() {
        assert_eq!(
            columns::<FidelityRow>().join(","),
            "trace,events,segment_ops_match,first_divergence_event,reserved_bytes_peak_sim,\
             reserved_bytes_peak_torch,allocated_bytes_peak_sim,allocated_bytes_peak_torch,\
             oom_event_sim,oom_event_torch,checkpoints_match,exact"
        );
    }

    /// Every column of every CSV is documented in docs/metrics.md or docs/validation.md.
    #[test]
    fn every_column_is_documented() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let docs = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap()
            + &std::fs::read_to_string(root.join("docs/validation.md")).unwrap();
        let all = [
            columns::<CompareRecord<'_>>(),
            columns::<TimelineRecord>(),
            columns::<FidelityRow>(),
            columns::<crate::validation::ValidationRecord<'_>>(),
            columns::<crate::sweep::SweepRecord>(),
            columns::<crate::diff::DiffRecord>(),
            columns::<crate::iterations::IterationRecord>(),
        ];
        for c in all.iter().flatten() {
            assert!(
                docs.contains(&format!("`{c}`")),
                "column {c} is not documented"
            );
        }
    }

    /// A row is written with empty fields for what is absent, ratios with six decimals;
    /// a table with no rows still has its header.
    #[test]
    fn rows_and_empty_tables() {
        let row = Row {
            trace: "t,1".into(),
            policy: "caching".into(),
            capacity_bytes: 100,
            total_bytes: 100,
            events: 3,
            summary: Summary {
                event_count: 3,
                allocated_bytes_peak: 1,
                reserved_bytes_peak: 3,
                ..Summary::default()
            },
            oom: None,
            live_allocation_count: 2,
            explanation: None,
            caveats: Vec::new(),
            margin: crate::boundary::Margin::Clear,
        };
        let mut out = Vec::new();
        write_compare_csv(std::slice::from_ref(&row), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().nth(1),
            Some("\"t,1\",caching,100,3,0,1,3,0.333333,,,0,0,3,0,0,,,,3,2,100,,,,")
        );
        let oom = Row {
            oom: Some(Oom {
                event_index: Some(2),
                requested_bytes: 5,
                tried_bytes: 6,
                policy: PolicyStats {
                    allocated_bytes: 7,
                    reserved_bytes: 8,
                    ..PolicyStats::default()
                },
                device: DeviceStats::default(),
                message: None,
            }),
            summary: Summary::default(),
            ..row
        };
        let record = CompareRecord::from(&oom);
        assert_eq!(
            (
                record.utilization.as_str(),
                record.oom_event_index,
                record.oom_tried_bytes,
                record.reserved_bytes_at_oom
            ),
            ("", Some(2), Some(6), Some(8))
        );
        let mut out = Vec::new();
        write_timeline_csv(&[], &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event_index,op,id,bytes,requested_bytes,allocated_bytes,reserved_bytes,charged_bytes,allocation_count,segment_count\n"
        );
    }
}
