//! Why a replay ran out of memory: the failing request, the memory around it sorted by
//! why the request could not use it, a verdict, and the setting that would have
//! helped, checked by replaying with it.
//!
//! [`OomWatch`] is an observer of the engine: at the first out-of-memory it takes the
//! policy's segments ([`Policy::snapshot`]) and sorts every free byte by what kept the
//! request from it, asking the policy ([`Policy::free_block_use`],
//! [`Policy::rounded_bytes`]): nothing here knows one policy from another. The bytes
//! counted:
//!
//! - *rounding*: inside live allocations, `rounded − requested` (the policy's rounding);
//! - *unsplit remainders*: inside live allocations, `block − rounded` (what the policy
//!   kept unsplit: PyTorch's `max_split_size_mb` and oversize blocks, small remainders);
//! - free blocks the request could not take: *too small* (fragmentation), *other
//!   pool*, *unsplittable* (split rules), *other streams' caches*, *pending frees*
//!   (freed but waiting for another stream);
//! - *device free*: what the device (or the policy's memory limit) still had;
//! - *shortage*: what the last device request (`tried`) lacked beyond that.
//!
//! The verdict ([`OomCause`]): too little memory when even every free byte together
//! (device free plus the whole cache) is below what was tried; otherwise the largest of
//! pending frees, other streams' caches and fragmentation (too small + other pool +
//! unsplittable). [`check_remedies`] replays with each setting the policy proposes for
//! that cause ([`policies::PolicyConfig::remedies`]) and keeps the first that runs to
//! the end, else the one that gets furthest.

use policies::{BlockState, FreeBlockUse, OomCause, Policy, PolicyConfig, Request, StreamId};
use workloads::{AllocId, Event, Trace};

use crate::compare::CompareError;
use crate::device::{AddressHints, SimDevice, SimDeviceOptions};
use crate::metrics::Oom;
use crate::observe::{Observer, Outcome, Step};
use crate::replay::{replay, ReplayError, ReplayOptions};

/// Free bytes at an out-of-memory, by what kept the request from them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeBreakdown {
    /// Inside live allocations: rounded − requested.
    pub rounding_bytes: u64,
    /// Inside live allocations: block − rounded (remainders kept unsplit).
    pub unsplit_remainder_bytes: u64,
    /// Free blocks of the request's stream and pool, each too small.
    pub too_small_bytes: u64,
    /// Free blocks of a pool the request does not draw from.
    pub other_pool_bytes: u64,
    /// Free blocks the policy's split rules keep the request out of.
    pub unsplittable_bytes: u64,
    /// Free blocks in other streams' caches.
    pub other_stream_bytes: u64,
    /// Blocks freed by the program but waiting for other streams.
    pub pending_free_bytes: u64,
    /// What the device (or the policy's memory limit) still had.
    pub device_free_bytes: u64,
    /// What the device request lacked beyond the device's free memory.
    pub shortage_bytes: u64,
}

impl FreeBreakdown {
    /// Free memory in pieces the request could not use: too small, other pool,
    /// unsplittable.
    pub fn fragmentation_bytes(&self) -> u64 {
        self.too_small_bytes + self.other_pool_bytes + self.unsplittable_bytes
    }
}

/// A segment and the free memory in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFree {
    /// First byte.
    pub addr: u64,
    /// Segment bytes.
    pub size_bytes: u64,
    /// Its stream.
    pub stream: u64,
    /// Its pool (`small`, `large`, ...).
    pub pool: &'static str,
    /// Free bytes in it (free blocks, pending frees not counted).
    pub free_bytes: u64,
    /// Its largest free block.
    pub largest_free_block_bytes: u64,
}

/// A setting tried against the out-of-memory, and what replaying with it gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remedy {
    /// The setting, in specification syntax (`expandable_segments=True`).
    pub setting: String,
    /// The whole configuration with it, as a specification.
    pub spec: String,
    /// `None`: the trace ran to the end; else the event of its first out-of-memory.
    pub oom_event_index: Option<u64>,
    /// Reserved peak of that replay.
    pub reserved_bytes_peak: u64,
}

