//! The real-GPU device: replays a policy's segment traffic on CUDA memory.
//!
//! [`CudaDevice`] implements the policies' [`policies::Device`] and
//! [`policies::VirtualMemory`] with CUDA *driver* calls, so any policy that runs on the
//! simulated device runs unchanged on a GPU. [`probe`] measures how the driver charges
//! allocations on a given card.
//!
//! # What is measured, and what is not
//!
//! Measured, per device:
//! - what the driver *charges*: after every successful allocate, free, create, release,
//!   map and unmap the device re-reads `cuMemGetInfo` and reports the drop of free memory since open
//!   ([`policies::DeviceStats::charged_bytes`], with its peak in
//!   [`CudaDevice::charged_bytes_peak`]). This includes the driver's rounding to 2 MiB
//!   pages and its packing of small allocations into shared 2 MiB chunks;
//! - the duration of each `cuMemAlloc_v2` / `cuMemFree_v2` (and of each `cuMemCreate`,
//!   `cuMemRelease`, map and unmap call), the driver calls only;
//! - the used memory as the hardware reports it ([`policies::Device::observed_used_bytes`]).
//!
//! Not measured: anything about *using* the memory. No kernel runs and no byte is
//! read or written; the memory is only allocated. `cuMemGetInfo` is device-wide, so
//! other processes' allocations show up in the charged figure: run on an idle GPU.
//! The accounting in [`policies::Device::stats`] is cached and never calls the driver.
//!
//! [`validate_one`] replays a trace under a policy both on the simulated device
//! (predicted) and on the GPU (observed), with the same engine; `sim::validation` says
//! whether and where they part.
//!
//! A card larger than the one being modelled can be shrunk with
//! [`CudaDevice::set_ballast_for_free_bytes`] (to within 2 MiB).
//!
//! # Why libcuda is loaded at run time
//!
//! cudarc is built with `dynamic-loading`: `libcuda.so` is `dlopen()`ed on first use
//! instead of being linked. The workspace therefore builds, and its tests pass, on
//! machines with no CUDA at all; only running on a GPU needs the driver. Opening a
//! device on such a machine is an ordinary error, [`OpenError::NoDriver`] (one line, a
//! command-line tool exits with status 3), never a panic: the library and every symbol
//! this crate calls are checked up front, and cudarc's loader panics are caught as a
//! second line of defence.
//!
//! # Why `unsafe` lives only here
//!
//! Driver calls are `unsafe`: raw pointers, handles that must be freed exactly once.
//! This crate is the only one in the workspace with `unsafe` code; it wraps each call
//! so that the rest of the workspace only sees owned [`policies::Segment`]s,
//! [`policies::AddressRange`]s and [`policies::PhysicalChunk`]s, which the type system
//! keeps from being freed twice.
//! Every `unsafe` block states why it is sound in a `SAFETY:` comment, and every driver
//! error is mapped to a [`policies::DeviceError`] in one module (`conv`).
//!
//! # Threads and cleanup
//!
//! A [`CudaDevice`] stays on the thread that opened it (it is neither `Send` nor
//! `Sync`). Dropping it frees everything it allocated; [`CudaDevice::release_all`] does
//! so reporting errors. [`install_interrupt_flag`] lets a replay stop at Ctrl-C and
//! clean up in order.

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod conv;
mod device;
mod interrupt;
mod loader;
mod probe;
mod validate;

pub use device::{drop_cleanup_errors, CudaDevice, DeviceInfo, OpenError, BALLAST_GRANULE_BYTES};
pub use interrupt::install_interrupt_flag;
pub use probe::{
    probe, probe_fill, FillProbe, HoldBack, PlacementCall, PlacementProbe, PlacementRecord,
    PlacementStep, ProbeError, ProbeReport, SizeProbe, FILL_CHUNK_BYTES, FILL_MIN_CHUNK_BYTES,
    PLACEMENT_SCRIPT, PROBE_BATCH, PROBE_SIZES,
};
pub use validate::{validate_one, ValidateError};
