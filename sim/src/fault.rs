//! A fault-injecting device: any [`Device`] (the simulated one, usually) whose driver
//! fails at chosen or random operations, to check that every policy and the engine
//! survive driver failures: the policy's invariants hold after each, its stats agree
//! with the device, everything can still be freed, and the failure reaches the caller
//! as an error, never as an out-of-memory result (unless it is one).
//!
//! Faults are injected into the operations that acquire memory: `cuMemAlloc`
//! ([`Device::allocate_segment`]), `cuMemAddressReserve`
//! ([`VirtualMemory::reserve_range`]), `cuMemCreate`
//! ([`VirtualMemory::create_physical`]) and `cuMemMap` ([`VirtualMemory::map`]), and
//! into a starting state's adoption ([`Device::adopt_segment`] as `cuMemAlloc`,
//! [`VirtualMemory::adopt_range`] as `cuMemAddressReserve`: what a real GPU does for
//! them). Operations that give memory back never fail here: a driver whose `cuMemFree`
//! fails has lost its context, and nothing could be freed after it anyway. Injection is
//! deterministic: the same plan fails the same calls.

use policies::{
    AddressRange, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment,
    VirtualMemory,
};

/// An operation faults can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `cuMemAlloc` of a segment.
    AllocateSegment,
    /// `cuMemAddressReserve` of an address range.
    ReserveRange,
    /// `cuMemCreate` of a physical chunk.
    CreatePhysical,
    /// `cuMemMap` (and access) of chunks into a range.
    Map,
}

impl FaultOp {
    /// Every operation faults can be injected into.
    pub const ALL: [FaultOp; 4] = [
        FaultOp::AllocateSegment,
        FaultOp::ReserveRange,
        FaultOp::CreatePhysical,
        FaultOp::Map,
    ];

    /// The driver call it stands for.
    pub fn driver_call(self) -> &'static str {
        match self {
            FaultOp::AllocateSegment => "cuMemAlloc",
            FaultOp::ReserveRange => "cuMemAddressReserve",
            FaultOp::CreatePhysical => "cuMemCreate",
            FaultOp::Map => "cuMemMap",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the driver fails with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// `CUDA_ERROR_OUT_OF_MEMORY` (2): for `cuMemAlloc` and `cuMemCreate` the
    /// policy-visible [`DeviceError::OutOfMemory`] (it is out of memory), for the others
    /// a driver error, as the CUDA device reports them.
    OutOfMemory,
    /// `CUDA_ERROR_INVALID_VALUE` (1).
    InvalidValue,
    /// `CUDA_ERROR_LAUNCH_FAILED` (719), the sticky error of a crashed kernel.
    LaunchFailure,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 3] = [
        FaultKind::OutOfMemory,
        FaultKind::InvalidValue,
        FaultKind::LaunchFailure,
    ];

    /// The error `op` fails with, for a request of `bytes`.
    pub fn error(self, op: FaultOp, bytes: u64) -> DeviceError {
        let (code, name, what) = match self {
            FaultKind::OutOfMemory
                if matches!(op, FaultOp::AllocateSegment | FaultOp::CreatePhysical) =>
            {
                return DeviceError::OutOfMemory {
                    requested_bytes: bytes,
                }
            }
            FaultKind::OutOfMemory => (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
            FaultKind::InvalidValue => (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
            FaultKind::LaunchFailure => (
                719,
                "CUDA_ERROR_LAUNCH_FAILED",
                "unspecified launch failure",
            ),
        };
        DeviceError::Driver {
            code,
            message: format!("{name} ({code}): {what} (injected in {})", op.driver_call()),
        }
    }
}

/// Where faults are injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// The `nth` call (from 1) of `op` fails with `kind`, for each entry.
    At(Vec<(FaultOp, u64, FaultKind)>),
    /// Each call fails with probability `1 / one_in`, with a kind drawn at random, from a
    /// xorshift generator seeded with `seed` (the same seed fails the same calls).
    Random {
        /// The generator's seed.
        seed: u64,
        /// One call in this many fails, on average (0: none).
        one_in: u64,
    },
}

/// A device whose driver fails as its [`FaultPlan`] says. See the module docs.
#[derive(Debug)]
pub struct FaultyDevice<D> {
    inner: D,
    plan: FaultPlan,
    calls: [u64; 4],
    state: u64,
    injected: Vec<(FaultOp, u64, DeviceError)>,
}

impl<D: Device> FaultyDevice<D> {
    /// `inner` with faults injected as `plan` says.
    pub fn new(inner: D, plan: FaultPlan) -> FaultyDevice<D> {
        let state = match &plan {
            FaultPlan::Random { seed, .. } => seed | 1,
            FaultPlan::At(_) => 1,
        };
        FaultyDevice {
            inner,
            plan,
            calls: [0; 4],
            state,
            injected: Vec::new(),
        }
    }

