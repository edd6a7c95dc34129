//! [`probe`]: what the driver really charges, measured on the device.
//!
//! Allocates through a [`CudaDevice`] (so every allocation is freed on every path,
//! errors included) and reads `cuMemGetInfo` free memory around each step.

use policies::{AddressRange, Device, DeviceError, Segment};

use crate::device::{CudaDevice, OpenError};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The sizes [`probe`] allocates, one at a time and eight at a time: around the
/// driver's 2 MiB page and its packing of small allocations, and a few large ones.
pub const PROBE_SIZES: [u64; 12] = [
    1,
    512,
    4096,
    65536,
    MIB,
    2 * MIB - 1,
    2 * MIB,
    2 * MIB + 1,
    20 * MIB,
    20 * MIB + 512,
    64 * MIB + 1,
    GIB,
];

/// How many allocations of one size [`SizeProbe::x8_free_drop_bytes`] keeps live.
pub const PROBE_BATCH: u32 = 8;

/// Size of the chunks [`probe`] fills the device with first.
pub const FILL_CHUNK_BYTES: u64 = GIB;

/// Smallest chunk of the fill's top-up.
pub const FILL_MIN_CHUNK_BYTES: u64 = 2 * MIB;

/// One step of [`PLACEMENT_SCRIPT`]: what the driver is asked, by index of an earlier
/// step for frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementStep {
    /// `cuMemAlloc_v2` of this many bytes.
    Alloc(u64),
    /// `cuMemFree_v2` of the allocation made at this step.
    Free(usize),
    /// `cuMemAddressReserve` of this many bytes (no physical memory).
    Reserve(u64),
    /// `cuMemAddressFree` of the range reserved at this step.
    Release(usize),
}

/// The sequence of driver calls [`probe`] records the addresses of: what the
/// simulated device's address model (`sim/src/address.rs`) is built on. Chunk
/// granularity (consecutive 20 MiB allocations), 2 MiB allocations filling
/// leftovers, large allocations of odd sizes with small ones between, released space
/// reused (a hole of exactly a chunk's size, a chunk kept by a live allocation), and
/// address ranges reserved, released and reserved again. What is still allocated at
/// the end is freed in reverse order, each free recorded too.
pub const PLACEMENT_SCRIPT: &[PlacementStep] = {
    use PlacementStep::{Alloc, Free, Release, Reserve};
    &[
        // 0..8: eight 20 MiB allocations: the chunk granularity.
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        Alloc(20 * MIB),
        // 8..16: eight 2 MiB allocations: where leftovers are filled.
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        // 16..22: odd large sizes, 2 MiB ones between.
        Alloc(124 * MIB),
        Alloc(234 * MIB),
        Alloc(2 * MIB),
        Alloc(2 * MIB),
        Alloc(20 * MIB),
        Alloc(2 * MIB),
        // 22..30: a released chunk pair and what reuses it.
        Alloc(128 * MIB),
        Alloc(160 * MIB),
        Alloc(64 * MIB),
        Free(22),
        Free(23),
        Alloc(84 * MIB),
        Alloc(180 * MIB),
        Alloc(150 * MIB),
        // 30..35: a chunk kept alive by a small allocation in its leftover.
        Alloc(252 * MIB),
        Alloc(2 * MIB),
        Free(30),
        Alloc(150 * MIB),
        Alloc(68 * MIB),
        // 35..39: address ranges.
        Reserve(GIB),
        Reserve(4 * GIB),
        Release(35),
        Reserve(512 * MIB),
    ]
};

/// Which driver call a [`PlacementRecord`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementCall {
    /// `cuMemAlloc_v2`.
    Alloc,
    /// `cuMemFree_v2`.
    Free,
    /// `cuMemAddressReserve`.
    Reserve,
    /// `cuMemAddressFree`.
    Release,
}

impl PlacementCall {
    /// The driver function's name.
    pub fn name(self) -> &'static str {
        match self {
            PlacementCall::Alloc => "cuMemAlloc",
            PlacementCall::Free => "cuMemFree",
            PlacementCall::Reserve => "cuMemAddressReserve",
            PlacementCall::Release => "cuMemAddressFree",
        }
    }
}

