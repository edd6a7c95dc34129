//! What a picture needs from a replay, gathered by observers of the engine: the
//! series of bytes over the run ([`SeriesRecorder`]) and the segments at one moment
//! ([`Capture`]).

use policies::{PolicyStats, SegmentSnapshot};
use sim::{Observer, Outcome, Step};
use workloads::Trace;

use crate::XAxis;

/// A point of a series: where on the x axis (an event index, or seconds since the
/// trace's first event), and the bytes then.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Event index, or seconds since the first event.
    pub x: f64,
    /// Bytes after the event.
    pub bytes: u64,
}

/// A series of points in x order, downsampled so that a line through them looks like
/// the line through every event's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// The points.
    pub points: Vec<Point>,
}

impl Series {
    /// The highest value.
    pub fn max(&self) -> u64 {
        self.points.iter().map(|p| p.bytes).max().unwrap_or(0)
    }
}

/// The first, last, lowest and highest point of one column.
#[derive(Clone, Copy)]
struct Bucket {
    first: Point,
    last: Point,
    min: Point,
    max: Point,
}

/// M4 downsampling: per column of the x range, the first, last, lowest and highest
/// point; a line through them, in x order, covers every pixel the full line covers.
struct M4 {
    buckets: Vec<Option<Bucket>>,
    x0: f64,
    width: f64,
}

impl M4 {
    fn new(columns: usize, x0: f64, x1: f64) -> M4 {
        M4 {
            buckets: vec![None; columns.max(1)],
            x0,
            width: (x1 - x0).max(f64::MIN_POSITIVE),
        }
    }

    fn add(&mut self, x: f64, bytes: u64) {
        let n = self.buckets.len();
        // `as` saturates; the last column takes the right edge.
        let i = (((x - self.x0) / self.width) * n as f64).floor() as usize;
        let p = Point { x, bytes };
        match &mut self.buckets[i.min(n - 1)] {
            Some(b) => {
                b.last = p;
                if bytes < b.min.bytes {
                    b.min = p;
                }
                if bytes > b.max.bytes {
                    b.max = p;
                }
            }
            slot => {
                *slot = Some(Bucket {
                    first: p,
                    last: p,
                    min: p,
                    max: p,
                })
            }
        }
    }

    fn finish(self) -> Series {
        let mut points = Vec::new();
        for b in self.buckets.into_iter().flatten() {
            let mut four = [b.first, b.min, b.max, b.last];
            four.sort_by(|a, b| a.x.total_cmp(&b.x));
            for p in four {
                if points.last() != Some(&p) {
                    points.push(p);
                }
            }
        }
        Series { points }
    }
}

/// Where a replay ran out of memory, for the chart's marker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OomPoint {
    /// x of the event.
    pub x: f64,
    /// Index of the event.
    pub event_index: usize,
    /// Bytes the program asked for.
    pub requested_bytes: u64,
    /// Reserved bytes then.
    pub reserved_bytes: u64,
}

/// Observes a replay and keeps, downsampled, the requested, allocated and reserved
/// bytes after each event, and the first out-of-memory. The x of event `i` is `i`, or,
/// on an [`XAxis::Seconds`] chart, the seconds since the trace's first event.
pub struct SeriesRecorder {
    times_us: Vec<u64>,
    requested: M4,
    allocated: M4,
    reserved: M4,
    oom: Option<OomPoint>,
}

impl SeriesRecorder {
    /// Columns kept per series (about one per pixel of a wide chart).
    pub const BUCKETS: usize = 2000;

    /// A recorder for a replay of `trace` on a chart whose x axis is `axis` (seconds
    /// only for a trace that records times).
    pub fn new(trace: &Trace, axis: XAxis) -> SeriesRecorder {
        let times_us = match axis {
            XAxis::Seconds => trace.times_us.clone(),
            XAxis::Events => Vec::new(),
        };
        let (x0, x1) = match (times_us.first(), times_us.last()) {
            (Some(&a), Some(&b)) => (0.0, (b - a) as f64 / 1e6),
            _ => (0.0, trace.events.len().saturating_sub(1) as f64),
        };
        let m4 = || M4::new(Self::BUCKETS, x0, x1);
        SeriesRecorder {
            times_us,
            requested: m4(),
            allocated: m4(),
            reserved: m4(),
            oom: None,
        }
    }

