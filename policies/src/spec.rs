//! Policy specifications as users write them on the command line:
//! `caching`, `immediate`, `buddy:min_block=4KiB,segment=1GiB`,
//! `arena:superblock=4MiB,growth=2GiB,threshold=1MiB`,
//! `caching:expandable_segments=True,max_split_size_mb=64`, `caching:cap=5GiB`.
//!
//! A specification is a registered policy's name ([`crate::registry::POLICIES`]),
//! optionally followed by `:` and comma-separated `key=value` settings, which the
//! policy's options type reads ([`crate::options::PolicyOptions::parse`]). A list
//! (`--policies`) is split on commas outside brackets; an item with a `=` but no `name:`
//! continues the settings of the item before it, so
//! `buddy:min_block=4KiB,segment=1GiB,caching` is two policies and
//! `caching:roundup_power2_divisions=[256:1,>:8]` one.

use crate::caching::CachingDefaults;
use crate::options::{ParseError, Setting};
use crate::registry::{self, PolicyConfig};

/// A parsed policy with the text that named it (its label in reports).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    /// The text as given (trimmed), e.g. `buddy:min_block=4KiB`.
    pub label: String,
    /// The policy and its options.
    pub config: PolicyConfig,
}

/// A specification that does not name a valid policy. Each message is one line naming
/// the item (or the flag) at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The list is empty.
    #[error("no policy given (known: {known})")]
    Empty {
        /// The registered names.
        known: String,
    },
    /// The name is not registered.
    #[error("unknown policy '{name}' (known: {known})")]
    UnknownPolicy {
        /// The name given.
        name: String,
        /// The registered names.
        known: String,
    },
    /// A setting without `=`.
    #[error("policy '{item}': option '{setting}' is not key=value")]
    NotKeyValue {
        /// The specification.
        item: String,
        /// The setting.
        setting: String,
    },
    /// An unknown option, a bad value, or options that do not make a valid policy.
    #[error("policy '{item}': {message}")]
    Options {
        /// The specification.
        item: String,
        /// What is wrong.
        message: String,
    },
    /// A command-line default is invalid (`--alloc-conf`).
    #[error("{0}")]
    Default(ParseError),
}

/// Parses a comma-separated list of policy specifications.
///
/// # Errors
/// The first item that does not parse, or an empty list.
pub fn parse_policy_list(
    text: &str,
    defaults: &CachingDefaults,
) -> Result<Vec<PolicySpec>, SpecError> {
    let mut items: Vec<String> = Vec::new();
    for part in split_top_level(text) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let is_name = part
            .split(['=', ':'])
            .next()
            .is_some_and(|head| !part[head.len()..].starts_with('='));
        match items.last_mut() {
            Some(last) if !is_name => {
                last.push(if last.contains(':') { ',' } else { ':' });
                last.push_str(part);
            }
            _ => items.push(part.to_string()),
        }
    }
    if items.is_empty() {
        return Err(SpecError::Empty {
            known: registry::known_names(", "),
        });
    }
    items
        .iter()
        .map(|item| parse_policy(item, defaults))
        .collect()
}

/// Parses one policy specification; [`PolicySpec::label`] is `text`, trimmed.
///
/// # Errors
/// Unknown policy or option, a bad value, options that do not make a valid policy.
pub fn parse_policy(text: &str, defaults: &CachingDefaults) -> Result<PolicySpec, SpecError> {
    let text = text.trim();
    let (name, rest) = match text.split_once(':') {
        Some((n, r)) => (n.trim(), r),
        None => (text, ""),
    };
    let settings: Vec<Setting<'_>> = split_top_level(rest)
        .into_iter()
        .filter(|o| !o.trim().is_empty())
        .map(|o| match o.split_once('=') {
            Some((key, value)) => Ok(Setting {
                key: key.trim(),
                value: value.trim(),
            }),
            None => Err(SpecError::NotKeyValue {
                item: text.to_string(),
                setting: o.to_string(),
            }),
        })
        .collect::<Result<_, _>>()?;
    let entry = registry::find(name).ok_or_else(|| SpecError::UnknownPolicy {
        name: name.to_string(),
        known: registry::known_names(", "),
    })?;
    let item = |message: String| SpecError::Options {
        item: text.to_string(),
        message,
    };
    let config = entry.parse(&settings, defaults).map_err(|e| match e {
        ParseError::Options(message) => item(message),
        default @ ParseError::Default { .. } => SpecError::Default(default),
    })?;
    config.validate().map_err(|e| item(e.message))?;
    Ok(PolicySpec {
        label: text.to_string(),
        config,
    })
}

/// The policy name and the `key=value` settings of a specification, as written (a
/// comma inside `[...]` does not split; a setting without `=` has an empty value). For
/// reading labels back, e.g. a sweep's rows; [`parse_policy`] checks them.
pub fn split_spec(text: &str) -> (&str, Vec<(&str, &str)>) {
    let text = text.trim();
    let (name, rest) = match text.split_once(':') {
        Some((n, r)) => (n.trim(), r),
        None => (text, ""),
    };
    let settings = split_top_level(rest)
        .into_iter()
        .filter(|o| !o.trim().is_empty())
        .map(|o| match o.split_once('=') {
            Some((key, value)) => (key.trim(), value.trim()),
            None => (o.trim(), ""),
        })
        .collect();
    (name, settings)
}

