//! Two configurations on one trace, side by side: where their reserved bytes part, the
//! first decision that differs, their peaks and out-of-memory points, and which
//! requests cost the difference.
//!
//! Both replays go through the one engine with an observer ([`Trail`]) that keeps, per
//! event, the reserved and allocated bytes after it and the device operations it
//! caused (16 bytes an event, plus one entry per device operation). Then:
//!
//! - **parted at**: the first event after which the two reserve different bytes;
//! - **first differing decision**: the first event at which the two made different
//!   device operations (segment allocations, frees, maps, unmaps, by kind and bytes) or
//!   one served a request the other could not;
//! - **the cost**: let X be the side with the higher reserved peak and `p` the event at
//!   which it first reached it. At `p`, X holds `gap(p) = reserved_X(p) −
//!   reserved_Y(p)` more than Y, the sum over the events up to `p` of how much each
//!   widened the gap (`reserved_X` grew by more than `reserved_Y`, or shrank by less).
//!   The events that widened it most, with their requests, are what cost the
//!   difference; the gap at `p` is at least the difference of the peaks.

use serde::Serialize;
use workloads::{Event, Trace};

use crate::compare::{replay_policy, CompareError, CompareInput};
use crate::device::SimDeviceOptions;
use crate::metrics::{Oom, Summary};
use crate::observe::{DeviceOpKind, Observer, Outcome, Step};
use crate::replay::ReplayOptions;
use policies::spec::PolicySpec;

/// What one replay did, event by event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trail {
    /// Reserved bytes before the first event: the starting state's under this policy
    /// for a trace that starts mid-run (taken over, or its live blocks allocated), 0
    /// otherwise.
    pub start_reserved: u64,
    /// Reserved bytes after each replayed event.
    pub reserved: Vec<u64>,
    /// Allocated bytes after each replayed event.
    pub allocated: Vec<u64>,
    /// Device operations: (event index, kind, bytes), in order.
    pub ops: Vec<(usize, DeviceOpKind, u64)>,
    /// Events whose request ran out of memory.
    pub ooms: Vec<usize>,
}

impl Observer for Trail {
    fn before_event(&mut self, index: usize, _event: &Event, policy: &dyn policies::Policy) {
        if index == 0 {
            self.start_reserved = policy.stats().reserved_bytes;
        }
    }

    fn after_event(&mut self, step: &Step<'_>) {
        self.reserved.push(step.policy_stats.reserved_bytes);
        self.allocated.push(step.policy_stats.allocated_bytes);
        self.ops.extend(
            step.device_ops
                .iter()
                .map(|op| (step.index, op.kind, op.bytes)),
        );
        if matches!(step.outcome, Outcome::OutOfMemory { .. }) {
            self.ooms.push(step.index);
        }
    }
}

impl Trail {
    /// The device operations of event `i`.
    fn ops_of(&self, i: usize) -> &[(usize, DeviceOpKind, u64)] {
        let start = self.ops.partition_point(|op| op.0 < i);
        let end = self.ops.partition_point(|op| op.0 <= i);
        &self.ops[start..end]
    }
}

/// One side of a diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Side {
    /// The configuration's label.
    pub label: String,
    /// Peaks and counts.
    pub summary: Summary,
    /// The first out-of-memory.
    pub oom: Option<Oom>,
    /// Event by event.
    pub trail: Trail,
}

/// An event that changed the gap between the two reservations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cost {
    /// The event.
    pub event_index: usize,
    /// How much it widened the gap toward the side with the higher peak (negative:
    /// narrowed it).
    pub bytes: i64,
}

/// Two replays of one trace compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// The first configuration.
    pub a: Side,
    /// The second.
    pub b: Side,
    /// `reserved(b) − reserved(a)` before the first event: the starting states of a
    /// trace that starts mid-run under the two policies (one may take the state over,
    /// the other allocate its live blocks); 0 otherwise.
    pub start_gap: i64,
    /// The first event after which they reserve different bytes, having reserved the
    /// same before it (`None`: never, or already before the first event: `start_gap`).
    pub parted_at: Option<usize>,
    /// The first event at which their device operations or outcomes differ.
    pub first_decision: Option<usize>,
    /// Which side has the higher reserved peak: `Some(false)` a, `Some(true)` b, `None`
    /// when the peaks are equal.
    pub higher_is_b: Option<bool>,
    /// The event at which the higher side first reached its peak.
    pub peak_event: Option<usize>,
    /// reserved(higher) − reserved(lower) at `peak_event` (before the first event
    /// where the higher side's peak is its starting state).
    pub gap_at_peak: i64,
    /// Every event up to `peak_event` that changed the gap, the widest first (ties: the
    /// earlier event); their sum is `gap_at_peak` less the gap before the first event.
    pub costs: Vec<Cost>,
}

