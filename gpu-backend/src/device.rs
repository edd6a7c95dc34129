//! [`CudaDevice`]: the policies' [`Device`] and [`VirtualMemory`] on real CUDA memory.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, Segment, SegmentId, VirtualMemory,
};

use crate::{conv, loader};

#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "gpu-backend needs a 64-bit target (device sizes are passed to the driver as usize)"
);

/// The step of [`CudaDevice::set_ballast_for_free_bytes`]: the driver charges whole
/// 2 MiB pages for `cuMemAlloc`, so ballast chunks are multiples of 2 MiB and the free
/// memory left lands within 2 MiB above the target.
pub const BALLAST_GRANULE_BYTES: u64 = 2 << 20;

/// Why [`CudaDevice::open`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No usable driver or device: libcuda cannot be loaded or lacks symbols this crate
    /// needs, `cuInit` failed (no GPU, driver/library mismatch, ...), or the driver
    /// reports no device with this index. The message is one line; a command-line tool
    /// prints it and exits with status 3.
    #[error("no usable CUDA driver or device: {0}")]
    NoDriver(String),
    /// The driver is up but opening the device failed (retaining its primary context,
    /// reading its properties).
    #[error("opening the CUDA device failed: {0}")]
    Driver(DeviceError),
}

/// What [`CudaDevice::open`] learnt about the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA device ordinal that was opened.
    pub index: usize,
    /// `cuDeviceGetName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor, e.g. 12080 for CUDA 12.8.
    pub driver_version: i32,
    /// (major, minor) compute capability, e.g. (9, 0) for an H100.
    pub compute_capability: (i32, i32),
    /// Total device memory (`cuMemGetInfo` total).
    pub total_bytes: u64,
    /// Free device memory right after the primary context was made current (what this
    /// process's context and every other process left).
    pub free_at_open_bytes: u64,
    /// `cuMemGetAllocationGranularity(MINIMUM)` for a pinned device allocation; `None`
    /// when the device or driver has no virtual memory management.
    pub vmm_granularity_min_bytes: Option<u64>,
    /// `cuMemGetAllocationGranularity(RECOMMENDED)`; `None` like the minimum.
    pub vmm_granularity_recommended_bytes: Option<u64>,
}

/// Sum and count of timed driver calls.
#[derive(Clone, Copy, Debug, Default)]
struct CallTimes {
    calls: u64,
    total_ns: u128,
    last_ns: u64,
}

impl CallTimes {
    fn record(&mut self, started: Instant) {
        let ns = started.elapsed().as_nanos();
        self.calls += 1;
        self.total_ns += ns;
        self.last_ns = u64::try_from(ns).unwrap_or(u64::MAX);
    }

    fn mean(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.total_ns as f64 / self.calls as f64)
    }
}

/// One `cuMemAlloc_v2` allocation handed out as a [`Segment`].
#[derive(Clone, Copy, Debug)]
struct LiveSegment {
    ptr: sys::CUdeviceptr,
    size_bytes: u64,
}

/// One mapped page of an address range: its physical allocation handle and size.
#[derive(Clone, Copy, Debug)]
struct Page {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: u64,
}

/// One `cuMemAddressReserve` range handed out as an [`AddressRange`].
#[derive(Debug)]
struct LiveRange {
    ptr: sys::CUdeviceptr,
    /// The size the caller asked for (and sees in [`AddressRange::size_bytes`]).
    asked_bytes: u64,
    /// The size really reserved: `asked_bytes` rounded up to the VMM granularity.
    reserved_bytes: u64,
    /// Mapped pages by offset from `ptr`.
    pages: BTreeMap<u64, Page>,
}

/// What virtual memory management needs, fixed at open.
#[derive(Clone, Copy, Debug)]
struct Vmm {
    granularity: u64,
    prop: sys::CUmemAllocationProp,
    access: sys::CUmemAccessDesc,
}

/// Cleanup failures in [`Drop`], which cannot report them otherwise.
static DROP_CLEANUP_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Driver calls that failed while a [`CudaDevice`] was being dropped, in this process
/// so far (freeing segments, pages, ranges, ballast, releasing the context). Drop
/// ignores them; this counter is the only trace. Use [`CudaDevice::release_all`] for a
/// cleanup that reports its errors.
pub fn drop_cleanup_errors() -> u64 {
    DROP_CLEANUP_ERRORS.load(Ordering::Relaxed)
}

