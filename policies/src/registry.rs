//! The one list of policies: [`POLICIES`]. Each entry comes from a type implementing
//! [`PolicyOptions`], which carries the policy's name, help, options (with their
//! defaults), parsing, printing and building. The command line's `--policies`, its help
//! and error messages, `allocsim policies`, [`PolicyConfig::defaults`] and the
//! conformance tests all read this table; adding a policy is one line here.
//!
//! The same line lets code generic over the policy's type run on the policy as its own
//! type ([`PolicyConfig::with_policy`], with a [`PolicyVisitor`]): the replay's engine
//! then calls the policy directly, not through `dyn Policy`.

use std::any::Any;
use std::fmt;

use crate::arena::ArenaOptions;
use crate::buddy::BuddyOptions;
use crate::caching::{CachingConfig, CachingDefaults};
use crate::immediate::ImmediateOptions;
use crate::options::{OptionDoc, ParseError, PolicyOptions, Setting};
use crate::policy::Policy;

/// [`POLICIES`] and [`PolicyConfig::with_policy`] from one list of options types.
macro_rules! registry {
    ($($options:ty),* $(,)?) => {
        /// Every policy, in the order help lists them and `compare` runs them by default.
        pub static POLICIES: &[PolicyEntry] = &[$(PolicyEntry::of::<$options>()),*];

        /// `visitor` on the policy `options` build, as its own type where `options` are
        /// of a registered type, else as a `dyn Policy`.
        fn visit_built<V: PolicyVisitor>(
            options: &dyn AnyOptions,
            visitor: V,
        ) -> Result<V::Output, OptionsError> {
            options.validate()?;
            $(
                if let Some(options) = options.as_any().downcast_ref::<$options>() {
                    return Ok(visitor.visit(&mut PolicyOptions::build_policy(options)?));
                }
            )*
            Ok(visitor.visit(&mut *options.build()?))
        }
    };
}

registry! {
    CachingConfig,
    ImmediateOptions,
    BuddyOptions,
    ArenaOptions,
}

/// Code generic over a policy's type, run by [`PolicyConfig::with_policy`] on the
/// policy a configuration builds (a closure cannot be generic, a trait's method can).
pub trait PolicyVisitor {
    /// What the visit gives.
    type Output;

    /// Runs on `policy`: its own type for a registered policy, `dyn Policy` otherwise.
    fn visit<P: Policy + AsDynPolicy + ?Sized>(self, policy: &mut P) -> Self::Output;
}

/// A policy of any type, sized or `dyn Policy`, seen as a `dyn Policy` (for code
/// generic over the policy's type that hands it on to code that is not).
pub trait AsDynPolicy {
    /// The policy as a `dyn Policy`.
    fn as_dyn(&self) -> &dyn Policy;
    /// The policy as a `dyn Policy`, to change.
    fn as_dyn_mut(&mut self) -> &mut dyn Policy;
}

impl<P: Policy> AsDynPolicy for P {
    #[inline(always)]
    fn as_dyn(&self) -> &dyn Policy {
        self
    }

    #[inline(always)]
    fn as_dyn_mut(&mut self) -> &mut dyn Policy {
        self
    }
}

impl AsDynPolicy for dyn Policy + '_ {
    #[inline(always)]
    fn as_dyn(&self) -> &dyn Policy {
        self
    }

    #[inline(always)]
    fn as_dyn_mut(&mut self) -> &mut dyn Policy {
        self
    }
}