/// Replays `input` under `a` and `b` on fresh devices like `device` and compares them.
///
/// # Errors
/// A policy that does not build, or a replay that stops for a reason other than
/// running out of memory.
pub fn diff(
    input: &CompareInput,
    a: &PolicySpec,
    b: &PolicySpec,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<Diff, CompareError> {
    let side = |spec: &PolicySpec| -> Result<Side, CompareError> {
        let mut trail = Trail::default();
        let r = replay_policy(
            &input.trace,
            &input.hints,
            &spec.config,
            &spec.label,
            device,
            options,
            &mut trail,
        )?;
        Ok(Side {
            label: spec.label.clone(),
            summary: r.summary,
            oom: r.oom,
            trail,
        })
    };
    let (a, b) = rayon::join(|| side(a), || side(b));
    Ok(compare_sides(a?, b?))
}

/// The comparison of two replays of one trace.
pub fn compare_sides(a: Side, b: Side) -> Diff {
    let n = a.trail.reserved.len().min(b.trail.reserved.len());
    let start_gap = b.trail.start_reserved as i64 - a.trail.start_reserved as i64;
    let parted_at = if start_gap == 0 {
        (0..n).find(|&i| a.trail.reserved[i] != b.trail.reserved[i])
    } else {
        None
    };
    let kinds = |t: &Trail, i: usize| -> Vec<(DeviceOpKind, u64)> {
        t.ops_of(i).iter().map(|&(_, k, b)| (k, b)).collect()
    };
    let first_decision = (0..n).find(|&i| {
        kinds(&a.trail, i) != kinds(&b.trail, i)
            || a.trail.ooms.contains(&i) != b.trail.ooms.contains(&i)
    });
    let (pa, pb) = (a.summary.reserved_bytes_peak, b.summary.reserved_bytes_peak);
    let higher_is_b = match pa.cmp(&pb) {
        std::cmp::Ordering::Less => Some(true),
        std::cmp::Ordering::Greater => Some(false),
        std::cmp::Ordering::Equal => None,
    };
    let (hi, lo) = match higher_is_b {
        Some(true) => (&b, &a),
        _ => (&a, &b),
    };
    let peak_event = higher_is_b.and_then(|_| {
        hi.summary
            .reserved_peak_event_index
            .map(|e| e as usize)
            .filter(|&e| e < hi.trail.reserved.len())
    });
    let at = |t: &Trail, i: usize| -> i64 {
        // After a side stopped (out of memory), it holds what it held then.
        t.reserved
            .get(i)
            .or(t.reserved.last())
            .copied()
            .unwrap_or(0) as i64
    };
    let mut costs = Vec::new();
    let mut gap_at_peak = hi.trail.start_reserved as i64 - lo.trail.start_reserved as i64;
    if let Some(p) = peak_event {
        let mut before = gap_at_peak;
        for i in 0..=p {
            let gap = at(&hi.trail, i) - at(&lo.trail, i);
            if gap != before {
                costs.push(Cost {
                    event_index: i,
                    bytes: gap - before,
                });
            }
            before = gap;
        }
        gap_at_peak = before;
        costs.sort_by_key(|c| (std::cmp::Reverse(c.bytes), c.event_index));
    }
    Diff {
        a,
        b,
        start_gap,
        parted_at,
        first_decision,
        higher_is_b,
        peak_event,
        gap_at_peak,
        costs,
    }
}

/// One row of `allocsim diff`'s CSV: an event after which the gap between the two
/// reservations changed (`docs/metrics.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiffRecord {
    /// The event, from 0.
    pub event_index: usize,
    /// Its op.
    pub op: &'static str,
    /// The allocation it is about, as the trace names it.
    pub id: String,
    /// Bytes an `alloc` asked for.
    pub bytes: Option<u64>,
    /// Reserved bytes of the first configuration after it.
    pub reserved_a: u64,
    /// Reserved bytes of the second after it.
    pub reserved_b: u64,
    /// `reserved_b − reserved_a` after it.
    pub gap_bytes: i64,
    /// How much the event changed the gap.
    pub change_bytes: i64,
    /// The first configuration's device operations at this event, for programs
    /// (`ops_csv`: `segment_alloc:2097152 map:2097152`, `out_of_memory`).
    pub ops_a: String,
    /// The second's.
    pub ops_b: String,
}

