//! Fidelity: replay a recorded PyTorch run under the caching policy, configured as the
//! run was (its `PYTORCH_CUDA_ALLOC_CONF`, its memory cap, its device total), and compare
//! what the simulator decides with what PyTorch decided.
//!
//! Compared:
//! - **segment operations**: the sequence of (`segment_alloc` | `segment_free` |
//!   `segment_map` | `segment_unmap`, bytes), each tied to the request that caused it
//!   (the malloc, or the `empty_cache` call), up to the first `oom` entry;
//! - **peaks**: reserved and allocated bytes (`reserved_bytes.all.peak`,
//!   `allocated_bytes.all.peak` of the final statistics);
//! - **the OOM point**: the index of the `oom` entry against the request at which the
//!   simulation ran out;
//! - **checkpoints**: allocated, reserved, inactive_split bytes, segment count,
//!   `num_alloc_retries` and `num_ooms` at every checkpoint.
//!
//! Replay drives the policy from the requests alone: `alloc` (and `oom`) entries are
//! mallocs, `free_requested` drops allocated bytes when its block waits for other
//! streams, `free_completed` returns the block, `empty_cache` markers release the cache.
//! Segment addresses recorded by PyTorch are fed to the simulated device while the
//! simulation follows the recorded path, so best-fit ties break as they did on the GPU.

use std::collections::HashMap;
use std::fmt::Write as _;

use policies::caching::{CachingConfig, CachingPolicy, MemoryLimit};
use policies::{
    AddressRange, AllocError, Allocation, Device, DeviceError, DeviceStats, PhysicalChunk, Policy,
    Request, Segment, StreamId, VirtualMemory,
};
use workloads::{Action, Checkpoint, RecordedRun};

use crate::device::{AddressHints, SimDevice, SimDeviceOptions};

/// A segment decision: kind and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentOp {
    /// `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap`.
    pub action: Action,
    /// Bytes of the segment or mapped range.
    pub bytes: u64,
    /// Index of the entry whose request caused it (the malloc or `empty_cache`).
    pub owner: usize,
}

/// One row of `allocsim fidelity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FidelityRow {
    /// Run name.
    pub trace: String,
    /// Entries in the recorded trace.
    pub events: usize,
    /// Whether the segment operations agree up to the first `oom` entry.
    pub segment_ops_match: bool,
    /// Index (in the recorded entries) of the first segment operation that differs.
    pub first_divergence_event: Option<usize>,
    /// Simulated `reserved_bytes.all.peak`.
    pub reserved_bytes_peak_sim: u64,
    /// PyTorch's `reserved_bytes.all.peak`.
    pub reserved_bytes_peak_torch: u64,
    /// Simulated `allocated_bytes.all.peak`.
    pub allocated_bytes_peak_sim: u64,
    /// PyTorch's `allocated_bytes.all.peak`; `None` when the recording has no statistics
    /// (snapshot pickles).
    pub allocated_bytes_peak_torch: Option<u64>,
    /// Index of the request at which the simulation ran out of memory.
    pub oom_event_sim: Option<usize>,
    /// Index of the recorded `oom` entry.
    pub oom_event_torch: Option<usize>,
    /// Whether every checkpoint agrees (vacuously true without checkpoints).
    pub checkpoints_match: bool,
    /// All of the above agree.
    pub exact: bool,
}

/// Columns of `allocsim fidelity`, in order.
pub const FIDELITY_COLUMNS: &[&str] = &[
    "trace",
    "events",
    "segment_ops_match",
    "first_divergence_event",
    "reserved_bytes_peak_sim",
    "reserved_bytes_peak_torch",
    "allocated_bytes_peak_sim",
    "allocated_bytes_peak_torch",
    "oom_event_sim",
    "oom_event_torch",
    "checkpoints_match",
    "exact",
];

