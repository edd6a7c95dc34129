//! Virtual memory management: address ranges and mapped pages (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, ...).

use super::*;

/// One mapped page of an address range: its physical allocation handle and size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Page {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: u64,
}

/// One `cuMemAddressReserve` range handed out as an [`AddressRange`].
#[derive(Debug)]
pub(super) struct LiveRange {
    pub(super) ptr: sys::CUdeviceptr,
    /// The size the caller asked for (and sees in [`AddressRange::size_bytes`]).
    pub(super) asked_bytes: u64,
    /// The size really reserved: `asked_bytes` rounded up to the VMM granularity.
    pub(super) reserved_bytes: u64,
    /// Mapped pages by offset from `ptr`.
    pub(super) pages: BTreeMap<u64, Page>,
}

/// What virtual memory management needs, fixed at open.
#[derive(Clone, Copy, Debug)]
pub(super) struct Vmm {
    pub(super) granularity: u64,
    pub(super) prop: sys::CUmemAllocationProp,
    pub(super) access: sys::CUmemAccessDesc,
}

impl CudaDevice {
    /// The bookkeeping of a range this device reserved.
    ///
    /// # Panics
    /// If the range was not reserved here, or its address does not match (a bug).
    pub(super) fn live_range(&self, range: &AddressRange) -> &LiveRange {
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

    /// Undoes the pages a failed `map_pages` call mapped (offset, handle), newest first.
    pub(super) fn rollback(&mut self, base: sys::CUdeviceptr, bytes: u64, mapped: Vec<(u64, u64)>) {
        for (offset, handle) in mapped.into_iter().rev() {
            // SAFETY: this call mapped `handle` at base + offset with `bytes` bytes and
            // nothing else knows about it; it is unmapped and released once, here.
            if unsafe { unmap_and_release(base + offset, Page { handle, bytes }) }.is_err() {
                self.cleanup_errors += 1;
            }
        }
    }

    pub(super) fn vmm(&self) -> Result<Vmm, DeviceError> {
        self.vmm.ok_or(DeviceError::Unsupported {
            what: "virtual memory management (cuMemCreate/cuMemMap)",
        })
    }
}

/// `cuMemUnmap` then `cuMemRelease` of one page. The release is skipped when the unmap
/// fails (the handle is still mapped).
///
/// # Safety
/// `va` must be where this process mapped `page.handle`, with `page.bytes` bytes, on the
/// current context, and neither may be used again afterwards.
pub(super) unsafe fn unmap_and_release(
    va: sys::CUdeviceptr,
    page: Page,
) -> Result<(), DeviceError> {
    // SAFETY: guaranteed by the caller (see above).
    unsafe { sys::cuMemUnmap(va, usize_of(page.bytes)) }
        .result()
        .map_err(conv::at("cuMemUnmap", 0))?;
    // SAFETY: the handle came from cuMemCreate and is no longer mapped.
    unsafe { sys::cuMemRelease(page.handle) }
        .result()
        .map_err(conv::at("cuMemRelease", 0))
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
