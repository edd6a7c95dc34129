//! The device side of the policy boundary: what a policy can ask a GPU (or a
//! simulated one) for. Devices hand out whole segments; policies carve them.

use std::fmt;

/// A device address. Same width as CUDA's `CUdeviceptr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceAddr(pub u64);

impl fmt::Display for DeviceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Identifies one segment or address range for as long as it lives on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u64);

/// One region handed out by [`Device::allocate_segment`] (one `cuMemAlloc`).
///
/// Not `Clone`: [`Device::free_segment`] consumes it, so a segment cannot be freed twice.
#[derive(Debug, PartialEq, Eq)]
pub struct Segment {
    /// Device-local identity.
    pub id: SegmentId,
    /// First byte.
    pub addr: DeviceAddr,
    /// Size as the policy asked for it (the driver may charge more, see
    /// [`DeviceStats::charged_bytes`]).
    pub size_bytes: u64,
}

/// A reserved range of virtual addresses with no physical memory behind it until
/// [`PhysicalChunk`]s are mapped into it ([`VirtualMemory`]). Not `Clone`, like
/// [`Segment`].
#[derive(Debug, PartialEq, Eq)]
pub struct AddressRange {
    /// Device-local identity.
    pub id: SegmentId,
    /// First byte of the range.
    pub addr: DeviceAddr,
    /// Length of the range in bytes.
    pub size_bytes: u64,
}

/// Identifies one physical chunk for as long as it lives on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId(pub u64);

/// Physical device memory with no address of its own (one `cuMemCreate` handle): it is
/// reached where it is mapped into an [`AddressRange`], at one place or several.
///
/// Not `Clone`: [`VirtualMemory::release_physical`] consumes it, so a chunk cannot be
/// released twice.
#[derive(Debug, PartialEq, Eq)]
pub struct PhysicalChunk {
    /// Device-local identity.
    pub id: ChunkId,
    /// Size in bytes.
    pub size_bytes: u64,
}

/// Accounting a device keeps about itself. Cheap: the engine reads it after every event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Bytes the device can hand out in all (for a GPU: what is left after the context).
    pub capacity_bytes: u64,
    /// The device's total memory as `cuMemGetInfo` reports it (PyTorch's `total_memory`);
    /// memory fractions and expandable-segment address ranges are computed from it.
    pub total_bytes: u64,
    /// Sum of live segment sizes plus live physical chunks (created and not yet
    /// released), as the policy asked for them.
    pub reserved_bytes: u64,
    /// What the driver really takes for them (page rounding, packing of small
    /// allocations), comparable to the drop in `cuMemGetInfo` free memory.
    pub charged_bytes: u64,
    /// Live segments plus live address ranges.
    pub segment_count: u64,
    /// Successful segment allocations and [`VirtualMemory::map`] calls so far.
    pub allocate_count: u64,
    /// Segment frees and [`VirtualMemory::unmap`] calls so far.
    pub free_count: u64,
}

impl DeviceStats {
    /// Bytes still free on the device by its own accounting.
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.charged_bytes)
    }
}

/// Why a device call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device cannot supply `requested_bytes` more. Expected; policies react to it.
    #[error("out of device memory allocating {requested_bytes} bytes")]
    OutOfMemory {
        /// Size of the refused request.
        requested_bytes: u64,
    },
    /// Any other driver failure, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS (700): ...`. The replay stops.
    #[error("driver error {code}: {message}")]
    Driver {
        /// The driver's numeric error code.
        code: u32,
        /// The driver's name and description of the error.
        message: String,
    },
    /// The device lacks a capability the policy needs (virtual memory management).
    #[error("the device does not support {what}")]
    Unsupported {
        /// The missing capability.
        what: &'static str,
    },
}

/// A source of device memory in whole segments.
///
/// Implemented by the simulated device (`sim::SimDevice`) and by the real one
/// (`gpu_backend::CudaDevice`), so one policy runs unchanged on both.
pub trait Device {
    /// Reserves one segment of `size_bytes` (already rounded by the policy).
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when the device cannot supply it; other variants for
    /// failures that stop the run.
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError>;

    /// Returns a segment.
    ///
    /// # Errors
    /// Only for driver failures.
    ///
    /// # Panics
    /// If this device did not hand the segment out (a bug, not an error).
    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError>;

    /// The device's own accounting. It changes only through the device's `&mut`
    /// methods: the replay engine reads it again only after the policy called one.
    fn stats(&self) -> DeviceStats;

