//! One device allocation per request, freed at once: PyTorch with
//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (`uncached_allocate` / `uncached_delete`).
//!
//! Each request becomes one `cudaMalloc` of exactly the requested size and each free one
//! `cudaFree`. Nothing is cached, so reserved bytes equal allocated bytes equal requested
//! bytes, and the only overhead is what the driver charges (page rounding and packing of
//! small allocations, modelled by the device). `empty_cache` has nothing to do; an out of
//! memory has nothing to release and leaves the state unchanged. Streams are ignored:
//! `cudaFree` synchronizes the device.

use crate::device::{Device, DeviceAddr, DeviceError, Segment, SegmentId};
use crate::lease::Leases;
use crate::options::PolicyOptions;
use crate::policy::{
    AllocError, Allocation, BlockSnapshot, BlockState, Policy, PolicyStats, Request,
    SegmentSnapshot, MAX_REQUEST_BYTES,
};
use crate::registry::OptionsError;

/// Options of the immediate policy: there are none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImmediateOptions;

impl PolicyOptions for ImmediateOptions {
    const NAME: &'static str = "immediate";
    const ABOUT: &'static str = "One cudaMalloc per request, freed at once: PyTorch with \
        PYTORCH_NO_CUDA_MEMORY_CACHING=1.";

    type Built = ImmediatePolicy;

    fn build_policy(&self) -> Result<ImmediatePolicy, OptionsError> {
        Ok(ImmediatePolicy::default())
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ImmediatePolicy {
    /// Live allocations, each with the id of the segment that is all of it (the
    /// segment's address and size are the allocation's).
    live: Leases<SegmentId>,
    /// The allocation half, kept by the lease table; the reserved half is the same
    /// (each allocation is one segment of its size), filled in by
    /// [`ImmediatePolicy::stats`] where read rather than kept twice.
    stats: PolicyStats,
}

impl Policy for ImmediatePolicy {
    fn name(&self) -> &str {
        "immediate"
    }

    fn allocate(
        &mut self,
        device: &mut dyn Device,
        request: Request,
    ) -> Result<Allocation, AllocError> {
        if request.size_bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        let oom = |stats| AllocError::OutOfMemory {
            requested_bytes: request.size_bytes,
            tried_bytes: request.size_bytes,
            stats,
        };
        if request.size_bytes >= MAX_REQUEST_BYTES {
            return Err(oom(self.stats()));
        }
        let segment = match device.allocate_segment(request.size_bytes) {
            Ok(s) => s,
            Err(DeviceError::OutOfMemory { .. }) => return Err(oom(self.stats())),
            Err(e) => return Err(e.into()),
        };
        let Segment {
            id,
            addr: DeviceAddr(addr),
            size_bytes: size,
        } = segment;
        Ok(self
            .live
            .issue(addr, size, size, request.stream, id, &mut self.stats))
    }

    fn free(
        &mut self,
        device: &mut dyn Device,
        allocation: &Allocation,
    ) -> Result<(), DeviceError> {
        let lease = self.live.retire(allocation, "immediate", &mut self.stats);
        device.free_segment(Segment {
            id: lease.detail,
            addr: DeviceAddr(lease.addr),
            size_bytes: lease.block_bytes,
        })
    }

    fn empty_cache(&mut self, _device: &mut dyn Device) -> Result<(), DeviceError> {
        Ok(())
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            reserved_bytes: self.stats.allocated_bytes,
            segment_count: self.stats.allocation_count,
            ..self.stats
        }
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out: Vec<SegmentSnapshot> = self
            .live
            .values()
            .map(|l| SegmentSnapshot {
                addr: DeviceAddr(l.addr),
                size_bytes: l.block_bytes,
                stream: l.stream,
                pool: "immediate",
                blocks: vec![BlockSnapshot {
                    addr: DeviceAddr(l.addr),
                    size_bytes: l.block_bytes,
                    requested_bytes: l.requested_bytes,
                    state: BlockState::Allocated,
                }],
            })
            .collect();
        out.sort_by_key(|s| s.addr);
        out
    }

    fn check_invariants(&self) {
        let (requested, allocated, count) = self.live.check("immediate");
        for l in self.live.values() {
            assert_eq!(
                l.block_bytes, l.requested_bytes,
                "immediate: an allocation is not exactly its segment"
            );
        }
        let recomputed = PolicyStats {
            requested_bytes: requested,
            allocated_bytes: allocated,
            reserved_bytes: allocated,
            allocation_count: count,
            segment_count: count,
        };
        assert_eq!(
            self.stats(),
            recomputed,
            "immediate: stats disagree with the live segments"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::StreamId;
    use crate::testing::TestDevice;

    /// Every request is one segment of exactly its size, and frees return it at once.
    #[test]
    fn one_segment_per_request() {
        let mut d = TestDevice::unbounded();
        let mut p = ImmediatePolicy::default();
        let a = p
            .allocate(
                &mut d,
                Request {
                    size_bytes: 1000,
                    stream: StreamId(0),
                },
            )
            .unwrap();
        let b = p
            .allocate(
                &mut d,
                Request {
                    size_bytes: 3,
                    stream: StreamId(0),
                },
            )
            .unwrap();
        assert_eq!(p.stats().reserved_bytes, 1003);
        assert_eq!(d.live_segments().len(), 2);
        p.free(&mut d, &a).unwrap();
        p.free(&mut d, &b).unwrap();
        p.check_invariants();
        assert_eq!(p.stats(), PolicyStats::default());
        assert!(d.live_segments().is_empty());
    }

    /// Out of memory leaves every figure as it was.
    #[test]
    fn oom_changes_nothing() {
        let mut d = TestDevice::with_capacity(4096);
        let mut p = ImmediatePolicy::default();
        let _a = p
            .allocate(
                &mut d,
                Request {
                    size_bytes: 4000,
                    stream: StreamId(0),
                },
            )
            .unwrap();
        let before = p.stats();
        let err = p
            .allocate(
                &mut d,
                Request {
                    size_bytes: 200,
                    stream: StreamId(0),
                },
            )
            .unwrap_err();
        assert!(matches!(
            err,
            AllocError::OutOfMemory {
                tried_bytes: 200,
                ..
            }
        ));
        assert_eq!(p.stats(), before);
    }
}