impl FidelityRow {
    /// The row as CSV fields, in [`FIDELITY_COLUMNS`] order.
    pub fn fields(&self) -> Vec<String> {
        let opt = |v: Option<usize>| v.map(|x| x.to_string()).unwrap_or_default();
        vec![
            self.trace.clone(),
            self.events.to_string(),
            self.segment_ops_match.to_string(),
            opt(self.first_divergence_event),
            self.reserved_bytes_peak_sim.to_string(),
            self.reserved_bytes_peak_torch.to_string(),
            self.allocated_bytes_peak_sim.to_string(),
            self.allocated_bytes_peak_torch
                .map(|x| x.to_string())
                .unwrap_or_default(),
            opt(self.oom_event_sim),
            opt(self.oom_event_torch),
            self.checkpoints_match.to_string(),
            self.exact.to_string(),
        ]
    }
}

/// A checkpoint compared field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointComparison {
    /// The recorded checkpoint.
    pub recorded: Checkpoint,
    /// Simulated (allocated, reserved, inactive_split, segments, num_alloc_retries,
    /// num_ooms) at the same point.
    pub simulated: [u64; 6],
}

impl CheckpointComparison {
    /// Recorded values in the order of `simulated`.
    pub fn recorded_values(&self) -> [u64; 6] {
        let c = &self.recorded;
        [
            c.allocated,
            c.reserved,
            c.inactive_split,
            c.segments,
            c.num_alloc_retries,
            c.num_ooms,
        ]
    }

    /// Whether every field agrees.
    pub fn matches(&self) -> bool {
        self.recorded_values() == self.simulated
    }
}

/// Field names of [`CheckpointComparison`] values.
pub const CHECKPOINT_FIELDS: [&str; 6] = [
    "allocated",
    "reserved",
    "inactive_split",
    "segments",
    "num_alloc_retries",
    "num_ooms",
];

/// Everything one fidelity run found.
#[derive(Clone, Debug)]
pub struct FidelityReport {
    /// The summary row.
    pub row: FidelityRow,
    /// PyTorch's segment operations up to the first `oom` entry, each with its own
    /// entry index (the request that caused it is [`SegmentOp::owner`]).
    pub torch_ops: Vec<(usize, SegmentOp)>,
    /// The simulation's segment operations up to the same point.
    pub sim_ops: Vec<SegmentOp>,
    /// Every checkpoint, compared.
    pub checkpoints: Vec<CheckpointComparison>,
    /// The simulated OOM message, if the simulation ran out.
    pub oom_message_sim: Option<String>,
    explain: String,
}

impl FidelityReport {
    /// A human-readable account of the first divergence (empty when exact).
    pub fn explain(&self) -> &str {
        &self.explain
    }
}

/// Options of a fidelity run.
#[derive(Clone, Debug)]
pub struct FidelityOptions {
    /// The simulated device; its total is replaced by the run's recorded total and its
    /// capacity by what the run's checkpoints show the driver could give.
    pub device: SimDeviceOptions,
    /// Feed recorded segment addresses to the device (default true).
    pub use_recorded_addresses: bool,
    /// Check every policy invariant after every request (slow; for tests).
    pub check_invariants: bool,
}

impl Default for FidelityOptions {
    fn default() -> Self {
        FidelityOptions {
            device: crate::DeviceProfile::builtin("h100")
                .expect("built-in h100")
                .to_options(),
            use_recorded_addresses: true,
            check_invariants: false,
        }
    }
}

/// A recorded run that cannot be checked.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    /// The run's `alloc_conf` does not parse.
    #[error("{path}: alloc_conf '{conf}': {message}")]
    Config {
        /// The run's file.
        path: String,
        /// The configuration string.
        conf: String,
        /// PyTorch's error.
        message: String,
    },
    /// A device failure that is not out-of-memory.
    #[error("{path}: entry {index}: {error}")]
    Device {
        /// The run's file.
        path: String,
        /// Where.
        index: usize,
        /// What.
        error: DeviceError,
    },
}