/// Everything about the first out-of-memory of a replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomExplanation {
    /// The failing event.
    pub event_index: u64,
    /// Its allocation id.
    pub id: u64,
    /// Its stream.
    pub stream: u64,
    /// Bytes asked.
    pub requested_bytes: u64,
    /// Bytes after the policy's rounding.
    pub rounded_bytes: u64,
    /// Bytes the policy last tried to get from the device.
    pub tried_bytes: u64,
    /// The last `mark` before it: (event index, label).
    pub last_mark: Option<(u64, String)>,
    /// Live requested bytes then.
    pub live_requested_bytes: u64,
    /// What the allocator could hold at most then: its reserved bytes plus what the
    /// device (or its memory limit) still had.
    pub usable_bytes: u64,
    /// Allocated bytes then.
    pub allocated_bytes: u64,
    /// Reserved bytes then.
    pub reserved_bytes: u64,
    /// Reserved − allocated.
    pub cached_bytes: u64,
    /// The largest free block of any segment.
    pub largest_free_block_bytes: u64,
    /// The largest free block the request could have used (by the policy's rules; 0
    /// when none).
    pub largest_usable_block_bytes: u64,
    /// Free bytes by cause.
    pub breakdown: FreeBreakdown,
    /// Segments holding the most free memory, most first (at most five).
    pub top_segments: Vec<SegmentFree>,
    /// The verdict.
    pub cause: OomCause,
    /// Settings tried by [`check_remedies`], in the order tried.
    pub remedies: Vec<Remedy>,
}

impl OomExplanation {
    /// The setting that made the trace run to the end, if any.
    pub fn fix(&self) -> Option<&Remedy> {
        self.remedies.iter().find(|r| r.oom_event_index.is_none())
    }

    /// One line: the cause, and the setting that helps (checked) or what would be needed.
    pub fn verdict(&self) -> String {
        let b = &self.breakdown;
        let h = workloads::size::format_size_human;
        let need = self.live_requested_bytes + self.requested_bytes;
        let why = match self.cause {
            OomCause::TooLittleMemory if need > self.usable_bytes => format!(
                "too little memory: the live requests and this one need {}, more than the {} \
                 the allocator could hold (no allocator fits this at this capacity)",
                h(need),
                h(self.usable_bytes)
            ),
            OomCause::TooLittleMemory => format!(
                "too little memory: the device request of {} found {} free on the device and {} \
                 cached; {} more would have been needed",
                h(self.tried_bytes),
                h(b.device_free_bytes),
                h(self.cached_bytes),
                h(b.shortage_bytes.saturating_sub(self.cached_bytes))
            ),
            OomCause::Fragmentation => format!(
                "fragmentation: {} free in pieces this request could not use (largest usable \
                 block {}, request {})",
                h(b.fragmentation_bytes()),
                h(self.largest_usable_block_bytes),
                h(self.rounded_bytes)
            ),
            OomCause::StreamCache => format!(
                "stream cache: {} free in other streams' caches, which this stream cannot use",
                h(b.other_stream_bytes)
            ),
            OomCause::PendingFrees => format!(
                "pending frees: {} freed by the program but waiting for other streams \
                 (record_stream)",
                h(b.pending_free_bytes)
            ),
        };
        let help = match (self.fix(), self.remedies.first()) {
            (Some(r), _) => format!(
                "; {} fixes it (checked: replays to the end, reserved peak {})",
                r.setting,
                h(r.reserved_bytes_peak)
            ),
            (None, Some(_)) => {
                let tried: Vec<String> = self
                    .remedies
                    .iter()
                    .map(|r| match r.oom_event_index {
                        Some(ev) if ev == self.event_index => {
                            format!("{} (still here)", r.setting)
                        }
                        Some(ev) => format!("{} (gets past it, runs out at event {ev})", r.setting),
                        None => r.setting.clone(),
                    })
                    .collect();
                format!(
                    "; tried {}: none runs to the end; the live requests and this one leave \
                     only {} of the {} the allocator could hold for its own overhead, so a \
                     larger GPU is the fix (`allocsim fit`)",
                    tried.join(", "),
                    h(self.usable_bytes.saturating_sub(need)),
                    h(self.usable_bytes)
                )
            }
            (None, None) => match self.cause {
                OomCause::TooLittleMemory => "; a larger GPU helps (`allocsim fit` finds the \
                                              smallest)"
                    .to_string(),
                OomCause::Fragmentation => {
                    "; the policy proposes no setting against it".to_string()
                }
                OomCause::StreamCache | OomCause::PendingFrees => {
                    "; no allocator setting lends another stream's memory: synchronize or \
                     free earlier, or a larger GPU (`allocsim fit`)"
                        .to_string()
                }
            },
        };
        format!("{why}{help}")
    }
}