/// One driver call of the placement probe and the address it returned (or freed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementRecord {
    /// The call.
    pub call: PlacementCall,
    /// Bytes asked for (of the allocation or range freed, for frees).
    pub size_bytes: u64,
    /// The address the driver returned, or the one freed.
    pub addr: u64,
}

/// The addresses the driver gave [`PLACEMENT_SCRIPT`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementProbe {
    /// Every call in order, the final frees included.
    pub records: Vec<PlacementRecord>,
    /// The address gap between consecutive 20 MiB allocations (the median of the
    /// seven), the driver's chunk granularity; `None` when they did not all fit.
    pub chunk_bytes: Option<u64>,
    /// Whether the script stopped early because the device ran out of memory.
    pub out_of_memory: bool,
}

/// Why [`probe`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The device could not be opened ([`OpenError::NoDriver`]: no driver or device).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A driver call failed during the measurements (everything allocated was freed).
    #[error("probe failed: {0}")]
    Device(#[from] DeviceError),
}

/// Free-memory drops for one allocation size. Drops are signed: other processes may
/// free memory meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeProbe {
    /// The size passed to `cuMemAlloc_v2`.
    pub size_bytes: u64,
    /// Drop of `cuMemGetInfo` free memory while one allocation of this size is live
    /// (what the driver charges for it); `None` if it did not fit.
    pub single_free_drop_bytes: Option<i64>,
    /// Drop left after that allocation was freed (expected 0); `None` if it did not fit.
    pub single_residual_bytes: Option<i64>,
    /// Duration of that `cuMemAlloc_v2`, in nanoseconds.
    pub alloc_ns: Option<u64>,
    /// Duration of its `cuMemFree_v2`, in nanoseconds.
    pub free_ns: Option<u64>,
    /// How many of [`PROBE_BATCH`] allocations of this size fitted at once.
    pub x8_live: u32,
    /// Drop of free memory while those `x8_live` allocations were live: below
    /// `x8_live` × the single drop when the driver packs small allocations together.
    pub x8_free_drop_bytes: i64,
}

/// Filling the device until `cuMemAlloc_v2` reports out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FillProbe {
    /// Chunks of [`FILL_CHUNK_BYTES`] (1 GiB) that fitted.
    pub big_chunks: u64,
    /// Free memory when the first 1 GiB chunk failed.
    pub free_after_big_chunks_bytes: u64,
    /// Top-up chunks that fitted afterwards (halving from 512 MiB down to 2 MiB).
    pub tail_chunks: u64,
    /// Bytes of those top-up chunks.
    pub tail_bytes: u64,
    /// Everything that could be allocated: big chunks plus top-up. The usable capacity.
    pub usable_bytes: u64,
    /// Free memory the driver still reported when nothing more fitted.
    pub free_at_full_bytes: u64,
    /// Wall time of the fill, in nanoseconds.
    pub fill_ns: u64,
}

/// What [`probe`] measured. Plain data; bytes unless named `_ns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// The CUDA device ordinal probed.
    pub device_index: usize,
    /// `cuDeviceGetName`.
    pub device_name: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor (12080 = CUDA 12.8).
    pub driver_version: i32,
    /// (major, minor) compute capability.
    pub compute_capability: (i32, i32),
    /// Total device memory (`cuMemGetInfo` total).
    pub total_bytes: u64,
    /// Free memory at start, after this process's context was created.
    pub free_at_start_bytes: u64,
    /// `total_bytes - free_at_start_bytes`: this process's context plus whatever other
    /// processes hold (on an otherwise idle GPU, the context's share).
    pub context_bytes: u64,
    /// VMM granularity (`MINIMUM`) for a pinned device allocation; `None` without VMM.
    pub vmm_granularity_min_bytes: Option<u64>,
    /// VMM granularity (`RECOMMENDED`); `None` without VMM.
    pub vmm_granularity_recommended_bytes: Option<u64>,
    /// Duration of a first 1-byte `cuMemAlloc_v2` (first-call costs), not part of
    /// `sizes`.
    pub warmup_alloc_ns: u64,
    /// One entry per size of [`PROBE_SIZES`], in that order.
    pub sizes: Vec<SizeProbe>,
    /// The addresses of [`PLACEMENT_SCRIPT`].
    pub placement: PlacementProbe,
    /// Filling the device.
    pub fill: FillProbe,
    /// Free memory after everything was freed again.
    pub free_after_release_bytes: u64,
    /// Whether `free_after_release_bytes == free_at_start_bytes` (nothing leaked, no
    /// other process changed its usage meanwhile).
    pub returned_to_start: bool,
}

