//! The setup a recorded PyTorch run describes, derived in one place from the run and its
//! [`TraceMeta`]: the caching configuration it ran with, the
//! device it ran on, and the segment addresses it got (as hints for the simulated
//! device). Fidelity and the CLI's loading of recorded traces both use these.

use policies::caching::{CachingConfig, CachingDefaults, MemoryLimit};
use workloads::{Action, RecordedRun, TraceMeta};

use crate::address::RecordedPlacement;
use crate::device::{AddressHints, SimDeviceOptions};

/// Why a recorded run's address hints could not be derived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    /// The run's `alloc_conf` does not parse (a run PyTorch would have refused is not
    /// followed).
    #[error(transparent)]
    Config(#[from] AllocConfError),
    /// A recorded segment lies outside any device's address space: the file is damaged.
    #[error(
        "{path}: entry {entry}: {action} address {addr:#x} of {size} bytes lies outside a \
         device's address space (2 MiB to 2^64 - 2 MiB); the recording is damaged"
    )]
    Address {
        /// The run's file.
        path: String,
        /// The entry's index in the file.
        entry: u64,
        /// `segment_alloc` or `segment_map`.
        action: &'static str,
        /// The recorded address.
        addr: u64,
        /// The recorded bytes.
        size: u64,
    },
    /// An address hint a trace carries lies outside any device's address space.
    #[error(
        "{path}: recorded: {what}: item {item}: address {addr:#x} of {size} bytes lies outside \
         a device's address space (2 MiB to 2^64 - 2 MiB)"
    )]
    TraceAddress {
        /// The trace's file.
        path: String,
        /// `segments` or `ranges`.
        what: &'static str,
        /// The item's position in its list, from 1.
        item: u64,
        /// The address.
        addr: u64,
        /// The bytes (0 for a range).
        size: u64,
    },
}

/// A recorded run whose `alloc_conf` does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: alloc_conf '{conf}': {message}")]
pub struct AllocConfError {
    /// The run's file.
    pub path: String,
    /// The configuration string.
    pub conf: String,
    /// PyTorch's error.
    pub message: String,
}

/// Settings given instead of the ones a recorded run recorded (command-line flags).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// A `PYTORCH_CUDA_ALLOC_CONF` string replacing the recorded one.
    pub alloc_conf: Option<String>,
    /// A memory limit replacing the recorded cap.
    pub memory_limit: Option<MemoryLimit>,
}

/// The caching configuration a recorded run ran with: its `PYTORCH_CUDA_ALLOC_CONF`
/// (PyTorch's defaults when none is recorded) and its memory fraction.
///
/// # Errors
/// When its `alloc_conf` does not parse.
pub fn run_config(run: &RecordedRun) -> Result<CachingConfig, AllocConfError> {
    run_config_with(run, &Overrides::default())
}

/// [`run_config`] with `overrides` in place of what the run recorded.
///
/// # Errors
/// When the `alloc_conf` in force does not parse.
pub fn run_config_with(
    run: &RecordedRun,
    overrides: &Overrides,
) -> Result<CachingConfig, AllocConfError> {
    let conf = overrides
        .alloc_conf
        .as_deref()
        .or(run.meta.alloc_conf.as_deref())
        .unwrap_or("");
    let mut config = CachingConfig::from_alloc_conf(conf).map_err(|e| AllocConfError {
        path: run.path.display().to_string(),
        conf: conf.to_string(),
        message: e.to_string(),
    })?;
    match overrides.memory_limit {
        Some(limit) => config.memory_limit = limit,
        None => {
            if let Some(f) = run.meta.memory_fraction() {
                config.memory_limit = MemoryLimit::Fraction(f);
            }
        }
    }
    Ok(config)
}

/// The simulated device a recorded run ran on: `base` with the run's total, and as
/// capacity the least free memory the driver reported plus what PyTorch held at that
/// moment (without a checkpoint that reported it, the total less what `base` keeps
/// back).
pub fn run_device(run: &RecordedRun, base: &SimDeviceOptions) -> SimDeviceOptions {
    let mut d = base.clone();
    if let Some(total) = run.meta.total_bytes {
        d.total_bytes = total;
        d.capacity_bytes =
            total.saturating_sub(base.total_bytes.saturating_sub(base.capacity_bytes));
    }
    if let Some(cap) = run
        .checkpoints
        .iter()
        .map(|c| c.driver_free.saturating_add(c.reserved))
        .min()
    {
        d.capacity_bytes = cap;
    }
    d.capacity_bytes = d.capacity_bytes.min(d.total_bytes);
    d
}

