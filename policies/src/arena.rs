//! Arena allocation in the style of RAPIDS RMM. (Placeholder: the policy is being
//! written; only its options exist yet.)

use crate::device::{Device, DeviceError};
use crate::policy::{AllocError, Allocation, Policy, PolicyStats, Request, SegmentSnapshot};
use crate::registry::OptionsError;

/// Options of the arena policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaOptions {
    /// Size of the superblocks per-stream arenas take from the global arena (default 1 MiB).
    pub superblock_bytes: u64,
    /// Size of each chunk the global arena draws from the device (default 1 GiB).
    pub growth_bytes: u64,
    /// Requests above this go to the global arena directly (default: half a superblock).
    pub threshold_bytes: u64,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        ArenaOptions {
            superblock_bytes: 1 << 20,
            growth_bytes: 1 << 30,
            threshold_bytes: 1 << 19,
        }
    }
}

impl ArenaOptions {
    /// Checks the options.
    ///
    /// # Errors
    /// When a size is not a power of two or the minimum block exceeds the segment.
    pub fn validate(&self) -> Result<(), OptionsError> {
        Ok(())
    }
}

/// Placeholder.
#[derive(Debug)]
pub struct ArenaPolicy;

impl ArenaPolicy {
    /// Placeholder.
    ///
    /// # Errors
    /// Invalid options.
    pub fn new(options: ArenaOptions) -> Result<ArenaPolicy, OptionsError> {
        options.validate()?;
        Ok(ArenaPolicy)
    }
}

impl Policy for ArenaPolicy {
    fn name(&self) -> &str {
        "arena"
    }
    fn allocate(&mut self, _: &mut dyn Device, r: Request) -> Result<Allocation, AllocError> {
        Err(AllocError::OutOfMemory {
            requested_bytes: r.size_bytes,
            tried_bytes: 0,
            stats: PolicyStats::default(),
        })
    }
    fn free(&mut self, _: &mut dyn Device, _: Allocation) -> Result<(), DeviceError> {
        Ok(())
    }
    fn empty_cache(&mut self, _: &mut dyn Device) -> Result<(), DeviceError> {
        Ok(())
    }
    fn stats(&self) -> PolicyStats {
        PolicyStats::default()
    }
    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        Vec::new()
    }
    fn check_invariants(&self) {}
}
