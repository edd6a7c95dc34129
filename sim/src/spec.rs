//! Policy specifications as users write them on the command line:
//! `caching`, `immediate`, `buddy:min_block=4KiB,segment=1GiB`,
//! `arena:superblock=4MiB,growth=2GiB,threshold=1MiB`,
//! `caching:expandable_segments=True,max_split_size_mb=64`, `caching:cap=5GiB`.
//!
//! A list (`--policies`) is split on commas outside brackets; an item with a `=` but no
//! `name:` continues the options of the item before it, so
//! `buddy:min_block=4KiB,segment=1GiB,caching` is two policies. Caching options are
//! PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys written `key=value` (list values keep
//! their brackets: `roundup_power2_divisions=[256:1,>:8]`), plus `cap=SIZE` (an exact
//! limit on reserved bytes) and `memory_fraction=F` (as
//! `torch.cuda.set_per_process_memory_fraction`).

use policies::arena::ArenaOptions;
use policies::buddy::BuddyOptions;
use policies::caching::{CachingConfig, MemoryLimit};
use policies::PolicyConfig;
use workloads::size::parse_size;

/// A parsed policy with the text that named it (its label in reports).
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    /// The text as given, e.g. `buddy:min_block=4KiB`.
    pub label: String,
    /// The policy and its options.
    pub config: PolicyConfig,
}

/// Defaults applied to every caching policy of a list before its own options:
/// `--alloc-conf`, `--cap`, `--memory-fraction`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachingDefaults {
    /// A `PYTORCH_CUDA_ALLOC_CONF` string.
    pub alloc_conf: Option<String>,
    /// The memory limit.
    pub memory_limit: Option<MemoryLimit>,
}

/// Parses a comma-separated list of policy specifications.
///
/// # Errors
/// A one-line message naming the offending item.
pub fn parse_policy_list(
    text: &str,
    defaults: &CachingDefaults,
) -> Result<Vec<PolicySpec>, String> {
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
        return Err("no policy given (known: caching, immediate, buddy, arena)".into());
    }
    items
        .iter()
        .map(|item| parse_policy(item, defaults))
        .collect()
}

/// Parses one policy specification.
///
/// # Errors
/// Unknown policy or option, bad value.
pub fn parse_policy(text: &str, defaults: &CachingDefaults) -> Result<PolicySpec, String> {
    let text = text.trim();
    let (name, rest) = match text.split_once(':') {
        Some((n, r)) => (n.trim(), r),
        None => (text, ""),
    };
    let options: Vec<(String, String)> = split_top_level(rest)
        .into_iter()
        .filter(|o| !o.trim().is_empty())
        .map(|o| match o.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(format!("policy '{text}': option '{o}' is not key=value")),
        })
        .collect::<Result<_, _>>()?;
    let err = |msg: String| format!("policy '{text}': {msg}");
    let size = |key: &str, v: &str| parse_size(v).map_err(|e| err(format!("{key}: {e}")));
    let config = match name {
        "caching" => {
            let mut config = CachingConfig::default();
            if let Some(conf) = &defaults.alloc_conf {
                config
                    .apply_alloc_conf(conf)
                    .map_err(|e| format!("--alloc-conf '{conf}': {e}"))?;
            }
            if let Some(limit) = defaults.memory_limit {
                config.memory_limit = limit;
            }
            let mut conf = Vec::new();
            for (k, v) in &options {
                match k.as_str() {
                    "cap" => config.memory_limit = MemoryLimit::Bytes(size(k, v)?),
                    "memory_fraction" => {
                        let f: f64 = v
                            .parse()
                            .map_err(|_| err(format!("memory_fraction: '{v}' is not a number")))?;
                        if !(0.0..=1.0).contains(&f) {
                            return Err(err(format!("memory_fraction must be in [0, 1], got {v}")));
                        }
                        config.memory_limit = MemoryLimit::Fraction(f);
                    }
                    _ => conf.push(format!("{k}:{v}")),
                }
            }
            if !conf.is_empty() {
                // Keys of the spec add to --alloc-conf rather than resetting it.
                let base = defaults.alloc_conf.clone().unwrap_or_default();
                let joined = [base, conf.join(",")]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(",");
                let limit = config.memory_limit;
                config
                    .apply_alloc_conf(&joined)
                    .map_err(|e| err(e.to_string()))?;
                config.memory_limit = limit;
            }
            PolicyConfig::Caching(config)
        }
        "immediate" => {
            if let Some((k, _)) = options.first() {
                return Err(err(format!("unknown option '{k}' (immediate has none)")));
            }
            PolicyConfig::Immediate
        }
        "buddy" => {
            let mut o = BuddyOptions::default();
            for (k, v) in &options {
                match k.as_str() {
                    "min_block" => o.min_block_bytes = size(k, v)?,
                    "segment" => o.segment_bytes = size(k, v)?,
                    _ => {
                        return Err(err(format!(
                            "unknown option '{k}' (known: min_block, segment)"
                        )))
                    }
                }
            }
            PolicyConfig::Buddy(o)
        }
        "arena" => {
            let mut o = ArenaOptions::default();
            let mut threshold_set = false;
            for (k, v) in &options {
                match k.as_str() {
                    "superblock" => o.superblock_bytes = size(k, v)?,
                    "growth" => o.growth_bytes = size(k, v)?,
                    "threshold" => {
                        o.threshold_bytes = size(k, v)?;
                        threshold_set = true;
                    }
                    _ => {
                        return Err(err(format!(
                            "unknown option '{k}' (known: superblock, growth, threshold)"
                        )))
                    }
                }
            }
            if !threshold_set {
                o.threshold_bytes = o.superblock_bytes / 2;
            }
            PolicyConfig::Arena(o)
        }
        other => {
            return Err(format!(
                "unknown policy '{other}' (known: caching, immediate, buddy, arena)"
            ))
        }
    };
    config.validate().map_err(|e| err(e.message))?;
    Ok(PolicySpec {
        label: text.to_string(),
        config,
    })
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
            PolicyConfig::Buddy(BuddyOptions {
                min_block_bytes: 4096,
                segment_bytes: 1 << 30
            })
        );
        match &specs[3].config {
            PolicyConfig::Arena(o) => {
                assert_eq!((o.superblock_bytes, o.threshold_bytes), (4 << 20, 2 << 20))
            }
            other => panic!("{other:?}"),
        }
    }

    /// Caching options are PyTorch keys; bracketed lists keep their commas.
    #[test]
    fn caching_options_are_alloc_conf_keys() {
        let specs =
            list("caching:expandable_segments=True,roundup_power2_divisions=[256:1,>:8],cap=5GiB");
        assert_eq!(specs.len(), 1);
        let PolicyConfig::Caching(c) = &specs[0].config else {
            panic!()
        };
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
            let PolicyConfig::Caching(c) = &s.config else {
                panic!()
            };
            assert_eq!(c.max_split_size_bytes, 64 << 20);
            assert_eq!(c.memory_limit, MemoryLimit::Fraction(0.5));
        }
    }

    /// Bad specifications get messages naming the item.
    #[test]
    fn errors_name_the_item() {
        let d = CachingDefaults::default();
        for (text, needle) in [
            ("bogus", "unknown policy 'bogus'"),
            ("buddy:min_block=3000", "power of two"),
            ("buddy:color=red", "unknown option 'color'"),
            ("caching:max_split_size_mb=5", "too small"),
            ("immediate:x=1", "immediate has none"),
            ("buddy:segment=huge", "segment"),
            ("", "no policy"),
        ] {
            let e = parse_policy_list(text, &d).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
