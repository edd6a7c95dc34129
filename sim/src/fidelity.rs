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
//! The simulation is the one replay engine ([`crate::replay_with`]) replaying the run's
//! requests, [`RecordedRun::to_trace`] (`alloc` and `oom` entries are mallocs,
//! `free_requested` drops allocated bytes when its block waits for other streams,
//! `free_completed` returns the block, `empty_cache` markers release the cache), with
//! an observer that ties each device operation to its entry and takes the checkpoints.
//! It goes on after an out-of-memory: an `oom` entry the simulation serves stays
//! allocated (the program never got it, so never frees it), and a request PyTorch
//! served but the simulation could not is skipped, with its frees. Segment addresses
//! recorded by PyTorch are fed to the simulated device while the simulation follows the
//! recorded path, so best-fit ties break as they did on the GPU.

use std::fmt::Write as _;

use policies::caching::CachingPolicy;
use policies::{AdoptError, DeviceError, Policy};
use serde::Serialize;
use workloads::{Action, Checkpoint, Event, ReadError, RecordedRun, StartState};

use crate::device::{AddressHints, SimDevice, SimDeviceOptions};
pub use crate::divergence::Misplaced;
use crate::divergence::{Context, Places, StateBefore};
use crate::observe::{DeviceOpKind, Observer, Step};
use crate::recorded::{address_hints, run_config_with, run_device, AllocConfError, HintError};
use crate::replay::{replay_with, ReplayError, ReplayOptions};

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

/// One row of `allocsim fidelity`, also its CSV record: the fields are the columns, in
/// order (`docs/metrics.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
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
    /// PyTorch's `reserved_bytes.all.peak`, or for a trace that starts mid-run or a
    /// what-if compared in part, the peak of the compared entries' segment operations
    /// (from the bytes reserved at the first entry).
    pub reserved_bytes_peak_torch: u64,
    /// Simulated `allocated_bytes.all.peak`.
    pub allocated_bytes_peak_sim: u64,
    /// PyTorch's `allocated_bytes.all.peak`; `None` when the recording has no statistics
    /// (snapshot pickles) or when they cover more than the compared entries (a trace
    /// that starts mid-run, a what-if compared up to where the two runs part).
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
    /// For a what-if check, which part of the run could be compared.
    pub coverage: Option<Coverage>,
    /// The first request the simulation placed elsewhere than PyTorch while their
    /// segment decisions still agreed (a best-fit tie that broke the other way),
    /// when the run is not exact.
    pub misplaced: Option<Misplaced>,
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
    /// Settings in place of the recorded ones (the run's `alloc_conf`, its cap).
    pub overrides: crate::recorded::Overrides,
}

impl Default for FidelityOptions {
    fn default() -> Self {
        FidelityOptions {
            device: crate::DeviceProfile::builtin("h100")
                .expect("built-in h100")
                .to_options(),
            use_recorded_addresses: true,
            check_invariants: false,
            overrides: crate::recorded::Overrides::default(),
        }
    }
}

/// A recorded run that cannot be checked.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    /// The run's `alloc_conf` does not parse.
    #[error(transparent)]
    Config(#[from] AllocConfError),
    /// The run's recorded addresses cannot be followed (see
    /// [`crate::recorded::address_hints`]).
    #[error(transparent)]
    Hints(#[from] HintError),
    /// The run's requests do not form a trace (the recording started late or wrapped).
    #[error(transparent)]
    Trace(#[from] ReadError),
    /// A what-if check of a run that starts mid-run, or with its requests: requests are
    /// matched from each run's first entry, which must be the program's first request.
    #[error(
        "{path}: the recording starts mid-run (its ring buffer wrapped or it began late); a what-if check \
         matches two runs' requests from the program's first one, so both must be recorded from the start"
    )]
    MidRun {
        /// The run's file.
        path: String,
    },
    /// The replay stopped: a device failure other than out-of-memory, or a policy
    /// error.
    #[error("{path}: entry {index}: {error}")]
    Replay {
        /// The run's file.
        path: String,
        /// Index of the entry being replayed.
        index: usize,
        /// What happened.
        error: ReplayError,
    },
}

