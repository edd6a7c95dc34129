//! One device allocation per request, freed at once: PyTorch with
//! `PYTORCH_NO_CUDA_MEMORY_CACHING=1` (`uncached_allocate` / `uncached_delete`).
//!
//! Each request becomes one `cudaMalloc` of exactly the requested size and each free one
//! `cudaFree`. Nothing is cached, so reserved bytes equal allocated bytes equal requested
//! bytes, and the only overhead is what the driver charges (page rounding and packing of
//! small allocations, modelled by the device). `empty_cache` has nothing to do; an out of
//! memory has nothing to release and leaves the state unchanged. Streams are ignored:
//! `cudaFree` synchronizes the device.

use crate::device::{Device, DeviceAddr, DeviceError, Segment};
use crate::policy::{
    AllocError, Allocation, BlockSnapshot, BlockState, Policy, PolicyStats, Request,
    SegmentSnapshot, StreamId, MAX_REQUEST_BYTES,
};
use crate::slab::Slab;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ImmediatePolicy {
    live: Slab<(Segment, u64, StreamId)>,
    stats: PolicyStats,
    next_serial: u64,
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
            return Err(oom(self.stats));
        }
        let segment = match device.allocate_segment(request.size_bytes) {
            Ok(s) => s,
            Err(DeviceError::OutOfMemory { .. }) => return Err(oom(self.stats)),
            Err(e) => return Err(e.into()),
        };
        let addr = segment.addr;
        let size = segment.size_bytes;
        let slot = self.live.insert((segment, size, request.stream));
        self.stats.requested_bytes += size;
        self.stats.allocated_bytes += size;
        self.stats.reserved_bytes += size;
        self.stats.allocation_count += 1;
        self.stats.segment_count += 1;
        self.next_serial += 1;
        Ok(Allocation {
            addr,
            requested_bytes: size,
            block_bytes: size,
            stream: request.stream,
            block: slot,
            serial: self.next_serial,
        })
    }

    fn free(&mut self, device: &mut dyn Device, allocation: Allocation) -> Result<(), DeviceError> {
        let (segment, size, _) = self
            .live
            .take_if(allocation.block, |(s, _, _)| s.addr == allocation.addr)
            .expect("immediate: freeing an allocation that is not live in this policy");
        self.stats.requested_bytes -= size;
        self.stats.allocated_bytes -= size;
        self.stats.reserved_bytes -= size;
        self.stats.allocation_count -= 1;
        self.stats.segment_count -= 1;
        device.free_segment(segment)
    }

    fn empty_cache(&mut self, _device: &mut dyn Device) -> Result<(), DeviceError> {
        Ok(())
    }

    fn stats(&self) -> PolicyStats {
        self.stats
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out: Vec<SegmentSnapshot> = self
            .live
            .values()
            .map(|(segment, size, stream)| SegmentSnapshot {
                addr: segment.addr,
                size_bytes: *size,
                stream: *stream,
                pool: "immediate",
                blocks: vec![BlockSnapshot {
                    addr: DeviceAddr(segment.addr.0),
                    size_bytes: *size,
                    requested_bytes: *size,
                    state: BlockState::Allocated,
                }],
            })
            .collect();
        out.sort_by_key(|s| s.addr);
        out
    }

    fn check_invariants(&self) {
        let live: Vec<_> = self.live.values().collect();
        let bytes: u64 = live.iter().map(|(_, size, _)| size).sum();
        let recomputed = PolicyStats {
            requested_bytes: bytes,
            allocated_bytes: bytes,
            reserved_bytes: bytes,
            allocation_count: live.len() as u64,
            segment_count: live.len() as u64,
        };
        assert_eq!(
            self.stats, recomputed,
            "immediate: stats disagree with the live segments"
        );
        self.live.check("immediate");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        p.free(&mut d, a).unwrap();
        p.free(&mut d, b).unwrap();
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