/// The device a replay of a recorded run takes when no flag names one: the device the
/// run recorded ([`run_device`] over `base`: its total, and as capacity the least free
/// memory the driver reported plus what PyTorch held then), named after its card, as
/// `fidelity` replays it. `None` for a run that records no device total (snapshot
/// pickles, traces of other formats): those replay on the flags' device. A run recorded
/// on a card larger than the default 80 GiB ran out of memory at its first large request
/// on the default device.
pub fn recorded_device(run: &RecordedRun, base: &SimDeviceOptions) -> Option<SimDeviceOptions> {
    run.meta.total_bytes?;
    let mut d = run_device(run, base);
    d.name = format!(
        "{}, as recorded",
        run.meta.device.as_deref().unwrap_or("the recorded GPU")
    );
    // The capacity is this run's own; how it varies between processes does not apply.
    d.usable_spread_bytes = 0;
    Some(d)
}

/// Recorded segment addresses, for best-fit ties: each `segment_alloc`'s (size,
/// address), and the base of each expandable segment (the first mapping outside every
/// known range). A mapping belongs to a known range when it lies less than the
/// narrowest range PyTorch reserves above its base: the small pool's, the device's total
/// and an eighth in 2 MiB pages ([`policies::caching::expandable_range_bytes`], the one
/// owner of that size). No device, real or simulated, places a range inside another, so
/// the next range starts at least that far above a base, and no mapping reaches that
/// far (a range maps at most the device's memory, from its bottom). The total is the
/// run's, or `total_bytes` (the simulated device's) when the run does not record one.
///
/// Only the caching policy follows them ([`AddressHints::for_policy`]).
///
/// # Errors
/// When the run's `alloc_conf` does not parse, or a segment's recorded address and size
/// leave the address space ([`AddressHints::fits`]).
pub fn address_hints(run: &RecordedRun, total_bytes: u64) -> Result<AddressHints, HintError> {
    // The configuration decides nothing here, but a run whose settings PyTorch would
    // refuse is refused here too rather than followed.
    run_config(run)?;
    let total_bytes = run.meta.total_bytes.unwrap_or(total_bytes);
    let mut hints = AddressHints::default();
    let window = policies::caching::expandable_range_bytes(
        total_bytes,
        policies::caching::SMALL_BUFFER_BYTES,
    );
    let mut bases: Vec<u64> = Vec::new();
    for (index, e) in run.entries.iter().enumerate() {
        if e.action.is_segment_op() && !AddressHints::fits(e.addr, e.size) {
            return Err(HintError::Address {
                path: run.path.display().to_string(),
                entry: run.source_index(index),
                action: e.action.name(),
                addr: e.addr,
                size: e.size,
            });
        }
        match e.action {
            Action::SegmentAlloc => hints.segments.push_back((e.size, e.addr)),
            Action::SegmentMap
                if !bases
                    .iter()
                    .any(|&b| e.addr >= b && e.addr < b.saturating_add(window)) =>
            {
                bases.push(e.addr);
                hints.ranges.push_back(e.addr);
            }
            _ => {}
        }
    }
    Ok(hints)
}

/// The hints a trace carries in its metadata (a YAML trace converted from a recorded
/// run: [`workloads::TraceMeta::addresses`]); none when it carries none.
///
/// # Errors
/// An address outside a device's address space (the file is damaged).
pub fn trace_hints(trace: &workloads::Trace) -> Result<AddressHints, HintError> {
    let Some(a) = &trace.meta.addresses else {
        return Ok(AddressHints::default());
    };
    let path = || {
        trace
            .path
            .as_ref()
            .map_or_else(|| trace.name.clone(), |p| p.display().to_string())
    };
    let bad = |what: &'static str, item: usize, addr: u64, size: u64| HintError::TraceAddress {
        path: path(),
        what,
        item: item as u64 + 1,
        addr,
        size,
    };
    for (i, &(size, addr)) in a.segments.iter().enumerate() {
        if !AddressHints::fits(addr, size) {
            return Err(bad("segments", i, addr, size));
        }
    }
    for (i, &addr) in a.ranges.iter().enumerate() {
        if !AddressHints::fits(addr, 0) {
            return Err(bad("ranges", i, addr, 0));
        }
    }
    Ok(AddressHints {
        segments: a.segments.iter().copied().collect(),
        ranges: a.ranges.iter().copied().collect(),
    })
}