/// One registered policy: its name and help, and its options type's functions.
#[derive(Clone, Copy)]
pub struct PolicyEntry {
    /// The name in specifications.
    pub name: &'static str,
    /// What the policy is, for help.
    pub about: &'static str,
    docs: fn() -> Vec<OptionDoc>,
    parse: fn(&[Setting<'_>], &CachingDefaults) -> Result<PolicyConfig, ParseError>,
    default: fn() -> PolicyConfig,
}

impl PolicyEntry {
    /// The entry of the policy whose options are `T`.
    pub const fn of<T: PolicyOptions>() -> PolicyEntry {
        PolicyEntry {
            name: T::NAME,
            about: T::ABOUT,
            docs: T::docs,
            parse: parse_as::<T>,
            default: default_as::<T>,
        }
    }

    /// Every option with its meaning and default.
    pub fn docs(&self) -> Vec<OptionDoc> {
        (self.docs)()
    }

    /// The policy with the settings of a specification, on top of the command line's
    /// defaults.
    ///
    /// # Errors
    /// An unknown option, a value that does not read, or a bad default.
    pub fn parse(
        &self,
        settings: &[Setting<'_>],
        defaults: &CachingDefaults,
    ) -> Result<PolicyConfig, ParseError> {
        (self.parse)(settings, defaults)
    }

    /// The policy with its default options.
    pub fn default_config(&self) -> PolicyConfig {
        (self.default)()
    }
}

impl fmt::Debug for PolicyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEntry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn parse_as<T: PolicyOptions>(
    settings: &[Setting<'_>],
    defaults: &CachingDefaults,
) -> Result<PolicyConfig, ParseError> {
    T::parse(settings, defaults).map(PolicyConfig::new)
}

fn default_as<T: PolicyOptions>() -> PolicyConfig {
    PolicyConfig::new(T::default())
}

/// The registered policy called `name`.
pub fn find(name: &str) -> Option<&'static PolicyEntry> {
    POLICIES.iter().find(|e| e.name == name)
}

/// The registered names, comma-separated (`caching, immediate, ...`), for messages.
pub fn known_names(separator: &str) -> String {
    POLICIES
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(separator)
}

/// A policy and its options: any [`PolicyOptions`] type.
///
/// Displays as its canonical specification (`buddy:segment=256MiB`; the name alone for
/// the defaults), which parses back to an equal configuration.
pub struct PolicyConfig {
    options: Box<dyn AnyOptions>,
}

impl PolicyConfig {
    /// A configuration from a policy's options.
    pub fn new<T: PolicyOptions>(options: T) -> PolicyConfig {
        PolicyConfig {
            options: Box::new(options),
        }
    }

    /// Every registered policy with its default options, in [`POLICIES`] order.
    pub fn defaults() -> Vec<PolicyConfig> {
        POLICIES.iter().map(PolicyEntry::default_config).collect()
    }

    /// The policy's name: `caching`, `immediate`, `buddy`, ...
    pub fn kind_name(&self) -> &'static str {
        self.options.name()
    }

    /// The options, if they are of type `T` (`config.options::<CachingConfig>()`).
    pub fn options<T: PolicyOptions>(&self) -> Option<&T> {
        self.options.as_any().downcast_ref()
    }

    /// Settings that may avoid an out-of-memory of `cause` (see
    /// [`PolicyOptions::remedies`]): each as the setting's text and the whole
    /// configuration with it.
    pub fn remedies(
        &self,
        cause: crate::policy::OomCause,
        requested_bytes: u64,
    ) -> Vec<(String, PolicyConfig)> {
        self.options.remedies(cause, requested_bytes)
    }

    /// Checks the options without building anything.
    ///
    /// # Errors
    /// When the options are inconsistent (e.g. a buddy minimum block that is not a power
    /// of two).
    pub fn validate(&self) -> Result<(), OptionsError> {
        self.options.validate()
    }

    /// Builds the policy.
    ///
    /// # Errors
    /// See [`PolicyConfig::validate`].
    pub fn build(&self) -> Result<Box<dyn Policy>, OptionsError> {
        self.options.validate()?;
        self.options.build()
    }

    /// Builds the policy and runs `visitor` on it as its own type (a registered
    /// policy's; any other as a `dyn Policy`): code generic over the policy, such as the
    /// replay's engine, then calls it directly. The policy is dropped after.
    ///
    /// # Errors
    /// See [`PolicyConfig::validate`].
    pub fn with_policy<V: PolicyVisitor>(&self, visitor: V) -> Result<V::Output, OptionsError> {
        visit_built(&*self.options, visitor)
    }
}

impl Clone for PolicyConfig {
    fn clone(&self) -> Self {
        PolicyConfig {
            options: self.options.clone_box(),
        }
    }
}

impl PartialEq for PolicyConfig {
    fn eq(&self, other: &Self) -> bool {
        self.options.equals(other.options.as_any())
    }
}

impl fmt::Debug for PolicyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options.debug(f)
    }
}

impl fmt::Display for PolicyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options = self.options.print();
        if options.is_empty() {
            write!(f, "{}", self.kind_name())
        } else {
            write!(f, "{}:{options}", self.kind_name())
        }
    }
}