/// Wraps the simulated device and writes down every segment operation.
struct RecordingDevice<'a> {
    inner: &'a mut SimDevice,
    ops: Vec<(Action, u64)>,
}

impl Device for RecordingDevice<'_> {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        let s = self.inner.allocate_segment(size_bytes)?;
        self.ops.push((Action::SegmentAlloc, size_bytes));
        Ok(s)
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        let bytes = segment.size_bytes;
        self.inner.free_segment(segment)?;
        self.ops.push((Action::SegmentFree, bytes));
        Ok(())
    }

    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        Some(self)
    }
}

impl VirtualMemory for RecordingDevice<'_> {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        self.inner.reserve_range(size_bytes)
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        self.inner.create_physical(size_bytes)
    }

    /// One map call is one of PyTorch's `segment_map` entries.
    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.inner.map(range, offset_bytes, chunks)?;
        let bytes = chunks.iter().map(|c| c.size_bytes).sum();
        self.ops.push((Action::SegmentMap, bytes));
        Ok(())
    }

    /// One unmap call is one of PyTorch's `segment_unmap` entries.
    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.inner.unmap(range, offset_bytes, chunks)?;
        let bytes = chunks.iter().map(|c| c.size_bytes).sum();
        self.ops.push((Action::SegmentUnmap, bytes));
        Ok(())
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        self.inner.release_physical(chunk)
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        self.inner.release_range(range)
    }
}

/// The caching configuration a recorded run ran with.
///
/// # Errors
/// When its `alloc_conf` does not parse.
pub fn run_config(run: &RecordedRun) -> Result<CachingConfig, FidelityError> {
    let mut config =
        CachingConfig::from_alloc_conf(&run.alloc_conf).map_err(|e| FidelityError::Config {
            path: run.path.display().to_string(),
            conf: run.alloc_conf.clone(),
            message: e.to_string(),
        })?;
    if let Some(f) = run.memory_fraction() {
        config.memory_limit = MemoryLimit::Fraction(f);
    }
    Ok(config)
}

/// The simulated device a recorded run ran on: the run's total, and as capacity the
/// least free memory the driver reported plus what PyTorch held at that moment.
pub fn run_device(run: &RecordedRun, base: &SimDeviceOptions) -> SimDeviceOptions {
    let mut d = base.clone();
    if let Some(total) = run.total_bytes {
        d.total_bytes = total;
    }
    if let Some(cap) = run
        .checkpoints
        .iter()
        .map(|c| c.driver_free + c.reserved)
        .min()
    {
        d.capacity_bytes = cap;
    }
    d.capacity_bytes = d.capacity_bytes.min(d.total_bytes);
    d
}

/// Recorded segment addresses, for best-fit ties: each `segment_alloc`'s (size, address),
/// and the base of each expandable segment (the first mapping outside every known range).
pub fn address_hints(run: &RecordedRun, config: &CachingConfig, total_bytes: u64) -> AddressHints {
    let mut hints = AddressHints::default();
    let page = config.large_segment_size_bytes.max(2 << 20);
    let window = page * (total_bytes + total_bytes / 8).div_ceil(page);
    let mut bases: Vec<u64> = Vec::new();
    for e in &run.entries {
        match e.action {
            Action::SegmentAlloc => hints.segments.push_back((e.size, e.addr)),
            Action::SegmentMap if !bases.iter().any(|&b| e.addr >= b && e.addr < b + window) => {
                bases.push(e.addr);
                hints.ranges.push_back(e.addr);
            }
            _ => {}
        }
    }
    hints
}