/// One CUDA device, its memory handed out in the policies' terms.
///
/// - [`Device::allocate_segment`] / [`Device::free_segment`]: `cuMemAlloc_v2` /
///   `cuMemFree_v2`, each call timed ([`CudaDevice::alloc_ns_mean`],
///   [`CudaDevice::free_ns_mean`]).
/// - [`VirtualMemory`] (when the device supports it, see
///   [`DeviceInfo::vmm_granularity_min_bytes`]): `cuMemAddressReserve`, then per page
///   `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, and back with `cuMemUnmap` +
///   `cuMemRelease` and `cuMemAddressFree`.
/// - [`Device::stats`] is bookkeeping only and never calls the driver: capacity is the
///   free memory at open (after the ballast), reserved is what policies asked for,
///   charged is the drop of `cuMemGetInfo` free memory since open (after the ballast),
///   re-read after every successful allocate, free, map and unmap.
///
/// # Threads
/// Single-threaded: `open` retains the device's primary context and makes it current
/// on the calling thread, and every call re-binds it there (so several devices can be
/// used from one thread). The type holds raw driver handles and is neither `Send` nor
/// `Sync`, so the compiler keeps it on its thread.
///
/// # Cleanup
/// Dropping the device frees every live segment, unmaps and releases every page,
/// frees every address range and the ballast, and releases the primary context,
/// ignoring errors (counted in [`drop_cleanup_errors`]). [`CudaDevice::release_all`]
/// does the same (except for the context) and reports the first error. See
/// [`crate::install_interrupt_flag`] for Ctrl-C.
#[derive(Debug)]
pub struct CudaDevice {
    info: DeviceInfo,
    cu_device: sys::CUdevice,
    ctx: sys::CUcontext,
    vmm: Option<Vmm>,
    next_id: u64,
    segments: BTreeMap<u64, LiveSegment>,
    ranges: BTreeMap<u64, LiveRange>,
    ballast: Vec<(sys::CUdeviceptr, u64)>,
    ballast_bytes: u64,
    /// `cuMemGetInfo` free memory the charged figure is measured from: free at open,
    /// after the ballast.
    baseline_free: u64,
    reserved_bytes: u64,
    charged_bytes: u64,
    charged_bytes_peak: u64,
    allocate_count: u64,
    free_count: u64,
    alloc_times: CallTimes,
    free_times: CallTimes,
    map_times: CallTimes,
    unmap_times: CallTimes,
    cleanup_errors: u64,
}

/// Size of a device request as the driver API takes it (64-bit targets only).
fn usize_of(bytes: u64) -> usize {
    bytes as usize
}

impl CudaDevice {
    /// The bookkeeping of a range this device reserved.
    ///
    /// # Panics
    /// If the range was not reserved here, or its address does not match (a bug).
    fn live_range(&self, range: &AddressRange) -> &LiveRange {
        let live = self.ranges.get(&range.id.0).unwrap_or_else(|| {
            panic!(
                "CudaDevice: address range {:?} was not reserved by this device",
                range.id
            )
        });
        assert_eq!(
            live.ptr, range.addr.0,
            "CudaDevice: address range {:?} does not match",
            range.id
        );
        live
    }

    /// Opens CUDA device `device_index`: loads libcuda (at run time, see the crate
    /// docs), checks that it exports every symbol this crate calls, runs `cuInit`,
    /// retains the device's primary context and makes it current on the calling thread,
    /// then reads the device's name, compute capability, memory and VMM granularity.
    ///
    /// # Errors
    /// [`OpenError::NoDriver`] when there is no usable driver or no such device (never
    /// a panic, also when cudarc's loader panics: that is caught);
    /// [`OpenError::Driver`] for other driver failures.
    pub fn open(device_index: usize) -> Result<CudaDevice, OpenError> {
        match loader::guarded(|| CudaDevice::open_unguarded(device_index)) {
            Ok(result) => result,
            Err(panic) => Err(OpenError::NoDriver(format!(
                "the CUDA driver library cannot be used (cudarc's loader panicked: {panic})"
            ))),
        }
    }

