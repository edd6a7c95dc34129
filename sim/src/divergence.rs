//! Where a replay first put a request somewhere else than PyTorch did, and why: the
//! fidelity check's account of a run that is not exact ([`crate::fidelity`]).
//!
//! While both sides make the same segment decisions, every request is compared by
//! place: the segment it went to (segments numbered in the order they were allocated,
//! `#0` first) and its offset there. The first request placed differently, with
//! everything before it placed alike, can only be a best-fit tie that broke the
//! other way: both sides held the same free blocks, and PyTorch breaks ties between
//! equal blocks by address, so the two segments lie in a different order. The state
//! before that request (from a second replay) says which blocks tied; the segments'
//! addresses on both sides say who placed them where.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use policies::{BlockState, Policy, SegmentSnapshot};
use workloads::{Action, Event, RecordedRun};

use crate::device::AddressHints;
use crate::observe::{DeviceOpKind, Observer, Step};

/// A segment (`cudaMalloc`) as one side placed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlacedSegment {
    /// Its address.
    pub addr: u64,
    /// Its bytes.
    pub bytes: u64,
    /// The entry whose request allocated it.
    pub owner: usize,
}

/// Where one side put its segments and requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct Places {
    /// Every segment allocated, in order: the index is its number.
    pub segments: Vec<PlacedSegment>,
    /// Live segments by address: (number, bytes).
    live: BTreeMap<u64, (usize, u64)>,
    /// Each request served inside a segment: entry → (segment number, offset).
    /// Requests in expandable segments' ranges are left out (each pool and stream has
    /// one range, so no tie is broken between them).
    pub requests: BTreeMap<usize, (usize, u64)>,
}

impl Places {
    fn segment_alloc(&mut self, addr: u64, bytes: u64, owner: usize) {
        self.live.insert(addr, (self.segments.len(), bytes));
        self.segments.push(PlacedSegment { addr, bytes, owner });
    }

    fn segment_free(&mut self, addr: u64) {
        self.live.remove(&addr);
    }

    fn request(&mut self, entry: usize, addr: u64) {
        if let Some((&base, &(n, bytes))) = self.live.range(..=addr).next_back() {
            if addr - base < bytes {
                self.requests.insert(entry, (n, addr - base));
            }
        }
    }

    /// PyTorch's side, from the recorded entries (the `oom` entries served nothing).
    pub fn recorded(run: &RecordedRun) -> Places {
        let mut p = Places::default();
        let mut pending = Vec::new();
        for (i, e) in run.entries.iter().enumerate() {
            match e.action {
                // A segment belongs to the request after it.
                Action::SegmentAlloc => pending.push((e.addr, e.size)),
                Action::SegmentFree => p.segment_free(e.addr),
                Action::Alloc => {
                    for (addr, bytes) in pending.drain(..) {
                        p.segment_alloc(addr, bytes, i);
                    }
                    p.request(i, e.addr);
                }
                Action::Oom => pending.clear(),
                _ => {}
            }
        }
        p
    }

    /// The simulation's side of one replayed event (entry `entry`).
    pub fn observe(&mut self, entry: usize, step: &Step<'_>) {
        for op in step.device_ops {
            match op.kind {
                DeviceOpKind::SegmentAlloc => self.segment_alloc(op.addr.0, op.bytes, entry),
                DeviceOpKind::SegmentFree => self.segment_free(op.addr.0),
                DeviceOpKind::Map | DeviceOpKind::Unmap => {}
            }
        }
        if let crate::observe::Outcome::Allocated { addr, .. } = step.outcome {
            if matches!(step.event, Event::Alloc { .. }) {
                self.request(entry, addr.0);
            }
        }
    }
}

/// The first request the two sides placed differently, and what the simulation's
/// state held there ([`crate::fidelity::FidelityReport::misplaced`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Misplaced {
    /// Its entry in the recorded run.
    pub entry: usize,
    /// (segment number, offset) where PyTorch put it; segments are numbered in the
    /// order they were allocated, from 0, the same on both sides.
    pub torch: (usize, u64),
    /// (segment number, offset) where the simulation put it.
    pub sim: (usize, u64),
    /// The bytes of the two blocks when they were equal free blocks in the
    /// simulation's state before the request (a best-fit tie); `None` otherwise.
    pub tie_bytes: Option<u64>,
    /// Whether PyTorch's two segments lie in the other order than the simulation's:
    /// the tie broke the other way because of where the segments were placed.
    pub order_differs: bool,
}

/// The first request placed differently, among the requests before `before` (the
/// first segment decision that differs: after it, segment numbers no longer name the
/// same segments on both sides).
pub(crate) fn first_misplaced(torch: &Places, sim: &Places, before: usize) -> Option<Misplaced> {
    sim.requests
        .range(..before)
        .find_map(|(&entry, &s)| match torch.requests.get(&entry) {
            Some(&t) if t != s => Some(Misplaced {
                entry,
                torch: t,
                sim: s,
                tie_bytes: None,
                order_differs: false,
            }),
            _ => None,
        })
}