/// The entry index whose request caused each recorded segment operation: the `alloc`
/// or `oom` entry that follows it, or the `empty_cache` marker before it when no other
/// request came between.
fn torch_ops(run: &RecordedRun) -> Vec<(usize, SegmentOp)> {
    let mut out = Vec::new();
    let mut pending: Vec<(usize, Action, u64)> = Vec::new();
    let mut marker: Option<usize> = None;
    for (i, e) in run.entries.iter().enumerate() {
        match e.action {
            a if a.is_segment_op() => match marker {
                Some(m) => out.push((
                    i,
                    SegmentOp {
                        action: a,
                        bytes: e.size,
                        owner: m,
                    },
                )),
                None => pending.push((i, a, e.size)),
            },
            Action::Alloc | Action::Oom => {
                for (j, a, bytes) in pending.drain(..) {
                    out.push((
                        j,
                        SegmentOp {
                            action: a,
                            bytes,
                            owner: i,
                        },
                    ));
                }
                marker = None;
            }
            Action::EmptyCache => {
                for (j, a, bytes) in pending.drain(..) {
                    out.push((
                        j,
                        SegmentOp {
                            action: a,
                            bytes,
                            owner: j,
                        },
                    ));
                }
                marker = Some(i);
            }
            Action::FreeRequested | Action::FreeCompleted => marker = None,
            _ => {}
        }
    }
    for (j, a, bytes) in pending {
        out.push((
            j,
            SegmentOp {
                action: a,
                bytes,
                owner: j,
            },
        ));
    }
    out
}