    fn open_unguarded(device_index: usize) -> Result<CudaDevice, OpenError> {
        if !loader::library_present() {
            return Err(OpenError::NoDriver(
                "cannot load libcuda (tried libcuda.so, libcuda.so.1 and cudarc's other names): \
                 no NVIDIA driver installed, or its folder is not on the loader path \
                 (LD_LIBRARY_PATH)"
                    .to_owned(),
            ));
        }
        let missing = loader::missing_symbols(loader::CORE_SYMBOLS);
        if !missing.is_empty() {
            return Err(OpenError::NoDriver(format!(
                "the loaded libcuda lacks {}: driver too old, or not NVIDIA's libcuda",
                missing.join(", ")
            )));
        }
        let vmm_symbols = loader::missing_symbols(loader::VMM_SYMBOLS).is_empty();

        let mut driver_version: c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer; it needs
        // no cuInit.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(conv::no_driver("cuDriverGetVersion"))?;
        result::init().map_err(conv::no_driver("cuInit"))?;
        let count = result::device::get_count().map_err(conv::no_driver("cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(OpenError::NoDriver(
                "the CUDA driver reports no device".to_owned(),
            ));
        }
        let ordinal = match c_int::try_from(device_index) {
            Ok(o) if device_index < count => o,
            _ => {
                return Err(OpenError::NoDriver(format!(
                    "no CUDA device {device_index}: the driver reports {count} device(s), \
                     indices 0 to {}",
                    count - 1
                )))
            }
        };
        let cu_device = result::device::get(ordinal).map_err(conv::open_failed("cuDeviceGet"))?;
        // SAFETY: cu_device comes from cuDeviceGet; the retained context is released
        // exactly once, by CudaDevice's Drop (the device is built right below).
        let ctx = unsafe { result::primary_ctx::retain(cu_device) }
            .map_err(conv::open_failed("cuDevicePrimaryCtxRetain"))?;

