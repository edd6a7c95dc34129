//! What the engine shows an observer: per event, the decision, the device operations it
//! caused and the state after it. Fidelity, timelines and the model tests are observers
//! of the one engine ([`crate::replay_with`]); so are future plots, OOM explanations and
//! snapshot exports.

use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Policy, PolicyStats,
    Segment, VirtualMemory,
};
use workloads::Event;

use crate::metrics::Sample;

/// What became of one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An `alloc` was served.
    Allocated {
        /// First byte handed to the program.
        addr: DeviceAddr,
        /// Bytes asked for.
        requested_bytes: u64,
        /// Bytes the policy set aside.
        block_bytes: u64,
    },
    /// An `alloc` could not be served (a result, not an error).
    OutOfMemory {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Bytes the policy last tried to get from the device.
        tried_bytes: u64,
    },
    /// A `free_requested` reached the policy; the allocation stays live until its `free`.
    FreeRequested {
        /// First byte of the allocation.
        addr: DeviceAddr,
        /// Its block bytes.
        block_bytes: u64,
    },
    /// A `free` returned an allocation to the policy.
    Freed {
        /// First byte of the allocation.
        addr: DeviceAddr,
        /// Its block bytes.
        block_bytes: u64,
    },
    /// `empty_cache` ran.
    CacheEmptied,
    /// A `mark`: nothing to do.
    Marked,
    /// An allocator call (private pools, settings, statistics resets, enabling) reached
    /// the policy; `applied` is false where the policy does not model it and ignored it.
    Called {
        /// Whether the policy applied it.
        applied: bool,
    },
    /// The event did nothing (only in traces replayed despite validation errors, and
    /// for the free of an allocation that ran out of memory).
    Skipped(Skip),
}

/// Why an event was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// An `alloc` of zero bytes.
    ZeroSize,
    /// A `free` or `free_requested` of an id with no live allocation (never allocated,
    /// already freed, or its allocation ran out of memory).
    NotLive,
    /// A second `free_requested` of the same allocation.
    AlreadyRequested,
}

/// Kinds of device operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceOpKind {
    /// A segment allocated (`cudaMalloc`).
    SegmentAlloc,
    /// A segment freed (`cudaFree`).
    SegmentFree,
    /// Physical chunks mapped into a reserved range (expandable segments).
    Map,
    /// Physical chunks unmapped from a reserved range.
    Unmap,
}

/// One operation the device performed for the policy: segments, and mappings of physical
/// chunks into reserved ranges (one per map or unmap call). Reserving and releasing
/// address space, and creating and releasing physical chunks (which have no address
/// until mapped), are not listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOp {
    /// What happened.
    pub kind: DeviceOpKind,
    /// First byte of the segment or of the mapped span.
    pub addr: DeviceAddr,
    /// Bytes of the segment or of the mapped span.
    pub bytes: u64,
}

/// Everything about one replayed event, shown to [`Observer::after_event`].
pub struct Step<'a> {
    /// Index of the event in the trace.
    pub index: usize,
    /// The event.
    pub event: &'a Event,
    /// What the policy did with it.
    pub outcome: Outcome,
    /// The device operations the event caused, in order (usually none); always empty
    /// for an observer that does not ask for them ([`Observer::wants_device_ops`]).
    pub device_ops: &'a [DeviceOp],
    /// Policy accounting after the event (for an observer that does not need it
    /// after every event, [`Observer::needs_stats_every_event`], after a free it may
    /// be that of an earlier event).
    pub policy_stats: &'a PolicyStats,
    /// Device accounting after the event.
    pub device_stats: &'a DeviceStats,
    /// The policy, for snapshots and detailed statistics (costly: at checkpoints only).
    pub policy: &'a dyn Policy,
}

/// Watches a replay event by event. Every method has a default that does nothing, and
/// the engine is generic over the observer, so an observer costs only what it does.
pub trait Observer {
    /// Before event `index` is replayed: the policy is in the state after the previous
    /// event.
    fn before_event(&mut self, _index: usize, _event: &Event, _policy: &dyn Policy) {}

