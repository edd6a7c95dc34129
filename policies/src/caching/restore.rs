//! `setCheckpointPoolState`: a private pool set back to a checkpoint.
//!
//! `torch.compile`'s CUDA graph trees checkpoint their pool after recording a graph and
//! set it back before recording one on another path of the tree. PyTorch frees every
//! allocated block of the pool (ordinary frees, which the trace carries), then carves
//! each checkpointed segment again from its start, block by block: each block taken
//! where it was, exactly its checkpointed size, split whenever the free block is larger
//! (not as `should_split` would decide, and with no `round_size`), through
//! `alloc_found_block`, which records an ordinary `alloc` entry; then it frees the
//! blocks that were free in the checkpoint (ordinary frees again). A trace marks each of
//! those allocations with [`AllocatorCall::RestoreBlock`] just before it: the next
//! request takes that block instead of the best fit.

use super::*;

/// The block the next request takes ([`AllocatorCall::RestoreBlock`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Restore {
    /// The pool being set back.
    pool: PoolId,
    /// Its free block at the recorded address, if it has one.
    block: Option<u32>,
}

impl CachingPolicy {
    /// [`AllocatorCall::RestoreBlock`]: the next request takes `pool`'s free block
    /// that starts at `addr`.
    pub(super) fn restore_block(&mut self, pool: PoolId, addr: u64) -> Result<(), CallError> {
        let Some(owner) = self.private.get(&pool).map(|p| p.slot) else {
            return Err(CallError::Rejected {
                message: format!("setCheckpointPoolState: could not find private pool {pool}"),
            });
        };
        // Rare (a restore carves each checkpointed block once): a pass over the blocks.
        let block = self
            .blocks
            .iter()
            .find(|(_, b)| b.owner == owner && b.addr == addr && b.in_free_set() && b.mapped())
            .map(|(id, _)| id);
        self.restore = Some(Restore { pool, block });
        Ok(())
    }

    /// The request after an [`AllocatorCall::RestoreBlock`]: the block named, carved as
    /// `setSegmentStateToCheckpoint` carves it. When the pool has no free block there
    /// that holds the request (another configuration's pool, or a replay that went
    /// another way before), the request is served as usual from the pool being set
    /// back, and counted ([`Policy::restores_missed`]).
    #[cold]
    #[inline(never)]
    pub(super) fn restore_allocate(
        &mut self,
        device: &mut dyn Device,
        size: u64,
        stream: StreamId,
    ) -> Result<Allocation, AllocError> {
        let Restore { pool, block } = self.restore.take().expect("a restore is pending");
        let found = block.filter(|&id| {
            let b = self.block(id);
            size > 0 && b.in_free_set() && b.size >= size
        });
        if let Some(id) = found {
            let (owner, kind) = (self.block(id).owner, self.block(id).pool());
            let removed = self.pools[owner as usize]
                .get_mut(kind)
                .blocks
                .remove(&mut self.blocks, id);
            debug_assert!(removed, "block {id} was in its pool's free set");
            let split = self.block(id).size > size;
            return Ok(self.carve(id, stream, size, size, split));
        }
        self.restores_missed += 1;
        // Through `allocate` (the pending restore taken), so that the malloc keeps one
        // caller and stays inlined there.
        self.captures.push((pool, PoolStreams::All));
        let result = Policy::allocate(
            self,
            device,
            Request {
                size_bytes: size,
                stream,
            },
        );
        self.captures.pop();
        result
    }
}
