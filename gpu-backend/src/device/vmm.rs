//! Virtual memory management: `cuMemAddressReserve` / `cuMemAddressFree` for address
//! ranges, `cuMemCreate` / `cuMemRelease` for physical chunks, `cuMemMap` +
//! `cuMemSetAccess` / `cuMemUnmap` to place chunks in ranges. The bookkeeping (what is
//! live, what is mapped where, misuse) is the shared [`policies::PageTable`]; this file
//! makes the driver calls and keeps the table in step with them.

use policies::page_table::{Placement, Teardown};
use policies::{PhysicalChunk, VirtualMemory};

use super::*;

/// What virtual memory management needs, fixed at open.
#[derive(Clone, Copy, Debug)]
pub(super) struct Vmm {
    pub(super) granularity: u64,
    pub(super) prop: sys::CUmemAllocationProp,
    pub(super) access: sys::CUmemAccessDesc,
}

/// The device's page table: a chunk's handle is its `cuMemCreate` handle.
pub(super) type Table = PageTable<sys::CUmemGenericAllocationHandle>;

impl CudaDevice {
    fn vmm(&self) -> Result<Vmm, DeviceError> {
        self.vmm.ok_or(DeviceError::Unsupported {
            what: "virtual memory management (cuMemCreate/cuMemMap)",
        })
    }

    /// The size `cuMemAddressReserve` really reserves for a range asked as `size_bytes`:
    /// rounded up to the VMM granularity.
    fn reservation_bytes(granularity: u64, size_bytes: u64) -> Option<u64> {
        size_bytes.max(1).checked_next_multiple_of(granularity)
    }