    /// Virtual memory management (reserve, create, map, unmap, release), if the device
    /// has it. Expandable segments need it.
    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        None
    }

    /// Takes over a segment that exists at `addr` before the replay (a state rebuilt
    /// from a recording), as if this device had handed it out, and says where it is: a
    /// simulated device places it at `addr`; a real GPU, which cannot place memory where
    /// a recording says it was, allocates `size_bytes` where its driver puts them. The
    /// default refuses.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] by default; [`DeviceError::OutOfMemory`] when the
    /// device cannot hold it.
    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        let _ = (addr, size_bytes);
        Err(DeviceError::Unsupported {
            what: "taking over a recorded segment at its address",
        })
    }

    /// Used bytes as the hardware reports them (total − `cuMemGetInfo` free).
    /// `None` for simulated devices.
    fn observed_used_bytes(&mut self) -> Option<u64> {
        None
    }

    /// Where this device has the byte a recording had at `addr` (a checkpoint
    /// restore's block): `addr` itself by default, right for a device that put the
    /// recording's segments where it had them (a simulated one following the recorded
    /// addresses); a device that put them elsewhere translates (`sim::Placed`).
    fn recorded_address(&self, addr: u64) -> DeviceAddr {
        DeviceAddr(addr)
    }
}

/// Virtual memory management as the CUDA driver offers it: address space
/// (`cuMemAddressReserve` / `cuMemAddressFree`) and physical memory
/// (`cuMemCreate` / `cuMemRelease`) are separate, and a chunk of physical memory is
/// reachable only where it is mapped (`cuMemMap` + `cuMemSetAccess` / `cuMemUnmap`).
///
/// Address space costs nothing; physical memory is charged from its creation to its
/// release, however many times it is mapped. A chunk may be mapped at several places at
/// once, in one range or several, and mapped again elsewhere after an unmap: that is
/// what a stitching allocator (GMLake, ASPLOS '24) does to join scattered free chunks
/// into one contiguous virtual block. PyTorch's expandable segments use one chunk per
/// page, mapped once.
///
/// Misuse is a bug and panics naming the broken rule: a chunk or range this device did
/// not hand out, a span that leaves its range or overlaps a mapping, unmapping what is
/// not mapped there, releasing a chunk that is still mapped.
pub trait VirtualMemory {
    /// Reserves `size_bytes` of address space, with no physical memory behind it.
    ///
    /// # Errors
    /// When the address space cannot be reserved.
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError>;

    /// Takes over an address range that exists at `addr` before the replay (the
    /// range of an expandable segment in a rebuilt state), like
    /// [`Device::adopt_segment`] (a real GPU reserves the range where its driver
    /// puts it). The default refuses.
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] by default.
    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        let _ = (addr, size_bytes);
        Err(DeviceError::Unsupported {
            what: "taking over a recorded address range at its address",
        })
    }

    /// Creates one chunk of `size_bytes` of physical memory (`cuMemCreate`), unmapped.
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when the device cannot supply it; other variants for
    /// failures that stop the run.
    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError>;

    /// Maps `chunks` back to back at `range.addr + offset_bytes`, in order (one
    /// `cuMemMap` each, then access for the whole span). All or nothing: when one step
    /// fails, what this call mapped is unmapped again; the chunks stay created.
    ///
    /// # Errors
    /// Only for driver failures.
    ///
    /// # Panics
    /// If a chunk is not live on this device, or the span leaves the range or overlaps
    /// a mapping.
    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError>;

    /// Unmaps `chunks`, which must be mapped back to back at `range.addr +
    /// offset_bytes` (one `cuMemUnmap` each). The chunks stay created: release them with
    /// [`VirtualMemory::release_physical`], or map them elsewhere.
    ///
    /// # Errors
    /// Only for driver failures.
    ///
    /// # Panics
    /// If a chunk is not mapped at its place.
    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError>;

    /// Releases a chunk's physical memory (`cuMemRelease`).
    ///
    /// # Errors
    /// Only for driver failures.
    ///
    /// # Panics
    /// If the chunk is still mapped somewhere.
    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError>;

    /// Gives the address space back. Every mapping in it must have been unmapped.
    ///
    /// # Errors
    /// Driver failures; a device may also refuse, with an error, to release a range
    /// that still has mappings.
    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError>;
}