    /// The device faults are injected into.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The device, without faults from here on.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Stops injecting faults (the driver recovered, for tests that then free
    /// everything).
    pub fn heal(&mut self) {
        self.plan = FaultPlan::At(Vec::new());
    }

    /// Every fault injected so far: the operation, its call number, the error.
    pub fn injected(&self) -> &[(FaultOp, u64, DeviceError)] {
        &self.injected
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// The fault this call of `op` for `bytes` must fail with, if any.
    fn fault(&mut self, op: FaultOp, bytes: u64) -> Result<(), DeviceError> {
        self.calls[op.index()] += 1;
        let n = self.calls[op.index()];
        let kind = match &self.plan {
            FaultPlan::At(list) => list
                .iter()
                .find(|&&(o, at, _)| o == op && at == n)
                .map(|&(_, _, k)| k),
            &FaultPlan::Random { one_in, .. } => {
                let r = self.next_random();
                (one_in > 0 && r % one_in == 0)
                    .then(|| FaultKind::ALL[(r / one_in.max(1)) as usize % FaultKind::ALL.len()])
            }
        };
        match kind {
            Some(kind) => {
                let e = kind.error(op, bytes);
                self.injected.push((op, n, e.clone()));
                Err(e)
            }
            None => Ok(()),
        }
    }
}

impl<D: Device> Device for FaultyDevice<D> {
    fn allocate_segment(&mut self, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.fault(FaultOp::AllocateSegment, size_bytes)?;
        self.inner.allocate_segment(size_bytes)
    }

    fn free_segment(&mut self, segment: Segment) -> Result<(), DeviceError> {
        self.inner.free_segment(segment)
    }

    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    fn virtual_memory(&mut self) -> Option<&mut dyn VirtualMemory> {
        self.inner.virtual_memory()?;
        Some(self)
    }

    /// A starting state's segment, faults counted as `cuMemAlloc`'s (a real GPU allocates
    /// it: `gpu_backend::CudaDevice::adopt_segment`).
    fn adopt_segment(&mut self, addr: DeviceAddr, size_bytes: u64) -> Result<Segment, DeviceError> {
        self.fault(FaultOp::AllocateSegment, size_bytes)?;
        self.inner.adopt_segment(addr, size_bytes)
    }

    fn observed_used_bytes(&mut self) -> Option<u64> {
        self.inner.observed_used_bytes()
    }

    fn recorded_address(&self, addr: u64) -> policies::DeviceAddr {
        self.inner.recorded_address(addr)
    }
}

impl<D: Device> FaultyDevice<D> {
    fn vm(&mut self) -> &mut dyn VirtualMemory {
        self.inner
            .virtual_memory()
            .expect("virtual_memory() answered Some for the inner device")
    }
}

impl<D: Device> VirtualMemory for FaultyDevice<D> {
    fn reserve_range(&mut self, size_bytes: u64) -> Result<AddressRange, DeviceError> {
        self.fault(FaultOp::ReserveRange, size_bytes)?;
        self.vm().reserve_range(size_bytes)
    }

    /// A starting state's expandable range, faults counted as `cuMemAddressReserve`'s.
    fn adopt_range(
        &mut self,
        addr: DeviceAddr,
        size_bytes: u64,
    ) -> Result<AddressRange, DeviceError> {
        self.fault(FaultOp::ReserveRange, size_bytes)?;
        self.vm().adopt_range(addr, size_bytes)
    }

    fn create_physical(&mut self, size_bytes: u64) -> Result<PhysicalChunk, DeviceError> {
        self.fault(FaultOp::CreatePhysical, size_bytes)?;
        self.vm().create_physical(size_bytes)
    }

    fn map(
        &mut self,
        range: &AddressRange,
        offset_bytes: u64,
        chunks: &[PhysicalChunk],
    ) -> Result<(), DeviceError> {
        let bytes = chunks.iter().map(|c| c.size_bytes).sum();
        self.fault(FaultOp::Map, bytes)?;
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
