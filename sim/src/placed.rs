//! Where a device put the segments a recording had.
//!
//! A checkpoint restore names its blocks by their recorded addresses
//! (`workloads::Event::RestoreBlock`). A simulated device that follows the recorded
//! addresses ([`crate::AddressHints`]) puts each segment where the recording had it, so
//! those are its own; a real GPU puts them where its driver does, and a device adopting
//! a mid-run state where it places new segments ([`crate::Relocated`]) too. [`Placed`]
//! wraps such a device and keeps, for each segment and expandable range, where the
//! recording had it and where the device put it: the recorded address of a new one is
//! the next recorded `cudaMalloc` of the same size in order, as the simulated device takes
//! them (the first of another size ends the correspondence, as it ends the simulated
//! device's use of them), and an adopted one's is the address it was adopted at.
//! [`Device::recorded_address`] then translates.

use std::collections::BTreeMap;

use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment,
    VirtualMemory,
};

use crate::AddressHints;

/// `device`, translating recorded addresses to its own.
pub struct Placed<'d> {
    device: &'d mut dyn Device,
    hints: AddressHints,
    /// Recorded start → (bytes, where the device has it), for the live segments and
    /// ranges.
    places: BTreeMap<u64, (u64, u64)>,
}

impl<'d> Placed<'d> {
    /// `device`, following the recorded `cudaMalloc`s and expandable ranges of `hints`.
    pub fn new(device: &'d mut dyn Device, hints: AddressHints) -> Placed<'d> {
        Placed {
            device,
            hints,
            places: BTreeMap::new(),
        }
    }

    /// The device itself, which translates nothing.
    pub fn inner(&mut self) -> &mut dyn Device {
        &mut *self.device
    }

    fn note(&mut self, recorded: u64, size_bytes: u64, placed: DeviceAddr) {
        self.places.insert(recorded, (size_bytes, placed.0));
    }

    fn forget(&mut self, placed: DeviceAddr) {
        self.places.retain(|_, &mut (_, at)| at != placed.0);
    }

    fn vm(&mut self) -> &mut dyn VirtualMemory {
        self.device
            .virtual_memory()
            .expect("virtual_memory() answered Some only where the device has it")
    }
}

impl Device for Placed<'_> {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        let segment = self.device.allocate_segment(size_bytes)?;
        match self.hints.segments.front() {
            Some(&(size, recorded)) if size == size_bytes => {
                self.hints.segments.pop_front();
                self.note(recorded, size_bytes, segment.addr);
            }
            Some(_) => self.hints.segments.clear(),
            None => {}
        }
        Ok(segment)
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        self.forget(segment.addr);
        self.device.free_segment(segment)
    }

    fn stats(&self) -> DeviceStats {
        self.device.stats()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        self.device.virtual_memory()?;
        Some(self)
    }

    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        let segment = self.device.adopt_segment(addr, size_bytes)?;
        self.note(addr.0, size_bytes, segment.addr);
        Ok(segment)
    }

    fn observed_used_bytes(&mut self) -> Option<u64> {
        self.device.observed_used_bytes()
    }

    fn recorded_address(&self, addr: u64) -> DeviceAddr {
        match self.places.range(..=addr).next_back() {
            Some((&recorded, &(size, placed))) if addr - recorded < size => {
                DeviceAddr(placed + (addr - recorded))
            }
            _ => self.device.recorded_address(addr),
        }
    }
}

impl VirtualMemory for Placed<'_> {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        let range = self.vm().reserve_range(size_bytes)?;
        if let Some(recorded) = self.hints.ranges.pop_front() {
            self.note(recorded, size_bytes, range.addr);
        }
        Ok(range)
    }

    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        let range = self.vm().adopt_range(addr, size_bytes)?;
        self.note(addr.0, size_bytes, range.addr);
        Ok(range)
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
        self.forget(range.addr);
        self.vm().release_range(range)
    }
}