/// The fidelity observer: each device operation with the entry whose request caused
/// it, and the checkpoints, each taken before the first event at or after its entry.
struct Observe<'r> {
    run: &'r RecordedRun,
    /// For each event, the index of its entry.
    entry_of: &'r [usize],
    /// For each checkpoint, the entry before which it is taken (`usize::MAX`: the end).
    checkpoint_at: Vec<usize>,
    checkpoints: Vec<CheckpointComparison>,
    sim_ops: Vec<SegmentOp>,
    /// Where the simulation put its segments and requests.
    places: Places,
}

impl Observe<'_> {
    fn take_checkpoint(&mut self, policy: &dyn Policy) {
        let c = &self.run.checkpoints[self.checkpoints.len()];
        let flat = policy.detailed_stats();
        let stat = |key: &str| {
            flat.binary_search_by(|(k, _)| k.as_str().cmp(key))
                .map_or(0, |i| u64::try_from(flat[i].1).unwrap_or(0))
        };
        self.checkpoints.push(CheckpointComparison {
            recorded: c.clone(),
            simulated: [
                stat("allocated_bytes.all.current"),
                stat("reserved_bytes.all.current"),
                stat("inactive_split_bytes.all.current"),
                stat("segment.all.current"),
                stat("num_alloc_retries"),
                stat("num_ooms"),
            ],
        });
    }
}

impl Observer for Observe<'_> {
    fn before_event(&mut self, index: usize, _event: &Event, policy: &dyn Policy) {
        let entry = self.entry_of[index];
        while self
            .checkpoint_at
            .get(self.checkpoints.len())
            .is_some_and(|&at| at <= entry)
        {
            self.take_checkpoint(policy);
        }
    }

    fn after_event(&mut self, step: &Step<'_>) {
        let owner = self.entry_of[step.index];
        self.places.observe(owner, step);
        self.sim_ops
            .extend(step.device_ops.iter().map(|op| SegmentOp {
                action: match op.kind {
                    DeviceOpKind::SegmentAlloc => Action::SegmentAlloc,
                    DeviceOpKind::SegmentFree => Action::SegmentFree,
                    DeviceOpKind::Map => Action::SegmentMap,
                    DeviceOpKind::Unmap => Action::SegmentUnmap,
                },
                bytes: op.bytes,
                owner,
            }));
    }
}

/// For each checkpoint, the entry before which PyTorch took it: the first entry
/// (`empty_cache` markers aside) once `trace_len` entries (markers not counted) were
/// recorded; `usize::MAX` for those taken after the last entry.
fn checkpoint_entries(run: &RecordedRun) -> Vec<usize> {
    let mut at = Vec::with_capacity(run.checkpoints.len());
    let mut recorded = 0u64;
    for (i, e) in run.entries.iter().enumerate() {
        if e.action == Action::EmptyCache {
            continue;
        }
        while run
            .checkpoints
            .get(at.len())
            .is_some_and(|c| c.trace_len <= recorded)
        {
            at.push(i);
        }
        recorded += 1;
    }
    at.resize(run.checkpoints.len(), usize::MAX);
    at
}

