//! Ballast: memory taken so that a large card behaves like a smaller one.

use super::*;

/// The step of [`CudaDevice::set_ballast_for_free_bytes`]: the driver charges whole
/// 2 MiB pages for `cuMemAlloc`, so ballast chunks are multiples of 2 MiB and the free
/// memory left lands within 2 MiB above the target.
pub const BALLAST_GRANULE_BYTES: u64 = 2 << 20;

impl CudaDevice {
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
    /// [`DeviceError::Unsupported`] while segments, address ranges or physical chunks are
    /// live (set the ballast before the replay); driver errors otherwise.
    pub fn set_ballast_for_free_bytes(&mut self, free_bytes: u64) -> Result<u64, DeviceError> {
        if !self.segments.is_empty() || self.vm.range_count() > 0 || self.vm.chunk_count() > 0 {
            return Err(DeviceError::Unsupported {
                what: "changing the ballast while segments, address ranges or physical chunks are live",
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

    /// Frees the ballast, going on past failures; the first one is returned and all are
    /// counted in `cleanup_errors`. The ballast list is empty afterwards either way.
    pub(super) fn free_ballast(&mut self) -> Result<(), DeviceError> {
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
}