/// [`PolicyOptions`] behind a pointer: what [`PolicyConfig`] needs of any options type.
trait AnyOptions: Send + Sync {
    fn name(&self) -> &'static str;
    fn print(&self) -> String;
    fn validate(&self) -> Result<(), OptionsError>;
    fn build(&self) -> Result<Box<dyn Policy>, OptionsError>;
    fn remedies(
        &self,
        cause: crate::policy::OomCause,
        requested_bytes: u64,
    ) -> Vec<(String, PolicyConfig)>;
    fn as_any(&self) -> &dyn Any;
    fn clone_box(&self) -> Box<dyn AnyOptions>;
    fn equals(&self, other: &dyn Any) -> bool;
    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: PolicyOptions> AnyOptions for T {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn print(&self) -> String {
        PolicyOptions::print(self)
    }

    fn validate(&self) -> Result<(), OptionsError> {
        PolicyOptions::validate(self)
    }

    fn build(&self) -> Result<Box<dyn Policy>, OptionsError> {
        PolicyOptions::build(self)
    }

    fn remedies(
        &self,
        cause: crate::policy::OomCause,
        requested_bytes: u64,
    ) -> Vec<(String, PolicyConfig)> {
        PolicyOptions::remedies(self, cause, requested_bytes)
            .into_iter()
            .map(|(text, options)| (text, PolicyConfig::new(options)))
            .collect()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn clone_box(&self) -> Box<dyn AnyOptions> {
        Box::new(self.clone())
    }

    fn equals(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }

    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique and so are each policy's option names.
    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = POLICIES.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POLICIES.len());
        for entry in POLICIES {
            let mut options: Vec<&str> = entry.docs().iter().map(|d| d.name).collect();
            let n = options.len();
            options.sort_unstable();
            options.dedup();
            assert_eq!(options.len(), n, "{}", entry.name);
        }
    }

    /// Every entry's defaults carry its name, build, print as the bare name and read back
    /// from it.
    #[test]
    fn every_entry_parses_builds_and_prints() {
        for entry in POLICIES {
            let config = entry.default_config();
            assert_eq!(config.kind_name(), entry.name);
            assert_eq!(config.to_string(), entry.name);
            assert!(config.build().is_ok(), "{}", entry.name);
            assert_eq!(
                entry.parse(&[], &CachingDefaults::default()).unwrap(),
                config,
                "{}",
                entry.name
            );
            assert_eq!(find(entry.name).map(|e| e.name), Some(entry.name));
        }
        assert_eq!(PolicyConfig::defaults().len(), POLICIES.len());
    }

    /// `with_policy` hands every registered policy to the visitor as its own type (not
    /// as `dyn Policy`), built as `build` builds it, and refuses invalid options.
    #[test]
    fn with_policy_visits_the_policy_as_its_own_type() {
        struct Name;
        impl PolicyVisitor for Name {
            type Output = (&'static str, String);
            fn visit<P: Policy + AsDynPolicy + ?Sized>(self, policy: &mut P) -> Self::Output {
                (
                    std::any::type_name::<P>(),
                    policy.as_dyn().name().to_string(),
                )
            }
        }
        for entry in POLICIES {
            let config = entry.default_config();
            let (type_name, name) = config.with_policy(Name).unwrap();
            assert!(!type_name.contains("dyn "), "{}: {type_name}", entry.name);
            assert_eq!(name, config.build().unwrap().name(), "{}", entry.name);
        }
        let invalid = PolicyConfig::new(BuddyOptions {
            min_block_bytes: 3,
            ..BuddyOptions::default()
        });
        assert!(invalid.with_policy(Name).is_err());
    }

    /// Configurations compare by policy and options; a downcast finds the options type.
    #[test]
    fn equality_and_downcast() {
        let buddy = PolicyConfig::new(BuddyOptions::default());
        let arena = PolicyConfig::new(ArenaOptions::default());
        assert_eq!(buddy, buddy.clone());
        assert_ne!(buddy, arena);
        assert_ne!(
            buddy,
            PolicyConfig::new(BuddyOptions {
                segment_bytes: 1 << 20,
                ..BuddyOptions::default()
            })
        );
        assert_eq!(
            buddy.options::<BuddyOptions>(),
            Some(&BuddyOptions::default())
        );
        assert!(buddy.options::<ArenaOptions>().is_none());
    }
}