/// Every event after which the gap changed; none where a side ran out of memory
/// before the first event (a trace that starts mid-run whose starting state it cannot
/// hold: there is nothing to compare event by event).
pub fn records(trace: &Trace, d: &Diff) -> Vec<DiffRecord> {
    if [&d.a, &d.b]
        .iter()
        .any(|s| s.oom.as_ref().is_some_and(|o| o.before_first_event()))
    {
        return Vec::new();
    }
    let (ra, rb) = (&d.a.trail.reserved, &d.b.trail.reserved);
    let n = ra.len().max(rb.len());
    let at = |r: &Vec<u64>, i: usize| r.get(i).or(r.last()).copied().unwrap_or(0);
    let mut out = Vec::new();
    let mut before = d.start_gap;
    for i in 0..n {
        let gap = at(rb, i) as i64 - at(ra, i) as i64;
        if gap != before {
            let e = &trace.events[i];
            let (id, bytes) = match e {
                Event::Alloc { id, size_bytes, .. } => {
                    (trace.id_name(*id).to_string(), Some(*size_bytes))
                }
                Event::Free { id } | Event::FreeRequested { id } => {
                    (trace.id_name(*id).to_string(), None)
                }
                _ => (String::new(), None),
            };
            out.push(DiffRecord {
                event_index: i,
                op: e.op_name(),
                id,
                bytes,
                reserved_a: at(ra, i),
                reserved_b: at(rb, i),
                gap_bytes: gap,
                change_bytes: gap - before,
                ops_a: ops_csv(&d.a.trail, i),
                ops_b: ops_csv(&d.b.trail, i),
            });
        }
        before = gap;
    }
    out
}

/// An event's device operations, for people: `segment_alloc 20.00 MiB, map 2.00 MiB`.
pub fn ops_text(trail: &Trail, event_index: usize) -> String {
    let (ops, oom) = ops_of(trail, event_index);
    if ops.is_empty() && !oom {
        return "no device operation".to_string();
    }
    let mut parts: Vec<String> = ops
        .iter()
        .map(|&(name, bytes)| format!("{name} {}", workloads::size::format_size_human(bytes)))
        .collect();
    if oom {
        parts.push("out of memory".to_string());
    }
    parts.join(", ")
}

/// An event's device operations, for programs (the CSV's `ops_a`, `ops_b`): each
/// `kind:bytes`, separated by spaces, then `out_of_memory` where its request ran out;
/// empty where it made none: `segment_alloc:20971520 map:2097152`.
pub fn ops_csv(trail: &Trail, event_index: usize) -> String {
    let (ops, oom) = ops_of(trail, event_index);
    let mut parts: Vec<String> = ops
        .iter()
        .map(|&(name, bytes)| format!("{name}:{bytes}"))
        .collect();
    if oom {
        parts.push("out_of_memory".to_string());
    }
    parts.join(" ")
}