/// Takes the policy's state before one event.
pub(crate) struct StateBefore {
    /// The event.
    pub index: usize,
    /// The state, once taken.
    pub state: Option<Vec<SegmentSnapshot>>,
}

impl Observer for StateBefore {
    fn before_event(&mut self, index: usize, _event: &Event, policy: &dyn Policy) {
        if index == self.index {
            self.state = Some(policy.snapshot());
        }
    }
}

/// What the simulation's state held at `addr` before the request: (bytes, whether
/// free) of the block that starts there.
fn block_at(state: &[SegmentSnapshot], addr: u64) -> Option<(u64, BlockState)> {
    state
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.addr.0 == addr)
        .map(|b| (b.size_bytes, b.state))
}

/// Everything the account needs beyond the two sides' places.
pub(crate) struct Context<'a> {
    /// The recorded run.
    pub run: &'a RecordedRun,
    /// The hints the simulated device was given (a what-if's are the other run's).
    pub hints: &'a AddressHints,
    /// Whose addresses the hints are: the run's own, or the run whose requests were
    /// replayed.
    pub hints_from: &'a str,
    /// The simulation's state before the misplaced request.
    pub state: Option<&'a [SegmentSnapshot]>,
}

fn human(bytes: u64) -> String {
    units::format_size_human(bytes)
}

