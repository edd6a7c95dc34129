//! The live allocations of a policy that keeps them in a slot table (immediate, buddy,
//! arena): handing out [`Allocation`]s with unique serials, taking them back (and
//! refusing a stale or foreign one), and the allocation half of [`PolicyStats`]. One
//! definition, so the three policies cannot drift apart in that bookkeeping.

use crate::device::DeviceAddr;
use crate::policy::{Allocation, PolicyStats, StreamId};
use crate::slab::Slab;

/// One live allocation, with the policy's own detail about where it lives.
#[derive(Debug)]
pub(crate) struct Lease<T> {
    /// First byte.
    pub(crate) addr: u64,
    /// Bytes the program asked for.
    pub(crate) requested_bytes: u64,
    /// Bytes the policy set aside.
    pub(crate) block_bytes: u64,
    /// The stream it was requested on.
    pub(crate) stream: StreamId,
    /// Unique over the policy's lifetime; 1 and up.
    pub(crate) serial: u64,
    /// The policy's own record (its segment, superblock, kind of block...).
    pub(crate) detail: T,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Leases<T> {
    slab: Slab<Lease<T>>,
    next_serial: u64,
}

impl<T> Default for Leases<T> {
    fn default() -> Self {
        Leases {
            slab: Slab::default(),
            next_serial: 1,
        }
    }
}

impl<T> Leases<T> {
    /// Records a new allocation, counts it in `stats` (requested and allocated bytes,
    /// allocation count) and returns the handle for the program.
    #[inline(always)]
    pub(crate) fn issue(
        &mut self,
        addr: u64,
        requested_bytes: u64,
        block_bytes: u64,
        stream: StreamId,
        detail: T,
        stats: &mut PolicyStats,
    ) -> Allocation {
        let serial = self.next_serial;
        self.next_serial += 1;
        let block = self.slab.insert(Lease {
            addr,
            requested_bytes,
            block_bytes,
            stream,
            serial,
            detail,
        });
        stats.requested_bytes += requested_bytes;
        stats.allocated_bytes += block_bytes;
        stats.allocation_count += 1;
        Allocation {
            addr: DeviceAddr(addr),
            requested_bytes,
            block_bytes,
            stream,
            block,
            serial,
        }
    }

    /// Takes an allocation back and uncounts it from `stats`.
    ///
    /// # Panics
    /// If the allocation is not live here (freed twice, or from another policy); `who`
    /// names the policy in the message.
    #[inline(always)]
    pub(crate) fn retire(
        &mut self,
        allocation: &Allocation,
        who: &str,
        stats: &mut PolicyStats,
    ) -> Lease<T> {
        let Some(lease) = self.slab.take_if(allocation.block, |l| {
            l.serial == allocation.serial && l.addr == allocation.addr.0
        }) else {
            not_live(who, allocation)
        };
        stats.requested_bytes -= lease.requested_bytes;
        stats.allocated_bytes -= lease.block_bytes;
        stats.allocation_count -= 1;
        lease
    }

    /// The live allocations, in slot order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Lease<T>> {
        self.slab.values()
    }

    /// Checks the table (slots, serials, each block at least its request) and returns
    /// the requested bytes, allocated bytes and count it holds, for the policy to compare
    /// with its [`PolicyStats`].
    ///
    /// # Panics
    /// At the first broken invariant, naming `who`.
    pub(crate) fn check(&self, who: &str) -> (u64, u64, u64) {
        self.slab.check(who);
        let (mut requested, mut allocated, mut count) = (0u64, 0u64, 0u64);
        for l in self.values() {
            assert!(
                l.serial > 0 && l.serial < self.next_serial,
                "{who}: live block without a valid serial"
            );
            assert!(
                l.requested_bytes > 0 && l.requested_bytes <= l.block_bytes,
                "{who}: block smaller than its request"
            );
            requested += l.requested_bytes;
            allocated += l.block_bytes;
            count += 1;
        }
        (requested, allocated, count)
    }
}

/// The panic of [`Leases::retire`] for a handle that is not live, out of the hot path.
#[cold]
#[inline(never)]
fn not_live(who: &str, allocation: &Allocation) -> ! {
    panic!(
        "{who}: allocation at {} is not live in this policy (freed twice, or from another policy)",
        allocation.addr
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issued allocations are counted, get distinct serials, and come back once.
    #[test]
    fn issue_and_retire() {
        let mut leases = Leases::default();
        let mut stats = PolicyStats::default();
        let a = leases.issue(4096, 10, 512, StreamId(0), "a", &mut stats);
        let b = leases.issue(8192, 600, 1024, StreamId(3), "b", &mut stats);
        assert_ne!(a.serial, b.serial);
        assert_eq!(
            (
                stats.requested_bytes,
                stats.allocated_bytes,
                stats.allocation_count
            ),
            (610, 1536, 2)
        );
        assert_eq!(leases.check("test"), (610, 1536, 2));
        assert_eq!(leases.retire(&a, "test", &mut stats).detail, "a");
        assert_eq!(
            (
                stats.requested_bytes,
                stats.allocated_bytes,
                stats.allocation_count
            ),
            (600, 1024, 1)
        );
    }

    /// A stale handle (its slot reused by a newer allocation) is refused.
    #[test]
    #[should_panic(expected = "test: allocation at 0x1000 is not live in this policy")]
    fn stale_handle_panics() {
        let mut leases = Leases::default();
        let mut stats = PolicyStats::default();
        let a = leases.issue(4096, 10, 512, StreamId(0), (), &mut stats);
        let twin = Allocation {
            addr: a.addr,
            requested_bytes: 10,
            block_bytes: 512,
            stream: a.stream,
            block: a.block,
            serial: a.serial,
        };
        leases.retire(&a, "test", &mut stats);
        let _b = leases.issue(4096, 10, 512, StreamId(0), (), &mut stats);
        leases.retire(&twin, "test", &mut stats);
    }
}
