//! Allocation policies behind one trait, drawing whole segments from a device.
//!
//! Design choices, and why:
//!
//! - **Devices hand out segments, policies carve them.** [`Device`] is the only way a
//!   policy gets memory, so a policy runs unchanged on the simulated device (`sim`) and
//!   on a real GPU (`gpu-backend`), and can be unit-tested with a ten-line fake
//!   (module `testing`, behind the `testing` feature).
//! - **No I/O, no clock, no traces here.** A policy sees [`Request`]s and a
//!   `&mut dyn Device`, nothing else; replay, formats and reports live in other crates.
//!   That keeps the hot path lean and the policies deterministic.
//! - **Exactness over generality for the caching policy.** [`caching::CachingPolicy`]
//!   follows PyTorch's `CUDACachingAllocator.cpp` function by function, with its
//!   statistics, rather than an idealised best-fit.
//! - **Running out of memory is a value.** [`AllocError::OutOfMemory`] is an expected
//!   result; only driver failures stop a run.
//! - **Ownership prevents double frees.** [`Allocation`] and [`Segment`] are not
//!   `Clone`; freeing takes them by value. Misuse (a foreign allocation) panics with the
//!   broken invariant's name.
//! - **Physical memory apart from addresses.** [`VirtualMemory`] creates, maps, unmaps
//!   and releases physical chunks separately, as the CUDA driver does, so an allocator
//!   can map one chunk at several places (stitching); [`PageTable`] is the bookkeeping
//!   every device shares.
//! - **Every policy checks itself.** [`Policy::check_invariants`] walks the policy's
//!   structures; the replay engine calls it after each event in tests.
//!
//! The policies: [`caching`] (PyTorch's caching allocator), [`immediate`] (one
//! `cudaMalloc` per request, PyTorch with caching disabled), [`buddy`] (binary buddy
//! inside large segments) and [`arena`] (RAPIDS RMM's arena resource). [`registry`]
//! lists them in one table ([`registry::POLICIES`]) from which everything that names a
//! policy is derived; [`options`] is the schema each policy's options type follows, and
//! [`spec`] reads the `name:key=value,...` specifications users write.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod arena;
pub mod buddy;
pub mod caching;
mod device;
pub mod immediate;
mod lease;
pub mod options;
pub mod page_table;
mod policy;
pub mod registry;
mod slab;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use device::{
    AddressRange, ChunkId, Device, DeviceAddr, DeviceError, DeviceStats, PhysicalChunk, Segment,
    SegmentId, VirtualMemory,
};
pub use page_table::PageTable;
pub use policy::{
    AdoptBlock, AdoptError, AdoptPool, AdoptPrivatePool, AdoptSegment, AllocError, Allocation,
    AllocatorCall, BlockSnapshot, BlockState, CallError, CallOutcome, FreeBlockUse, OomCause,
    Policy, PolicyStats, PoolId, PoolStreams, Request, SegmentSnapshot, StreamId,
    MAX_REQUEST_BYTES,
};
pub use registry::{AsDynPolicy, PolicyConfig, PolicyVisitor, POLICIES};