/// The cause the CSVs name for an out-of-memory before the first event (a trace that
/// starts mid-run whose starting state the device cannot hold), beside
/// [`OomCause::name`]'s.
pub const STARTING_STATE: &str = "starting state";

/// The cause of a replay's first out-of-memory `oom` as the CSVs name it (`oom_cause`):
/// [`STARTING_STATE`] before the first event, else the `explanation`'s verdict; empty
/// without an out-of-memory or an explanation.
pub fn cause_name(oom: Option<&Oom>, explanation: Option<&OomExplanation>) -> &'static str {
    match (oom, explanation) {
        (Some(o), _) if o.before_first_event() => STARTING_STATE,
        (_, Some(e)) => e.cause.name(),
        _ => "",
    }
}

/// Why a replay ran out before the first event (`oom`, [`Oom::before_first_event`]),
/// and what can help: no allocator setting shrinks the memory the program already held
/// when the trace's window began, so none is tried; a larger device or a recording
/// begun earlier can.
pub fn starting_state_verdict(oom: &Oom) -> String {
    let what = oom.what_did_not_fit();
    format!(
        "{STARTING_STATE}: the trace starts mid-run, and {what}; no allocator setting shrinks \
         memory the program already held when the trace's window began, so none is tried: a \
         larger GPU (`allocsim fit` finds the smallest) or a recording begun earlier (from the \
         program's first request, which replays from an empty allocator) can answer"
    )
}

/// A table's cell for an out-of-memory before the first event (`oom`,
/// [`Oom::before_first_event`]): the starting state's bytes and [`STARTING_STATE`].
pub fn starting_state_cell(oom: &Oom) -> String {
    format!(
        "before the first event: {} ({STARTING_STATE})",
        workloads::size::format_size_human(oom.requested_bytes)
    )
}

/// Watches a replay and explains its first out-of-memory ([`OomWatch::explanation`]).
#[derive(Debug, Default)]
pub struct OomWatch {
    last_mark: Option<(u64, String)>,
    /// The explanation, once an out-of-memory happened.
    pub explanation: Option<OomExplanation>,
}

impl Observer for OomWatch {
    #[inline(always)]
    fn after_event(&mut self, step: &Step<'_>) {
        match (step.event, step.outcome) {
            (Event::Mark { label }, _) => {
                self.last_mark = Some((step.index as u64, label.clone()));
            }
            (
                &Event::Alloc {
                    id,
                    size_bytes,
                    stream,
                },
                Outcome::OutOfMemory { tried_bytes, .. },
            ) if self.explanation.is_none() => {
                self.explain(step, id, size_bytes, stream, tried_bytes)
            }
            _ => {}
        }
    }

    /// The policy's figures are read at an out-of-memory only.
    fn needs_stats_every_event(&self) -> bool {
        false
    }

    fn wants_device_ops(&self) -> bool {
        false
    }

    /// Marks, and the first out-of-memory.
    #[inline(always)]
    fn watches(&self, _index: usize, event: &Event, outcome: &Outcome) -> bool {
        matches!(event, Event::Mark { .. })
            || (matches!(outcome, Outcome::OutOfMemory { .. }) && self.explanation.is_none())
    }
}