    /// After each replayed event, the out-of-memory that stops a replay included.
    fn after_event(&mut self, _step: &Step<'_>) {}

    /// Whether [`Step::policy_stats`] must be read after every event. An observer
    /// that reads it only at an out-of-memory, or never, says `false`: the engine then
    /// reads [`Policy::stats`] again only after an event that may raise it (anything
    /// but a free, a `free_requested`, a skipped event or a mark that made no device
    /// call: those only lower the figures, so the peaks stay exact), and such a step
    /// shows the last state read.
    fn needs_stats_every_event(&self) -> bool {
        true
    }

    /// Whether [`Step::device_ops`] is read: an observer that never reads it says
    /// `false`, and the engine then does not write the device operations down (a
    /// vector push per device call; every request of `immediate` is one). The
    /// default: it is read.
    fn wants_device_ops(&self) -> bool {
        true
    }

    /// Whether [`Observer::after_event`] does anything with the step of event
    /// `index`, `event`, whose outcome is `outcome`: the engine makes the [`Step`] and
    /// calls `after_event` only where this says yes (an observer of marks and
    /// out-of-memories says no to the other steps, and the replay's usual events then
    /// cost it nothing). The default: every step.
    #[inline(always)]
    fn watches(&self, _index: usize, _event: &Event, _outcome: &Outcome) -> bool {
        true
    }

    /// A period in events (0: none): the engine also shows this observer the step of
    /// every event whose index is a multiple of it (event 0 included), whatever
    /// [`Observer::watches`] says, counting down to the next one itself where a test
    /// per event would cost each event (a progress display: every 65 536th event). Read
    /// once, before the first event. The default: none.
    fn period(&self) -> usize {
        0
    }
}

/// The period of two observers' [`Observer::period`]s together: the steps either wants
/// (a multiple of both periods is a multiple of their greatest common divisor; more
/// steps than either asked for, which [`Observer::after_event`] must take).
fn joint_period(a: usize, b: usize) -> usize {
    let (mut a, mut b) = (a, b);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The observer that watches nothing ([`crate::replay`]).
impl Observer for () {
    fn needs_stats_every_event(&self) -> bool {
        false
    }

    fn wants_device_ops(&self) -> bool {
        false
    }

    #[inline(always)]
    fn watches(&self, _index: usize, _event: &Event, _outcome: &Outcome) -> bool {
        false
    }
}

impl<O: Observer + ?Sized> Observer for &mut O {
    #[inline(always)]
    fn before_event(&mut self, index: usize, event: &Event, policy: &dyn Policy) {
        (**self).before_event(index, event, policy);
    }

    #[inline(always)]
    fn after_event(&mut self, step: &Step<'_>) {
        (**self).after_event(step);
    }

    fn needs_stats_every_event(&self) -> bool {
        (**self).needs_stats_every_event()
    }

    fn wants_device_ops(&self) -> bool {
        (**self).wants_device_ops()
    }

    #[inline(always)]
    fn watches(&self, index: usize, event: &Event, outcome: &Outcome) -> bool {
        (**self).watches(index, event, outcome)
    }

    fn period(&self) -> usize {
        (**self).period()
    }
}

/// An observer that may be absent.
impl<O: Observer> Observer for Option<O> {
    #[inline(always)]
    fn before_event(&mut self, index: usize, event: &Event, policy: &dyn Policy) {
        if let Some(o) = self {
            o.before_event(index, event, policy);
        }
    }

    #[inline(always)]
    fn after_event(&mut self, step: &Step<'_>) {
        if let Some(o) = self {
            o.after_event(step);
        }
    }

    fn needs_stats_every_event(&self) -> bool {
        self.as_ref().is_some_and(O::needs_stats_every_event)
    }

    fn wants_device_ops(&self) -> bool {
        self.as_ref().is_some_and(O::wants_device_ops)
    }

    #[inline(always)]
    fn watches(&self, index: usize, event: &Event, outcome: &Outcome) -> bool {
        self.as_ref()
            .is_some_and(|o| o.watches(index, event, outcome))
    }

    fn period(&self) -> usize {
        self.as_ref().map_or(0, O::period)
    }
}

/// Two observers at once, the first called first.
impl<A: Observer, B: Observer> Observer for (A, B) {
    #[inline(always)]
    fn before_event(&mut self, index: usize, event: &Event, policy: &dyn Policy) {
        self.0.before_event(index, event, policy);
        self.1.before_event(index, event, policy);
    }

    #[inline(always)]
    fn after_event(&mut self, step: &Step<'_>) {
        self.0.after_event(step);
        self.1.after_event(step);
    }

    fn needs_stats_every_event(&self) -> bool {
        self.0.needs_stats_every_event() || self.1.needs_stats_every_event()
    }

    fn wants_device_ops(&self) -> bool {
        self.0.wants_device_ops() || self.1.wants_device_ops()
    }

    /// Either watches it; each is then shown the step (an observer must do right by
    /// any step: `watches` only spares it the ones it does nothing with).
    #[inline(always)]
    fn watches(&self, index: usize, event: &Event, outcome: &Outcome) -> bool {
        self.0.watches(index, event, outcome) || self.1.watches(index, event, outcome)
    }

    fn period(&self) -> usize {
        joint_period(self.0.period(), self.1.period())
    }
}

/// One [`Sample`] per replayed event: the timeline of `allocsim replay --timeline`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The samples, in event order.
    pub samples: Vec<Sample>,
}

impl Observer for Timeline {
    fn after_event(&mut self, step: &Step<'_>) {
        self.samples.push(Sample::of(step));
    }