/// The entry index whose request caused each recorded segment operation: the `alloc`
/// or `oom` entry that follows it, or, for a release, the `empty_cache` marker or the
/// `empty_cache` of a private pool (a MemPool's destruction: one of
/// [`RecordedRun::calls`], which the replay ties to the entry it follows) before it
/// when no other request and no mark (a `snapshot` entry: the program ran) came
/// between. Other calls release nothing: a release after them is the next request's.
fn torch_ops(run: &RecordedRun) -> Vec<(usize, SegmentOp)> {
    let mut out = Vec::new();
    let mut pending: Vec<(usize, Action, u64)> = Vec::new();
    let mut marker: Option<usize> = None;
    // Whether the marker's call released anything yet.
    let mut released = false;
    let mut calls = run
        .calls
        .iter()
        .filter(|(_, call)| matches!(call, Event::EmptyPoolCache { .. }))
        .map(|(at, _)| at.map_or(0, |a| a as usize))
        .peekable();
    for (i, e) in run.entries.iter().enumerate() {
        match e.action {
            // `empty_cache` only releases: a segment allocated or mapped after it is
            // the next request's, even with no request between (a mark's `snapshot`
            // entry, as `torch.cuda.graph` empties the cache just before capturing).
            Action::SegmentAlloc | Action::SegmentMap => {
                marker = None;
                pending.push((i, e.action, e.size));
            }
            a if a.is_segment_op() => match marker {
                Some(m) => {
                    released = true;
                    out.push((
                        i,
                        SegmentOp {
                            action: a,
                            bytes: e.size,
                            owner: m,
                        },
                    ));
                }
                None => pending.push((i, a, e.size)),
            },
            // The program ran between (a mark): the call that released is over.
            Action::Snapshot if released => marker = None,
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
                released = false;
            }
            Action::FreeRequested | Action::FreeCompleted => marker = None,
            _ => {}
        }
        if calls.next_if(|&at| at <= i).is_some() {
            while calls.next_if(|&at| at <= i).is_some() {}
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
            released = false;
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
/// An `alloc_conf` that does not parse, requests that do not form a trace, or a device
/// failure.
///
/// # Panics
/// With `check_invariants`, at the first broken invariant (a policy bug).
pub fn fidelity(
    run: &RecordedRun,
    options: &FidelityOptions,
) -> Result<FidelityReport, FidelityError> {
    let (trace, entry_of) = run.to_trace_with_entries()?;
    let hints = if options.use_recorded_addresses {
        address_hints(run, run_device(run, &options.device).total_bytes)?
    } else {
        AddressHints::default()
    };
    check(run, &trace, &entry_of, hints, None, options)
}

/// What-if fidelity: the requests of `requests` (a recorded run of the same program,
/// under another configuration, cap or PyTorch setting) replayed under `run`'s recorded
/// configuration, cap and device, and compared decision by decision with what PyTorch
/// did in `run`. The addresses `requests` got are the device's hints unless
/// `use_recorded_addresses` is off (`run`'s own addresses are never used: they are what
/// is predicted).
///
/// The two runs' requests are matched in order (streams by order of first use); the
/// comparison covers the requests both runs share: all of them for runs of one
/// program, up to an out-of-memory error in either (after it, the program unwinds
/// differently). `run`'s `oom` entry matches the request that failed, whose size
/// PyTorch recorded rounded. A row is exact only if the shared requests reach the end
/// of `run` or its out-of-memory error.
///
/// # Errors
/// As [`fidelity`], for either run; [`FidelityError::MidRun`] when either starts
/// mid-run.
///
/// # Panics
/// As [`fidelity`].
pub fn fidelity_with_requests(
    run: &RecordedRun,
    requests: &RecordedRun,
    options: &FidelityOptions,
) -> Result<FidelityReport, FidelityError> {
    let config = run_config_with(run, &options.overrides)?;
    let (target, entry_of) = run.to_trace_with_entries()?;
    let mut source = requests.to_trace()?;
    for (trace, r) in [(&target, run), (&source, requests)] {
        if trace.start.is_some() {
            return Err(FidelityError::MidRun {
                path: r.path.display().to_string(),
            });
        }
    }
    remap_streams(&mut source, &target);
    let rounding = CachingPolicy::new(config);
    let oom_entry = run.entries.iter().position(|e| e.action == Action::Oom);
    let shared = source
        .events
        .iter()
        .zip(&target.events)
        .zip(&entry_of)
        .take_while(|((a, b), &entry)| match (a, b) {
            (
                Event::Alloc {
                    id: ia,
                    size_bytes: sa,
                    stream: ta,
                },
                Event::Alloc {
                    id: ib,
                    size_bytes: sb,
                    stream: tb,
                },
            ) => {
                ia == ib
                    && ta == tb
                    && (sa == sb
                        || (Some(entry) == oom_entry && rounding.round_size(*sa) == *sb)
                        || (requests.entries.iter().any(|e| e.action == Action::Oom)
                            && rounding.round_size(*sb) == *sa))
            }
            // A MemPool's flags are settings of the run checked, which it keeps.
            (Event::CreatePool { pool: pa, .. }, Event::CreatePool { pool: pb, .. }) => pa == pb,
            // Each run's restore names its own addresses: those of the requests
            // replayed are the device's hints.
            (Event::RestoreBlock { pool: pa, .. }, Event::RestoreBlock { pool: pb, .. }) => {
                pa == pb
            }
            (a, b) => a == b,
        })
        .count();
    let mut trace = source;
    trace.events.truncate(shared);
    for (e, t) in trace.events.iter_mut().zip(&target.events) {
        if let Event::CreatePool { .. } = t {
            e.clone_from(t);
        }
    }
    if !trace.locations.is_empty() {
        trace.locations = target.locations[..shared].to_vec();
    }
    trace.name = format!("{} <- {}", run.name, requests.name);
    trace.meta = run.meta.clone();
    // Everything, or the entries before the first request not shared.
    let covered = entry_of
        .get(shared)
        .copied()
        .filter(|_| shared < target.events.len())
        .unwrap_or(usize::MAX);
    let complete = covered == usize::MAX || oom_entry.is_some_and(|o| o < covered);
    let hints = if options.use_recorded_addresses {
        address_hints(requests, run_device(run, &options.device).total_bytes)?
    } else {
        AddressHints::default()
    };
    let coverage = Coverage {
        requests: requests.name.clone(),
        covered,
        complete,
    };
    check(
        run,
        &trace,
        &entry_of[..shared],
        hints,
        Some(coverage),
        options,
    )
}

/// Renames the streams of `source` to those of `target`, by order of first use (a
/// stream's raw handle is the process's own: a side stream, such as the one a CUDA
/// graph is captured on, has another in each run), in requests and in the streams a
/// capture routes to its pool.
fn remap_streams(source: &mut workloads::Trace, target: &workloads::Trace) {
    fn streams_of(e: &Event) -> &[u64] {
        match e {
            Event::Alloc { stream, .. } => std::slice::from_ref(stream),
            Event::BeginAllocateToPool {
                streams: workloads::PoolStreams::Only(list),
                ..
            } => list,
            _ => &[],
        }
    }
    fn order(t: &workloads::Trace) -> Vec<u64> {
        let mut seen = Vec::new();
        for s in t.events.iter().flat_map(streams_of) {
            if !seen.contains(s) {
                seen.push(*s);
            }
        }
        seen
    }
    let from = order(source);
    let to = order(target);
    let rename = |stream: &mut u64| {
        if let Some(i) = from.iter().position(|s| s == stream) {
            if let Some(&t) = to.get(i) {
                *stream = t;
            }
        }
    };
    for e in &mut source.events {
        match e {
            Event::Alloc { stream, .. } => rename(stream),
            Event::BeginAllocateToPool {
                streams: workloads::PoolStreams::Only(list),
                ..
            } => list.iter_mut().for_each(rename),
            _ => {}
        }
    }
}

/// Which part of a run a what-if check ([`fidelity_with_requests`]) could compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// The run whose requests were replayed.
    pub requests: String,
    /// The entries of the checked run before this index were compared (`usize::MAX`:
    /// all of them).
    pub covered: usize,
    /// Whether that is all that matters: the whole run, or past its out-of-memory
    /// error.
    pub complete: bool,
}

/// The replay of `trace` (whose event `i` stands for `run`'s entry `entry_of[i]`)
/// under `run`'s configuration and device, compared with `run` up to
/// `coverage.covered` (the whole run without a coverage).
fn check(
    run: &RecordedRun,
    trace: &workloads::Trace,
    entry_of: &[usize],
    hints: AddressHints,
    coverage: Option<Coverage>,
    options: &FidelityOptions,
) -> Result<FidelityReport, FidelityError> {
    let config = run_config_with(run, &options.overrides)?;
    let device_options = run_device(run, &options.device);
    let covered = coverage.as_ref().map_or(usize::MAX, |c| c.covered);
    let mut device = SimDevice::with_hints(device_options.clone(), hints.clone());
    let mut policy = CachingPolicy::new(config.clone());
    let checkpoint_at: Vec<usize> = checkpoint_entries(run)
        .into_iter()
        .take_while(|&at| covered == usize::MAX || at < covered)
        .collect();
    let checkpoint_count = checkpoint_at.len();
    let mut observe = Observe {
        run,
        entry_of,
        checkpoint_at,
        checkpoints: Vec::with_capacity(checkpoint_count),
        sim_ops: Vec::new(),
        places: Places::default(),
    };
    let replay_options = ReplayOptions {
        check_invariants: options.check_invariants,
        continue_after_oom: true,
        interrupt: None,
    };
    let replayed = replay_with(
        trace,
        &mut policy,
        &mut device,
        &replay_options,
        &mut observe,
    )
    .and_then(|r| match &r.oom {
        // The recording held its starting state: a simulated device that cannot hold
        // it is not the recorded one.
        Some(o) if o.before_first_event() => Err(ReplayError::Start {
            error: AdoptError::Device(DeviceError::OutOfMemory {
                requested_bytes: o.tried_bytes,
            }),
        }),
        _ => Ok(r),
    })
    .map_err(|error| FidelityError::Replay {
        path: run.path.display().to_string(),
        index: entry_of
            .get(error.event_index() as usize)
            .copied()
            .unwrap_or(run.entries.len()),
        error,
    })?;
    while observe.checkpoints.len() < checkpoint_count {
        observe.take_checkpoint(&policy);
    }
    let Observe {
        checkpoints,
        sim_ops,
        places,
        ..
    } = observe;
    let oom_event_sim = replayed
        .oom
        .as_ref()
        .and_then(|o| o.event_index)
        .map(|i| entry_of[i as usize]);
    let oom_message_sim = replayed.oom.and_then(|o| o.message);
    let entries = &run.entries;

    let oom_event_torch = entries
        .iter()
        .position(|e| e.action == Action::Oom)
        .filter(|&o| o < covered);
    let all_torch_ops = torch_ops(run);
    let cut = oom_event_torch.unwrap_or(covered);
    let torch_cut: Vec<(usize, SegmentOp)> = all_torch_ops
        .iter()
        .copied()
        .filter(|&(j, op)| j < cut && op.owner < covered)
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
    // The recorded statistics are the whole process's: they compare with the replay
    // only when it covers the whole process. A trace that starts mid-run, or a what-if
    // compared up to where the runs part, is compared over its own entries: the
    // reserved peak from their segment operations (from the rebuilt state's bytes),
    // and no allocated peak (the entries record requested sizes, not blocks).
    let start_reserved = trace.start.as_ref().map_or(0, StartState::reserved_bytes);
    let whole_process = trace.start.is_none() && covered >= entries.len();
    let (reserved_torch, allocated_torch) = if whole_process {
        (
            stat("reserved_bytes.all.peak")
                .unwrap_or_else(|| reserved_peak_from_trace(run, start_reserved, covered)),
            stat("allocated_bytes.all.peak"),
        )
    } else {
        (reserved_peak_from_trace(run, start_reserved, covered), None)
    };
    let s = policy.caching_stats();
    let reserved_sim = s.reserved_bytes.all.peak;
    let allocated_sim = s.allocated_bytes.all.peak;
    let checkpoints_match = checkpoints.iter().all(CheckpointComparison::matches);
    let segment_ops_match = first_divergence_event.is_none();
    // A run whose trace cannot say everything PyTorch did (private pools it cannot
    // route, calls it cannot carry) is never reported exact, nor a what-if whose
    // requests do not cover the run.
    let complete = coverage.as_ref().is_none_or(|c| c.complete);
    let exact = trace.meta.caveats.is_empty()
        && complete
        && segment_ops_match
        && checkpoints_match
        && reserved_sim == reserved_torch
        && allocated_torch.is_none_or(|a| a == allocated_sim)
        && oom_event_sim == oom_event_torch;
    let row = FidelityRow {
        trace: trace.name.clone(),
        events: covered.min(entries.len()),
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
    // The first request placed elsewhere, before the segment decisions part (after
    // that, segment numbers no longer name the same segments; past an out-of-memory
    // error too, where the replay goes on); the simulation's state before it comes
    // from a second replay, up to it.
    let mut misplaced_account = String::new();
    let torch_places = Places::recorded(run);
    let mut misplaced = if exact {
        None
    } else {
        let torch_all: Vec<(usize, SegmentOp)> = all_torch_ops
            .iter()
            .copied()
            .filter(|&(_, op)| op.owner < covered)
            .collect();
        let parted = (0..torch_all.len().max(sim_ops.len()))
            .find(|&k| torch_all.get(k).map(|(_, op)| op) != sim_ops.get(k))
            .map_or(covered, |k| match torch_all.get(k) {
                Some(&(j, _)) => j.min(sim_ops.get(k).map_or(j, |o| o.owner)),
                None => sim_ops[k].owner,
            });
        crate::divergence::first_misplaced(&torch_places, &places, parted.min(covered))
    };
    if let Some(m) = &mut misplaced {
        let mut before = StateBefore {
            index: entry_of.partition_point(|&e| e < m.entry),
            state: None,
        };
        let mut device = SimDevice::with_hints(device_options, hints.clone());
        let mut policy = CachingPolicy::new(config);
        let mut prefix = trace.clone();
        prefix.events.truncate(before.index + 1);
        prefix.locations.truncate(before.index + 1);
        prefix.times_us.truncate(before.index + 1);
        // The same replay as above, so it cannot fail where that one did not.
        let _ = replay_with(
            &prefix,
            &mut policy,
            &mut device,
            &replay_options,
            &mut before,
        );
        let hints_from = coverage
            .as_ref()
            .map_or_else(|| format!("{} (its own)", run.name), |c| c.requests.clone());
        misplaced_account = crate::divergence::describe(
            m,
            &torch_places,
            &places,
            &Context {
                run,
                hints: &hints,
                hints_from: &hints_from,
                state: before.state.as_deref(),
            },
        );
    }
    let mut report = FidelityReport {
        row,
        torch_ops: torch_cut,
        sim_ops: sim_cut,
        checkpoints,
        oom_message_sim,
        coverage,
        misplaced,
        explain: String::new(),
    };
    let mut notes = Vec::new();
    if run.snapshot.is_some()
        && run.meta.cap_bytes.is_none()
        && options.overrides.memory_limit.is_none()
        && report.row.oom_event_torch.is_some()
        && report.row.oom_event_sim.is_none()
    {
        notes.push(
            "PyTorch ran out of memory and the simulation did not: a snapshot does not record the \
             run's cap (set_per_process_memory_fraction); if it had one, give it with --cap"
                .to_string(),
        );
    }
    report.explain = explain(
        run,
        &report,
        first_mismatch,
        report.coverage.as_ref(),
        &notes,
        &misplaced_account,
    );
    Ok(report)
}

/// Reserved-bytes peak computed from the recorded segment operations, from `start`
/// bytes reserved before the first entry, over the operations caused by the entries
/// before `end` (a request's operations come before its entry: those of the request
/// at `end` are left out).
fn reserved_peak_from_trace(run: &RecordedRun, start: u64, end: usize) -> u64 {
    let mut now = i128::from(start);
    let mut peak = now;
    for (_, op) in torch_ops(run).iter().filter(|(_, op)| op.owner < end) {
        match op.action {
            Action::SegmentAlloc | Action::SegmentMap => now += i128::from(op.bytes),
            Action::SegmentFree | Action::SegmentUnmap => now -= i128::from(op.bytes),
            _ => {}
        }
        peak = peak.max(now);
    }
    peak as u64
}

/// The bytes of the largest segment operation the run recorded (a segment, or a
/// mapping of an expandable segment): what "within one segment" measures a reserved
/// peak's difference against.
pub fn largest_segment_bytes(run: &RecordedRun) -> u64 {
    run.entries
        .iter()
        .filter(|e| e.action.is_segment_op())
        .map(|e| e.size)
        .max()
        .unwrap_or(0)
}

fn describe_op(op: Option<&SegmentOp>) -> String {
    match op {
        Some(op) => format!("{} {} (for entry {})", op.action.name(), op.bytes, op.owner),
        None => "nothing".into(),
    }
}

/// The few entries before the first divergence and both sides' decisions, then any
/// checkpoint, peak or OOM disagreement.
fn explain(
    run: &RecordedRun,
    report: &FidelityReport,
    first_mismatch: Option<usize>,
    coverage: Option<&Coverage>,
    notes: &[String],
    misplaced: &str,
) -> String {
    let mut out = String::new();
    let row = &report.row;
    if row.exact {
        return out;
    }
    let _ = writeln!(out, "{}: not exact", row.trace);
    for note in notes {
        let _ = writeln!(out, "  {note}");
    }
    if let Some(c) = coverage.filter(|c| !c.complete) {
        let _ = writeln!(
            out,
            "  the requests of {} match {}'s only up to entry {} of {} (one of the runs ran out of memory there): the rest cannot be predicted from them",
            c.requests,
            run.name,
            c.covered.min(run.entries.len()),
            run.entries.len()
        );
    }
    out += misplaced;
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
        let (sim, torch) = (row.reserved_bytes_peak_sim, row.reserved_bytes_peak_torch);
        let largest = largest_segment_bytes(run);
        let d = sim.abs_diff(torch);
        let measure = if run
            .entries
            .iter()
            .any(|e| e.action.is_segment_op() && e.size == d)
        {
            "the bytes of one of the run's segments".to_string()
        } else {
            format!(
                "{:.2} of its largest segment",
                d as f64 / largest.max(1) as f64
            )
        };
        let _ = writeln!(
            out,
            "  reserved peak: pytorch={torch} sim={sim} (sim {} PyTorch by {}, {measure}; {} one segment: the run's largest is {})",
            if sim > torch { "above" } else { "below" },
            units::format_size_human(d),
            if d <= largest { "within" } else { "more than" },
            units::format_size_human(largest),
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

    /// A segment allocated after an `empty_cache` marker, with only a `snapshot` entry
    /// between, belongs to the request that follows it, not to the `empty_cache`
    /// (which only releases); a release after it is the next request's too.
    #[test]
    fn allocations_after_empty_cache_belong_to_the_next_request() {
        let run = RecordedRun {
            entries: vec![
                e(Action::EmptyCache, 0, 0),
                e(Action::SegmentFree, 1 << 40, 2 << 20),
                e(Action::Snapshot, 0, 0),
                e(Action::SegmentAlloc, 1 << 41, 2 << 20),
                e(Action::Alloc, 1 << 41, 512),
            ],
            ..RecordedRun::default()
        };
        let ops = torch_ops(&run);
        assert_eq!(
            ops.iter().map(|(j, o)| (*j, o.owner)).collect::<Vec<_>>(),
            vec![(1, 0), (3, 4)]
        );
    }

    /// Segments released after a pool's `empty_cache` (a MemPool destroyed after entry
    /// 2), with no request between, belong to the call's entry, as the replay ties the
    /// call's releases to it; after calls that release nothing (a window's end after
    /// entry 6), a release is the next request's (an OOM retry's).
    #[test]
    fn releases_after_a_call_belong_to_the_call() {
        let run = RecordedRun {
            entries: vec![
                e(Action::Alloc, 1 << 40, 512),
                e(Action::FreeCompleted, 1 << 40, 512),
                e(Action::Snapshot, 0, 0),
                e(Action::SegmentFree, 1 << 40, 2 << 20),
                e(Action::SegmentFree, 1 << 41, 2 << 20),
                e(Action::Snapshot, 0, 0),
                e(Action::Snapshot, 0, 0),
                e(Action::SegmentFree, 1 << 42, 2 << 20),
                e(Action::SegmentAlloc, 1 << 43, 4 << 20),
                e(Action::Alloc, 1 << 43, 3 << 20),
            ],
            calls: vec![
                (
                    Some(2),
                    Event::ReleasePool {
                        pool: workloads::PoolId(0, 1),
                    },
                ),
                (
                    Some(2),
                    Event::EmptyPoolCache {
                        pool: workloads::PoolId(0, 1),
                    },
                ),
                (
                    Some(6),
                    Event::EndAllocateToPool {
                        pool: workloads::PoolId(0, 2),
                    },
                ),
            ],
            ..RecordedRun::default()
        };
        let ops = torch_ops(&run);
        assert_eq!(
            ops.iter().map(|(j, o)| (*j, o.owner)).collect::<Vec<_>>(),
            vec![(3, 2), (4, 2), (7, 9), (8, 9)]
        );
    }

    /// A delayed free (`free_requested` with its completion later) is replayed by the
    /// engine: the block leaves `allocated` at once, as the checkpoint taken between the
    /// two shows, and is not reused before its completion (the next request takes
    /// another block of the segment, no new segment).
    #[test]
    fn delayed_free_is_replayed() {
        let a = 0x7f00_0000_0000u64;
        let cp = |label: &str, trace_len, allocated, inactive_split| Checkpoint {
            label: label.into(),
            trace_len,
            allocated,
            reserved: 2 << 20,
            inactive_split,
            segments: 1,
            driver_free: 70 << 30,
            ..Checkpoint::default()
        };
        let run = RecordedRun {
            name: "delayed".into(),
            entries: vec![
                e(Action::SegmentAlloc, a, 2 << 20),
                e(Action::Alloc, a, 512),
                e(Action::FreeRequested, a, 512),
                e(Action::Alloc, a + 512, 512),
                e(Action::FreeCompleted, a, 512),
                e(Action::FreeRequested, a + 512, 512),
                e(Action::FreeCompleted, a + 512, 512),
            ],
            checkpoints: vec![
                cp("pending", 3, 0, (2 << 20) - 512),
                cp("both", 4, 512, (2 << 20) - 1024),
                cp("end", 7, 0, 0),
            ],
            final_stats: vec![
                ("reserved_bytes.all.peak".into(), f64::from(2 << 20)),
                ("allocated_bytes.all.peak".into(), 512.0),
            ],
            ..RecordedRun::default()
        };
        let trace = run.to_trace().unwrap();
        assert_eq!(
            trace.events[1],
            Event::FreeRequested {
                id: workloads::AllocId(0)
            }
        );
        let r = fidelity(
            &run,
            &FidelityOptions {
                check_invariants: true,
                ..FidelityOptions::default()
            },
        )
        .unwrap();
        assert!(r.row.exact, "{}", r.explain());
        assert_eq!(r.sim_ops.len(), 1);
        assert_eq!(
            r.checkpoints
                .iter()
                .map(|c| c.simulated[0])
                .collect::<Vec<_>>(),
            vec![0, 512, 0]
        );
    }

    /// Checkpoints are taken before the first entry (empty_cache markers aside) once
    /// `trace_len` entries were recorded, markers not counted; later ones at the end.
    #[test]
    fn checkpoints_map_to_entries() {
        let cp = |trace_len| Checkpoint {
            trace_len,
            ..Checkpoint::default()
        };
        let run = RecordedRun {
            entries: vec![
                e(Action::Alloc, 1, 1),
                e(Action::EmptyCache, 0, 0),
                e(Action::FreeCompleted, 1, 1),
                e(Action::EmptyCache, 0, 0),
            ],
            checkpoints: vec![cp(0), cp(1), cp(2), cp(3)],
            ..RecordedRun::default()
        };
        assert_eq!(checkpoint_entries(&run), vec![0, 2, usize::MAX, usize::MAX]);
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
            segments,
            driver_free: 70 * gib,
            ..Checkpoint::default()
        };
        let run = RecordedRun {
            name: "tiny".into(),
            meta: workloads::TraceMeta {
                total_bytes: Some(80 * gib),
                ..workloads::TraceMeta::default()
            },
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
