//! [`CudaDevice`]: the policies' [`Device`] and [`VirtualMemory`] on real CUDA memory.
//!
//! This file holds the type, its accounting and cleanup; `open.rs` opens a device,
//! `ballast.rs` shrinks a large card, `vmm.rs` is the virtual memory management.

mod ballast;
mod open;
mod vmm;

pub use ballast::BALLAST_GRANULE_BYTES;
pub use open::{DeviceInfo, OpenError};

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PageTable, Segment, SegmentId,
    VirtualMemory,
};

use crate::{conv, loader};
use vmm::{Table, Vmm};

#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "gpu-backend needs a 64-bit target (device sizes are passed to the driver as usize)"
);

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
///   [`DeviceInfo::vmm_granularity_min_bytes`]): `cuMemAddressReserve` /
///   `cuMemAddressFree`, `cuMemCreate` / `cuMemRelease`, and `cuMemMap` +
///   `cuMemSetAccess` / `cuMemUnmap`, with the bookkeeping of [`PageTable`].
/// - [`Device::stats`] is bookkeeping only and never calls the driver: capacity is the
///   free memory at open (after the ballast), reserved is what policies asked for
///   (segments and physical chunks), charged is the drop of `cuMemGetInfo` free memory
///   since open (after the ballast), re-read after every successful allocate, free,
///   create, release, map and unmap.
///
/// # Threads
/// Single-threaded: `open` retains the device's primary context and makes it current
/// on the calling thread, and every call re-binds it there (so several devices can be
/// used from one thread). The type holds raw driver handles and is neither `Send` nor
/// `Sync`, so the compiler keeps it on its thread.
///
/// # Cleanup
/// Dropping the device frees every live segment, unmaps every mapping, releases every
/// physical chunk, frees every address range and the ballast, and releases the primary context,
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
    vm: Table,
    ballast: Vec<(sys::CUdeviceptr, u64)>,
    ballast_bytes: u64,
    /// `cuMemGetInfo` free memory the charged figure is measured from: free at open,
    /// after the ballast.
    baseline_free: u64,
    /// Bytes of live segments (physical chunks are in `vm`).
    segment_bytes: u64,
    charged_bytes: u64,
    charged_bytes_peak: u64,
    allocate_count: u64,
    free_count: u64,
    alloc_times: CallTimes,
    free_times: CallTimes,
    create_times: CallTimes,
    release_times: CallTimes,
    map_times: CallTimes,
    unmap_times: CallTimes,
    cleanup_errors: u64,
}

/// Size of a device request as the driver API takes it (64-bit targets only).
fn usize_of(bytes: u64) -> usize {
    bytes as usize
}

impl CudaDevice {
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

    /// Mean duration of successful `cuMemCreate` calls of
    /// [`VirtualMemory::create_physical`], in nanoseconds.
    pub fn create_ns_mean(&self) -> Option<f64> {
        self.create_times.mean()
    }

    /// Mean duration of successful `cuMemRelease` calls of
    /// [`VirtualMemory::release_physical`], in nanoseconds.
    pub fn release_ns_mean(&self) -> Option<f64> {
        self.release_times.mean()
    }

    /// Mean duration of successful [`VirtualMemory::map`] calls (all their `cuMemMap`
    /// and the `cuMemSetAccess`; creating the chunks is timed apart), in nanoseconds.
    pub fn map_ns_mean(&self) -> Option<f64> {
        self.map_times.mean()
    }

    /// Mean duration of successful [`VirtualMemory::unmap`] calls (all their
    /// `cuMemUnmap`; releasing the chunks is timed apart), in nanoseconds.
    pub fn unmap_ns_mean(&self) -> Option<f64> {
        self.unmap_times.mean()
    }

    /// Forgets the call timings so far, so that the means cover what follows (one
    /// replay, say). Counts of operations in [`Device::stats`] are not touched.
    pub fn reset_timings(&mut self) {
        self.alloc_times = CallTimes::default();
        self.free_times = CallTimes::default();
        self.create_times = CallTimes::default();
        self.release_times = CallTimes::default();
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
    /// ([`VirtualMemory::map`] rollback, [`CudaDevice::release_all`], ballast changes).
    pub fn cleanup_errors(&self) -> u64 {
        self.cleanup_errors
    }

    /// Frees every live segment, unmaps every mapping, releases every physical chunk,
    /// frees every address range and the ballast, going on past failures, and returns the device to its
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
        self.segment_bytes = 0;
        // release_all_virtual and free_ballast count their own failures in
        // cleanup_errors.
        let virtual_memory = self.release_all_virtual();
        let ballast = self.free_ballast();
        for r in [virtual_memory, ballast] {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
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

    /// Makes this device's primary context current on the calling thread (a no-op when
    /// it already is).
    pub(super) fn bind(&self) -> Result<(), DeviceError> {
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
    pub(super) fn free_now(&self) -> Result<u64, DeviceError> {
        result::mem_get_info()
            .map(|(free, _total)| u64_of(free))
            .map_err(conv::at("cuMemGetInfo_v2", 0))
    }

    /// Re-reads free memory after a successful allocate/free/map/unmap and sets the
    /// charged figure from it.
    pub(super) fn refresh_charged(&mut self) -> Result<(), DeviceError> {
        let free = self.free_now()?;
        self.charged_bytes = self.baseline_free.saturating_sub(free);
        self.charged_bytes_peak = self.charged_bytes_peak.max(self.charged_bytes);
        Ok(())
    }

    pub(super) fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

fn u64_of(bytes: usize) -> u64 {
    bytes as u64
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
        self.segment_bytes += size_bytes;
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
        self.segment_bytes -= live.size_bytes;
        self.free_count += 1;
        self.refresh_charged()
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            capacity_bytes: self.baseline_free,
            total_bytes: self.info.total_bytes,
            reserved_bytes: self.segment_bytes + self.vm.physical_bytes(),
            charged_bytes: self.charged_bytes,
            segment_count: (self.segments.len() + self.vm.range_count()) as u64,
            allocate_count: self.allocate_count,
            free_count: self.free_count,
        }
    }

    /// A segment of a state rebuilt from a recording: `cuMemAlloc` of its size, where the
    /// driver puts it (a real GPU cannot place memory at the recorded `addr`); the policy
    /// builds the state's blocks there.
    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        let _ = addr;
        self.allocate_segment(size_bytes)
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