    fn wants_device_ops(&self) -> bool {
        false
    }
}

impl Sample {
    /// The sample of one replayed event: a [`Timeline`]'s row.
    pub fn of(step: &Step<'_>) -> Sample {
        let bytes = match *step.event {
            Event::Alloc { size_bytes, .. } => Some(size_bytes),
            _ => None,
        };
        Sample {
            event_index: step.index as u64,
            op: step.event.op_name(),
            id: step.event.id().map(|id| id.0),
            bytes,
            policy: *step.policy_stats,
            charged_bytes: step.device_stats.charged_bytes,
        }
    }
}

/// [`Timeline`]'s rows written as the replay makes them, as
/// [`crate::report::write_timeline_csv`] writes a timeline's samples (the same bytes),
/// keeping none: memory does not grow with the trace (`allocsim replay --timeline`;
/// holding the samples took 1.4 GB at 10⁷ events). The first error of the writer stops
/// the writing; [`TimelineWriter::finish`] returns it.
pub struct TimelineWriter<W: std::io::Write> {
    out: Option<crate::report::RecordWriter<W>>,
    error: Option<csv::Error>,
    rows: u64,
}

impl<W: std::io::Write> TimelineWriter<W> {
    /// A timeline written to `writer` (its header at once).
    pub fn new(writer: W) -> TimelineWriter<W> {
        match crate::report::RecordWriter::new::<crate::report::TimelineRecord>(writer) {
            Ok(out) => TimelineWriter {
                out: Some(out),
                error: None,
                rows: 0,
            },
            Err(e) => TimelineWriter {
                out: None,
                error: Some(e),
                rows: 0,
            },
        }
    }

    /// The rows written, once flushed, and the writer.
    ///
    /// # Errors
    /// The writer's first error.
    pub fn finish(self) -> csv::Result<(u64, W)> {
        match (self.error, self.out) {
            (None, Some(out)) => Ok((self.rows, out.into_inner()?)),
            (Some(e), _) => Err(e),
            (None, None) => unreachable!("a timeline writer without an error has its writer"),
        }
    }
}

impl<W: std::io::Write> Observer for TimelineWriter<W> {
    fn after_event(&mut self, step: &Step<'_>) {
        let Some(out) = &mut self.out else {
            return;
        };
        match out.write(&crate::report::TimelineRecord::from(&Sample::of(step))) {
            Ok(()) => self.rows += 1,
            Err(e) => {
                self.error = Some(e);
                self.out = None;
            }
        }
    }

    fn wants_device_ops(&self) -> bool {
        false
    }
}

/// The device as the engine hands it to the policy: every call goes to the real device,
/// and each segment operation is written down for the observer (only where it reads
/// them, [`Observer::wants_device_ops`]). Segment operations are rare except under
/// `immediate`, so this costs one indirection per call. Every `Device` method is
/// forwarded (a method left to its default here would hide the real device's).
pub(crate) struct OpLog<'d> {
    pub(crate) device: &'d mut dyn Device,
    pub(crate) ops: Vec<DeviceOp>,
    /// Whether operations are written down in `ops` (else it stays empty).
    logging: bool,
    /// Set by every call that may change the device (its `&mut` methods): until one,
    /// [`Device::stats`] is what it was, and the engine does not read it again.
    pub(crate) touched: bool,
}

