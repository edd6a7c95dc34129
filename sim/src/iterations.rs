//! Per-iteration windows: a training or serving loop repeats, and what matters is the
//! steady state, not the first iteration that fills the cache. The trace is cut at its
//! `mark` events and, for snapshot pickles, at the annotations PyTorch recorded
//! (`_annotate_memory`, `external_annotations` such as profiler ranges); each window's
//! peaks are taken from the replay ([`IterationWatch`], an observer of the engine), and
//! the iterations after a warm-up are summarized ([`steady_state`]).

use serde::Serialize;
use workloads::{Event, RecordedRun, Trace};

use crate::observe::{Observer, Step};
use crate::report::format_ratio;
use crate::stats::Spread;

/// Where an iteration starts: an event index and the label of the mark or annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// The first event of the window.
    pub event_index: usize,
    /// The mark's label, or the annotation's text.
    pub label: String,
}

/// The trace's boundaries, in event order: every `mark` event, and a snapshot's
/// annotations placed before the first event recorded at or after them. Only those
/// whose label contains `matching` when given (`step` of `step 12`). Two at the same
/// event are one boundary (the first label).
pub fn boundaries(
    trace: &Trace,
    run: Option<&RecordedRun>,
    matching: Option<&str>,
) -> Vec<Boundary> {
    let mut out: Vec<Boundary> = trace
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::Mark { label } => Some(Boundary {
                event_index: i,
                label: label.clone(),
            }),
            _ => None,
        })
        .collect();
    out.extend(annotation_marks(trace, run));
    if let Some(m) = matching {
        out.retain(|b| b.label.contains(m));
    }
    out.sort_by_key(|b| b.event_index);
    out.dedup_by_key(|b| b.event_index);
    out
}

/// A snapshot's annotations as labelled places of `trace`: each `annotate` entry and
/// external annotation before the first event recorded at or after its entry (the
/// trace's end when none is). Empty for other sources.
pub fn annotation_marks(trace: &Trace, run: Option<&RecordedRun>) -> Vec<Boundary> {
    let Some(info) = run.and_then(|r| r.snapshot.as_ref()) else {
        return Vec::new();
    };
    let at = |entry: u64| -> usize {
        if trace.locations.is_empty() {
            usize::try_from(entry)
                .unwrap_or(usize::MAX)
                .min(trace.events.len())
        } else {
            trace.locations.partition_point(|&loc| loc < entry)
        }
    };
    let mut out: Vec<Boundary> = info
        .annotations
        .iter()
        .map(|a| Boundary {
            event_index: at(a.entry),
            label: a.text.clone(),
        })
        .collect();
    out.extend(info.external_annotations.iter().map(|a| {
        Boundary {
            event_index: at(a.entry),
            label: a
                .fields
                .iter()
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        }
    }));
    out.sort_by_key(|b| b.event_index);
    out
}

/// One window of the replay: from a boundary to the next (the events before the first
/// boundary are the prologue, window 0, labelled `start`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// The window's number: 0 the prologue, then 1, 2, ... from each boundary.
    pub index: usize,
    /// The label of the boundary it starts at (`start` for the prologue).
    pub label: String,
    /// Its first event.
    pub first_event: usize,
    /// Its last event replayed.
    pub last_event: usize,
    /// Peak of requested bytes inside it.
    pub requested_bytes_peak: u64,
    /// Peak of allocated bytes inside it.
    pub allocated_bytes_peak: u64,
    /// Peak of reserved bytes inside it.
    pub reserved_bytes_peak: u64,
    /// Reserved bytes after its last event.
    pub reserved_bytes_at_end: u64,
    /// Segment allocations (and map calls) inside it.
    pub device_allocs: u64,
    /// Whether the replay ran to its end (not stopped by an out-of-memory inside it).
    pub complete: bool,
}

impl Window {
    /// Allocated peak ÷ reserved peak inside the window.
    pub fn utilization(&self) -> Option<f64> {
        (self.reserved_bytes_peak > 0)
            .then(|| self.allocated_bytes_peak as f64 / self.reserved_bytes_peak as f64)
    }
}

/// Observes a replay and cuts it into windows at `boundaries`.
#[derive(Debug)]
pub struct IterationWatch {
    boundaries: Vec<Boundary>,
    next: usize,
    /// The windows so far; the last one is open until [`IterationWatch::finish`].
    windows: Vec<Window>,
    allocs_before: u64,
}