        let mut dev = CudaDevice {
            info: DeviceInfo {
                index: device_index,
                name: String::new(),
                driver_version,
                compute_capability: (0, 0),
                total_bytes: 0,
                free_at_open_bytes: 0,
                vmm_granularity_min_bytes: None,
                vmm_granularity_recommended_bytes: None,
            },
            cu_device,
            ctx,
            vmm: None,
            next_id: 1,
            segments: BTreeMap::new(),
            ranges: BTreeMap::new(),
            ballast: Vec::new(),
            ballast_bytes: 0,
            baseline_free: 0,
            reserved_bytes: 0,
            charged_bytes: 0,
            charged_bytes_peak: 0,
            allocate_count: 0,
            free_count: 0,
            alloc_times: CallTimes::default(),
            free_times: CallTimes::default(),
            map_times: CallTimes::default(),
            unmap_times: CallTimes::default(),
            cleanup_errors: 0,
        };
        // From here on an early return drops `dev`, which releases the context.
        dev.bind().map_err(OpenError::Driver)?;
        dev.info.name =
            result::device::get_name(cu_device).map_err(conv::open_failed("cuDeviceGetName"))?;
        let attribute = |a: sys::CUdevice_attribute| {
            // SAFETY: cu_device comes from cuDeviceGet.
            unsafe { result::device::get_attribute(cu_device, a) }
                .map_err(conv::open_failed("cuDeviceGetAttribute"))
        };
        dev.info.compute_capability = (
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let vmm_supported = vmm_symbols
            && attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )? != 0;
        if vmm_supported {
            let prop = pinned_device_prop(cu_device);
            let g_min = granularity(
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
            .map_err(conv::open_failed("cuMemGetAllocationGranularity(MINIMUM)"))?;
            let g_rec = granularity(
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
            .map_err(conv::open_failed(
                "cuMemGetAllocationGranularity(RECOMMENDED)",
            ))?;
            if g_min > 0 {
                dev.info.vmm_granularity_min_bytes = Some(g_min);
                dev.info.vmm_granularity_recommended_bytes = Some(g_rec);
                dev.vmm = Some(Vmm {
                    granularity: g_min,
                    prop,
                    access: sys::CUmemAccessDesc {
                        location: prop.location,
                        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    },
                });
            }
        }
        let (free, total) = result::mem_get_info().map_err(conv::open_failed("cuMemGetInfo_v2"))?;
        dev.info.total_bytes = u64_of(total);
        dev.info.free_at_open_bytes = u64_of(free);
        dev.baseline_free = u64_of(free);
        Ok(dev)
    }

    /// What `open` learnt about the device.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Free device memory now (`cuMemGetInfo`, a real driver call).
    ///
    /// # Errors
    /// When the driver call fails.
    pub fn observed_free_bytes(&self) -> Result<u64, DeviceError> {
        self.bind()?;
        self.free_now()
    }

    /// Highest [`DeviceStats::charged_bytes`] seen so far (since open or the last
    /// ballast change).
    pub fn charged_bytes_peak(&self) -> u64 {
        self.charged_bytes_peak
    }

    /// Bytes held by the ballast (see [`CudaDevice::set_ballast_for_free_bytes`]).
    pub fn ballast_bytes(&self) -> u64 {
        self.ballast_bytes
    }

    /// Mean duration of successful `cuMemAlloc_v2` calls of [`Device::allocate_segment`],
    /// in nanoseconds (the driver call only, not the accounting around it). `None`
    /// before the first one.
    pub fn alloc_ns_mean(&self) -> Option<f64> {
        self.alloc_times.mean()
    }

    /// Mean duration of successful `cuMemFree_v2` calls of [`Device::free_segment`], in
    /// nanoseconds. `None` before the first one.
    pub fn free_ns_mean(&self) -> Option<f64> {
        self.free_times.mean()
    }

    /// Mean duration of successful [`VirtualMemory::map_pages`] calls (all their
    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`), in nanoseconds.
    pub fn map_ns_mean(&self) -> Option<f64> {
        self.map_times.mean()
    }

    /// Mean duration of successful [`VirtualMemory::unmap_pages`] calls (all their
    /// `cuMemUnmap` + `cuMemRelease`), in nanoseconds.
    pub fn unmap_ns_mean(&self) -> Option<f64> {
        self.unmap_times.mean()
    }

    /// Forgets the call timings so far, so that the means cover what follows (one
    /// replay, say). Counts of operations in [`Device::stats`] are not touched.
    pub fn reset_timings(&mut self) {
        self.alloc_times = CallTimes::default();
        self.free_times = CallTimes::default();
        self.map_times = CallTimes::default();
        self.unmap_times = CallTimes::default();
    }

    /// Duration of the last successful `cuMemAlloc_v2` of a segment, in nanoseconds.
    pub(crate) fn last_alloc_ns(&self) -> u64 {
        self.alloc_times.last_ns
    }

    /// Duration of the last successful `cuMemFree_v2` of a segment, in nanoseconds.
    pub(crate) fn last_free_ns(&self) -> u64 {
        self.free_times.last_ns
    }

    /// Driver calls that failed during rollbacks and cleanups of this device
    /// (`map_pages` rollback, [`CudaDevice::release_all`], ballast changes).
    pub fn cleanup_errors(&self) -> u64 {
        self.cleanup_errors
    }

    /// Allocates ballast, memory nobody uses, so that the device's free memory
    /// (`cuMemGetInfo`) is as close as possible to, but not below, `free_bytes`: a large
    /// card then behaves like a smaller one. Any previous ballast is freed first. If
    /// less than `free_bytes` is free, no ballast is taken.
    ///
    /// Chunks are multiples of [`BALLAST_GRANULE_BYTES`] (2 MiB), as large as possible
    /// and smaller after an out-of-memory or an overshoot, so the free memory left is in
    /// `[free_bytes, free_bytes + 2 MiB)` when the driver charges whole 2 MiB pages, as
    /// it does on an H100; never below `free_bytes` unless others take memory meanwhile.
    ///
    /// Resets the accounting baseline: [`DeviceStats::capacity_bytes`] becomes the free
    /// memory left, charged bytes (and their peak) start again from 0. The ballast is
    /// freed by [`CudaDevice::release_all`] and on drop.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] while segments or address ranges are live (set the
    /// ballast before the replay); driver errors otherwise.
    pub fn set_ballast_for_free_bytes(&mut self, free_bytes: u64) -> Result<u64, DeviceError> {
        if !self.segments.is_empty() || !self.ranges.is_empty() {
            return Err(DeviceError::Unsupported {
                what: "changing the ballast while segments or address ranges are live",
            });
        }
        self.bind()?;
        self.free_ballast()?;
        let g = BALLAST_GRANULE_BYTES;
        let halve = |bytes: u64| (bytes / 2 / g * g).max(g);
        let mut free = self.free_now()?;
        let mut max_chunk = u64::MAX;
        // Bounded: each round shrinks the excess or the chunk size; the bound only
        // guards against a driver whose free memory does not move.
        for _ in 0..100_000 {
            let want = (free.saturating_sub(free_bytes) / g * g).min(max_chunk);
            if want < g {
                break;
            }
            // SAFETY: plain device allocation, never read or written by this process;
            // freed once, by free_ballast.
            match unsafe { result::malloc_sync(usize_of(want)) } {
                Ok(ptr) => {
                    self.ballast.push((ptr, want));
                    self.ballast_bytes += want;
                    let now = self.free_now()?;
                    if now >= free_bytes {
                        free = now;
                        continue;
                    }
                    // The driver charged more than asked: give this chunk back, go smaller.
                    self.ballast.pop();
                    self.ballast_bytes -= want;
                    // SAFETY: ptr was just allocated by cuMemAlloc_v2 and is freed once
                    // (it left the ballast list above).
                    unsafe { result::free_sync(ptr) }
                        .map_err(conv::at("cuMemFree_v2 (ballast)", 0))?;
                    free = self.free_now()?;
                    if want == g {
                        break;
                    }
                    max_chunk = halve(want);
                }
                Err(e) if conv::is_out_of_memory(e) => {
                    if want == g {
                        break;
                    }
                    max_chunk = halve(want);
                }
                Err(e) => return Err(conv::device_error("cuMemAlloc_v2 (ballast)", want, e)),
            }
        }
        self.baseline_free = free;
        self.charged_bytes = 0;
        self.charged_bytes_peak = 0;
        Ok(free)
    }

    /// Frees every live segment, unmaps and releases every page, frees every address
    /// range and the ballast, going on past failures, and returns the device to its
    /// state right after open (no ballast; the accounting baseline is the free memory
    /// now). Segments and ranges handed out before are dead afterwards: passing one back
    /// panics like any foreign segment. Allocation and free counts are not changed
    /// (cleanup is not part of a replay). The primary context stays retained until drop.
    ///
    /// # Errors
    /// The first driver failure; every failure is counted in
    /// [`CudaDevice::cleanup_errors`].
    pub fn release_all(&mut self) -> Result<(), DeviceError> {
        let mut first: Option<DeviceError> = None;
        let mut failed = 0u64;
        let mut note = |r: Result<(), DeviceError>| {
            if let Err(e) = r {
                failed += 1;
                first.get_or_insert(e);
            }
        };
        note(self.bind());
        for (_, seg) in std::mem::take(&mut self.segments) {
            // SAFETY: seg.ptr came from cuMemAlloc_v2 on this context and is freed once:
            // the segment table was emptied above.
            note(unsafe { result::free_sync(seg.ptr) }.map_err(conv::at("cuMemFree_v2", 0)));
        }
        for (_, range) in std::mem::take(&mut self.ranges) {
            for (offset, page) in range.pages {
                // SAFETY: the page is mapped at this address with this size and owned by
                // this device; the range table was emptied above, so it is unmapped and
                // released once.
                note(unsafe { unmap_and_release(range.ptr + offset, page) });
            }
            // SAFETY: the range was reserved by cuMemAddressReserve with exactly this
            // size, and all its pages were unmapped just above.
            let r = unsafe { sys::cuMemAddressFree(range.ptr, usize_of(range.reserved_bytes)) };
            note(r.result().map_err(conv::at("cuMemAddressFree", 0)));
        }
        self.reserved_bytes = 0;
        // free_ballast counts its own failures in cleanup_errors.
        let ballast = self.free_ballast();
        if let Err(e) = ballast {
            first.get_or_insert(e);
        }
        match self.free_now() {
            Ok(free) => {
                self.baseline_free = free;
                self.charged_bytes = 0;
            }
            Err(e) => {
                failed += 1;
                first.get_or_insert(e);
            }
        }
        self.cleanup_errors += failed;
        first.map_or(Ok(()), Err)
    }

    /// Frees the ballast, going on past failures; the first one is returned and all are
    /// counted in `cleanup_errors`. The ballast list is empty afterwards either way.
    fn free_ballast(&mut self) -> Result<(), DeviceError> {
        let mut first = None;
        for (ptr, _) in self.ballast.drain(..) {
            // SAFETY: ptr came from cuMemAlloc_v2 on this context; it is freed once
            // (drained from the ballast list).
            if let Err(e) = unsafe { result::free_sync(ptr) } {
                self.cleanup_errors += 1;
                first.get_or_insert(conv::device_error("cuMemFree_v2 (ballast)", 0, e));
            }
        }
        self.ballast_bytes = 0;
        first.map_or(Ok(()), Err)
    }

    /// Makes this device's primary context current on the calling thread (a no-op when
    /// it already is).
    fn bind(&self) -> Result<(), DeviceError> {
        let current = result::ctx::get_current().map_err(conv::at("cuCtxGetCurrent", 0))?;
        if current != Some(self.ctx) {
            // SAFETY: self.ctx is this device's primary context, retained in open and
            // released only in Drop.
            unsafe { result::ctx::set_current(self.ctx) }
                .map_err(conv::at("cuCtxSetCurrent", 0))?;
        }
        Ok(())
    }

    /// `cuMemGetInfo` free bytes (the context must be current).
    fn free_now(&self) -> Result<u64, DeviceError> {
        result::mem_get_info()
            .map(|(free, _total)| u64_of(free))
            .map_err(conv::at("cuMemGetInfo_v2", 0))
    }

    /// Re-reads free memory after a successful allocate/free/map/unmap and sets the
    /// charged figure from it.
    fn refresh_charged(&mut self) -> Result<(), DeviceError> {
        let free = self.free_now()?;
        self.charged_bytes = self.baseline_free.saturating_sub(free);
        self.charged_bytes_peak = self.charged_bytes_peak.max(self.charged_bytes);
        Ok(())
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Undoes the pages a failed `map_pages` call mapped (offset, handle), newest first.
    fn rollback(&mut self, base: sys::CUdeviceptr, bytes: u64, mapped: Vec<(u64, u64)>) {
        for (offset, handle) in mapped.into_iter().rev() {
            // SAFETY: this call mapped `handle` at base + offset with `bytes` bytes and
            // nothing else knows about it; it is unmapped and released once, here.
            if unsafe { unmap_and_release(base + offset, Page { handle, bytes }) }.is_err() {
                self.cleanup_errors += 1;
            }
        }
    }

    fn vmm(&self) -> Result<Vmm, DeviceError> {
        self.vmm.ok_or(DeviceError::Unsupported {
            what: "virtual memory management (cuMemCreate/cuMemMap)",
        })
    }
}

fn u64_of(bytes: usize) -> u64 {
    bytes as u64
}

/// A pinned allocation on device `dev`, no export handle: what `cuMemCreate` and the
/// granularity query take.
fn pinned_device_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // Layout of the cuda-12080 bindings (the workspace's cudarc feature): `location.id`
    // is a plain field. From cuda-13020 on it sits in a union and this stops compiling,
    // which is the wanted outcome (the change needs a look, not a guess).
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn granularity(
    prop: &sys::CUmemAllocationProp,
    option: sys::CUmemAllocationGranularity_flags,
) -> Result<u64, DriverError> {
    let mut g: usize = 0;
    // SAFETY: g is a valid out-pointer and prop a fully initialised property struct.
    unsafe { sys::cuMemGetAllocationGranularity(&mut g, prop, option) }.result()?;
    Ok(u64_of(g))
}

/// `cuMemUnmap` then `cuMemRelease` of one page. The release is skipped when the unmap
/// fails (the handle is still mapped).
///
/// # Safety
/// `va` must be where this process mapped `page.handle`, with `page.bytes` bytes, on the
/// current context, and neither may be used again afterwards.
unsafe fn unmap_and_release(va: sys::CUdeviceptr, page: Page) -> Result<(), DeviceError> {
    // SAFETY: guaranteed by the caller (see above).
    unsafe { sys::cuMemUnmap(va, usize_of(page.bytes)) }
        .result()
        .map_err(conv::at("cuMemUnmap", 0))?;
    // SAFETY: the handle came from cuMemCreate and is no longer mapped.
    unsafe { sys::cuMemRelease(page.handle) }
        .result()
        .map_err(conv::at("cuMemRelease", 0))
}

impl Device for CudaDevice {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.bind()?;
        let started = Instant::now();
        // SAFETY: cuMemAlloc_v2 only returns a device pointer; the memory is never read
        // or written by this process, so its being uninitialised does not matter. It is
        // freed once: by free_segment, release_all or Drop, whichever removes it from
        // the segment table.
        let allocated = unsafe { result::malloc_sync(usize_of(size_bytes)) };
        let ptr = allocated.map_err(conv::at("cuMemAlloc_v2", size_bytes))?;
        self.alloc_times.record(started);
        let id = self.take_id();
        self.segments.insert(id, LiveSegment { ptr, size_bytes });
        self.reserved_bytes += size_bytes;
        self.allocate_count += 1;
        // If this fails the segment stays in the table and is freed at cleanup.
        self.refresh_charged()?;
        Ok(Segment {
            id: SegmentId(id),
            addr: DeviceAddr(ptr),
            size_bytes,
        })
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        let live = *self.segments.get(&segment.id.0).unwrap_or_else(|| {
            panic!(
                "CudaDevice: segment {:?} was not handed out by this device (or is already freed)",
                segment.id
            )
        });
        assert_eq!(
            (live.ptr, live.size_bytes),
            (segment.addr.0, segment.size_bytes),
            "CudaDevice: segment {:?} does not match what this device handed out",
            segment.id
        );
        self.bind()?;
        let started = Instant::now();
        // SAFETY: live.ptr came from cuMemAlloc_v2 on this context and is still in the
        // segment table, so it has not been freed; it leaves the table right after.
        unsafe { result::free_sync(live.ptr) }.map_err(conv::at("cuMemFree_v2", 0))?;
        self.free_times.record(started);
        self.segments.remove(&segment.id.0);
        self.reserved_bytes -= live.size_bytes;
        self.free_count += 1;
        self.refresh_charged()
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            capacity_bytes: self.baseline_free,
            total_bytes: self.info.total_bytes,
            reserved_bytes: self.reserved_bytes,
            charged_bytes: self.charged_bytes,
            segment_count: (self.segments.len() + self.ranges.len()) as u64,
            allocate_count: self.allocate_count,
            free_count: self.free_count,
        }
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        if self.vmm.is_some() {
            Some(self)
        } else {
            None
        }
    }

    /// Total minus `cuMemGetInfo` free; `None` if that driver call fails.
    fn observed_used_bytes(&mut self) -> Option<u64> {
        let free = self.observed_free_bytes().ok()?;
        Some(self.info.total_bytes.saturating_sub(free))
    }
}

impl VirtualMemory for CudaDevice {
    /// Reserves `size_bytes` rounded up to the VMM granularity (the returned range still
    /// says `size_bytes`; pages are only mapped inside that).
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        let vmm = self.vmm()?;
        let reserved = size_bytes
            .max(1)
            .checked_next_multiple_of(vmm.granularity)
            .ok_or_else(|| conv::refused("cuMemAddressReserve", "size overflows"))?;
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: ptr is a valid out-pointer; size is a multiple of the granularity;
        // alignment 0 and address 0 let the driver choose. Freed once by release_range,
        // release_all or Drop, whichever removes it from the range table.
        unsafe { sys::cuMemAddressReserve(&mut ptr, usize_of(reserved), 0, 0, 0) }
            .result()
            .map_err(conv::at("cuMemAddressReserve", size_bytes))?;
        let id = self.take_id();
        self.ranges.insert(
            id,
            LiveRange {
                ptr,
                asked_bytes: size_bytes,
                reserved_bytes: reserved,
                pages: BTreeMap::new(),
            },
        );
        Ok(AddressRange {
            id: SegmentId(id),
            addr: DeviceAddr(ptr),
            size_bytes,
        })
    }

    fn map_pages(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        page_bytes: u64,
        page_count: u64,
    ) -> Result<(), DeviceError> {
        let vmm = self.vmm()?;
        let live = self.live_range(range);
        assert!(page_bytes > 0, "CudaDevice: mapping pages of 0 bytes");
        let requested = page_bytes
            .checked_mul(page_count)
            .expect("CudaDevice: page span overflows");
        let end = offset_bytes
            .checked_add(requested)
            .expect("CudaDevice: page span overflows");
        assert!(
            end <= live.asked_bytes,
            "CudaDevice: mapping past the range"
        );
        if let Some((&at, page)) = live.pages.range(..end).next_back() {
            assert!(
                at + page.bytes <= offset_bytes,
                "CudaDevice: page mapped twice (at offset {at})"
            );
        }
        if page_count == 0 {
            return Ok(());
        }
        let base = live.ptr;
        self.bind()?;
        let started = Instant::now();
        let size = usize_of(page_bytes);
        let mut mapped: Vec<(u64, sys::CUmemGenericAllocationHandle)> = Vec::new();
        let mut failure = None;
        for i in 0..page_count {
            let offset = offset_bytes + i * page_bytes;
            let va = base + offset;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: handle is a valid out-pointer and vmm.prop a fully initialised
            // pinned-device property struct.
            if let Err(e) = unsafe { sys::cuMemCreate(&mut handle, size, &vmm.prop, 0) }.result() {
                failure = Some(conv::device_error("cuMemCreate", requested, e));
                break;
            }
            // SAFETY: [va, va + size) lies inside a range this device reserved and holds
            // no mapping (both checked above); handle is a fresh allocation of `size`.
            if let Err(e) = unsafe { sys::cuMemMap(va, size, 0, handle, 0) }.result() {
                failure = Some(conv::device_error("cuMemMap", requested, e));
                // SAFETY: handle was created just above and is not mapped.
                if unsafe { sys::cuMemRelease(handle) }.result().is_err() {
                    self.cleanup_errors += 1;
                }
                break;
            }
            mapped.push((offset, handle));
            // SAFETY: [va, va + size) was mapped just above; access is one valid
            // descriptor (count 1).
            if let Err(e) = unsafe { sys::cuMemSetAccess(va, size, &vmm.access, 1) }.result() {
                failure = Some(conv::device_error("cuMemSetAccess", requested, e));
                break;
            }
        }
        if let Some(e) = failure {
            self.rollback(base, page_bytes, mapped);
            return Err(e);
        }
        self.map_times.record(started);
        let live = self
            .ranges
            .get_mut(&range.id.0)
            .expect("range checked above");
        for (offset, handle) in mapped {
            live.pages.insert(
                offset,
                Page {
                    handle,
                    bytes: page_bytes,
                },
            );
        }
        self.reserved_bytes += requested;
        self.allocate_count += 1;
        self.refresh_charged()
    }

    fn unmap_pages(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        page_bytes: u64,
        page_count: u64,
    ) -> Result<(), DeviceError> {
        let live = self.live_range(range);
        for i in 0..page_count {
            let offset = offset_bytes + i * page_bytes;
            assert_eq!(
                live.pages.get(&offset).map(|p| p.bytes),
                Some(page_bytes),
                "CudaDevice: unmapping a page that is not mapped (offset {offset})"
            );
        }
        if page_count == 0 {
            return Ok(());
        }
        let base = live.ptr;
        self.bind()?;
        let started = Instant::now();
        let live = self
            .ranges
            .get_mut(&range.id.0)
            .expect("range checked above");
        let mut outcome = Ok(());
        for i in 0..page_count {
            let offset = offset_bytes + i * page_bytes;
            let page = live.pages[&offset];
            // SAFETY: the page is mapped at base + offset with page.bytes (checked
            // above) and leaves the page table right after, so this happens once.
            let r = unsafe { unmap_and_release(base + offset, page) };
            if let Err(e) = r {
                outcome = Err(e);
                break;
            }
            live.pages.remove(&offset);
            self.reserved_bytes -= page_bytes;
        }
        outcome?;
        self.unmap_times.record(started);
        self.free_count += 1;
        self.refresh_charged()
    }

    /// Frees the address space. Refused (an error, nothing freed, the range stays
    /// live until cleanup) while pages are still mapped in it.
    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        let live = self.live_range(&range);
        if !live.pages.is_empty() {
            return Err(conv::refused(
                "cuMemAddressFree",
                &format!(
                    "address range {} still has {} mapped page(s); unmap them first",
                    range.addr,
                    live.pages.len()
                ),
            ));
        }
        let (ptr, reserved) = (live.ptr, live.reserved_bytes);
        self.bind()?;
        // SAFETY: the range was reserved with exactly this size by this device, has no
        // mapped pages, and leaves the range table right after, so it is freed once.
        unsafe { sys::cuMemAddressFree(ptr, usize_of(reserved)) }
            .result()
            .map_err(conv::at("cuMemAddressFree", 0))?;
        self.ranges.remove(&range.id.0);
        Ok(())
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let before = self.cleanup_errors;
        let _ = self.release_all();
        let mut failed = self.cleanup_errors - before;
        // SAFETY: cu_device comes from cuDeviceGet and its primary context was retained
        // once in open; this is the matching release, and self.ctx is not used after.
        if unsafe { result::primary_ctx::release(self.cu_device) }.is_err() {
            failed += 1;
        }
        DROP_CLEANUP_ERRORS.fetch_add(failed, Ordering::Relaxed);
    }
}