impl<'d> OpLog<'d> {
    /// `device`, with nothing written down yet; operations are written down only if
    /// `logging`.
    pub(crate) fn new(device: &'d mut dyn Device, logging: bool) -> OpLog<'d> {
        OpLog {
            device,
            ops: Vec::new(),
            logging,
            touched: false,
        }
    }
}

impl OpLog<'_> {
    #[inline(always)]
    fn log(&mut self, kind: DeviceOpKind, addr: u64, bytes: u64) {
        if self.logging {
            self.push(kind, addr, bytes);
        }
    }

    /// [`Device::allocate_segment`] written down.
    #[inline(never)]
    fn logged_allocate(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        let result = self.device.allocate_segment(size_bytes);
        if let Ok(segment) = &result {
            self.push(DeviceOpKind::SegmentAlloc, segment.addr.0, size_bytes);
        }
        result
    }

    /// [`Device::free_segment`] written down.
    #[inline(never)]
    fn logged_free(&mut self, segment: Segment) -> Result<(), DeviceError> {
        let (addr, bytes) = (segment.addr.0, segment.size_bytes);
        let result = self.device.free_segment(segment);
        if result.is_ok() {
            self.push(DeviceOpKind::SegmentFree, addr, bytes);
        }
        result
    }

    /// Writes an operation down (out of line: the forwarding calls stay short).
    #[inline(never)]
    fn push(&mut self, kind: DeviceOpKind, addr: u64, bytes: u64) {
        self.ops.push(DeviceOp {
            kind,
            addr: DeviceAddr(addr),
            bytes,
        });
    }

    fn vm(&mut self) -> Result<&mut dyn VirtualMemory, DeviceError> {
        self.touched = true;
        self.device
            .virtual_memory()
            .ok_or(DeviceError::Unsupported {
                what: "virtual memory management",
            })
    }
}

impl Device for OpLog<'_> {
    // The device's answer is handed back as it came (not taken apart by `?` and
    // rebuilt). Where nothing is written down the call is the device's own, made last
    // (a jump, not a call whose answer is copied back: under `immediate` every event
    // is one); writing down is out of line.
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.touched = true;
        if !self.logging {
            return self.device.allocate_segment(size_bytes);
        }
        self.logged_allocate(size_bytes)
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        self.touched = true;
        if !self.logging {
            return self.device.free_segment(segment);
        }
        self.logged_free(segment)
    }

    // The engine reads it after every event that touched the device: inlined there.
    #[inline]
    fn stats(&self) -> DeviceStats {
        self.device.stats()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        self.touched = true;
        if self.device.virtual_memory().is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn observed_used_bytes(&mut self) -> Option<u64> {
        self.touched = true;
        self.device.observed_used_bytes()
    }

    fn recorded_address(&self, addr: u64) -> DeviceAddr {
        self.device.recorded_address(addr)
    }

    /// Taking over a segment at its address is state, not one of PyTorch's operations:
    /// forwarded, not written down.
    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.touched = true;
        self.device.adopt_segment(addr, size_bytes)
    }
}