impl IterationWatch {
    /// A watch cutting at `boundaries` (in event order, as [`boundaries`] gives them).
    pub fn new(boundaries: Vec<Boundary>) -> IterationWatch {
        IterationWatch {
            boundaries,
            next: 0,
            windows: Vec::new(),
            allocs_before: 0,
        }
    }

    /// The windows; the one holding the replay's first out-of-memory (`oom_event`, as
    /// [`crate::Replay::oom`] gives it) is incomplete, and the replay stopped there.
    pub fn finish(mut self, oom_event: Option<u64>) -> Vec<Window> {
        if let (Some(e), Some(w)) = (oom_event, self.windows.last_mut()) {
            w.complete = (w.last_event as u64) < e;
        }
        self.windows
    }
}

impl Observer for IterationWatch {
    fn after_event(&mut self, step: &Step<'_>) {
        let i = step.index;
        let mut opened = false;
        while self.next < self.boundaries.len() && self.boundaries[self.next].event_index <= i {
            if !opened {
                self.windows.push(Window {
                    index: self.next + 1,
                    label: self.boundaries[self.next].label.clone(),
                    first_event: i,
                    last_event: i,
                    complete: true,
                    ..Window::default()
                });
                opened = true;
            }
            self.next += 1;
        }
        if self.windows.is_empty() {
            self.windows.push(Window {
                index: 0,
                label: "start".to_string(),
                first_event: i,
                last_event: i,
                complete: true,
                ..Window::default()
            });
        }
        if opened {
            self.allocs_before = step
                .device_stats
                .allocate_count
                .saturating_sub(step.device_ops.len() as u64);
        }
        let p = step.policy_stats;
        let w = self.windows.last_mut().expect("a window is open");
        w.last_event = i;
        w.requested_bytes_peak = w.requested_bytes_peak.max(p.requested_bytes);
        w.allocated_bytes_peak = w.allocated_bytes_peak.max(p.allocated_bytes);
        w.reserved_bytes_peak = w.reserved_bytes_peak.max(p.reserved_bytes);
        w.reserved_bytes_at_end = p.reserved_bytes;
        w.device_allocs = step.device_stats.allocate_count - self.allocs_before;
    }
}

/// The iterations after the warm-up: every window but the prologue and the first
/// `warmup` iterations, complete ones only.
pub fn steady(windows: &[Window], warmup: usize) -> Vec<&Window> {
    windows
        .iter()
        .filter(|w| w.index > warmup && w.complete)
        .collect()
}

/// The spread over the steady iterations.
#[derive(Clone, Debug, PartialEq)]
pub struct SteadyState {
    /// How many iterations it covers.
    pub iterations: usize,
    /// Of the reserved peaks.
    pub reserved_bytes_peak: Option<Spread>,
    /// Of the utilizations.
    pub utilization: Option<Spread>,
    /// Of the segment allocations per iteration (0 in a steady state that reuses its
    /// cache).
    pub device_allocs: Option<Spread>,
}

/// The spread of the iterations after `warmup` ([`steady`]).
pub fn steady_state(windows: &[Window], warmup: usize) -> SteadyState {
    let s = steady(windows, warmup);
    let of = |f: &dyn Fn(&Window) -> Option<f64>| {
        Spread::of(&s.iter().filter_map(|w| f(w)).collect::<Vec<_>>())
    };
    SteadyState {
        iterations: s.len(),
        reserved_bytes_peak: of(&|w| Some(w.reserved_bytes_peak as f64)),
        utilization: of(&|w| w.utilization()),
        device_allocs: of(&|w| Some(w.device_allocs as f64)),
    }
}

/// One row of `replay --iterations FILE.csv` (`docs/metrics.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IterationRecord {
    /// The window's number (0: before the first boundary).
    pub iteration: usize,
    /// The label it starts at.
    pub label: String,
    /// First event.
    pub first_event: usize,
    /// Last event replayed.
    pub last_event: usize,
    /// Requested peak inside it.
    pub requested_bytes_peak: u64,
    /// Allocated peak inside it.
    pub allocated_bytes_peak: u64,
    /// Reserved peak inside it.
    pub reserved_bytes_peak: u64,
    /// Allocated peak ÷ reserved peak, six decimals.
    pub utilization: String,
    /// Reserved bytes after its last event.
    pub reserved_bytes_at_end: u64,
    /// Segment allocations and map calls inside it.
    pub device_allocs: u64,
    /// `true` for a warm-up iteration (or the prologue), left out of the steady state.
    pub warmup: bool,
    /// `false` when an out-of-memory stopped the replay inside it.
    pub complete: bool,
}