/// Checks one recorded run. See the module docs.
///
/// # Errors
/// An `alloc_conf` that does not parse, or a device failure.
pub fn fidelity(
    run: &RecordedRun,
    options: &FidelityOptions,
) -> Result<FidelityReport, FidelityError> {
    let config = run_config(run)?;
    let device_options = run_device(run, &options.device);
    let hints = if options.use_recorded_addresses {
        address_hints(run, &config, device_options.total_bytes)
    } else {
        AddressHints::default()
    };
    let mut sim = SimDevice::with_hints(device_options, hints);
    let mut device = RecordingDevice {
        inner: &mut sim,
        ops: Vec::new(),
    };
    let mut policy = CachingPolicy::new(config);
    let path = run.path.display().to_string();

    let mut live: HashMap<u64, Allocation> = HashMap::new();
    let mut sim_ops: Vec<SegmentOp> = Vec::new();
    let mut oom_event_sim: Option<usize> = None;
    let mut oom_message_sim: Option<String> = None;
    let mut checkpoints = Vec::new();
    let mut next_checkpoint = 0usize;
    let mut recorded_count = 0u64; // entries seen, not counting inserted markers
    let entries = &run.entries;

    let snapshot_checkpoint = |policy: &CachingPolicy, c: &Checkpoint| {
        let s = policy.caching_stats();
        CheckpointComparison {
            recorded: c.clone(),
            simulated: [
                s.allocated_bytes.all.current,
                s.reserved_bytes.all.current,
                s.inactive_split_bytes.all.current,
                s.segment.all.current,
                s.num_alloc_retries,
                s.num_ooms,
            ],
        }
    };

    for (i, e) in entries.iter().enumerate() {
        if e.action != Action::EmptyCache {
            while let Some(c) = run
                .checkpoints
                .get(next_checkpoint)
                .filter(|c| c.trace_len <= recorded_count)
            {
                checkpoints.push(snapshot_checkpoint(&policy, c));
                next_checkpoint += 1;
            }
            recorded_count += 1;
        }
        let device_error = |error| FidelityError::Device {
            path: path.clone(),
            index: i,
            error,
        };
        match e.action {
            Action::Alloc | Action::Oom => {
                let request = Request {
                    size_bytes: e.size,
                    stream: StreamId(e.stream),
                };
                match policy.allocate(&mut device, request) {
                    Ok(a) => {
                        if e.action == Action::Alloc {
                            live.insert(e.addr, a);
                        }
                        // After a missed OOM the allocation stays live in the simulation:
                        // the program never got (and never freed) it.
                    }
                    Err(AllocError::OutOfMemory { tried_bytes, .. }) => {
                        if oom_event_sim.is_none() {
                            oom_event_sim = Some(i);
                            oom_message_sim = Some(policy.oom_message(tried_bytes, &device));
                        }
                    }
                    Err(AllocError::Device(err)) => return Err(device_error(err)),
                    Err(other) => {
                        return Err(device_error(DeviceError::Driver {
                            code: 0,
                            message: other.to_string(),
                        }))
                    }
                }
            }
            Action::FreeRequested => {
                let completes_now = entries
                    .get(i + 1)
                    .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                if !completes_now {
                    if let Some(a) = live.get(&e.addr) {
                        policy.free_requested(a);
                    }
                }
            }
            Action::FreeCompleted => {
                if let Some(a) = live.remove(&e.addr) {
                    policy.free(&mut device, a).map_err(device_error)?;
                }
            }
            Action::EmptyCache => policy.empty_cache(&mut device).map_err(device_error)?,
            _ => {}
        }
        for (action, bytes) in device.ops.drain(..) {
            sim_ops.push(SegmentOp {
                action,
                bytes,
                owner: i,
            });
        }
        if options.check_invariants {
            policy.check_invariants();
            assert_eq!(
                policy.stats().reserved_bytes,
                device.stats().reserved_bytes,
                "policy and device disagree"
            );
        }
    }
    for c in &run.checkpoints[next_checkpoint.min(run.checkpoints.len())..] {
        checkpoints.push(snapshot_checkpoint(&policy, c));
    }

    let oom_event_torch = entries.iter().position(|e| e.action == Action::Oom);
    let all_torch_ops = torch_ops(run);
    let cut = oom_event_torch.unwrap_or(usize::MAX);
    let torch_cut: Vec<(usize, SegmentOp)> = all_torch_ops
        .iter()
        .copied()
        .filter(|(j, _)| *j < cut)
        .collect();
    let sim_cut: Vec<SegmentOp> = sim_ops.iter().copied().filter(|o| o.owner <= cut).collect();
    let first_mismatch = (0..torch_cut.len().max(sim_cut.len()))
        .find(|&k| torch_cut.get(k).map(|(_, op)| op) != sim_cut.get(k));
    let first_divergence_event = first_mismatch.map(|k| match torch_cut.get(k) {
        Some((j, _)) => *j,
        None => sim_cut[k].owner,
    });

    let stat = |key: &str| {
        run.final_stats
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v as u64)
    };
    let reserved_torch =
        stat("reserved_bytes.all.peak").unwrap_or_else(|| reserved_peak_from_trace(run));
    let allocated_torch = stat("allocated_bytes.all.peak");
    let s = policy.caching_stats();
    let reserved_sim = s.reserved_bytes.all.peak;
    let allocated_sim = s.allocated_bytes.all.peak;
    let checkpoints_match = checkpoints.iter().all(CheckpointComparison::matches);
    let segment_ops_match = first_divergence_event.is_none();
    let exact = segment_ops_match
        && checkpoints_match
        && reserved_sim == reserved_torch
        && allocated_torch.is_none_or(|a| a == allocated_sim)
        && oom_event_sim == oom_event_torch;
    let row = FidelityRow {
        trace: run.name.clone(),
        events: entries.len(),
        segment_ops_match,
        first_divergence_event,
        reserved_bytes_peak_sim: reserved_sim,
        reserved_bytes_peak_torch: reserved_torch,
        allocated_bytes_peak_sim: allocated_sim,
        allocated_bytes_peak_torch: allocated_torch,
        oom_event_sim,
        oom_event_torch,
        checkpoints_match,
        exact,
    };
    let mut report = FidelityReport {
        row,
        torch_ops: torch_cut,
        sim_ops: sim_cut,
        checkpoints,
        oom_message_sim,
        explain: String::new(),
    };
    report.explain = explain(run, &report, first_mismatch);
    Ok(report)
}