    /// `cuMemUnmap` of each placement, going on past failures (counted in
    /// `cleanup_errors`); for rollbacks and cleanup.
    fn unmap_quietly(&mut self, placements: &[(DeviceAddr, u64)]) -> Result<(), DeviceError> {
        let mut first = None;
        for &(addr, bytes) in placements.iter().rev() {
            // SAFETY: the caller passes mappings this device made at these addresses
            // with these sizes and forgets them afterwards, so each is unmapped once.
            let r = unsafe { sys::cuMemUnmap(addr.0, usize_of(bytes)) }.result();
            if let Err(e) = r {
                self.cleanup_errors += 1;
                first.get_or_insert(conv::driver_failure("cuMemUnmap")(e));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Unmaps every mapping, releases every chunk and frees every range of the page
    /// table, going on past failures; returns the first one (each is counted in
    /// `cleanup_errors`).
    pub(super) fn release_all_virtual(&mut self) -> Result<(), DeviceError> {
        let Teardown {
            mappings,
            chunks,
            ranges,
        } = self.vm.take_all();
        let mut first = self.unmap_quietly(&mappings).err();
        for (handle, _) in chunks {
            // SAFETY: the handle came from cuMemCreate and left the page table above, so
            // it is released once; its mappings were unmapped just above.
            if let Err(e) = unsafe { sys::cuMemRelease(handle) }.result() {
                self.cleanup_errors += 1;
                first.get_or_insert(conv::driver_failure("cuMemRelease")(e));
            }
        }
        let granularity = self.vmm.map_or(1, |v| v.granularity);
        for (addr, asked) in ranges {
            let reserved = Self::reservation_bytes(granularity, asked).unwrap_or(asked);
            // SAFETY: the range was reserved by cuMemAddressReserve with exactly this
            // size (the same rounding as in reserve_range), left the page table above
            // and has no mapping left.
            if let Err(e) = unsafe { sys::cuMemAddressFree(addr.0, usize_of(reserved)) }.result() {
                self.cleanup_errors += 1;
                first.get_or_insert(conv::driver_failure("cuMemAddressFree")(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl VirtualMemory for CudaDevice {
    /// Reserves `size_bytes` rounded up to the VMM granularity (the returned range still
    /// says `size_bytes`; chunks are only mapped inside that).
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        let vmm = self.vmm()?;
        let reserved = Self::reservation_bytes(vmm.granularity, size_bytes)
            .ok_or_else(|| conv::refused("cuMemAddressReserve", "size overflows"))?;
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: ptr is a valid out-pointer; size is a multiple of the granularity;
        // alignment 0 and address 0 let the driver choose. Freed once by release_range,
        // release_all or Drop, whichever removes it from the page table.
        unsafe { sys::cuMemAddressReserve(&mut ptr, usize_of(reserved), 0, 0, 0) }
            .result()
            .map_err(conv::at("cuMemAddressReserve", size_bytes))?;
        let id = self.take_id();
        Ok(self
            .vm
            .add_range(SegmentId(id), DeviceAddr(ptr), size_bytes))
    }

    /// An expandable segment's range in a state rebuilt from a recording: reserved
    /// where the driver puts it, as [`VirtualMemory::reserve_range`] (a real GPU cannot
    /// place it at the recorded `addr`); the policy maps the state's runs into it.
    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        let _ = addr;
        self.reserve_range(size_bytes)
    }

    /// `cuMemCreate` of a pinned device allocation; `size_bytes` must be a multiple of
    /// the VMM granularity (the driver refuses it otherwise).
    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        let vmm = self.vmm()?;
        self.bind()?;
        let started = Instant::now();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: handle is a valid out-pointer and vmm.prop a fully initialised
        // pinned-device property struct. The handle is released once: by
        // release_physical, release_all or Drop, whichever removes it from the table.
        unsafe { sys::cuMemCreate(&mut handle, usize_of(size_bytes), &vmm.prop, 0) }
            .result()
            .map_err(conv::at("cuMemCreate", size_bytes))?;
        self.create_times.record(started);
        let chunk = self.vm.add_chunk(size_bytes, handle);
        // If this fails the chunk stays in the table and is released at cleanup.
        self.refresh_charged()?;
        Ok(chunk)
    }

    /// One `cuMemMap` per chunk, then one `cuMemSetAccess` (read-write, this device)
    /// over the whole span, as PyTorch's `ExpandableSegment` does. When a call fails,
    /// the mappings this call made are unmapped again and the error is returned (an
    /// out-of-memory here is a driver failure too: PyTorch raises it).
    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        let vmm = self.vmm()?;
        let placements: Vec<Placement<_>> = self.vm.check_map(range, offset_bytes, chunks);
        let Some(first) = placements.first() else {
            return Ok(());
        };
        let (start, span) = (first.addr, placements.iter().map(|p| p.size_bytes).sum());
        self.bind()?;
        let started = Instant::now();
        let mut mapped = Vec::with_capacity(placements.len());
        let mut failure = None;
        for p in &placements {
            // SAFETY: the page table checked that [addr, addr + size) lies inside a
            // range this device reserved and holds no mapping, and that the handle is a
            // live cuMemCreate allocation of exactly this size.
            let r = unsafe { sys::cuMemMap(p.addr.0, usize_of(p.size_bytes), 0, p.handle, 0) };
            if let Err(e) = r.result() {
                failure = Some(conv::driver_failure("cuMemMap")(e));
                break;
            }
            mapped.push((p.addr, p.size_bytes));
        }
        if failure.is_none() {
            // SAFETY: [start, start + span) was mapped just above, chunk after chunk;
            // access is one valid descriptor (count 1).
            let r = unsafe { sys::cuMemSetAccess(start.0, usize_of(span), &vmm.access, 1) };
            if let Err(e) = r.result() {
                failure = Some(conv::driver_failure("cuMemSetAccess")(e));
            }
        }
        if let Some(e) = failure {
            // Failures of the rollback itself are counted in cleanup_errors.
            let _ = self.unmap_quietly(&mapped);
            return Err(e);
        }
        self.map_times.record(started);
        self.vm.map(range, offset_bytes, chunks);
        self.allocate_count += 1;
        self.refresh_charged()
    }

    /// One `cuMemUnmap` per chunk. A failure stops there; the chunks unmapped before it
    /// are recorded as unmapped.
    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        let placements = self.vm.check_unmap(range, offset_bytes, chunks);
        if placements.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let started = Instant::now();
        let mut offset = offset_bytes;
        for (p, chunk) in placements.iter().zip(chunks) {
            // SAFETY: the page table checked that this chunk is mapped at p.addr with
            // p.size_bytes; it leaves the table right after, so it is unmapped once.
            let r = unsafe { sys::cuMemUnmap(p.addr.0, usize_of(p.size_bytes)) };
            r.result().map_err(conv::driver_failure("cuMemUnmap"))?;
            self.vm.unmap(range, offset, std::slice::from_ref(chunk));
            offset += p.size_bytes;
        }
        self.unmap_times.record(started);
        self.free_count += 1;
        self.refresh_charged()
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        let handle = self.vm.check_release_chunk(&chunk);
        self.bind()?;
        let started = Instant::now();
        // SAFETY: the handle came from cuMemCreate, is mapped nowhere (checked by the
        // page table) and leaves the table right after, so it is released once.
        unsafe { sys::cuMemRelease(handle) }
            .result()
            .map_err(conv::driver_failure("cuMemRelease"))?;
        self.release_times.record(started);
        self.vm.remove_chunk(chunk);
        self.refresh_charged()
    }

    /// Frees the address space. Refused (an error, nothing freed, the range stays
    /// live until cleanup) while chunks are still mapped in it.
    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        let mapped = self.vm.mappings_in(&range);
        if mapped > 0 {
            return Err(conv::refused(
                "cuMemAddressFree",
                &format!(
                    "address range {} still has {mapped} mapped page(s); unmap them first",
                    range.addr
                ),
            ));
        }
        let vmm = self.vmm()?;
        let reserved = Self::reservation_bytes(vmm.granularity, range.size_bytes)
            .expect("the size was rounded when the range was reserved");
        self.bind()?;
        // SAFETY: the range was reserved with exactly this size by this device, has no
        // mapping, and leaves the page table right after, so it is freed once.
        unsafe { sys::cuMemAddressFree(range.addr.0, usize_of(reserved)) }
            .result()
            .map_err(conv::at("cuMemAddressFree", 0))?;
        self.vm.remove_range(range);
        Ok(())
    }
}