/// The hints of a recorded run in the form a trace carries them
/// ([`workloads::TraceMeta::addresses`]), for `convert` to write.
///
/// # Errors
/// As [`address_hints`].
pub fn recorded_addresses(
    run: &RecordedRun,
    total_bytes: u64,
) -> Result<workloads::RecordedAddresses, HintError> {
    let hints = address_hints(run, total_bytes)?;
    Ok(workloads::RecordedAddresses {
        segments: hints.segments.into_iter().collect(),
        ranges: hints.ranges.into_iter().collect(),
    })
}

/// The run's `cudaMalloc`s and `cudaFree`s in order, for
/// [`crate::address::check_placements`].
pub fn placements(run: &RecordedRun) -> Vec<RecordedPlacement> {
    run.entries
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree))
        .map(|e| RecordedPlacement {
            alloc: e.action == Action::SegmentAlloc,
            addr: e.addr,
            size: e.size,
        })
        .collect()
}

/// What the caller asks instead of a recorded run's settings, and how the caller names
/// each (`--cap` on the command line, `cap=` in Python), for the line saying what
/// applies.
#[derive(Clone, Debug, PartialEq)]
pub struct SettingFlags {
    /// A `PYTORCH_CUDA_ALLOC_CONF` string replacing the recorded one.
    pub alloc_conf: Option<String>,
    /// A memory limit replacing the recorded cap, with the name of what gave it.
    pub memory_limit: Option<(MemoryLimit, &'static str)>,
    /// The name of the capacity given, if one was: a capacity asks about another card,
    /// so a recorded cap (the recording's way of making a smaller one) does not apply.
    pub capacity: Option<&'static str>,
    /// How the caller names the `alloc_conf` and the cap settings.
    pub names: (&'static str, &'static str),
}

/// The caching settings a replay runs with, and what to tell people about them.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The `alloc_conf` and the memory limit in force: the caller's where given, else
    /// what the recording says.
    pub caching: CachingDefaults,
    /// One line saying which recorded settings apply and which the caller replaced;
    /// `None` when the trace records none that differ from PyTorch's defaults.
    pub note: Option<String>,
}

/// The settings a recorded run ran with apply to its replay unless the caller replaces
/// them: its `PYTORCH_CUDA_ALLOC_CONF` unless an `alloc_conf` is given, its cap (the
/// limit PyTorch computed from it on the recorded device, in bytes) unless a memory
/// limit or a capacity is given (a capacity asks about another card; a recorded cap was
/// the recording's way of making a smaller one). Traces that record no settings (YAML,
/// CSV, RMM logs) take the caller's alone. The one owner of this rule: the command
/// line and the Python package both ask it.
pub fn settings(meta: &TraceMeta, flags: &SettingFlags) -> Settings {
    let (conf_name, cap_name) = flags.names;
    let mut caching = CachingDefaults {
        alloc_conf: flags.alloc_conf.clone(),
        memory_limit: flags.memory_limit.map(|(limit, _)| limit),
    };
    let mut applied = Vec::new();
    let mut replaced = Vec::new();
    match (&meta.alloc_conf, &flags.alloc_conf) {
        (Some(conf), None) => {
            if !conf.is_empty() {
                applied.push(format!("PYTORCH_CUDA_ALLOC_CONF={conf:?}"));
            }
            caching.alloc_conf = Some(conf.clone());
        }
        (Some(conf), Some(_)) if !conf.is_empty() => {
            replaced.push(format!(
                "PYTORCH_CUDA_ALLOC_CONF={conf:?} ({conf_name} given)"
            ));
        }
        _ => {}
    }
    if let Some(limit) = recorded_limit(meta) {
        let cap = format!("cap {}", units::format_size_human(limit));
        match flags.memory_limit.map(|(_, name)| name).or(flags.capacity) {
            Some(name) => replaced.push(format!("{cap} ({name} given)")),
            None => {
                applied.push(format!("{cap} ({limit} bytes)"));
                caching.memory_limit = Some(MemoryLimit::Bytes(limit));
            }
        }
    }
    let note = match (applied.is_empty(), replaced.is_empty()) {
        (true, true) => None,
        (false, true) => Some(format!(
            "{} as recorded ({conf_name}, {cap_name} replace them)",
            applied.join(", ")
        )),
        (true, false) => Some(format!("not applied: {}", replaced.join(", "))),
        (false, false) => Some(format!(
            "{} as recorded; not applied: {}",
            applied.join(", "),
            replaced.join(", ")
        )),
    };
    Settings { caching, note }
}

