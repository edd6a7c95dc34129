//! Binary buddy allocation inside large segments. (Placeholder: the policy is being
//! written; only its options exist yet.)

use crate::device::{Device, DeviceError};
use crate::policy::{AllocError, Allocation, Policy, PolicyStats, Request, SegmentSnapshot};
use crate::registry::OptionsError;

/// Options of the buddy policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuddyOptions {
    /// Smallest block, a power of two (default 512 B).
    pub min_block_bytes: u64,
    /// Size of each segment the policy draws from the device, a power of two (default 1 GiB).
    pub segment_bytes: u64,
}

impl Default for BuddyOptions {
    fn default() -> Self {
        BuddyOptions {
            min_block_bytes: 512,
            segment_bytes: 1 << 30,
        }
    }
}

impl BuddyOptions {
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
pub struct BuddyPolicy;

impl BuddyPolicy {
    /// Placeholder.
    ///
    /// # Errors
    /// Invalid options.
    pub fn new(options: BuddyOptions) -> Result<BuddyPolicy, OptionsError> {
        options.validate()?;
        Ok(BuddyPolicy)
    }
}

impl Policy for BuddyPolicy {
    fn name(&self) -> &str {
        "buddy"
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