/// Splits on commas that are not inside `[...]`.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::ArenaOptions;
    use crate::buddy::BuddyOptions;
    use crate::caching::{CachingConfig, MemoryLimit};
    use proptest::prelude::Strategy;
    use proptest::strategy::Just;
    use proptest::{arbitrary::any, prop_oneof};

    fn list(text: &str) -> Vec<PolicySpec> {
        parse_policy_list(text, &CachingDefaults::default()).unwrap()
    }

    /// Options attach to the policy before them; bare names start a new policy.
    #[test]
    fn list_grouping() {
        let specs =
            list("buddy:min_block=4KiB,segment=1GiB,caching,immediate,arena:superblock=4MiB");
        let labels: Vec<&str> = specs.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "buddy:min_block=4KiB,segment=1GiB",
                "caching",
                "immediate",
                "arena:superblock=4MiB"
            ]
        );
        assert_eq!(
            specs[0].config,
            PolicyConfig::new(BuddyOptions {
                min_block_bytes: 4096,
                segment_bytes: 1 << 30
            })
        );
        let arena = specs[3].config.options::<ArenaOptions>().unwrap();
        assert_eq!(
            (arena.superblock_bytes, arena.threshold_bytes),
            (4 << 20, 2 << 20)
        );
    }

    /// A bare item with `=` after a bare name becomes that policy's first option.
    #[test]
    fn bare_name_takes_following_options() {
        let specs = list("buddy,segment=256MiB, arena");
        let labels: Vec<&str> = specs.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["buddy:segment=256MiB", "arena"]);
    }

    /// Caching options are PyTorch keys; bracketed lists keep their commas.
    #[test]
    fn caching_options_are_alloc_conf_keys() {
        let specs =
            list("caching:expandable_segments=True,roundup_power2_divisions=[256:1,>:8],cap=5GiB");
        assert_eq!(specs.len(), 1);
        let c = specs[0].config.options::<CachingConfig>().unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.roundup_power2_divisions[15], 8);
        assert_eq!(c.memory_limit, MemoryLimit::Bytes(5 << 30));
    }

    /// --alloc-conf applies to every caching policy and spec keys add to it.
    #[test]
    fn caching_defaults() {
        let d = CachingDefaults {
            alloc_conf: Some("max_split_size_mb:64".into()),
            memory_limit: Some(MemoryLimit::Fraction(0.5)),
        };
        let specs = parse_policy_list("caching,caching:expandable_segments=True", &d).unwrap();
        for s in &specs {
            let c = s.config.options::<CachingConfig>().unwrap();
            assert_eq!(c.max_split_size_bytes, 64 << 20);
            assert_eq!(c.memory_limit, MemoryLimit::Fraction(0.5));
        }
    }

    /// Bad specifications get messages naming the item.
    #[test]
    fn errors_name_the_item() {
        let d = CachingDefaults::default();
        for (text, message) in [
            (
                "bogus",
                "unknown policy 'bogus' (known: caching, immediate, buddy, arena)",
            ),
            (
                "buddy:min_block=3000",
                "policy 'buddy:min_block=3000': min_block must be a power of two, got 3000",
            ),
            (
                "buddy:color=red",
                "policy 'buddy:color=red': unknown option 'color' (known: min_block, segment)",
            ),
            (
                "arena:size=1",
                "policy 'arena:size=1': unknown option 'size' (known: superblock, growth, threshold)",
            ),
            (
                "caching:max_split_size_mb=5",
                "policy 'caching:max_split_size_mb=5': CachingAllocator option max_split_size_mb too small, must be >= 20",
            ),
            (
                "immediate:x=1",
                "policy 'immediate:x=1': unknown option 'x' (immediate has none)",
            ),
            (
                "buddy:segment=huge",
                "policy 'buddy:segment=huge': segment: 'huge' is not a size (expected e.g. 512, 4KiB, 20MiB, 80GiB)",
            ),
            (
                "caching:memory_fraction=2",
                "policy 'caching:memory_fraction=2': memory_fraction must be in [0, 1], got 2",
            ),
            (
                "caching:cap",
                "policy 'caching:cap': option 'cap' is not key=value",
            ),
            (
                "",
                "no policy given (known: caching, immediate, buddy, arena)",
            ),
        ] {
            let e = parse_policy_list(text, &d).unwrap_err();
            assert_eq!(e.to_string(), message, "{text}");
        }
        let bad_default = CachingDefaults {
            alloc_conf: Some("max_split_size_mb:5".into()),
            memory_limit: None,
        };
        assert_eq!(
            parse_policy_list("buddy,caching", &bad_default)
                .unwrap_err()
                .to_string(),
            "--alloc-conf 'max_split_size_mb:5': CachingAllocator option max_split_size_mb too small, must be >= 20"
        );
    }

    /// Reads a configuration back from its printed text.
    fn reparse(config: &PolicyConfig) -> PolicyConfig {
        parse_policy(&config.to_string(), &CachingDefaults::default())
            .map(|s| s.config)
            .or_else(|e| match e {
                // Printing does not validate; invalid options read back all the same.
                SpecError::Options { .. } => {
                    let text = config.to_string();
                    let (name, rest) = text.split_once(':').unwrap_or((&text, ""));
                    let settings: Vec<Setting<'_>> = split_top_level(rest)
                        .into_iter()
                        .filter(|o| !o.is_empty())
                        .map(|o| {
                            let (key, value) = o.split_once('=').unwrap();
                            Setting { key, value }
                        })
                        .collect();
                    registry::find(name)
                        .unwrap()
                        .parse(&settings, &CachingDefaults::default())
                        .map_err(|e| SpecError::Options {
                            item: text.clone(),
                            message: e.to_string(),
                        })
                }
                other => Err(other),
            })
            .unwrap_or_else(|e| panic!("{config} does not read back: {e}"))
    }

    /// One caching setting, from values PyTorch accepts and some it refuses.
    fn caching_setting() -> impl Strategy<Value = (&'static str, String)> {
        // Values near PyTorch's bounds (10 and 20 MiB) reach the order-dependent checks.
        let mb = prop_oneof![11u64..=24, 11u64..=64, Just(u64::MAX / 3)];
        prop_oneof![
            mb.clone()
                .prop_map(|v| ("max_split_size_mb", v.to_string())),
            mb.clone()
                .prop_map(|v| ("max_non_split_rounding_mb", v.to_string())),
            mb.prop_map(|v| ("large_segment_size_mb", v.to_string())),
            (0.0f64..1.0).prop_map(|v| ("garbage_collection_threshold", v.to_string())),
            (0u32..6).prop_map(|k| ("roundup_power2_divisions", (1u64 << k).to_string())),
            proptest::collection::vec((0u32..16, 0u32..5), 1..5).prop_map(|pairs| {
                let list: Vec<String> = pairs
                    .iter()
                    .map(|(b, d)| format!("{}:{}", 1u64 << b, if *d == 0 { 0 } else { 1u64 << d }))
                    .collect();
                (
                    "roundup_power2_divisions",
                    format!("[{},>:2]", list.join(",")),
                )
            }),
            any::<bool>().prop_map(|b| (
                "expandable_segments",
                if b { "True" } else { "False" }.to_string()
            )),
            any::<bool>().prop_map(|b| (
                "release_lock_on_cudamalloc",
                if b { "True" } else { "False" }.to_string()
            )),
            prop_oneof![Just("native"), Just("cudaMallocAsync")]
                .prop_map(|v| ("backend", v.to_string())),
            (0.0f64..=1.0).prop_map(|v| ("per_process_memory_fraction", v.to_string())),
            (1u64..1 << 40).prop_map(|v| ("cap", v.to_string())),
            (0.0f64..=1.0).prop_map(|v| ("memory_fraction", v.to_string())),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

        /// Any caching configuration the settings reach prints as text that reads back
        /// to it, and printing that again gives the same text.
        #[test]
        fn caching_print_round_trips(settings in proptest::collection::vec(caching_setting(), 0..6)) {
            let text = settings
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let Ok(spec) = parse_policy(&format!("caching:{text}"), &CachingDefaults::default()) else {
                return Ok(());
            };
            let back = reparse(&spec.config);
            proptest::prop_assert_eq!(&back, &spec.config, "{} -> {}", text, spec.config);
            proptest::prop_assert_eq!(back.to_string(), spec.config.to_string());
            let c = spec.config.options::<CachingConfig>().unwrap();
            let mut from_conf = CachingConfig::from_alloc_conf(&c.to_alloc_conf()).unwrap();
            from_conf.memory_limit = c.memory_limit;
            proptest::prop_assert_eq!(&from_conf, c, "{}", c.to_alloc_conf());
        }

        /// Buddy options of any sizes, valid or not, print and read back.
        #[test]
        fn buddy_print_round_trips(min_block_bytes in any::<u64>(), segment_bytes in any::<u64>()) {
            let config = PolicyConfig::new(BuddyOptions { min_block_bytes, segment_bytes });
            proptest::prop_assert_eq!(&reparse(&config), &config, "{}", config);
            proptest::prop_assert_eq!(reparse(&config).to_string(), config.to_string());
        }

        /// Arena options of any sizes, with the threshold derived or not, print and read
        /// back.
        #[test]
        fn arena_print_round_trips(
            superblock_bytes in any::<u64>(),
            growth_bytes in any::<u64>(),
            threshold_bytes in proptest::option::of(any::<u64>()),
        ) {
            let config = PolicyConfig::new(ArenaOptions {
                superblock_bytes,
                growth_bytes,
                threshold_bytes: threshold_bytes
                    .unwrap_or(ArenaOptions::default_threshold(superblock_bytes)),
            });
            proptest::prop_assert_eq!(&reparse(&config), &config, "{}", config);
            proptest::prop_assert_eq!(reparse(&config).to_string(), config.to_string());
        }
    }
}
