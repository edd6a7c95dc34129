//! One place that knows every policy: a [`PolicyConfig`] names a policy and its options,
//! and [`PolicyConfig::build`] makes it. Adding a variant here enlists a policy in the
//! CLI, `compare` and the conformance tests.

use crate::arena::{ArenaOptions, ArenaPolicy};
use crate::buddy::{BuddyOptions, BuddyPolicy};
use crate::caching::{CachingConfig, CachingPolicy};
use crate::immediate::ImmediatePolicy;
use crate::policy::Policy;

/// A policy and its options.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyConfig {
    /// PyTorch's caching allocator.
    Caching(CachingConfig),
    /// One device allocation per request, freed at once.
    Immediate,
    /// Binary buddy allocation inside large segments.
    Buddy(BuddyOptions),
    /// RAPIDS RMM-style arena allocation.
    Arena(ArenaOptions),
}

/// Options that do not make a valid policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{policy}: {message}")]
pub struct OptionsError {
    /// The policy the options were for.
    pub policy: &'static str,
    /// What is wrong with them.
    pub message: String,
}

impl PolicyConfig {
    /// Every policy with its default options.
    pub fn defaults() -> Vec<PolicyConfig> {
        vec![
            PolicyConfig::Caching(CachingConfig::default()),
            PolicyConfig::Immediate,
            PolicyConfig::Buddy(BuddyOptions::default()),
            PolicyConfig::Arena(ArenaOptions::default()),
        ]
    }

    /// The policy's short name: `caching`, `immediate`, `buddy` or `arena`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            PolicyConfig::Caching(_) => "caching",
            PolicyConfig::Immediate => "immediate",
            PolicyConfig::Buddy(_) => "buddy",
            PolicyConfig::Arena(_) => "arena",
        }
    }

    /// Checks the options without building anything.
    ///
    /// # Errors
    /// When the options are inconsistent (e.g. a buddy minimum block that is not a power
    /// of two).
    pub fn validate(&self) -> Result<(), OptionsError> {
        match self {
            PolicyConfig::Caching(_) | PolicyConfig::Immediate => Ok(()),
            PolicyConfig::Buddy(o) => o.validate(),
            PolicyConfig::Arena(o) => o.validate(),
        }
    }

    /// Builds the policy.
    ///
    /// # Errors
    /// See [`PolicyConfig::validate`].
    pub fn build(&self) -> Result<Box<dyn Policy>, OptionsError> {
        self.validate()?;
        Ok(match self {
            PolicyConfig::Caching(c) => Box::new(CachingPolicy::new(c.clone())),
            PolicyConfig::Immediate => Box::new(ImmediatePolicy::default()),
            PolicyConfig::Buddy(o) => Box::new(BuddyPolicy::new(o.clone())?),
            PolicyConfig::Arena(o) => Box::new(ArenaPolicy::new(o.clone())?),
        })
    }
}