/// Opens device `device_index` and measures: its identity, memory at start, VMM
/// granularity, for each of [`PROBE_SIZES`] the free-memory drop of one and of eight
/// live allocations with their alloc/free times, and the usable capacity (1 GiB chunks
/// until out of memory, then halving chunks down to 2 MiB). Everything is freed
/// afterwards and free memory compared with its starting value.
///
/// Fills the whole device for a moment: run it on an idle GPU, other processes on it
/// may run out of memory meanwhile.
///
/// # Errors
/// [`ProbeError::Open`] when the device cannot be opened, [`ProbeError::Device`] when a
/// driver call fails (everything allocated so far is freed when the device drops).
pub fn probe(device_index: usize) -> Result<ProbeReport, ProbeError> {
    let mut dev = CudaDevice::open(device_index)?;
    let info = dev.info().clone();
    let free_at_start = dev.observed_free_bytes()?;

    let warm = dev.allocate_segment(1)?;
    let warmup_alloc_ns = dev.last_alloc_ns();
    dev.free_segment(warm)?;

    let mut sizes = Vec::with_capacity(PROBE_SIZES.len());
    for &size in &PROBE_SIZES {
        sizes.push(probe_size(&mut dev, size)?);
    }
    let placement = probe_placement(&mut dev)?;
    let fill = fill(&mut dev, info.total_bytes)?;
    let free_after_release = dev.observed_free_bytes()?;
    dev.release_all()?;

    Ok(ProbeReport {
        device_index,
        device_name: info.name,
        driver_version: info.driver_version,
        compute_capability: info.compute_capability,
        total_bytes: info.total_bytes,
        free_at_start_bytes: free_at_start,
        context_bytes: info.total_bytes.saturating_sub(free_at_start),
        vmm_granularity_min_bytes: info.vmm_granularity_min_bytes,
        vmm_granularity_recommended_bytes: info.vmm_granularity_recommended_bytes,
        warmup_alloc_ns,
        sizes,
        placement,
        fill,
        free_after_release_bytes: free_after_release,
        returned_to_start: free_after_release == free_at_start,
    })
}

/// One process's usable memory: what [`probe_fill`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldBack {
    /// Free memory at start, after this process's context was created.
    pub free_at_start_bytes: u64,
    /// Everything that could be allocated (as [`FillProbe::usable_bytes`]).
    pub usable_bytes: u64,
}

impl HoldBack {
    /// Free memory this process could not allocate: free at start − usable.
    pub fn held_back_bytes(&self) -> u64 {
        self.free_at_start_bytes.saturating_sub(self.usable_bytes)
    }
}

/// The part of [`probe`] that measures the usable memory, alone: opens device
/// `device_index`, reads the free memory, makes one warm-up allocation, fills the device
/// as [`probe`] does and frees everything. `allocsim probe --processes N` runs it in
/// separate processes, because on some GPUs the driver holds back a different amount of
/// the free memory in each process (the H200).
///
/// # Errors
/// As [`probe`].
pub fn probe_fill(device_index: usize) -> Result<HoldBack, ProbeError> {
    let mut dev = CudaDevice::open(device_index)?;
    let total = dev.info().total_bytes;
    let free_at_start = dev.observed_free_bytes()?;
    let warm = dev.allocate_segment(1)?;
    dev.free_segment(warm)?;
    let fill = fill(&mut dev, total)?;
    dev.release_all()?;
    Ok(HoldBack {
        free_at_start_bytes: free_at_start,
        usable_bytes: fill.usable_bytes,
    })
}