/// Reserved-bytes peak computed from the recorded segment operations.
fn reserved_peak_from_trace(run: &RecordedRun) -> u64 {
    let mut now: i128 = 0;
    let mut peak: i128 = 0;
    for e in &run.entries {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => now += i128::from(e.size),
            Action::SegmentFree | Action::SegmentUnmap => now -= i128::from(e.size),
            _ => {}
        }
        peak = peak.max(now);
    }
    peak as u64
}

fn describe_op(op: Option<&SegmentOp>) -> String {
    match op {
        Some(op) => format!("{} {} (for entry {})", op.action.name(), op.bytes, op.owner),
        None => "nothing".into(),
    }
}

/// The few entries before the first divergence and both sides' decisions, then any
/// checkpoint, peak or OOM disagreement.
fn explain(run: &RecordedRun, report: &FidelityReport, first_mismatch: Option<usize>) -> String {
    let mut out = String::new();
    let row = &report.row;
    if row.exact {
        return out;
    }
    let _ = writeln!(out, "{}: not exact", row.trace);
    if let (Some(k), Some(at)) = (first_mismatch, row.first_divergence_event) {
        let torch = report.torch_ops.get(k).map(|(_, op)| op);
        let sim = report.sim_ops.get(k);
        let _ = writeln!(
            out,
            "  first divergence: segment operation #{k}, at entry {at}"
        );
        let _ = writeln!(out, "    pytorch:   {}", describe_op(torch));
        let _ = writeln!(out, "    simulated: {}", describe_op(sim));
        let owner = torch
            .map(|o| o.owner)
            .into_iter()
            .chain(sim.map(|o| o.owner))
            .min()
            .unwrap_or(at);
        let from = owner.saturating_sub(8);
        let _ = writeln!(out, "  entries {from}..={}:", owner.max(at));
        for j in from..=owner.max(at).min(run.entries.len().saturating_sub(1)) {
            let e = &run.entries[j];
            let sim_here: Vec<String> = report
                .sim_ops
                .iter()
                .filter(|o| o.owner == j)
                .map(|o| format!("{} {}", o.action.name(), o.bytes))
                .collect();
            let note = if matches!(e.action, Action::Alloc | Action::Oom | Action::EmptyCache) {
                if sim_here.is_empty() {
                    "   | sim: no segment operation".to_string()
                } else {
                    format!("   | sim: {}", sim_here.join(", "))
                }
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "    {j:>6} {:<15} addr={:#x} size={} stream={}{note}",
                e.action.name(),
                e.addr,
                e.size,
                e.stream
            );
        }
    }
    for c in report.checkpoints.iter().filter(|c| !c.matches()) {
        let diffs: Vec<String> = CHECKPOINT_FIELDS
            .iter()
            .zip(c.recorded_values().iter().zip(c.simulated.iter()))
            .filter(|(_, (r, s))| r != s)
            .map(|(name, (r, s))| format!("{name} pytorch={r} sim={s}"))
            .collect();
        let _ = writeln!(
            out,
            "  checkpoint '{}' (trace_len {}): {}",
            c.recorded.label,
            c.recorded.trace_len,
            diffs.join(", ")
        );
    }
    if row.reserved_bytes_peak_sim != row.reserved_bytes_peak_torch {
        let _ = writeln!(
            out,
            "  reserved peak: pytorch={} sim={}",
            row.reserved_bytes_peak_torch, row.reserved_bytes_peak_sim
        );
    }
    if let Some(a) = row
        .allocated_bytes_peak_torch
        .filter(|&a| a != row.allocated_bytes_peak_sim)
    {
        let _ = writeln!(
            out,
            "  allocated peak: pytorch={a} sim={}",
            row.allocated_bytes_peak_sim
        );
    }
    if row.oom_event_sim != row.oom_event_torch {
        let _ = writeln!(
            out,
            "  oom: pytorch at {:?}, sim at {:?}",
            row.oom_event_torch, row.oom_event_sim
        );
    }
    if let (Some(torch), Some(sim)) = (&run.oom, &report.oom_message_sim) {
        let _ = writeln!(out, "  pytorch said: {}", torch.message);
        let _ = writeln!(out, "  sim says:     {sim}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::RecordedEntry;

    fn e(action: Action, addr: u64, size: u64) -> RecordedEntry {
        RecordedEntry {
            action,
            addr,
            size,
            stream: 0,
        }
    }

    /// Segment operations belong to the request that follows them, or to the
    /// empty_cache marker before them.
    #[test]
    fn ops_are_owned_by_their_request() {
        let run = RecordedRun {
            entries: vec![
                e(Action::SegmentAlloc, 1 << 40, 2 << 20),
                e(Action::Alloc, 1 << 40, 512),
                e(Action::FreeRequested, 1 << 40, 512),
                e(Action::FreeCompleted, 1 << 40, 512),
                e(Action::EmptyCache, 0, 0),
                e(Action::SegmentFree, 1 << 40, 2 << 20),
            ],
            ..RecordedRun::default()
        };
        let ops = torch_ops(&run);
        assert_eq!(
            ops.iter().map(|(j, o)| (*j, o.owner)).collect::<Vec<_>>(),
            vec![(0, 1), (5, 4)]
        );
    }

    /// A tiny hand-made run is reproduced exactly, segment operations and checkpoints.
    #[test]
    fn tiny_run_is_exact() {
        let gib = 1u64 << 30;
        let cp = |label: &str, trace_len, allocated, reserved, segments| Checkpoint {
            label: label.into(),
            trace_len,
            allocated,
            reserved,
            max_allocated: 0,
            max_reserved: 0,
            inactive_split: 0,
            num_alloc_retries: 0,
            num_ooms: 0,
            segments,
            driver_free: 70 * gib,
        };
        let run = RecordedRun {
            name: "tiny".into(),
            total_bytes: Some(80 * gib),
            entries: vec![
                e(Action::SegmentAlloc, 0x7f00_0000_0000, gib),
                e(Action::Alloc, 0x7f00_0000_0000, gib),
                e(Action::FreeRequested, 0x7f00_0000_0000, gib),
                e(Action::FreeCompleted, 0x7f00_0000_0000, gib),
                e(Action::EmptyCache, 0, 0),
                e(Action::SegmentFree, 0x7f00_0000_0000, gib),
            ],
            checkpoints: vec![cp("a", 2, gib, gib, 1), cp("end", 5, 0, 0, 0)],
            final_stats: vec![
                ("reserved_bytes.all.peak".into(), gib as f64),
                ("allocated_bytes.all.peak".into(), gib as f64),
            ],
            ..RecordedRun::default()
        };
        let r = fidelity(
            &run,
            &FidelityOptions {
                check_invariants: true,
                ..FidelityOptions::default()
            },
        )
        .unwrap();
        assert!(r.row.exact, "{}", r.explain());
        assert_eq!(r.checkpoints.len(), 2);
    }

    /// A wrong recorded decision is reported at its entry, and explained.
    #[test]
    fn divergence_is_located_and_explained() {
        let run = RecordedRun {
            name: "wrong".into(),
            entries: vec![
                e(Action::SegmentAlloc, 0x7f00_0000_0000, 4 << 20),
                e(Action::Alloc, 0x7f00_0000_0000, 100),
            ],
            ..RecordedRun::default()
        };
        let r = fidelity(&run, &FidelityOptions::default()).unwrap();
        assert!(!r.row.exact);
        assert_eq!(r.row.first_divergence_event, Some(0));
        assert!(
            r.explain().contains("pytorch:   segment_alloc 4194304"),
            "{}",
            r.explain()
        );
        assert!(
            r.explain().contains("simulated: segment_alloc 2097152"),
            "{}",
            r.explain()
        );
    }
}