    /// The x of event `index`.
    pub fn x_of(&self, index: usize) -> f64 {
        x_of(&self.times_us, index)
    }

    /// The series (requested, allocated, reserved) and the first out-of-memory.
    pub fn finish(self) -> (Series, Series, Series, Option<OomPoint>) {
        (
            self.requested.finish(),
            self.allocated.finish(),
            self.reserved.finish(),
            self.oom,
        )
    }
}

/// The x of event `index` of a trace with these times: seconds since the first event,
/// or the index when there are none.
pub(crate) fn x_of(times_us: &[u64], index: usize) -> f64 {
    match (times_us.first(), times_us.get(index)) {
        (Some(&t0), Some(&t)) => t.saturating_sub(t0) as f64 / 1e6,
        _ => index as f64,
    }
}

impl Observer for SeriesRecorder {
    fn after_event(&mut self, step: &Step<'_>) {
        let x = self.x_of(step.index);
        let s = step.policy_stats;
        self.requested.add(x, s.requested_bytes);
        self.allocated.add(x, s.allocated_bytes);
        self.reserved.add(x, s.reserved_bytes);
        if let Outcome::OutOfMemory {
            requested_bytes, ..
        } = step.outcome
        {
            if self.oom.is_none() {
                self.oom = Some(OomPoint {
                    x,
                    event_index: step.index,
                    requested_bytes,
                    reserved_bytes: s.reserved_bytes,
                });
            }
        }
    }
}

/// A moment of a replay at which to draw the segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// When reserved bytes first reached their peak.
    Peak,
    /// At the first out-of-memory (after its failed attempt).
    Oom,
    /// After the event of this index.
    Event(usize),
}

/// The policy's segments at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Index of the event after which they were taken.
    pub event_index: usize,
    /// Segments in address order, with their blocks.
    pub segments: Vec<SegmentSnapshot>,
    /// The policy's accounting then.
    pub stats: PolicyStats,
}

/// Observes a replay and takes the policy's segments after one event, or at the first
/// out-of-memory ([`Moment::Peak`] is found by a first replay: the summary's
/// `reserved_peak_event_index`).
pub struct Capture {
    at: Option<usize>,
    /// What was captured.
    pub snapshot: Option<Snapshot>,
}

impl Capture {
    /// Captures after event `index`, or at the first out-of-memory when `None`.
    pub fn new(at: Option<usize>) -> Capture {
        Capture { at, snapshot: None }
    }
}

impl Observer for Capture {
    fn after_event(&mut self, step: &Step<'_>) {
        if self.snapshot.is_some() {
            return;
        }
        let now = match self.at {
            Some(i) => step.index == i,
            None => matches!(step.outcome, Outcome::OutOfMemory { .. }),
        };
        if now {
            self.snapshot = Some(Snapshot {
                event_index: step.index,
                segments: step.policy.snapshot(),
                stats: *step.policy_stats,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Downsampling keeps, per column, the first, last, lowest and highest point, in x
    /// order, so the peak and the trough of every column survive; with fewer points than
    /// columns every point is kept.
    #[test]
    fn m4_keeps_extremes() {
        let mut m = M4::new(2, 0.0, 9.0);
        for (i, v) in [5u64, 1, 9, 3, 4, 8, 2, 7, 6, 6].iter().enumerate() {
            m.add(i as f64, *v);
        }
        let s = m.finish();
        let pts: Vec<(f64, u64)> = s.points.iter().map(|p| (p.x, p.bytes)).collect();
        assert_eq!(
            pts,
            [
                (0.0, 5),
                (1.0, 1),
                (2.0, 9),
                (4.0, 4),
                (5.0, 8),
                (6.0, 2),
                (9.0, 6)
            ]
        );
        assert_eq!(s.max(), 9);
        let mut m = M4::new(100, 0.0, 2.0);
        for i in 0..3 {
            m.add(f64::from(i), 10 * i as u64);
        }
        assert_eq!(m.finish().points.len(), 3);
    }
}
