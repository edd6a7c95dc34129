//! CSV output of comparisons and timelines. The column order is defined here once and
//! documented in `docs/metrics.md`.

use std::io;

use crate::compare::Row;
use crate::metrics::Sample;

/// Columns of `allocsim compare`, in order. The first ten are a stable contract.
pub const COMPARE_COLUMNS: &[&str] = &[
    "trace",
    "policy",
    "capacity_bytes",
    "events",
    "requested_bytes_peak",
    "allocated_bytes_peak",
    "reserved_bytes_peak",
    "utilization",
    "oom_event_index",
    "oom_requested_bytes",
    "charged_bytes_peak",
    "segment_count_peak",
    "cached_bytes_at_reserved_peak",
    "device_alloc_count",
    "device_free_count",
    "oom_tried_bytes",
    "allocated_bytes_at_oom",
    "reserved_bytes_at_oom",
    "events_replayed",
    "live_allocations_at_end",
];

/// Formats a ratio with six decimals (empty when undefined), the same on every machine.
pub fn format_ratio(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.6}")).unwrap_or_default()
}

/// Writes comparison rows as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_compare_csv<W: io::Write>(rows: &[Row], writer: W) -> io::Result<()> {
    let mut w = csv::Writer::from_writer(writer);
    w.write_record(COMPARE_COLUMNS)?;
    for r in rows {
        let s = &r.summary;
        let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
        w.write_record([
            r.trace.clone(),
            r.policy.clone(),
            r.capacity_bytes.to_string(),
            r.events.to_string(),
            s.requested_bytes_peak.to_string(),
            s.allocated_bytes_peak.to_string(),
            s.reserved_bytes_peak.to_string(),
            format_ratio(s.utilization()),
            opt(r.oom.as_ref().map(|o| o.event_index)),
            opt(r.oom.as_ref().map(|o| o.requested_bytes)),
            s.charged_bytes_peak.to_string(),
            s.segment_count_peak.to_string(),
            s.cached_bytes_at_reserved_peak().to_string(),
            s.device_allocate_count.to_string(),
            s.device_free_count.to_string(),
            opt(r.oom.as_ref().map(|o| o.tried_bytes)),
            opt(r.oom.as_ref().map(|o| o.policy.allocated_bytes)),
            opt(r.oom.as_ref().map(|o| o.policy.reserved_bytes)),
            s.event_count.to_string(),
            r.live_allocation_count.to_string(),
        ])?;
    }
    w.flush()
}

/// Columns of `--timeline` files.
pub const TIMELINE_COLUMNS: &[&str] = &[
    "event_index",
    "requested_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "charged_bytes",
    "allocation_count",
    "segment_count",
];

/// Writes a timeline as CSV with a header.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_timeline_csv<W: io::Write>(samples: &[Sample], writer: W) -> io::Result<()> {
    let mut w = csv::Writer::from_writer(writer);
    w.write_record(TIMELINE_COLUMNS)?;
    for s in samples {
        let p = &s.policy;
        w.write_record([
            s.event_index.to_string(),
            p.requested_bytes.to_string(),
            p.allocated_bytes.to_string(),
            p.reserved_bytes.to_string(),
            s.charged_bytes.to_string(),
            p.allocation_count.to_string(),
            p.segment_count.to_string(),
        ])?;
    }
    w.flush()
}