impl IterationRecord {
    /// The record of a window, given the warm-up.
    pub fn of(w: &Window, warmup: usize) -> IterationRecord {
        IterationRecord {
            iteration: w.index,
            label: w.label.clone(),
            first_event: w.first_event,
            last_event: w.last_event,
            requested_bytes_peak: w.requested_bytes_peak,
            allocated_bytes_peak: w.allocated_bytes_peak,
            reserved_bytes_peak: w.reserved_bytes_peak,
            utilization: format_ratio(w.utilization()),
            reserved_bytes_at_end: w.reserved_bytes_at_end,
            device_allocs: w.device_allocs,
            warmup: w.index <= warmup,
            complete: w.complete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceOptions};
    use crate::replay::{replay_with, ReplayOptions};
    use workloads::AllocId;

    fn alloc(id: u64, size_bytes: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        }
    }

    fn free(id: u64) -> Event {
        Event::Free { id: AllocId(id) }
    }

    fn mark(label: &str) -> Event {
        Event::Mark {
            label: label.into(),
        }
    }

    /// Windows cut at marks: the prologue, then one per mark with its own peaks; the
    /// first iteration grows the cache (a segment of the small pool), the later ones
    /// reuse it, and the steady state leaves out the warm-up.
    #[test]
    fn windows_at_marks() {
        let mib = 1 << 20;
        let mut events = vec![alloc(100, 4 * mib)];
        for step in 0..4u64 {
            events.push(mark(&format!("step {step}")));
            events.push(alloc(step, (step + 1) * mib));
            events.push(free(step));
        }
        let trace = Trace::new("t", events);
        let b = boundaries(&trace, None, Some("step"));
        assert_eq!(b.len(), 4);
        let mut watch = IterationWatch::new(b);
        let mut policy = policies::PolicyConfig::defaults()[0].build().unwrap();
        let mut device = SimDevice::new(SimDeviceOptions::default());
        let r = replay_with(
            &trace,
            policy.as_mut(),
            &mut device,
            &ReplayOptions::default(),
            &mut watch,
        )
        .unwrap();
        let w = watch.finish(r.oom.and_then(|o| o.event_index));
        let got: Vec<(usize, &str, usize, usize, u64, u64)> = w
            .iter()
            .map(|w| {
                (
                    w.index,
                    w.label.as_str(),
                    w.first_event,
                    w.last_event,
                    w.requested_bytes_peak,
                    w.device_allocs,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (0, "start", 0, 0, 4 * mib, 1),
                // Its 1 MiB request is the small pool's first: a 2 MiB segment.
                (1, "step 0", 1, 3, 5 * mib, 1),
                (2, "step 1", 4, 6, 6 * mib, 0),
                (3, "step 2", 7, 9, 7 * mib, 0),
                (4, "step 3", 10, 12, 8 * mib, 0),
            ]
        );
        assert!(w.iter().all(|w| w.complete));
        let s = steady_state(&w, 1);
        assert_eq!(s.iterations, 3);
        assert_eq!(s.device_allocs.unwrap().mean, 0.0);
        assert!(IterationRecord::of(&w[1], 1).warmup);
        assert!(!IterationRecord::of(&w[2], 1).warmup);
    }

    /// An out-of-memory inside a window leaves it incomplete and out of the steady
    /// state; a filter that matches no label gives no boundary.
    #[test]
    fn an_oom_ends_the_last_window() {
        let trace = Trace::new(
            "t",
            vec![mark("a"), alloc(1, 1 << 20), mark("b"), alloc(2, 1 << 40)],
        );
        let mut watch = IterationWatch::new(boundaries(&trace, None, None));
        let mut policy = policies::PolicyConfig::defaults()[0].build().unwrap();
        let mut device = SimDevice::new(SimDeviceOptions::default().with_capacity(64 << 20));
        let r = replay_with(
            &trace,
            policy.as_mut(),
            &mut device,
            &ReplayOptions::default(),
            &mut watch,
        )
        .unwrap();
        let w = watch.finish(r.oom.and_then(|o| o.event_index));
        assert_eq!(w.len(), 2);
        assert!(w[0].complete);
        assert!(!w[1].complete);
        assert!(steady(&w, 0).len() == 1);
        assert!(boundaries(&trace, None, Some("zzz")).is_empty());
    }
}