/// The limit a recorded cap gave PyTorch on the recorded device: `floor(cap / total ×
/// total)` in double arithmetic (`set_per_process_memory_fraction(cap / total)`, as
/// the recorder calls it); `None` without a cap, or for a fraction of 1 or more (no
/// limit).
fn recorded_limit(meta: &TraceMeta) -> Option<u64> {
    let f = meta.memory_fraction()?;
    let total = meta.total_bytes?;
    (f < 1.0).then_some((f * total as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::{RecordedEntry, TraceMeta};

    fn entry(action: Action, addr: u64, size: u64) -> RecordedEntry {
        RecordedEntry {
            action,
            addr,
            size,
            stream: 0,
        }
    }

    /// A recorded alloc_conf that does not parse is an error naming the file and the
    /// string, not silently PyTorch's defaults.
    #[test]
    fn bad_alloc_conf_is_an_error() {
        let run = RecordedRun {
            path: "runs/x.json".into(),
            meta: TraceMeta {
                alloc_conf: Some("max_split_size_mb:oops".into()),
                ..TraceMeta::default()
            },
            ..RecordedRun::default()
        };
        let e = address_hints(&run, 80 << 30).unwrap_err().to_string();
        assert!(
            e.starts_with("runs/x.json: alloc_conf 'max_split_size_mb:oops': "),
            "{e}"
        );
        assert!(run_config(&run).is_err());
    }

    /// Segment allocations become address hints in order; mappings inside a known
    /// range are not new ranges, and the range window comes from the recorded total
    /// when there is one, else from the device's.
    #[test]
    fn hints_follow_the_recording() {
        let gib = 1u64 << 30;
        let base = 0x7f00_0000_0000;
        let mut run = RecordedRun {
            entries: vec![
                entry(Action::SegmentAlloc, 0x4000_0000, 2 << 20),
                entry(Action::SegmentMap, base, 2 << 20),
                entry(Action::SegmentMap, base + 40 * gib, 2 << 20),
                entry(Action::SegmentAlloc, 0x9000_0000, 20 << 20),
            ],
            ..RecordedRun::default()
        };
        let hints = address_hints(&run, 80 * gib).unwrap();
        assert_eq!(
            hints.segments.iter().copied().collect::<Vec<_>>(),
            vec![(2 << 20, 0x4000_0000), (20 << 20, 0x9000_0000)]
        );
        assert_eq!(hints.ranges.iter().copied().collect::<Vec<_>>(), vec![base]);
        // A 32 GiB device's ranges are 36 GiB: the second mapping starts a new one.
        assert_eq!(address_hints(&run, 32 * gib).unwrap().ranges.len(), 2);
        run.meta.total_bytes = Some(32 * gib);
        assert_eq!(address_hints(&run, 80 * gib).unwrap().ranges.len(), 2);
    }

    /// The expandable ranges the simulated device reserves on an H100 (the small pool's
    /// range first, 91 213.875 MiB, then the large pool's, 91 220 MiB) are two hints:
    /// the hints measure a range as the narrowest PyTorch reserves, which no device
    /// places another range inside (they once measured it as the large pool's, wider
    /// than the device's spacing, and took the second range for part of the first).
    #[test]
    fn ranges_the_simulated_device_places_are_all_hints() {
        use policies::caching::{expandable_range_bytes, SMALL_BUFFER_BYTES};
        use policies::Device as _;
        let total = 85_017_493_504;
        let mut device = crate::SimDevice::new(SimDeviceOptions {
            total_bytes: total,
            capacity_bytes: total,
            ..SimDeviceOptions::default()
        });
        let vm = device.virtual_memory().unwrap();
        let small = vm
            .reserve_range(expandable_range_bytes(total, SMALL_BUFFER_BYTES))
            .unwrap();
        let large = vm
            .reserve_range(expandable_range_bytes(total, 20 << 20))
            .unwrap();
        let run = RecordedRun {
            meta: TraceMeta {
                total_bytes: Some(total),
                ..TraceMeta::default()
            },
            entries: vec![
                entry(Action::SegmentMap, small.addr.0, 2 << 20),
                entry(Action::SegmentMap, large.addr.0, 20 << 20),
                entry(Action::SegmentMap, large.addr.0 + (20 << 20), 20 << 20),
                entry(Action::SegmentMap, small.addr.0 + (2 << 20), 2 << 20),
            ],
            ..RecordedRun::default()
        };
        let hints = address_hints(&run, total).unwrap();
        assert_eq!(
            hints.ranges.iter().copied().collect::<Vec<_>>(),
            vec![small.addr.0, large.addr.0]
        );
    }

    /// A recorded segment address near 0 or near 2^64 (a damaged file) is refused with
    /// the file, the entry and the address, rather than steering the simulated device
    /// out of its address space.
    #[test]
    fn addresses_outside_the_address_space_are_refused() {
        for (addr, size) in [
            (1, 2 << 20),
            (0, 2 << 20),
            (u64::MAX - (1 << 20), 2 << 20),
            (1 << 63, u64::MAX),
        ] {
            let run = RecordedRun {
                path: "runs/x.json".into(),
                entries: vec![
                    entry(Action::SegmentAlloc, 0x7f00_0000_0000, 2 << 20),
                    entry(Action::SegmentAlloc, addr, size),
                ],
                ..RecordedRun::default()
            };
            let e = address_hints(&run, 80 << 30).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!(
                    "runs/x.json: entry 1: segment_alloc address {addr:#x} of {size} bytes lies outside"
                )),
                "{e}"
            );
        }
    }

    /// A damaged recorded total (u64::MAX) and checkpoints whose figures add past 2^64
    /// give the widest window and the largest capacity, without wrapping.
    #[test]
    fn damaged_totals_do_not_wrap() {
        let run = RecordedRun {
            meta: TraceMeta {
                total_bytes: Some(u64::MAX),
                ..TraceMeta::default()
            },
            entries: vec![
                entry(Action::SegmentMap, 0x7f00_0000_0000, 2 << 20),
                entry(Action::SegmentMap, 0x7f00_4000_0000, 2 << 20),
            ],
            checkpoints: vec![workloads::Checkpoint {
                reserved: u64::MAX,
                driver_free: u64::MAX,
                ..workloads::Checkpoint::default()
            }],
            ..RecordedRun::default()
        };
        assert_eq!(address_hints(&run, 80 << 30).unwrap().ranges.len(), 1);
        let d = run_device(&run, &SimDeviceOptions::default());
        assert_eq!((d.capacity_bytes, d.total_bytes), (u64::MAX, u64::MAX));
    }

    /// The recorded device: none without a recorded total; its card's name; without a
    /// checkpoint, its total less what the base device keeps back (it was the base's
    /// capacity, 80 GiB, whatever the run's card), with one, what the checkpoints say.
    #[test]
    fn the_recorded_device() {
        let gib = 1u64 << 30;
        let base = SimDeviceOptions {
            capacity_bytes: 79 * gib,
            ..SimDeviceOptions::default()
        };
        let mut run = RecordedRun::default();
        assert!(recorded_device(&run, &base).is_none());
        run.meta.total_bytes = Some(140 * gib);
        run.meta.device = Some("NVIDIA H200".into());
        let d = recorded_device(&run, &base).unwrap();
        assert_eq!(d.name, "NVIDIA H200, as recorded");
        assert_eq!((d.total_bytes, d.capacity_bytes), (140 * gib, 139 * gib));
        assert_eq!(d.usable_spread_bytes, 0);
        run.checkpoints = vec![workloads::Checkpoint {
            reserved: 2 * gib,
            driver_free: 130 * gib,
            ..workloads::Checkpoint::default()
        }];
        assert_eq!(
            recorded_device(&run, &base).unwrap().capacity_bytes,
            132 * gib
        );
    }
}
