//! A device that cannot place memory where a recording says it was, as a real GPU.
//!
//! A trace that starts mid-run carries the allocator's state at its first entry, with
//! the addresses PyTorch's segments had ([`workloads::StartState`]). A simulated device
//! adopts them there; a real GPU cannot, and allocates each segment (reserves each
//! expandable range) where its driver puts it (`gpu_backend::CudaDevice`), after which
//! the caching policy decides by those addresses. [`Relocated`] makes any device adopt
//! as a real GPU does, through its own `allocate_segment` and `reserve_range`: over a
//! [`crate::SimDevice`] without address hints it predicts what a GPU run of the trace
//! does (`allocsim validate`), where the recorded addresses would predict the recorded
//! process instead.

use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment,
    VirtualMemory,
};

/// `D`, adopting a starting state's segments and ranges where `D` places new ones.
pub struct Relocated<D>(pub D);

impl<D: Device> Device for Relocated<D> {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.0.allocate_segment(size_bytes)
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        self.0.free_segment(segment)
    }

    fn stats(&self) -> DeviceStats {
        self.0.stats()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        self.0.virtual_memory()?;
        Some(self)
    }

    /// Allocates `size_bytes` where the device puts a new segment (`addr` is not kept).
    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        let _ = addr;
        self.0.allocate_segment(size_bytes)
    }

    fn observed_used_bytes(&mut self) -> Option<u64> {
        self.0.observed_used_bytes()
    }

    fn recorded_address(&self, addr: u64) -> DeviceAddr {
        self.0.recorded_address(addr)
    }
}

impl<D: Device> Relocated<D> {
    fn vm(&mut self) -> &mut dyn VirtualMemory {
        self.0
            .virtual_memory()
            .expect("virtual_memory() answered Some only where the device has it")
    }
}

impl<D: Device> VirtualMemory for Relocated<D> {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        self.vm().reserve_range(size_bytes)
    }

    /// Reserves `size_bytes` where the device puts a new range (`addr` is not kept).
    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        let _ = addr;
        self.vm().reserve_range(size_bytes)
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        self.vm().create_physical(size_bytes)
    }

    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm().map(range, offset_bytes, chunks)
    }

    fn unmap(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        self.vm().unmap(range, offset_bytes, chunks)
    }

    fn release_physical(&mut self, chunk: PhysicalChunk) -> Result<(), DeviceError> {
        self.vm().release_physical(chunk)
    }

    fn release_range(&mut self, range: AddressRange) -> Result<(), DeviceError> {
        self.vm().release_range(range)
    }
}