impl OomWatch {
    /// Explains the out-of-memory of `step`, an alloc of `id`.
    #[cold]
    #[inline(never)]
    fn explain(
        &mut self,
        step: &Step<'_>,
        id: AllocId,
        size_bytes: u64,
        stream: u64,
        tried_bytes: u64,
    ) {
        {
            {
                let request = Request {
                    size_bytes,
                    stream: StreamId(stream),
                };
                let free = step.policy.memory_limit_bytes().map_or(
                    step.device_stats.free_bytes(),
                    |limit| {
                        limit
                            .saturating_sub(step.policy_stats.reserved_bytes)
                            .min(step.device_stats.free_bytes())
                    },
                );
                let mut e = explain_state(step.policy, request, tried_bytes, free);
                e.event_index = step.index as u64;
                e.id = id.0;
                e.last_mark = self.last_mark.clone();
                self.explanation = Some(e);
            }
        }
    }
}

/// The explanation of `request` failing on `policy` as it is now, `device_free_bytes`
/// being what the device (or the policy's limit) still had. The event, id and mark are
/// left for the caller ([`OomWatch`] fills them).
pub fn explain_state(
    policy: &dyn Policy,
    request: Request,
    tried_bytes: u64,
    device_free_bytes: u64,
) -> OomExplanation {
    let stats = policy.stats();
    let rounded = policy.rounded_bytes(request.size_bytes);
    let mut b = FreeBreakdown {
        device_free_bytes,
        shortage_bytes: tried_bytes.saturating_sub(device_free_bytes),
        ..FreeBreakdown::default()
    };
    let (mut largest, mut largest_usable) = (0u64, 0u64);
    let mut segments = Vec::new();
    for seg in policy.snapshot() {
        let (mut free, mut seg_largest) = (0u64, 0u64);
        for block in &seg.blocks {
            match block.state {
                BlockState::Allocated => {
                    let r = policy
                        .rounded_bytes(block.requested_bytes.max(1))
                        .min(block.size_bytes)
                        .max(block.requested_bytes);
                    b.rounding_bytes += r - block.requested_bytes.min(r);
                    b.unsplit_remainder_bytes += block.size_bytes - r;
                }
                BlockState::PendingFree => b.pending_free_bytes += block.size_bytes,
                BlockState::Free => {
                    free += block.size_bytes;
                    seg_largest = seg_largest.max(block.size_bytes);
                    match policy.free_block_use(&seg, block, request) {
                        FreeBlockUse::Fits => largest_usable = largest_usable.max(block.size_bytes),
                        FreeBlockUse::TooSmall => b.too_small_bytes += block.size_bytes,
                        FreeBlockUse::OtherStream => b.other_stream_bytes += block.size_bytes,
                        FreeBlockUse::OtherPool => b.other_pool_bytes += block.size_bytes,
                        FreeBlockUse::Unsplittable => b.unsplittable_bytes += block.size_bytes,
                    }
                }
            }
        }
        largest = largest.max(seg_largest);
        if free > 0 {
            segments.push(SegmentFree {
                addr: seg.addr.0,
                size_bytes: seg.size_bytes,
                stream: seg.stream.0,
                pool: seg.pool,
                free_bytes: free,
                largest_free_block_bytes: seg_largest,
            });
        }
    }
    segments.sort_by(|x, y| y.free_bytes.cmp(&x.free_bytes).then(x.addr.cmp(&y.addr)));
    segments.truncate(5);
    let cached = stats.reserved_bytes.saturating_sub(stats.allocated_bytes);
    let usable = stats.reserved_bytes + device_free_bytes;
    let cause = if device_free_bytes + cached < tried_bytes.min(rounded.max(1)) {
        OomCause::TooLittleMemory
    } else {
        let candidates = [
            (b.pending_free_bytes, OomCause::PendingFrees),
            (b.other_stream_bytes, OomCause::StreamCache),
            (
                b.fragmentation_bytes() + b.unsplit_remainder_bytes,
                OomCause::Fragmentation,
            ),
        ];
        // The largest; ties go to the earlier (pending frees, then streams).
        let (bytes, cause) =
            candidates
                .iter()
                .copied()
                .fold((0, OomCause::TooLittleMemory), |best, c| {
                    if c.0 > best.0 {
                        c
                    } else {
                        best
                    }
                });
        if bytes == 0 {
            OomCause::TooLittleMemory
        } else {
            cause
        }
    };
    OomExplanation {
        event_index: 0,
        id: 0,
        stream: request.stream.0,
        requested_bytes: request.size_bytes,
        rounded_bytes: rounded,
        tried_bytes,
        last_mark: None,
        live_requested_bytes: stats.requested_bytes,
        usable_bytes: usable,
        allocated_bytes: stats.allocated_bytes,
        reserved_bytes: stats.reserved_bytes,
        cached_bytes: cached,
        largest_free_block_bytes: largest,
        largest_usable_block_bytes: largest_usable,
        breakdown: b,
        top_segments: segments,
        cause,
        remedies: Vec::new(),
    }
}