/// `before - after` as a signed drop.
fn drop_between(before: u64, after: u64) -> i64 {
    i128::from(before)
        .saturating_sub(i128::from(after))
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// `Ok(None)` for out of memory, other errors passed on.
fn try_allocate(dev: &mut CudaDevice, size: u64) -> Result<Option<Segment>, DeviceError> {
    match dev.allocate_segment(size) {
        Ok(s) => Ok(Some(s)),
        Err(DeviceError::OutOfMemory { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn free_all(dev: &mut CudaDevice, segments: Vec<Segment>) -> Result<(), DeviceError> {
    for s in segments {
        dev.free_segment(s)?;
    }
    Ok(())
}

fn probe_size(dev: &mut CudaDevice, size: u64) -> Result<SizeProbe, DeviceError> {
    let before = dev.observed_free_bytes()?;
    let (mut single_drop, mut residual, mut alloc_ns, mut free_ns) = (None, None, None, None);
    if let Some(seg) = try_allocate(dev, size)? {
        alloc_ns = Some(dev.last_alloc_ns());
        single_drop = Some(drop_between(before, dev.observed_free_bytes()?));
        dev.free_segment(seg)?;
        free_ns = Some(dev.last_free_ns());
        residual = Some(drop_between(before, dev.observed_free_bytes()?));
    }

    let before = dev.observed_free_bytes()?;
    let mut live = Vec::with_capacity(PROBE_BATCH as usize);
    for _ in 0..PROBE_BATCH {
        match try_allocate(dev, size)? {
            Some(seg) => live.push(seg),
            None => break,
        }
    }
    let during = dev.observed_free_bytes()?;
    let x8_live = live.len() as u32;
    free_all(dev, live)?;
    Ok(SizeProbe {
        size_bytes: size,
        single_free_drop_bytes: single_drop,
        single_residual_bytes: residual,
        alloc_ns,
        free_ns,
        x8_live,
        x8_free_drop_bytes: drop_between(before, during),
    })
}

/// What a step of the placement probe still holds.
enum Held {
    Segment(Segment),
    Range(AddressRange),
    Gone,
}

/// Frees what `held` holds (recording the call) and leaves it empty.
fn free_held(
    dev: &mut CudaDevice,
    held: &mut Held,
    records: &mut Vec<PlacementRecord>,
) -> Result<(), DeviceError> {
    match std::mem::replace(held, Held::Gone) {
        Held::Segment(seg) => {
            let (addr, size_bytes) = (seg.addr.0, seg.size_bytes);
            dev.free_segment(seg)?;
            records.push(PlacementRecord {
                call: PlacementCall::Free,
                size_bytes,
                addr,
            });
        }
        Held::Range(range) => {
            let (addr, size_bytes) = (range.addr.0, range.size_bytes);
            if let Some(vm) = dev.virtual_memory() {
                vm.release_range(range)?;
            }
            records.push(PlacementRecord {
                call: PlacementCall::Release,
                size_bytes,
                addr,
            });
        }
        Held::Gone => {}
    }
    Ok(())
}

/// The median address gap between the first eight allocations (20 MiB each), if all
/// eight were made.
fn chunk_gap(records: &[PlacementRecord]) -> Option<u64> {
    let firsts: Vec<u64> = records
        .iter()
        .take(8)
        .filter(|r| r.call == PlacementCall::Alloc && r.size_bytes == 20 * MIB)
        .map(|r| r.addr)
        .collect();
    if firsts.len() < 8 {
        return None;
    }
    let mut gaps: Vec<u64> = firsts.windows(2).map(|w| w[0].abs_diff(w[1])).collect();
    gaps.sort_unstable();
    Some(gaps[gaps.len() / 2])
}

/// Runs [`PLACEMENT_SCRIPT`], recording every address, then frees what is left (also
/// after an error).
fn probe_placement(dev: &mut CudaDevice) -> Result<PlacementProbe, DeviceError> {
    let mut held: Vec<Held> = Vec::with_capacity(PLACEMENT_SCRIPT.len());
    let mut out = PlacementProbe::default();
    let mut result = Ok(());
    for step in PLACEMENT_SCRIPT {
        let done = match *step {
            PlacementStep::Alloc(size) => try_allocate(dev, size).map(|seg| match seg {
                Some(seg) => {
                    out.records.push(PlacementRecord {
                        call: PlacementCall::Alloc,
                        size_bytes: size,
                        addr: seg.addr.0,
                    });
                    held.push(Held::Segment(seg));
                    true
                }
                None => false,
            }),
            PlacementStep::Reserve(size) => match dev.virtual_memory() {
                None => {
                    held.push(Held::Gone);
                    Ok(true)
                }
                Some(vm) => vm.reserve_range(size).map(|r| {
                    out.records.push(PlacementRecord {
                        call: PlacementCall::Reserve,
                        size_bytes: size,
                        addr: r.addr.0,
                    });
                    held.push(Held::Range(r));
                    true
                }),
            },
            PlacementStep::Free(i) | PlacementStep::Release(i) => {
                held.push(Held::Gone);
                free_held(dev, &mut held[i], &mut out.records).map(|()| true)
            }
        };
        match done {
            Ok(true) => {}
            Ok(false) => {
                out.out_of_memory = true;
                break;
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    out.chunk_bytes = chunk_gap(&out.records);
    for slot in held.iter_mut().rev() {
        let freed = free_held(dev, slot, &mut out.records);
        if result.is_ok() {
            result = freed;
        }
    }
    result.map(|()| out)
}

fn fill(dev: &mut CudaDevice, total_bytes: u64) -> Result<FillProbe, DeviceError> {
    let started = std::time::Instant::now();
    // Can never legitimately fit more; a guard against a driver that never says no.
    let cap = total_bytes / FILL_CHUNK_BYTES + 8;
    let mut big = Vec::new();
    while (big.len() as u64) < cap {
        match try_allocate(dev, FILL_CHUNK_BYTES)? {
            Some(seg) => big.push(seg),
            None => break,
        }
    }
    let free_after_big = dev.observed_free_bytes()?;
    let mut tail = Vec::new();
    let mut tail_bytes = 0;
    let mut chunk = FILL_CHUNK_BYTES / 2;
    while chunk >= FILL_MIN_CHUNK_BYTES {
        match try_allocate(dev, chunk)? {
            Some(seg) => {
                tail_bytes += chunk;
                tail.push(seg);
            }
            None => chunk /= 2,
        }
    }
    let fill_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let free_at_full = dev.observed_free_bytes()?;
    let report = FillProbe {
        big_chunks: big.len() as u64,
        free_after_big_chunks_bytes: free_after_big,
        tail_chunks: tail.len() as u64,
        tail_bytes,
        usable_bytes: big.len() as u64 * FILL_CHUNK_BYTES + tail_bytes,
        free_at_full_bytes: free_at_full,
        fill_ns,
    };
    free_all(dev, tail)?;
    free_all(dev, big)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signed drops saturate instead of overflowing.
    #[test]
    fn drops_are_signed() {
        assert_eq!(drop_between(10, 4), 6);
        assert_eq!(drop_between(4, 10), -6);
        assert_eq!(drop_between(u64::MAX, 0), i64::MAX);
    }

    /// The placement script only frees what it allocated before, each thing once.
    #[test]
    fn placement_script_is_consistent() {
        let mut freed = std::collections::HashSet::new();
        for (i, step) in PLACEMENT_SCRIPT.iter().enumerate() {
            match *step {
                PlacementStep::Free(j) => {
                    assert!(j < i && matches!(PLACEMENT_SCRIPT[j], PlacementStep::Alloc(_)));
                    assert!(freed.insert(j), "step {i} frees {j} twice");
                }
                PlacementStep::Release(j) => {
                    assert!(j < i && matches!(PLACEMENT_SCRIPT[j], PlacementStep::Reserve(_)));
                    assert!(freed.insert(j), "step {i} releases {j} twice");
                }
                _ => {}
            }
        }
        assert!(PLACEMENT_SCRIPT[..8]
            .iter()
            .all(|s| *s == PlacementStep::Alloc(20 * MIB)));
    }

    /// The chunk gap is the median gap of the first eight 20 MiB allocations, and
    /// unknown when they were not all made.
    #[test]
    fn chunk_gap_is_the_median() {
        let rec = |addr| PlacementRecord {
            call: PlacementCall::Alloc,
            size_bytes: 20 * MIB,
            addr,
        };
        let top = 1u64 << 46;
        let mut r: Vec<_> = (0..8).map(|i| rec(top - i * 32 * MIB)).collect();
        r[7].addr = top - 900 * MIB; // one jump
        assert_eq!(chunk_gap(&r), Some(32 * MIB));
        assert_eq!(chunk_gap(&r[..7]), None);
    }

    /// The probed sizes are the ones the oracle measured, around the 2 MiB page.
    #[test]
    fn probe_sizes() {
        assert_eq!(PROBE_SIZES.len(), 12);
        assert!(PROBE_SIZES.contains(&(2 * MIB - 1)) && PROBE_SIZES.contains(&(2 * MIB + 1)));
        assert!(PROBE_SIZES.windows(2).all(|w| w[0] < w[1]));
    }
}