/// The account of the first misplaced request: which blocks tied, in which segments,
/// where each side put those segments, and why they lie in another order.
/// Fills in `m`'s tie and order from the simulation's state.
pub(crate) fn describe(
    m: &mut Misplaced,
    torch: &Places,
    sim: &Places,
    cx: &Context<'_>,
) -> String {
    let mut out = String::new();
    let e = &cx.run.entries[m.entry];
    let (ti, si) = (m.torch.0, m.sim.0);
    let (Some(t_seg), Some(s_seg)) = (sim.segments.get(ti), sim.segments.get(si)) else {
        return out;
    };
    let (rt, rs) = (torch.segments[ti], torch.segments[si]);
    // The blocks the two sides took, in the simulation's state before the request.
    let taken = cx.state.and_then(|st| block_at(st, s_seg.addr + m.sim.1));
    let passed = cx.state.and_then(|st| block_at(st, t_seg.addr + m.torch.1));
    let tie = matches!(
        (taken, passed),
        (Some((a, BlockState::Free)), Some((b, BlockState::Free))) if a == b
    );
    m.tie_bytes = taken.map(|(b, _)| b).filter(|_| tie);
    m.order_differs = (rt.addr < rs.addr) != (t_seg.addr < s_seg.addr);
    let _ = writeln!(
        out,
        "  first request placed differently: entry {} (alloc of {} bytes, stream {}), every request before it placed alike",
        m.entry, e.size, e.stream
    );
    if tie {
        let bytes = taken.map_or(0, |(b, _)| b);
        let _ = writeln!(
            out,
            "    a best-fit tie: two free blocks of {bytes} bytes ({}), one in segment #{ti} and one in segment #{si}; PyTorch takes the one at the lower address",
            human(bytes)
        );
    } else {
        let show = |b: Option<(u64, BlockState)>| match b {
            Some((bytes, state)) => format!("a {state:?} block of {bytes} bytes").to_lowercase(),
            None => "no block start".to_string(),
        };
        let _ = writeln!(
            out,
            "    not a tie of equal free blocks: the simulation had {} where PyTorch took its block, and took {}",
            show(passed),
            show(taken)
        );
    }
    let hinted = |n: usize, s: &PlacedSegment| cx.hints.segments.get(n) == Some(&(s.bytes, s.addr));
    let placed_by = |n: usize, s: &PlacedSegment| {
        if hinted(n, s) {
            format!("at the address {} got", cx.hints_from)
        } else {
            "by the driver model".to_string()
        }
    };
    for (n, r, s, took) in [
        (ti, rt, t_seg, "PyTorch"),
        (si, rs, s_seg, "the simulation"),
    ] {
        let _ = writeln!(
            out,
            "    segment #{n} ({} bytes, allocated for entry {}; {took} took the block at offset {}): recorded at {:#x}, simulated at {:#x} ({})",
            r.bytes,
            r.owner,
            if n == ti { m.torch.1 } else { m.sim.1 },
            r.addr,
            s.addr,
            placed_by(n, s)
        );
    }
    let order = |a: u64, b: u64| if a < b { "below" } else { "above" };
    let _ = writeln!(
        out,
        "    the driver put #{ti} {} #{si}; the simulation put #{ti} {} #{si}",
        order(rt.addr, rs.addr),
        order(t_seg.addr, s_seg.addr)
    );
    if tie && m.order_differs {
        let from_hints = hinted(ti, t_seg) && hinted(si, s_seg);
        let _ = writeln!(
            out,
            "    the difference comes from placement: the segments' order is where the CUDA driver put them, {}; memory the driver gave outside PyTorch's allocator (the CUDA context, kernel modules loaded on first use, library workspaces), which no trace shows, moves its placement",
            if from_hints {
                format!("and {} got them in the other order", cx.hints_from)
            } else {
                "which the simulation predicts with the driver model".to_string()
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::{BlockSnapshot, DeviceAddr, StreamId};
    use workloads::RecordedEntry;

    const MIB: u64 = 1 << 20;

    fn e(action: Action, addr: u64, size: u64) -> RecordedEntry {
        RecordedEntry {
            action,
            addr,
            size,
            stream: 0,
        }
    }

    /// PyTorch put two 20 MiB segments with #1 below #0 and took #1's block at entry
    /// 5; the simulation put #0 below #1 and took #0's.
    fn sides() -> (RecordedRun, Places, Places) {
        let (a0, a1) = (0x7f00_0000_0000, 0x7eff_0000_0000);
        let run = RecordedRun {
            name: "r".into(),
            entries: vec![
                e(Action::SegmentAlloc, a0, 20 * MIB),
                e(Action::Alloc, a0, 12 * MIB),
                e(Action::SegmentAlloc, a1, 20 * MIB),
                e(Action::Alloc, a1, 12 * MIB),
                e(Action::Snapshot, 0, 0),
                e(Action::Alloc, a1 + 12 * MIB, 4 * MIB),
                e(Action::Alloc, a0 + 12 * MIB, 4 * MIB),
            ],
            ..RecordedRun::default()
        };
        let torch = Places::recorded(&run);
        let (s0, s1) = (0x1000_0000, 0x3000_0000);
        let mut sim = Places::default();
        sim.segment_alloc(s0, 20 * MIB, 1);
        sim.request(1, s0);
        sim.segment_alloc(s1, 20 * MIB, 3);
        sim.request(3, s1);
        sim.request(5, s0 + 12 * MIB);
        sim.request(6, s1 + 12 * MIB);
        (run, torch, sim)
    }

    fn state(free0: u64, free1: u64) -> Vec<SegmentSnapshot> {
        let seg = |addr: u64, free: u64| SegmentSnapshot {
            addr: DeviceAddr(addr),
            size_bytes: 20 * MIB,
            stream: StreamId(0),
            pool: "large",
            blocks: vec![
                BlockSnapshot {
                    addr: DeviceAddr(addr),
                    size_bytes: 12 * MIB,
                    requested_bytes: 12 * MIB,
                    state: BlockState::Allocated,
                },
                BlockSnapshot {
                    addr: DeviceAddr(addr + 12 * MIB),
                    size_bytes: free,
                    requested_bytes: 0,
                    state: BlockState::Free,
                },
            ],
        };
        vec![seg(0x1000_0000, free0), seg(0x3000_0000, free1)]
    }

    /// The first request placed in another segment is found, by segment number and
    /// offset, and none at or after the bound (where segment numbers stop naming the
    /// same segments).
    #[test]
    fn the_first_misplaced_request_is_found_before_the_bound() {
        let (_, torch, sim) = sides();
        let m = first_misplaced(&torch, &sim, usize::MAX).unwrap();
        assert_eq!((m.entry, m.torch, m.sim), (5, (1, 12 * MIB), (0, 12 * MIB)));
        assert_eq!(first_misplaced(&torch, &sim, 5), None);
    }

    /// Equal free blocks in segments that lie in the other order are a tie from
    /// placement; blocks of different sizes are not called a tie.
    #[test]
    fn a_tie_is_told_from_a_different_state() {
        let (run, torch, sim) = sides();
        let hints = AddressHints::default();
        let account = |st: &[SegmentSnapshot]| {
            let mut m = first_misplaced(&torch, &sim, usize::MAX).unwrap();
            let cx = Context {
                run: &run,
                hints: &hints,
                hints_from: "r",
                state: Some(st),
            };
            let text = describe(&mut m, &torch, &sim, &cx);
            (m, text)
        };
        let (m, text) = account(&state(8 * MIB, 8 * MIB));
        assert_eq!((m.tie_bytes, m.order_differs), (Some(8 * MIB), true));
        assert!(
            text.contains("a best-fit tie: two free blocks of 8388608 bytes"),
            "{text}"
        );
        assert!(
            text.contains("the driver put #1 below #0; the simulation put #1 above #0"),
            "{text}"
        );
        assert!(
            text.contains("the difference comes from placement"),
            "{text}"
        );
        let (m, text) = account(&state(6 * MIB, 8 * MIB));
        assert_eq!(m.tie_bytes, None);
        assert!(text.contains("not a tie of equal free blocks"), "{text}");
        assert!(
            !text.contains("the difference comes from placement"),
            "{text}"
        );
    }
}
