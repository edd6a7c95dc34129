//! The replay engine: one pass over a trace, one policy, one device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use policies::{
    AllocError, Allocation, BlockState, Device, DeviceError, DeviceStats, Policy, PolicyStats,
    Request, StreamId,
};
use workloads::{AllocId, Event, Trace};

use crate::metrics::{Oom, Recorder, Sample, Summary};

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// After every event: the policy's own invariant walk, policy-reserved equal to
    /// device-reserved, and every live allocation inside a live block with no overlap.
    /// Costly; always on in tests.
    pub check_invariants: bool,
    /// Keep going after an out-of-memory (the failed allocation is skipped, and so is its
    /// later free) instead of stopping at the first one.
    pub continue_after_oom: bool,
    /// Keep one [`Sample`] per event.
    pub timeline: bool,
    /// Stop early when this becomes true (Ctrl-C on a GPU run).
    pub interrupt: Option<&'static AtomicBool>,
}

/// The result of a replay. An OOM is part of the result, not an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Peaks and totals.
    pub summary: Summary,
    /// One sample per event, if asked for.
    pub timeline: Vec<Sample>,
    /// The first request that failed, if any.
    pub oom: Option<Oom>,
    /// Requests that failed (more than one only with `continue_after_oom`).
    pub oom_count: u64,
    /// Events skipped: frees of allocations that failed, and (for traces replayed
    /// despite validation problems) frees of unknown ids and zero-size requests.
    pub skipped_event_count: u64,
    /// Allocations still live when the replay ended.
    pub live_allocation_count: u64,
    /// Policy accounting at the end.
    pub final_policy: PolicyStats,
    /// Device accounting at the end.
    pub final_device: DeviceStats,
}

/// A replay that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A device failure other than out-of-memory.
    #[error("event {event_index}: {error}")]
    Device {
        /// Where it happened.
        event_index: u64,
        /// The driver's error.
        error: DeviceError,
    },
    /// The interrupt flag was raised.
    #[error("interrupted at event {event_index}")]
    Interrupted {
        /// The first event not replayed.
        event_index: u64,
    },
}

/// Live allocations by id: a dense table for the usual small ids, a map otherwise.
struct LiveTable {
    dense: Vec<Option<Allocation>>,
    sparse: HashMap<AllocId, Allocation>,
    /// Allocations whose id was reused while they were live (a trace problem that
    /// validation reports): the trace can never free them.
    orphans: Vec<Allocation>,
    count: u64,
}

impl LiveTable {
    fn for_trace(trace: &Trace) -> LiveTable {
        let limit = (trace.events.len() as u64).saturating_mul(2).max(1024);
        LiveTable {
            dense: Vec::new(),
            sparse: HashMap::new(),
            orphans: Vec::new(),
            count: limit,
        }
    }

    fn insert(&mut self, id: AllocId, a: Allocation) -> Option<Allocation> {
        if id.0 < self.count {
            let i = id.0 as usize;
            if self.dense.len() <= i {
                self.dense.resize_with(i + 1, || None);
            }
            self.dense[i].replace(a)
        } else {
            self.sparse.insert(id, a)
        }
    }