/// Replays `trace` with each setting `config` proposes against the explanation's cause,
/// on the same device, and records what each gave (in `explanation.remedies`), stopping
/// at the first that runs to the end.
///
/// A setting whose replay fails on the device (a driver error), that PyTorch would
/// refuse on this trace, or that cannot take over its starting state (or hold it) is
/// left out.
///
/// # Errors
/// A replay that stops for another reason than those or memory (an interruption).
pub fn check_remedies(
    explanation: &mut OomExplanation,
    trace: &Trace,
    hints: &AddressHints,
    config: &PolicyConfig,
    device: &SimDeviceOptions,
    options: &ReplayOptions,
) -> Result<(), CompareError> {
    let options = ReplayOptions {
        continue_after_oom: false,
        ..options.clone()
    };
    for (setting, candidate) in config.remedies(explanation.cause, explanation.requested_bytes) {
        let spec = candidate.to_string();
        let mut policy = candidate.build().map_err(|source| CompareError::Build {
            trace: trace.name.clone(),
            policy: spec.clone(),
            source,
        })?;
        let mut dev = SimDevice::with_hints(device.clone(), hints.for_policy(&candidate));
        let r = match replay(trace, policy.as_mut(), &mut dev, &options) {
            Ok(r) => r,
            // A setting the device cannot run (its address reservation refused, a
            // driver error), that PyTorch would refuse on this trace, or that cannot
            // take over a mid-run trace's starting state is no remedy: the replay under
            // the configuration asked for ran out, which is its result.
            Err(
                ReplayError::Device { .. }
                | ReplayError::Rejected { .. }
                | ReplayError::Start { .. },
            ) => continue,
            Err(source) => {
                return Err(CompareError::Replay {
                    trace: trace.name.clone(),
                    policy: spec.clone(),
                    source,
                })
            }
        };
        // A setting under which the device cannot hold the starting state is no remedy
        // either.
        if r.oom.as_ref().is_some_and(Oom::before_first_event) {
            continue;
        }
        let oom_event_index = r.oom.and_then(|o| o.event_index);
        let fixed = oom_event_index.is_none();
        explanation.remedies.push(Remedy {
            setting,
            spec,
            oom_event_index,
            reserved_bytes_peak: r.summary.reserved_bytes_peak,
        });
        if fixed {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::replay_with;
    use workloads::AllocId;

    const MIB: u64 = 1 << 20;

    fn alloc(id: u64, size_bytes: u64, stream: u64) -> Event {
        Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream,
        }
    }

    fn free(id: u64) -> Event {
        Event::Free { id: AllocId(id) }
    }

    fn explain(events: Vec<Event>, spec: &str, capacity: u64) -> OomExplanation {
        let trace = Trace::new("t", events);
        let config = policies::spec::parse_policy_list(spec, &Default::default()).unwrap()[0]
            .config
            .clone();
        let device = SimDeviceOptions::default().with_total(capacity).unwrap();
        let mut policy = config.build().unwrap();
        let mut dev = SimDevice::new(device.clone());
        let options = ReplayOptions {
            check_invariants: true,
            ..ReplayOptions::default()
        };
        let mut watch = OomWatch::default();
        replay_with(&trace, policy.as_mut(), &mut dev, &options, &mut watch).unwrap();
        let mut e = watch.explanation.expect("an out-of-memory");
        check_remedies(
            &mut e,
            &trace,
            &AddressHints::default(),
            &config,
            &device,
            &options,
        )
        .unwrap();
        e
    }

    /// Holes left between live blocks of one segment are fragmentation; expandable
    /// segments are proposed and checked to fit; the failing request, the last mark and
    /// the largest free block are reported.
    #[test]
    fn fragmentation_is_found_and_fixed() {
        // Four 20 MiB segments of 2 x 8 MiB and a free 4 MiB tail each; free the first
        // 8 MiB of each, then ask for 16 MiB with the 80 MiB device full and 48 MiB free
        // in 8 and 4 MiB holes.
        let mut events = Vec::new();
        for i in 0..8 {
            events.push(alloc(i, 8 * MIB, 0));
        }
        for i in (0..8).step_by(2) {
            events.push(free(i));
        }
        events.push(Event::Mark {
            label: "step".into(),
        });
        events.push(alloc(100, 16 * MIB, 0));
        let e = explain(events, "caching", 80 * MIB);
        assert_eq!(
            (e.event_index, e.id, e.requested_bytes),
            (13, 100, 16 * MIB)
        );
        assert_eq!(e.last_mark, Some((12, "step".to_string())));
        assert_eq!(e.cause, OomCause::Fragmentation);
        assert_eq!(e.breakdown.too_small_bytes, 4 * 12 * MIB);
        assert_eq!(e.breakdown.device_free_bytes, 0);
        assert_eq!(e.largest_free_block_bytes, 8 * MIB);
        assert_eq!(e.largest_usable_block_bytes, 0);
        assert_eq!(e.top_segments.len(), 4);
        assert_eq!(e.top_segments[0].free_bytes, 8 * MIB + 4 * MIB);
        let fix = e.fix().expect("expandable segments fit it");
        assert_eq!(fix.setting, "expandable_segments=True");
        assert!(
            e.verdict().starts_with("fragmentation: "),
            "{}",
            e.verdict()
        );
        assert!(e
            .verdict()
            .contains("expandable_segments=True fixes it (checked"));
    }

    /// With everything live and nothing cached, the verdict is too little memory and no
    /// setting is proposed.
    #[test]
    fn too_little_memory() {
        let e = explain(
            vec![alloc(0, 40 * MIB, 0), alloc(1, 60 * MIB, 0)],
            "caching",
            80 * MIB,
        );
        assert_eq!(e.cause, OomCause::TooLittleMemory);
        assert_eq!(e.breakdown.device_free_bytes, 40 * MIB);
        assert_eq!(e.breakdown.shortage_bytes, 20 * MIB);
        assert!(e.remedies.is_empty());
        assert!(e.verdict().contains("larger GPU"), "{}", e.verdict());
        assert_eq!(e.usable_bytes, 80 * MIB);
        assert!(
            e.verdict()
                .contains("need 100.00 MiB, more than the 80.00 MiB the allocator could hold"),
            "{}",
            e.verdict()
        );
    }

    /// Free blocks in another stream's partly used segments are that stream's cache,
    /// which no setting lends: the verdict says so.
    #[test]
    fn other_streams_cache() {
        // Stream 1's 20 MiB segment holds a live 2 MiB block and 18 MiB free; stream 0
        // has 50 MiB live and asks for 16 MiB more on the 80 MiB device.
        let e = explain(
            vec![
                alloc(0, 2 * MIB, 1),
                alloc(1, 2 * MIB, 1),
                free(1),
                alloc(2, 50 * MIB, 0),
                alloc(3, 16 * MIB, 0),
            ],
            "caching",
            80 * MIB,
        );
        assert_eq!(e.cause, OomCause::StreamCache, "{e:?}");
        assert_eq!(e.breakdown.other_stream_bytes, 18 * MIB);
        assert!(
            e.verdict().contains("no allocator setting lends"),
            "{}",
            e.verdict()
        );
    }
}
