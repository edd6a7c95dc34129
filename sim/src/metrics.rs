//! What a replay measured: peaks, the OOM point, and the samples of timelines.

use policies::{DeviceStats, PolicyStats};

/// Peaks and totals of one replay. Plain data; [`Summary::utilization`] is derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Events replayed (all kinds).
    pub event_count: u64,
    /// Highest sum of requested bytes of live allocations.
    pub requested_bytes_peak: u64,
    /// Highest sum of block bytes of live allocations.
    pub allocated_bytes_peak: u64,
    /// Highest bytes held from the device.
    pub reserved_bytes_peak: u64,
    /// Highest bytes the driver charged (page model).
    pub charged_bytes_peak: u64,
    /// Highest number of live segments.
    pub segment_count_peak: u64,
    /// Allocated bytes when reserved bytes first reached their peak.
    pub allocated_bytes_at_reserved_peak: u64,
    /// Index of the event at which reserved bytes first reached their peak.
    pub reserved_peak_event_index: Option<u64>,
    /// Segment allocations (and map calls) the device performed.
    pub device_allocate_count: u64,
    /// Segment frees (and unmap calls) the device performed.
    pub device_free_count: u64,
}

impl Summary {
    /// Allocated peak ÷ reserved peak: how much of the memory held at most was ever
    /// in use at most. `None` when nothing was reserved.
    pub fn utilization(&self) -> Option<f64> {
        (self.reserved_bytes_peak > 0)
            .then(|| self.allocated_bytes_peak as f64 / self.reserved_bytes_peak as f64)
    }

    /// Reserved − allocated at the reserved peak: memory held but unused when it
    /// mattered most.
    pub fn cached_bytes_at_reserved_peak(&self) -> u64 {
        self.reserved_bytes_peak - self.allocated_bytes_at_reserved_peak
    }
}

/// State after one event, for timelines ([`crate::Timeline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Index of the event in the trace.
    pub event_index: u64,
    /// The event's op (`alloc`, `free`, ...).
    pub op: &'static str,
    /// The allocation it is about, if any.
    pub id: Option<u64>,
    /// Bytes it asked for (`alloc` only).
    pub bytes: Option<u64>,
    /// Policy accounting after the event.
    pub policy: PolicyStats,
    /// Bytes the driver charged after the event.
    pub charged_bytes: u64,
}

/// The first request that could not be served: a request of the trace, or, for a
/// trace that starts mid-run, the starting state the device could not hold (an
/// out-of-memory before the first event, [`Oom::event_index`] `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oom {
    /// Index of the event in the trace; `None` before the first event: the trace starts
    /// mid-run and the device could not hold its starting state.
    pub event_index: Option<u64>,
    /// Bytes the program asked for; before the first event, the starting state's: the
    /// bytes of its segments (a policy that takes the state over), or of its live
    /// blocks' requests (a policy that allocates them instead).
    pub requested_bytes: u64,
    /// Bytes the policy last tried to get from the device.
    pub tried_bytes: u64,
    /// Policy accounting after the failed attempt (before the first event: what was
    /// taken over or allocated of the starting state until it failed).
    pub policy: PolicyStats,
    /// Device accounting after the failed attempt.
    pub device: DeviceStats,
    /// The policy's own message (PyTorch's, for the caching policy); before the first
    /// event, what did not fit ("the starting state of 40 segment(s), 1.29 GiB, does
    /// not fit ...").
    pub message: Option<String>,
}

impl Oom {
    /// Whether it happened before the first event (the starting state did not fit).
    pub fn before_first_event(&self) -> bool {
        self.event_index.is_none()
    }

    /// For an out-of-memory before the first event, what did not fit: its message
    /// (the engine writes one there), else a line that says so.
    pub fn what_did_not_fit(&self) -> &str {
        self.message
            .as_deref()
            .unwrap_or("the starting state does not fit")
    }
}

/// Accumulates a [`Summary`] as events are replayed.
#[derive(Debug, Default)]
pub struct Recorder {
    summary: Summary,
}

impl Recorder {
    /// A recorder that has seen nothing.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Notes the state after event `event_index`: [`Recorder::observe_policy`],
    /// [`Recorder::observe_device`] and the event count.
    #[inline]
    pub fn observe(&mut self, event_index: u64, policy: &PolicyStats, device: &DeviceStats) {
        self.set_event_count(event_index + 1);
        self.observe_policy(event_index, policy);
        self.observe_device(device);
    }

    /// Notes that `event_count` events were replayed.
    #[inline]
    pub fn set_event_count(&mut self, event_count: u64) {
        self.summary.event_count = event_count;
    }

    /// Notes the policy's figures after event `event_index`. Figures equal to those
    /// noted last change nothing: a caller may skip them.
    #[inline]
    pub fn observe_policy(&mut self, event_index: u64, policy: &PolicyStats) {
        let s = &mut self.summary;
        s.requested_bytes_peak = s.requested_bytes_peak.max(policy.requested_bytes);
        s.allocated_bytes_peak = s.allocated_bytes_peak.max(policy.allocated_bytes);
        if policy.reserved_bytes > s.reserved_bytes_peak {
            s.reserved_bytes_peak = policy.reserved_bytes;
            s.allocated_bytes_at_reserved_peak = policy.allocated_bytes;
            s.reserved_peak_event_index = Some(event_index);
        }
        s.segment_count_peak = s.segment_count_peak.max(policy.segment_count);
    }

    /// Notes the device's figures after an event. Figures equal to those noted last
    /// change nothing: a caller may skip them.
    #[inline]
    pub fn observe_device(&mut self, device: &DeviceStats) {
        let s = &mut self.summary;
        s.charged_bytes_peak = s.charged_bytes_peak.max(device.charged_bytes);
        s.device_allocate_count = device.allocate_count;
        s.device_free_count = device.free_count;
    }

    /// Notes the state before the first event (a trace that starts mid-run): its
    /// values count for the peaks, at no event.
    pub fn observe_start(&mut self, policy: &PolicyStats, device: &DeviceStats) {
        let s = &mut self.summary;
        s.requested_bytes_peak = s.requested_bytes_peak.max(policy.requested_bytes);
        s.allocated_bytes_peak = s.allocated_bytes_peak.max(policy.allocated_bytes);
        if policy.reserved_bytes > s.reserved_bytes_peak {
            s.reserved_bytes_peak = policy.reserved_bytes;
            s.allocated_bytes_at_reserved_peak = policy.allocated_bytes;
            s.reserved_peak_event_index = None;
        }
        s.charged_bytes_peak = s.charged_bytes_peak.max(device.charged_bytes);
        s.segment_count_peak = s.segment_count_peak.max(policy.segment_count);
    }

    /// The summary.
    pub fn finish(self) -> Summary {
        self.summary
    }
}