    fn remove(&mut self, id: AllocId) -> Option<Allocation> {
        if id.0 < self.count {
            self.dense.get_mut(id.0 as usize).and_then(Option::take)
        } else {
            self.sparse.remove(&id)
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Allocation> {
        self.dense
            .iter()
            .flatten()
            .chain(self.sparse.values())
            .chain(self.orphans.iter())
    }

    fn len(&self) -> u64 {
        (self.dense.iter().flatten().count() + self.sparse.len() + self.orphans.len()) as u64
    }
}

/// Replays `trace` under `policy` on `device`.
///
/// # Errors
/// Device failures other than out-of-memory, and interruption.
///
/// # Panics
/// With `check_invariants`, at the first broken invariant (a policy bug).
pub fn replay(
    trace: &Trace,
    policy: &mut dyn Policy,
    device: &mut dyn Device,
    options: &ReplayOptions,
) -> Result<Replay, ReplayError> {
    let mut live = LiveTable::for_trace(trace);
    let mut recorder = Recorder::new(options.timeline);
    let mut oom: Option<Oom> = None;
    let mut oom_count = 0u64;
    let mut skipped = 0u64;
    for (index, event) in trace.events.iter().enumerate() {
        let event_index = index as u64;
        if let Some(flag) = options.interrupt {
            if flag.load(Ordering::Relaxed) {
                return Err(ReplayError::Interrupted { event_index });
            }
        }
        let device_error = |error| ReplayError::Device { event_index, error };
        match *event {
            Event::Alloc {
                id,
                size_bytes,
                stream,
            } => {
                let request = Request {
                    size_bytes,
                    stream: StreamId(stream),
                };
                match policy.allocate(device, request) {
                    Ok(a) => {
                        if let Some(old) = live.insert(id, a) {
                            live.orphans.push(old);
                        }
                    }
                    Err(AllocError::OutOfMemory {
                        requested_bytes,
                        tried_bytes,
                        stats,
                    }) => {
                        oom_count += 1;
                        if oom.is_none() {
                            oom = Some(Oom {
                                event_index,
                                requested_bytes,
                                tried_bytes,
                                policy: stats,
                                device: device.stats(),
                                message: policy.describe_oom(tried_bytes, device),
                            });
                        }
                        if !options.continue_after_oom {
                            recorder.observe(event_index, &policy.stats(), &device.stats());
                            break;
                        }
                    }
                    Err(AllocError::ZeroSize) => skipped += 1,
                    Err(AllocError::Device(e)) => return Err(device_error(e)),
                    Err(e) => {
                        return Err(device_error(DeviceError::Driver {
                            code: 0,
                            message: e.to_string(),
                        }))
                    }
                }
            }
            Event::Free { id } => match live.remove(id) {
                Some(a) => policy.free(device, a).map_err(device_error)?,
                None => skipped += 1,
            },
            Event::EmptyCache => policy.empty_cache(device).map_err(device_error)?,
            Event::Mark { .. } => {}
        }
        let stats = policy.stats();
        let dstats = device.stats();
        recorder.observe(event_index, &stats, &dstats);
        if options.check_invariants {
            check_state(policy, &stats, &dstats, &live, event_index);
        }
    }
    let (summary, timeline) = recorder.finish();
    Ok(Replay {
        summary,
        timeline,
        oom,
        oom_count,
        skipped_event_count: skipped,
        live_allocation_count: live.len(),
        final_policy: policy.stats(),
        final_device: device.stats(),
    })
}

/// The engine's own checks, on two paths: the policy's view against the device's, and
/// the live allocations against the policy's blocks.
fn check_state(
    policy: &dyn Policy,
    stats: &PolicyStats,
    device: &DeviceStats,
    live: &LiveTable,
    event_index: u64,
) {
    policy.check_invariants();
    let at = format!("after event {event_index}");
    assert_eq!(
        stats.reserved_bytes, device.reserved_bytes,
        "policy and device disagree on reserved bytes {at}"
    );
    assert!(
        stats.allocated_bytes <= stats.reserved_bytes,
        "allocated exceeds reserved {at}"
    );
    assert!(
        stats.requested_bytes <= stats.allocated_bytes,
        "requested exceeds allocated {at}"
    );
    let snapshot = policy.snapshot();
    let mut blocks: Vec<(u64, u64, BlockState)> = Vec::new();
    let mut last_end = 0u64;
    for seg in &snapshot {
        assert!(
            seg.addr.0 >= last_end,
            "segments overlap at {} {at}",
            seg.addr
        );
        let mut cursor = seg.addr.0;
        for b in &seg.blocks {
            assert_eq!(
                b.addr.0, cursor,
                "blocks do not tile segment {} {at}",
                seg.addr
            );
            cursor += b.size_bytes;
            blocks.push((b.addr.0, b.size_bytes, b.state));
        }
        assert_eq!(
            cursor,
            seg.addr.0 + seg.size_bytes,
            "segment {} size {at}",
            seg.addr
        );
        last_end = cursor;
    }
    let mut count = 0u64;
    let mut bytes = 0u64;
    for a in live.iter() {
        let i = blocks.partition_point(|&(addr, _, _)| addr < a.addr.0);
        let hit = blocks.get(i).filter(|&&(addr, size, state)| {
            addr == a.addr.0 && size == a.block_bytes && state == BlockState::Allocated
        });
        assert!(
            hit.is_some(),
            "live allocation at {} ({} bytes) is not an allocated block {at}",
            a.addr,
            a.block_bytes
        );
        count += 1;
        bytes += a.block_bytes;
    }
    assert_eq!(count, stats.allocation_count, "live allocation count {at}");
    assert_eq!(
        bytes, stats.allocated_bytes,
        "allocated bytes are not conserved {at}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceOptions};
    use policies::caching::CachingPolicy;
    use policies::immediate::ImmediatePolicy;

    const GIB: u64 = 1 << 30;

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

    fn checked() -> ReplayOptions {
        ReplayOptions {
            check_invariants: true,
            ..ReplayOptions::default()
        }
    }

    /// The seed000 scenario peaks at 3 GiB reserved under the caching policy.
    #[test]
    fn seed000_reserved_peak() {
        let t = Trace::new(
            "seed000",
            vec![
                alloc(0, GIB),
                alloc(1, GIB),
                free(1),
                alloc(2, GIB),
                alloc(3, GIB),
                free(2),
                alloc(4, GIB),
                free(4),
                alloc(5, GIB),
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r = replay(&t, &mut CachingPolicy::default(), &mut d, &checked()).unwrap();
        assert_eq!(r.summary.reserved_bytes_peak, 3 * GIB);
        assert_eq!(r.summary.allocated_bytes_peak, 3 * GIB);
        assert_eq!(r.live_allocation_count, 3);
        assert_eq!(r.oom, None);
    }

    /// An OOM stops the replay and records the event, its bytes and the state then.
    #[test]
    fn oom_is_a_result() {
        let t = Trace::new("t", vec![alloc(0, 3 * GIB), alloc(1, 2 * GIB), free(0)]);
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let r = replay(&t, &mut ImmediatePolicy::default(), &mut d, &checked()).unwrap();
        let oom = r.oom.unwrap();
        assert_eq!((oom.event_index, oom.requested_bytes), (1, 2 * GIB));
        assert_eq!(oom.policy.allocated_bytes, 3 * GIB);
        assert_eq!(r.summary.event_count, 2, "stopped at the OOM");
    }

    /// With continue_after_oom the failed allocation's free is skipped.
    #[test]
    fn continue_after_oom_skips_the_failed_free() {
        let t = Trace::new(
            "t",
            vec![alloc(0, 3 * GIB), alloc(1, 2 * GIB), free(1), free(0)],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default().with_capacity(4 * GIB));
        let o = ReplayOptions {
            continue_after_oom: true,
            ..checked()
        };
        let r = replay(&t, &mut ImmediatePolicy::default(), &mut d, &o).unwrap();
        assert_eq!(
            (r.oom_count, r.skipped_event_count, r.live_allocation_count),
            (1, 1, 0)
        );
        assert_eq!(r.summary.event_count, 4);
    }

    /// A timeline has one sample per event with the policy's figures.
    #[test]
    fn timeline_samples_every_event() {
        let t = Trace::new(
            "t",
            vec![
                alloc(0, 100),
                Event::Mark { label: "x".into() },
                free(0),
                Event::EmptyCache,
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let o = ReplayOptions {
            timeline: true,
            ..checked()
        };
        let r = replay(&t, &mut CachingPolicy::default(), &mut d, &o).unwrap();
        let reserved: Vec<u64> = r.timeline.iter().map(|s| s.policy.reserved_bytes).collect();
        assert_eq!(reserved, vec![2 << 20, 2 << 20, 2 << 20, 0]);
        assert_eq!(r.timeline[0].policy.requested_bytes, 100);
    }

    /// Large ids and reused ids work.
    #[test]
    fn sparse_and_reused_ids() {
        let t = Trace::new(
            "t",
            vec![
                alloc(u64::MAX - 3, 10),
                free(u64::MAX - 3),
                alloc(7, 10),
                free(7),
                alloc(7, 20),
            ],
        );
        let mut d = SimDevice::new(SimDeviceOptions::default());
        let r = replay(&t, &mut CachingPolicy::default(), &mut d, &checked()).unwrap();
        assert_eq!(r.live_allocation_count, 1);
        assert_eq!(r.skipped_event_count, 0);
    }
}