/// An event's device operations by name and bytes, and whether its request ran out.
fn ops_of(trail: &Trail, event_index: usize) -> (Vec<(&'static str, u64)>, bool) {
    let ops = trail
        .ops_of(event_index)
        .iter()
        .map(|&(_, kind, bytes)| {
            let name = match kind {
                DeviceOpKind::SegmentAlloc => "segment_alloc",
                DeviceOpKind::SegmentFree => "segment_free",
                DeviceOpKind::Map => "map",
                DeviceOpKind::Unmap => "unmap",
            };
            (name, bytes)
        })
        .collect();
    (ops, trail.ooms.contains(&event_index))
}

/// An event for people: `alloc id 12 of 20.00 MiB on stream 0`, `free id 12`, ...
pub fn event_text(trace: &Trace, index: usize) -> String {
    let Some(e) = trace.events.get(index) else {
        return String::new();
    };
    let id = |id: workloads::AllocId| trace.id_name(id).to_string();
    match e {
        Event::Alloc {
            id: i,
            size_bytes,
            stream,
        } => format!(
            "alloc id {} of {} on stream {stream}",
            id(*i),
            workloads::size::format_size_human(*size_bytes)
        ),
        Event::Free { id: i } => format!("free id {}", id(*i)),
        Event::FreeRequested { id: i } => format!("free_requested id {}", id(*i)),
        other => other.op_name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::AddressHints;
    use workloads::AllocId;

    /// `trace` diffed under `caching` against `other`, on the default device.
    fn caching_against(trace: Trace, other: &str) -> (CompareInput, Diff) {
        let input = CompareInput {
            trace,
            hints: AddressHints::default(),
        };
        let specs =
            policies::spec::parse_policy_list(&format!("caching,{other}"), &Default::default())
                .unwrap();
        let d = diff(
            &input,
            &specs[0],
            &specs[1],
            &SimDeviceOptions::default(),
            &ReplayOptions::default(),
        )
        .unwrap();
        (input, d)
    }

    /// A side of a mid-run trace: `start` reserved before the first event, then
    /// `reserved` after each, its peak where `summary` says.
    fn side(start: u64, reserved: &[u64], peak_event: Option<u64>) -> Side {
        let peak = reserved.iter().copied().chain([start]).max().unwrap();
        Side {
            label: String::new(),
            summary: Summary {
                reserved_bytes_peak: peak,
                reserved_peak_event_index: peak_event,
                ..Summary::default()
            },
            oom: None,
            trail: Trail {
                start_reserved: start,
                reserved: reserved.to_vec(),
                ..Trail::default()
            },
        }
    }

    /// Sides whose starting states differ part before the first event: no event is
    /// charged with that difference (the costs sum to the gap at the peak less it),
    /// and a higher peak that is the starting state itself has no event.
    #[test]
    fn starting_states_that_differ() {
        // a takes 10 over and grows to 40 at event 1; b allocates 30 and stays.
        let d = compare_sides(side(10, &[10, 40], Some(1)), side(30, &[30, 30], None));
        assert_eq!((d.start_gap, d.parted_at), (20, None));
        assert_eq!(
            (d.higher_is_b, d.peak_event, d.gap_at_peak),
            (Some(false), Some(1), 10)
        );
        assert_eq!(
            d.costs,
            vec![Cost {
                event_index: 1,
                bytes: 30
            }]
        );
        // b's peak is its starting state (50), a never reaches it.
        let d = compare_sides(side(10, &[10, 20], Some(1)), side(50, &[30, 30], None));
        assert_eq!(
            (d.higher_is_b, d.peak_event, d.gap_at_peak),
            (Some(true), None, 40)
        );
        assert!(d.costs.is_empty());
    }

    fn alloc(id: u64, size_bytes: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        }
    }

    /// Caching against immediate on a trace whose small requests share one 2 MiB
    /// segment under caching: they part at the first request, the first decision is
    /// that request's (a 2 MiB segment against a segment of its own size), caching has
    /// the higher peak, and the requests that cost it are the first one (the whole
    /// segment) less the later ones (immediate grows, caching does not).
    #[test]
    fn caching_against_immediate() {
        let trace = Trace::new(
            "t",
            vec![
                alloc(1, 512),
                alloc(2, 512),
                Event::Free { id: AllocId(1) },
                alloc(3, 1024),
            ],
        );
        let (input, d) = caching_against(trace, "immediate");
        assert_eq!(d.parted_at, Some(0));
        assert_eq!(d.first_decision, Some(0));
        assert_eq!(ops_text(&d.a.trail, 0), "segment_alloc 2.00 MiB");
        assert_eq!(ops_text(&d.b.trail, 0), "segment_alloc 512 B");
        assert_eq!(d.higher_is_b, Some(false));
        assert_eq!(d.peak_event, Some(0));
        assert_eq!(d.gap_at_peak, (2 << 20) - 512);
        assert_eq!(
            d.costs,
            [Cost {
                event_index: 0,
                bytes: (2 << 20) - 512
            }]
        );
        assert_eq!(
            event_text(&input.trace, 0),
            "alloc id 1 of 512 B on stream 0"
        );
    }

    /// Two identical configurations never part and cost nothing.
    #[test]
    fn identical_configurations() {
        let (_, d) = caching_against(Trace::new("t", vec![alloc(1, 3 << 20)]), "caching");
        assert_eq!(
            (d.parted_at, d.first_decision, d.higher_is_b),
            (None, None, None)
        );
        assert!(d.costs.is_empty());
    }

    /// The CSV's device operations are for programs: each `kind:bytes` in bytes,
    /// separated by spaces, `out_of_memory` for a request that ran out, empty where the
    /// event made no device operation (the terminal's text has human sizes).
    #[test]
    fn csv_ops_are_in_bytes() {
        let trace = Trace::new("t", vec![alloc(1, 512), alloc(2, 512), alloc(3, 100 << 30)]);
        let (input, d) = caching_against(trace, "immediate");
        let rows = records(&input.trace, &d);
        assert_eq!(rows[0].event_index, 0);
        assert_eq!(rows[0].ops_a, "segment_alloc:2097152");
        assert_eq!(rows[0].ops_b, "segment_alloc:512");
        let later: Vec<(&str, &str)> = rows[1..]
            .iter()
            .map(|r| (r.ops_a.as_str(), r.ops_b.as_str()))
            .collect();
        assert_eq!(later, [("", "segment_alloc:512")]);
        assert_eq!(ops_csv(&d.a.trail, 2), "out_of_memory");
        assert_eq!(ops_text(&d.a.trail, 1), "no device operation");
    }
}