impl VirtualMemory for OpLog<'_> {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        self.vm()?.reserve_range(size_bytes)
    }

    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        self.vm()?.adopt_range(addr, size_bytes)
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        self.vm()?.create_physical(size_bytes)
    }

    /// One map call is one operation (one of PyTorch's `segment_map` entries).
    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm()?.map(range, offset_bytes, chunks)?;
        let bytes = chunks.iter().map(|c| c.size_bytes).sum();
        self.log(DeviceOpKind::Map, range.addr.0 + offset_bytes, bytes);
        Ok(())
    }

    /// One unmap call is one operation (one of PyTorch's `segment_unmap` entries).
    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm()?.unmap(range, offset_bytes, chunks)?;
        let bytes = chunks.iter().map(|c| c.size_bytes).sum();
        self.log(DeviceOpKind::Unmap, range.addr.0 + offset_bytes, bytes);
        Ok(())
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        self.vm()?.release_physical(chunk)
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        self.vm()?.release_range(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimDevice, SimDeviceOptions};

    /// A timeline written as the replay goes (`replay --timeline`) is the bytes of the
    /// held timeline's CSV, and reaches its writer during the replay, all but the
    /// writer's last buffer, rather than being held until the end.
    #[test]
    fn timeline_writer_writes_as_it_goes() {
        use std::cell::Cell;
        use std::rc::Rc;

        /// Keeps the bytes; `seen` is shared with the observer below.
        struct Sink {
            bytes: Vec<u8>,
            seen: Rc<Cell<usize>>,
        }
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.bytes.extend_from_slice(buf);
                self.seen.set(self.bytes.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let trace = workloads::random(&workloads::RandomOptions {
            seed: 4,
            events: 20_000,
            mark_every: Some(1000),
            ..workloads::RandomOptions::default()
        })
        .unwrap();
        let seen = Rc::new(Cell::new(0));
        let mut writer = TimelineWriter::new(Sink {
            bytes: Vec::new(),
            seen: Rc::clone(&seen),
        });
        let options = crate::ReplayOptions::default();
        let mut policy = policies::caching::CachingPolicy::default();
        let mut device = SimDevice::new(SimDeviceOptions::default());
        crate::replay_with(&trace, &mut policy, &mut device, &options, &mut writer).unwrap();
        let during = seen.get();
        let (rows, sink) = writer.finish().unwrap();
        assert_eq!(rows, trace.events.len() as u64);

        let mut held = Timeline::default();
        let mut policy = policies::caching::CachingPolicy::default();
        let mut device = SimDevice::new(SimDeviceOptions::default());
        crate::replay_with(&trace, &mut policy, &mut device, &options, &mut held).unwrap();
        let mut expected = Vec::new();
        crate::report::write_timeline_csv(&held.samples, &mut expected).unwrap();
        assert!(sink.bytes == expected, "the streamed timeline differs");
        assert!(
            expected.len() - during <= 64 << 10,
            "{during} of {} bytes reached the writer during the replay",
            expected.len()
        );
    }

    /// `OpLog` hands a policy the real device's adoption of recorded segments and
    /// ranges (the trait's defaults refuse it), without writing them down as operations.
    #[test]
    fn adoption_reaches_the_real_device() {
        let mut device = SimDevice::new(SimDeviceOptions::default());
        let mut log = OpLog::new(&mut device, true);
        let addr = DeviceAddr(0x7f00_0000_0000);
        let segment = log.adopt_segment(addr, 2 << 20).expect("adopted segment");
        assert_eq!((segment.addr, segment.size_bytes), (addr, 2 << 20));
        let range = log
            .virtual_memory()
            .expect("virtual memory")
            .adopt_range(DeviceAddr(0x7e00_0000_0000), 64 << 20)
            .expect("adopted range");
        assert_eq!(range.addr, DeviceAddr(0x7e00_0000_0000));
        assert!(log.ops.is_empty());
        assert_eq!(log.stats().reserved_bytes, 2 << 20);
    }

    /// An observer that asks for no device operations is shown none, and the replay
    /// (figures, device calls) is the same as one that reads them; one that reads
    /// them is shown every segment allocation and free of `immediate`.
    #[test]
    fn device_ops_only_where_asked() {
        use policies::immediate::ImmediatePolicy;
        use workloads::{AllocId, Trace};

        /// Counts the device operations it is shown; `wants` is its answer.
        struct Count {
            wants: bool,
            ops: usize,
            steps: usize,
        }
        impl Observer for Count {
            fn after_event(&mut self, step: &Step<'_>) {
                self.ops += step.device_ops.len();
                self.steps += 1;
            }
            fn wants_device_ops(&self) -> bool {
                self.wants
            }
        }
        let alloc = |id, size_bytes| Event::Alloc {
            id: AllocId(id),
            size_bytes,
            stream: 0,
        };
        let free = |id| Event::Free { id: AllocId(id) };
        let t = Trace::new(
            "t",
            vec![alloc(0, 100), alloc(1, 3 << 20), free(0), free(1)],
        );
        let mut runs = Vec::new();
        for wants in [true, false] {
            let mut device = SimDevice::new(SimDeviceOptions::default());
            let mut count = Count {
                wants,
                ops: 0,
                steps: 0,
            };
            let r = crate::replay_with(
                &t,
                &mut ImmediatePolicy::default(),
                &mut device,
                &crate::ReplayOptions::default(),
                &mut count,
            )
            .expect("replay");
            assert_eq!(count.steps, 4);
            runs.push((count.ops, r.summary, device.stats()));
        }
        assert_eq!(runs[0].0, 4, "two allocations and two frees");
        assert_eq!(runs[1].0, 0, "nothing written down where not asked");
        assert_eq!((&runs[0].1, runs[0].2), (&runs[1].1, runs[1].2));
    }
}
