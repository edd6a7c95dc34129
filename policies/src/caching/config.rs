//! `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`, parsed as PyTorch 2.11 parses it.
//!
//! PyTorch runs two parsers over the same string: the device-generic one
//! (`c10/core/AllocatorConfig.cpp`), which skips keys it does not know, then the CUDA one
//! (`c10/cuda/CUDAAllocatorConfig.cpp`), which rejects keys neither knows. Both work on
//! the same token stream: keys, values and the single characters `,` `:` `[` `]`, with
//! whitespace dropped. Error texts below are PyTorch's own where PyTorch checks a value.

use std::fmt;

use super::CachingPolicy;
use crate::options::{unknown_option, OptionDoc, OptionKind, ParseError, PolicyOptions, Setting};
use crate::registry::OptionsError;

/// 1 MiB, PyTorch's "MB" in option names.
pub const MIB: u64 = 1 << 20;
/// Every block size is a multiple of this, and at least this.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// Largest (rounded) request served from the small pool, inclusive.
pub const SMALL_SIZE_BYTES: u64 = MIB;
/// Size of a small-pool segment; the small-pool page of expandable segments.
pub const SMALL_BUFFER_BYTES: u64 = 2 * MIB;
/// Large requests below this get a `large_segment_size` segment.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 * MIB;
/// Default large segment size (`kLargeBuffer`).
pub const LARGE_BUFFER_BYTES: u64 = 20 * MIB;
/// Large requests of 10 MiB and more get a segment rounded up to a multiple of this.
pub const ROUND_LARGE_BYTES: u64 = 2 * MIB;
/// Number of power-of-two intervals (1 MiB .. 64 GiB) of `roundup_power2_divisions`.
pub const ROUNDUP_INTERVALS: usize = 16;

/// The settings of PyTorch's native caching allocator that change what it does with
/// bytes. Host (pinned) allocator keys are parsed and validated but have no field here.
#[derive(Clone, Debug, PartialEq)]
pub struct CachingConfig {
    /// Blocks of at least this size are never split (`max_split_size_mb`);
    /// `u64::MAX` = unlimited, the default.
    pub max_split_size_bytes: u64,
    /// An oversize request may take a cached oversize block at most this much larger
    /// (`max_non_split_rounding_mb`, default 20 MiB).
    pub max_non_split_rounding_bytes: u64,
    /// Divisions per power-of-two interval, index `i` covering `[2^(20+i), 2^(21+i))`
    /// bytes (index 0 also everything below, index 15 everything above); 0 or 1 = off.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Fraction of the memory limit above which cached whole segments are freed by age
    /// (`garbage_collection_threshold`); 0 = off. Needs a memory limit to take effect.
    pub garbage_collection_threshold: f64,
    /// One growing virtual segment per stream and pool (`expandable_segments:True`).
    pub expandable_segments: bool,
    /// Segment size for 1–10 MiB requests and large-pool page of expandable segments
    /// (`large_segment_size_mb`, default 20 MiB).
    pub large_segment_size_bytes: u64,
    /// `per_process_memory_fraction` from the string (1.0 = no limit), applied when the
    /// allocator is created; an explicit [`MemoryLimit`] overrides it.
    pub per_process_memory_fraction: f64,
    /// `release_lock_on_cudamalloc`: only changes multi-threaded interleaving, kept for
    /// completeness.
    pub release_lock_on_cudamalloc: bool,
    /// `backend:cudaMallocAsync` was asked for; this policy models only `native`.
    pub backend_cuda_malloc_async: bool,
    /// `graph_capture_record_stream_reuse`: during a CUDA graph capture, a block freed
    /// while other streams used it is reused at the next request on its stream instead
    /// of after the capture.
    pub graph_capture_record_stream_reuse: bool,
    /// The limit on reserved bytes (`torch.cuda.set_per_process_memory_fraction`).
    pub memory_limit: MemoryLimit,
}

impl Default for CachingConfig {
    fn default() -> Self {
        CachingConfig {
            max_split_size_bytes: u64::MAX,
            max_non_split_rounding_bytes: LARGE_BUFFER_BYTES,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            large_segment_size_bytes: LARGE_BUFFER_BYTES,
            per_process_memory_fraction: 1.0,
            release_lock_on_cudamalloc: false,
            backend_cuda_malloc_async: false,
            graph_capture_record_stream_reuse: false,
            memory_limit: MemoryLimit::FromConfig,
        }
    }
}

/// How the per-process limit on reserved bytes is set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryLimit {
    /// Whatever `per_process_memory_fraction` in the config string says (default: none).
    FromConfig,
    /// `torch.cuda.set_per_process_memory_fraction(f)`: the limit is
    /// `floor(f × total_bytes)` computed in IEEE double, as PyTorch does; 1.0 = none.
    Fraction(f64),
    /// An exact limit in bytes.
    Bytes(u64),
}

impl CachingConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string on top of the defaults.
    ///
    /// # Errors
    /// The first problem PyTorch would raise, with PyTorch's message where it has one.
    pub fn from_alloc_conf(conf: &str) -> Result<CachingConfig, AllocConfError> {
        let mut config = CachingConfig::default();
        config.apply_env(conf)?;
        Ok(config)
    }

    /// Applies a `PYTORCH_CUDA_ALLOC_CONF` string read from the environment when CUDA
    /// starts: the CUDA parser runs first (the native allocator asks for its settings
    /// when it is created), then the device-generic one. Under
    /// `backend:cudaMallocAsync` the device-generic parser never runs (only the native
    /// allocator asks for its settings): its keys must be known, but their values are
    /// not read.
    fn apply_env(&mut self, conf: &str) -> Result<(), AllocConfError> {
        let tokens = Tokens::new(conf);
        let mut next = self.clone();
        next.parse_cuda(&tokens, "CUDA")?;
        if !next.backend_cuda_malloc_async {
            next.parse_common(&tokens, false)?;
        }
        *self = next;
        Ok(())
    }

    /// Applies a `PYTORCH_CUDA_ALLOC_CONF` string mid-run, as
    /// `torch.cuda.memory._set_allocator_settings` does (PyTorch's `setAllocatorSettings`:
    /// the device-generic parser first, which refuses unknown keys "in Accelerator
    /// allocator config", then the CUDA one): `max_split_size_mb`,
    /// `roundup_power2_divisions` and `garbage_collection_threshold` go back to their
    /// defaults first, other settings keep their value unless the string sets them. The
    /// backend cannot change.
    ///
    /// # Errors
    /// See [`CachingConfig::from_alloc_conf`]. On error `self` is unchanged.
    pub fn apply_alloc_conf(&mut self, conf: &str) -> Result<(), AllocConfError> {
        let tokens = Tokens::new(conf);
        let mut next = self.clone();
        next.parse_common(&tokens, true)?;
        let async_before = next.backend_cuda_malloc_async;
        next.parse_cuda(&tokens, "CUDA")?;
        if next.backend_cuda_malloc_async != async_before {
            let name = |a: bool| if a { "cudaMallocAsync" } else { "native" };
            return Err(AllocConfError::new(format!(
                "Allocator backend parsed at runtime != allocator backend parsed at load time, {} != {}",
                name(next.backend_cuda_malloc_async),
                name(async_before)
            )));
        }
        *self = next;
        Ok(())
    }

    /// The limit on total reserved bytes for a device of `total_bytes`, if any.
    pub fn allowed_bytes(&self, total_bytes: u64) -> Option<u64> {
        let fraction = match self.memory_limit {
            MemoryLimit::Bytes(bytes) => return Some(bytes),
            MemoryLimit::Fraction(f) => f,
            MemoryLimit::FromConfig => self.per_process_memory_fraction,
        };
        // PyTorch: `allowed_memory_maximum = static_cast<size_t>(fraction * total)`,
        // set only for a fraction below 1.
        (fraction < 1.0).then_some((fraction * total_bytes as f64) as u64)
    }

    /// Divisions for a (rounded-to-be) size, PyTorch's `roundup_power2_divisions(size)`.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log_size = 63 - u64::from(size.max(1).leading_zeros());
        let index = (log_size.saturating_sub(20) as usize).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }

    /// Renders the configuration string back into `PYTORCH_CUDA_ALLOC_CONF` syntax: the
    /// settings a fresh parse needs to give these settings (empty for the defaults), in
    /// field order. [`CachingConfig::from_alloc_conf`] reads it back to an equal
    /// configuration, [`CachingConfig::memory_limit`] aside.
    pub fn to_alloc_conf(&self) -> String {
        self.alloc_conf_parts().join(",")
    }

    /// The `key:value` items of [`CachingConfig::to_alloc_conf`].
    fn alloc_conf_parts(&self) -> Vec<String> {
        let defaults = CachingConfig::default();
        let mut parts = Vec::new();
        let split_mb = self.max_split_size_bytes / MIB;
        let rounding_printed = self.max_non_split_rounding_bytes != self.large_segment_size_bytes
            || self.max_non_split_rounding_bytes > defaults.max_non_split_rounding_bytes;
        // PyTorch checks a split size and a rounding tolerance against the large segment
        // size parsed before them: one under the default segment size (reachable by
        // setting a smaller segment size first) needs a segment size that small first.
        let lowest_checked = [
            (self.max_split_size_bytes != defaults.max_split_size_bytes)
                .then_some(self.max_split_size_bytes),
            rounding_printed.then_some(self.max_non_split_rounding_bytes),
        ]
        .into_iter()
        .flatten()
        .min()
        .filter(|&b| b < defaults.large_segment_size_bytes);
        let lower_segment_first = lowest_checked.is_some();
        if let Some(low) = lowest_checked {
            parts.push(format!("large_segment_size_mb:{}", low / MIB));
        }
        if self.max_split_size_bytes != defaults.max_split_size_bytes {
            parts.push(format!("max_split_size_mb:{split_mb}"));
        }
        // Left out, the tolerance follows the large segment size. Written where it differs
        // from that, and (as always) where it is above its default; never when it follows
        // a segment size below 20 MiB, since PyTorch refuses such a tolerance written out.
        if rounding_printed {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding_bytes / MIB
            ));
        }
        if self.roundup_power2_divisions != defaults.roundup_power2_divisions {
            let d = &self.roundup_power2_divisions;
            if d.iter().all(|&x| x == d[0]) {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            } else {
                let list: Vec<String> = d
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{}:{}", 1u64 << i, v))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        if self.garbage_collection_threshold != defaults.garbage_collection_threshold {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.expandable_segments != defaults.expandable_segments {
            parts.push(format!(
                "expandable_segments:{}",
                py_bool(self.expandable_segments)
            ));
        }
        if self.large_segment_size_bytes != defaults.large_segment_size_bytes || lower_segment_first
        {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size_bytes / MIB
            ));
        }
        if self.per_process_memory_fraction != defaults.per_process_memory_fraction {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                self.per_process_memory_fraction
            ));
        }
        if self.release_lock_on_cudamalloc != defaults.release_lock_on_cudamalloc {
            parts.push(format!(
                "release_lock_on_cudamalloc:{}",
                py_bool(self.release_lock_on_cudamalloc)
            ));
        }
        if self.backend_cuda_malloc_async != defaults.backend_cuda_malloc_async {
            parts.push("backend:cudaMallocAsync".to_string());
        }
        if self.graph_capture_record_stream_reuse != defaults.graph_capture_record_stream_reuse {
            parts.push(format!(
                "graph_capture_record_stream_reuse:{}",
                py_bool(self.graph_capture_record_stream_reuse)
            ));
        }
        parts
    }

    /// `AcceleratorAllocatorConfig::parseArgs`: the device-generic keys; unknown keys are
    /// skipped here and rejected by [`CachingConfig::parse_cuda`].
    /// `strict`: unknown keys are refused here (a device parser is registered, as under
    /// `setAllocatorSettings`); otherwise they were checked by [`CachingConfig::parse_cuda`].
    fn parse_common(&mut self, t: &Tokens, strict: bool) -> Result<(), AllocConfError> {
        // Reset on every (re)parse, as PyTorch does.
        self.max_split_size_bytes = u64::MAX;
        self.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
        self.garbage_collection_threshold = 0.0;
        self.max_non_split_rounding_bytes = self.large_segment_size_bytes;
        let mut rounding_set = false;
        let mut i = 0;
        while i < t.len() {
            let key = t.get(i)?;
            i = match key {
                "max_split_size_mb" => {
                    t.expect(i + 1, ":")?;
                    let mb = t.to_size(i + 2)?;
                    let min_mb = self.large_segment_size_bytes / MIB;
                    if mb < min_mb {
                        return Err(AllocConfError::new(format!(
                            "CachingAllocator option max_split_size_mb too small, must be >= {min_mb}"
                        )));
                    }
                    self.max_split_size_bytes = mb.min(u64::MAX / MIB) * MIB;
                    i + 2
                }
                "max_non_split_rounding_mb" => {
                    t.expect(i + 1, ":")?;
                    let mb = t.to_size(i + 2)?;
                    let min_mb = self.large_segment_size_bytes / MIB;
                    if mb < min_mb {
                        return Err(AllocConfError::new(format!(
                            "CachingAllocator option max_non_split_rounding_mb too small, must be >= {min_mb}"
                        )));
                    }
                    self.max_non_split_rounding_bytes = mb.min(u64::MAX / MIB) * MIB;
                    rounding_set = true;
                    i + 2
                }
                "large_segment_size_mb" => {
                    t.expect(i + 1, ":")?;
                    let mb = t.to_size(i + 2)?;
                    if mb <= MIN_LARGE_ALLOC_BYTES / MIB {
                        return Err(AllocConfError::new(format!(
                            "CachingAllocator option large_segment_size_mb must be > {} MB",
                            MIN_LARGE_ALLOC_BYTES / MIB
                        )));
                    }
                    self.large_segment_size_bytes = mb.min(u64::MAX / MIB) * MIB;
                    if !rounding_set {
                        // The oversize tolerance defaults to the large segment size.
                        self.max_non_split_rounding_bytes = self.large_segment_size_bytes;
                    }
                    i + 2
                }
                "garbage_collection_threshold" => {
                    t.expect(i + 1, ":")?;
                    let v = t.to_double(i + 2)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(AllocConfError::new(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                        ));
                    }
                    self.garbage_collection_threshold = v;
                    i + 2
                }
                "roundup_power2_divisions" => self.parse_roundup(t, i)?,
                "expandable_segments" => {
                    t.expect(i + 1, ":")?;
                    self.expandable_segments = t.to_bool(i + 2)?;
                    i + 2
                }
                "pinned_use_background_threads" => {
                    t.expect(i + 1, ":")?;
                    t.to_bool(i + 2)?;
                    i + 2
                }
                _ if strict && !COMMON_KEYS.contains(&key) && !CUDA_KEYS.contains(&key) => {
                    return Err(unrecognized(key, "Accelerator"))
                }
                _ => t.skip_key(i)?,
            };
            if i + 1 < t.len() {
                i += 1;
                t.expect(i, ",")?;
            }
            i += 1;
        }
        Ok(())
    }

    /// The `roundup_power2_divisions` value: a single power of two, or a list
    /// `[K1:D1,K2:D2,...,>:Dn]` of MiB interval starts.
    fn parse_roundup(&mut self, t: &Tokens, key_index: usize) -> Result<usize, AllocConfError> {
        t.expect(key_index + 1, ":")?;
        let mut i = key_index + 2;
        let table = &mut self.roundup_power2_divisions;
        if t.get(i)? == "[" {
            let mut first_value = true;
            let mut last_index = 0usize;
            loop {
                i += 1;
                if i >= t.len() {
                    return Err(AllocConfError::new(
                        "Expected closing bracket ']' in ConfigTokenizer but reached end of config",
                    ));
                }
                if t.get(i)? == "]" {
                    break;
                }
                let value_index = i;
                t.expect(i + 1, ":")?;
                i += 2;
                let value = t.to_size(i)?;
                if !(value == 0 || value.is_power_of_two()) {
                    return Err(AllocConfError::new(
                        "For roundups, the divisions has to be power of 2 or 0 to disable roundup ",
                    ));
                }
                if t.get(value_index)? == ">" {
                    for slot in table.iter_mut().skip(last_index + 1) {
                        *slot = value;
                    }
                } else {
                    let boundary = t.to_size(value_index)?;
                    if !boundary.is_power_of_two() {
                        return Err(AllocConfError::new(
                            "For roundups, the intervals have to be power of 2 ",
                        ));
                    }
                    let index = (63 - boundary.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                    if first_value {
                        for slot in table.iter_mut().take(index) {
                            *slot = value;
                        }
                        first_value = false;
                    }
                    table[index] = value;
                    last_index = index;
                }
                if t.get(i + 1)? != "]" {
                    i += 1;
                    t.expect(i, ",")?;
                }
            }
            Ok(i)
        } else {
            let value = t.to_size(i)?;
            if !value.is_power_of_two() {
                return Err(AllocConfError::new(
                    "For roundups, the divisions has to be power of 2 ",
                ));
            }
            *table = [value; ROUNDUP_INTERVALS];
            Ok(i)
        }
    }

    /// `CUDAAllocatorConfig::parseArgs`: the CUDA-specific keys; every other key must be
    /// one the device-generic parser knows.
    fn parse_cuda(&mut self, t: &Tokens, parser: &str) -> Result<(), AllocConfError> {
        let mut i = 0;
        while i < t.len() {
            let key = t.get(i)?;
            i = match key {
                "backend" => {
                    t.expect(i + 1, ":")?;
                    let value = t.get(i + 2)?;
                    if value != "native" && value != "cudaMallocAsync" {
                        return Err(AllocConfError::new(
                            "Unknown allocator backend, options are native and cudaMallocAsync",
                        ));
                    }
                    self.backend_cuda_malloc_async = value == "cudaMallocAsync";
                    i + 2
                }
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    t.expect(i + 1, ":")?;
                    self.release_lock_on_cudamalloc = t.to_bool(i + 2)?;
                    i + 2
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    t.expect(i + 1, ":")?;
                    t.to_bool(i + 2)?;
                    i + 2
                }
                "graph_capture_record_stream_reuse" => {
                    t.expect(i + 1, ":")?;
                    self.graph_capture_record_stream_reuse = t.to_bool(i + 2)?;
                    i + 2
                }
                "pinned_num_register_threads" => {
                    t.expect(i + 1, ":")?;
                    let n = t.to_size(i + 2)?;
                    if !n.is_power_of_two() {
                        return Err(AllocConfError::new(format!(
                            "Number of register threads has to be power of 2, got {n}"
                        )));
                    }
                    if n > 128 {
                        return Err(AllocConfError::new(format!(
                            "Number of register threads should be less than or equal to 128, got {n}"
                        )));
                    }
                    i + 2
                }
                "pinned_reserve_segment_size_mb" => {
                    t.expect(i + 1, ":")?;
                    if t.to_size(i + 2)? == 0 {
                        return Err(AllocConfError::new(
                            "Pinned reserve segment size has to be greater than 0",
                        ));
                    }
                    i + 2
                }
                "per_process_memory_fraction" => {
                    t.expect(i + 1, ":")?;
                    let v = t.to_double(i + 2)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(AllocConfError::new(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        ));
                    }
                    self.per_process_memory_fraction = v;
                    i + 2
                }
                _ if COMMON_KEYS.contains(&key) => t.skip_key(i)?,
                _ => return Err(unrecognized(key, parser)),
            };
            if i + 1 < t.len() {
                i += 1;
                t.expect(i, ",")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// Keys of the device-generic parser, accepted (and skipped) by the CUDA one.
const COMMON_KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
    "large_segment_size_mb",
];

/// Keys of the CUDA parser (`CUDAAllocatorConfig::getKeys`, PyTorch 2.11).
const CUDA_KEYS: &[&str] = &[
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
    "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads",
    "per_process_memory_fraction",
];

/// Keys PyTorch 2.11 does not know but later releases do, with the first release that
/// accepts each (read from the headers of the 2.12 to 2.15 wheels).
pub const LATER_KEYS: &[(&str, &str)] = &[
    ("pinned_free_catch_all", "2.12"),
    ("throw_on_cudamalloc_oom", "2.12"),
    ("pinned_max_cached_size_mb", "2.13"),
    ("pinned_max_round_threshold_mb", "2.13"),
    ("expandable_segments_reserve", "2.15"),
    ("expandable_segments_reserve_by_class", "2.15"),
];

/// PyTorch's refusal of an unknown key (`parser`: "CUDA" or "Accelerator"), with the
/// release a later key belongs to.
fn unrecognized(key: &str, parser: &str) -> AllocConfError {
    let mut message = format!("Unrecognized key '{key}' in {parser} allocator config.");
    if let Some((_, version)) = LATER_KEYS.iter().find(|(k, _)| *k == key) {
        message.push_str(&format!(
            " ('{key}' is a key of PyTorch {version} and later; allocsim models PyTorch 2.11's allocator)"
        ));
    }
    AllocConfError::new(message)
}

/// A configuration string PyTorch would refuse, with PyTorch's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AllocConfError {
    message: String,
}

impl AllocConfError {
    fn new(message: impl Into<String>) -> AllocConfError {
        AllocConfError {
            message: message.into(),
        }
    }
}

/// PyTorch's `ConfigTokenizer`.
struct Tokens {
    tokens: Vec<String>,
}

impl Tokens {
    fn new(conf: &str) -> Tokens {
        let mut tokens = Vec::new();
        let mut buffer = String::new();
        for ch in conf.chars() {
            if matches!(ch, ',' | ':' | '[' | ']') {
                if !buffer.is_empty() {
                    tokens.push(std::mem::take(&mut buffer));
                }
                tokens.push(ch.to_string());
            } else if !ch.is_ascii_whitespace() {
                buffer.push(ch);
            }
        }
        if !buffer.is_empty() {
            tokens.push(buffer);
        }
        Tokens { tokens }
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn get(&self, i: usize) -> Result<&str, AllocConfError> {
        self.tokens
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| AllocConfError::new("Index out of bounds in ConfigTokenizer"))
    }

    /// `checkToken`: PyTorch 2.11 checks only that the token exists (its callers
    /// ignore whether it is the separator they expect), so `max_split_size_mb,64` reads
    /// as `max_split_size_mb:64`.
    fn expect(&self, i: usize, _token: &str) -> Result<(), AllocConfError> {
        self.get(i).map(|_| ())
    }

    fn to_size(&self, i: usize) -> Result<u64, AllocConfError> {
        stoull(self.get(i)?)
    }

    fn to_double(&self, i: usize) -> Result<f64, AllocConfError> {
        stod(self.get(i)?)
    }

    fn to_bool(&self, i: usize) -> Result<bool, AllocConfError> {
        match self.get(i)? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(AllocConfError::new(format!(
                "Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{other}'"
            ))),
        }
    }

    /// Skips a key and its value (a single token or a bracketed list); returns the
    /// index of the value's last token.
    fn skip_key(&self, i: usize) -> Result<usize, AllocConfError> {
        self.expect(i + 1, ":")?;
        let mut j = i + 2;
        if self.get(j)? != "[" {
            return Ok(j);
        }
        loop {
            j += 1;
            match self.tokens.get(j) {
                None => {
                    return Err(AllocConfError::new(
                        "Expected closing bracket ']' in ConfigTokenizer but reached end of config",
                    ))
                }
                Some(t) if t == "]" => return Ok(j),
                Some(_) => {}
            }
        }
    }
}

/// `std::stoull`: optional sign, then the longest run of decimal digits; a negative
/// value wraps around as in C++. Errors are C++'s `invalid_argument` / `out_of_range`.
fn stoull(token: &str) -> Result<u64, AllocConfError> {
    let (negative, rest) = match token.as_bytes().first() {
        Some(b'-') => (true, &token[1..]),
        Some(b'+') => (false, &token[1..]),
        _ => (false, token),
    };
    let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
    if digits.is_empty() {
        return Err(AllocConfError::new(format!(
            "stoull: no number in '{token}' (invalid_argument)"
        )));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| AllocConfError::new(format!("stoull: '{token}' is out of range")))?;
    Ok(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

/// `std::stod`: the longest prefix that is a decimal floating-point number.
fn stod(token: &str) -> Result<f64, AllocConfError> {
    // Tokens are ASCII in practice; stop at a char boundary either way.
    (1..=token.len())
        .rev()
        .filter(|&end| token.is_char_boundary(end))
        .find_map(|end| token[..end].parse::<f64>().ok())
        .ok_or_else(|| {
            AllocConfError::new(format!("stod: no number in '{token}' (invalid_argument)"))
        })
}

/// `PYTORCH_CUDA_ALLOC_CONF`-style booleans.
fn py_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}

/// What the command line sets for every caching policy of a list before the policy's own
/// options: `--alloc-conf`, and `--cap` or `--memory-fraction`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachingDefaults {
    /// A `PYTORCH_CUDA_ALLOC_CONF` string (`--alloc-conf`).
    pub alloc_conf: Option<String>,
    /// The memory limit (`--cap`, `--memory-fraction`).
    pub memory_limit: Option<MemoryLimit>,
}

/// Specification options: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys written `key=value`
/// (`caching:expandable_segments=True,max_split_size_mb=64`), plus `cap=SIZE` and
/// `memory_fraction=F`, applied on top of [`CachingDefaults`].
impl PolicyOptions for CachingConfig {
    const NAME: &'static str = "caching";
    const ABOUT: &'static str = "PyTorch's CUDA caching allocator (CUDACachingAllocator.cpp \
        2.11, rule for rule). Options are PYTORCH_CUDA_ALLOC_CONF keys written key=value, \
        plus cap and memory_fraction; --alloc-conf, --cap and --memory-fraction apply to \
        every caching policy before its own options.";

    fn docs() -> Vec<OptionDoc> {
        let d = CachingConfig::default();
        let doc = |name, kind, default: String, help| OptionDoc {
            name,
            kind,
            default,
            help,
        };
        let mib = OptionKind::Text("MiB");
        let flag = OptionKind::Text("True|False");
        let host = "Host (pinned) memory setting: checked as PyTorch checks it; no effect on \
            device memory.";
        vec![
            doc(
                "cap",
                OptionKind::Bytes,
                "none".into(),
                "Exact limit on reserved bytes (overrides the fractions).",
            ),
            doc(
                "memory_fraction",
                OptionKind::Float,
                "none".into(),
                "torch.cuda.set_per_process_memory_fraction(F), F in [0, 1]: limit = \
                 floor(F × total bytes) (overrides per_process_memory_fraction).",
            ),
            doc(
                "max_split_size_mb",
                mib,
                "unlimited".into(),
                "Blocks of at least this size are never split; at least \
                 large_segment_size_mb.",
            ),
            doc(
                "max_non_split_rounding_mb",
                mib,
                format!(
                    "large_segment_size_mb ({})",
                    d.max_non_split_rounding_bytes / MIB
                ),
                "An oversize request may take a cached oversize block at most this much \
                 larger; at least 20.",
            ),
            doc(
                "roundup_power2_divisions",
                OptionKind::Text("N|[MiB:N,...,>:N]"),
                format!("{} (off)", d.roundup_power2_divisions[0]),
                "Round requests up to one of N divisions of their power-of-two interval; \
                 a list gives N per interval from the MiB boundary on, > for the rest.",
            ),
            doc(
                "garbage_collection_threshold",
                OptionKind::Float,
                format!("{} (off)", d.garbage_collection_threshold),
                "Above this fraction of the memory limit, free cached whole segments, \
                 oldest first; in (0, 1), needs a memory limit.",
            ),
            doc(
                "expandable_segments",
                flag,
                py_bool(d.expandable_segments).into(),
                "One growing virtual segment per stream and pool instead of one \
                 cudaMalloc per segment.",
            ),
            doc(
                "large_segment_size_mb",
                mib,
                (d.large_segment_size_bytes / MIB).to_string(),
                "Segment size for 1-10 MiB requests, and the large pool's page of \
                 expandable segments; above 10.",
            ),
            doc(
                "per_process_memory_fraction",
                OptionKind::Float,
                format!("{} (no limit)", d.per_process_memory_fraction),
                "Limit on reserved bytes as a fraction of total memory, in [0, 1].",
            ),
            doc(
                "release_lock_on_cudamalloc",
                flag,
                py_bool(d.release_lock_on_cudamalloc).into(),
                "Changes only thread interleaving: no effect here.",
            ),
            doc(
                "release_lock_on_hipmalloc",
                flag,
                py_bool(d.release_lock_on_cudamalloc).into(),
                "ROCm spelling of release_lock_on_cudamalloc.",
            ),
            doc(
                "backend",
                OptionKind::Text("native|cudaMallocAsync"),
                "native".into(),
                "Only the native allocator is modelled: cudaMallocAsync is parsed as \
                 PyTorch parses it (the native keys' values unread) and replayed as native, \
                 with a warning.",
            ),
            doc("pinned_use_background_threads", flag, "False".into(), host),
            doc("pinned_use_cuda_host_register", flag, "False".into(), host),
            doc("pinned_use_hip_host_register", flag, "False".into(), host),
            doc(
                "pinned_num_register_threads",
                OptionKind::Text("N"),
                "1".into(),
                host,
            ),
            doc("pinned_reserve_segment_size_mb", mib, "0".into(), host),
            doc(
                "graph_capture_record_stream_reuse",
                flag,
                "False".into(),
                "During a CUDA graph capture, a block freed while other streams used it is \
                 reused at the next request on its stream, not after the capture.",
            ),
        ]
    }

    fn parse(settings: &[Setting<'_>], defaults: &CachingDefaults) -> Result<Self, ParseError> {
        let bad = |message: String| ParseError::Options(message);
        let mut config = CachingConfig::default();
        if let Some(conf) = &defaults.alloc_conf {
            config.apply_env(conf).map_err(|e| ParseError::Default {
                flag: "--alloc-conf",
                value: conf.clone(),
                message: e.to_string(),
            })?;
        }
        if let Some(limit) = defaults.memory_limit {
            config.memory_limit = limit;
        }
        let known = Self::docs();
        let mut conf = Vec::new();
        for &Setting { key, value } in settings {
            match key {
                "cap" => {
                    let bytes =
                        units::parse_memory_size(value).map_err(|e| bad(format!("cap: {e}")))?;
                    config.memory_limit = MemoryLimit::Bytes(bytes);
                }
                "memory_fraction" => {
                    let f: f64 = value
                        .parse()
                        .map_err(|_| bad(format!("memory_fraction: '{value}' is not a number")))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(bad(format!(
                            "memory_fraction must be in [0, 1], got {value}"
                        )));
                    }
                    config.memory_limit = MemoryLimit::Fraction(f);
                }
                _ if known.iter().any(|d| d.name == key) => conf.push(format!("{key}:{value}")),
                _ => return Err(unknown_option::<Self>(key)),
            }
        }
        if !conf.is_empty() {
            // The specification's keys add to --alloc-conf rather than resetting it: one
            // string, parsed once, as PyTorch would see it.
            let joined = defaults
                .alloc_conf
                .iter()
                .filter(|base| !base.is_empty())
                .cloned()
                .chain([conf.join(",")])
                .collect::<Vec<_>>()
                .join(",");
            let limit = config.memory_limit;
            config = CachingConfig::default();
            config.apply_env(&joined).map_err(|e| bad(e.to_string()))?;
            config.memory_limit = limit;
        }
        Ok(config)
    }

    /// The configuration string's keys (see [`CachingConfig::to_alloc_conf`]) written
    /// `key=value`, then the memory limit.
    fn print(&self) -> String {
        let mut parts: Vec<String> = self
            .alloc_conf_parts()
            .into_iter()
            .map(|part| part.replacen(':', "=", 1))
            .collect();
        match self.memory_limit {
            MemoryLimit::FromConfig => {}
            MemoryLimit::Bytes(bytes) => {
                // `cap` is read as device memory (a small unitless number is refused),
                // so a small one is printed with its unit to read back.
                parts.push(match units::format_size_exact(bytes) {
                    text if bytes < units::UNITLESS_MEMORY_MIN_BYTES
                        && text.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        format!("cap={text}B")
                    }
                    text => format!("cap={text}"),
                })
            }
            MemoryLimit::Fraction(f) => parts.push(format!("memory_fraction={f}")),
        }
        parts.join(",")
    }

    type Built = CachingPolicy;

    fn build_policy(&self) -> Result<CachingPolicy, OptionsError> {
        Ok(CachingPolicy::new(self.clone()))
    }

    /// Against fragmentation: expandable segments (one growing segment per stream and
    /// pool, so free pages join up), then `max_split_size_mb` at the request's size
    /// (blocks that large stay whole for requests that large). Nothing in the
    /// allocator's settings lends another stream's cache or hurries a pending free.
    fn remedies(
        &self,
        cause: crate::policy::OomCause,
        requested_bytes: u64,
    ) -> Vec<(String, Self)> {
        if cause != crate::policy::OomCause::Fragmentation {
            return Vec::new();
        }
        let mut out = Vec::new();
        if !self.expandable_segments {
            out.push((
                "expandable_segments=True".to_string(),
                CachingConfig {
                    expandable_segments: true,
                    ..self.clone()
                },
            ));
        }
        let mb = requested_bytes
            .div_ceil(MIB)
            .max(self.large_segment_size_bytes / MIB);
        if self.max_split_size_bytes == u64::MAX && mb < u64::MAX / MIB {
            out.push((
                format!("max_split_size_mb={mb}"),
                CachingConfig {
                    max_split_size_bytes: mb * MIB,
                    ..self.clone()
                },
            ));
        }
        out
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLimit::FromConfig => write!(f, "from config"),
            MemoryLimit::Fraction(x) => write!(f, "fraction {x}"),
            MemoryLimit::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default string parses to the defaults.
    #[test]
    fn empty_string_is_default() {
        assert_eq!(
            CachingConfig::from_alloc_conf("").unwrap(),
            CachingConfig::default()
        );
    }

    /// Every documented key is read into its field.
    #[test]
    fn keys_set_fields() {
        let c = CachingConfig::from_alloc_conf(
            "max_split_size_mb:64, max_non_split_rounding_mb:40,garbage_collection_threshold:0.6,expandable_segments:True,per_process_memory_fraction:0.5,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False",
        )
        .unwrap();
        assert_eq!(c.max_split_size_bytes, 64 * MIB);
        assert_eq!(c.max_non_split_rounding_bytes, 40 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(c.expandable_segments);
        assert_eq!(c.per_process_memory_fraction, 0.5);
        assert!(c.release_lock_on_cudamalloc);
    }

    /// A single divisions value fills every interval.
    #[test]
    fn roundup_single_value() {
        let c = CachingConfig::from_alloc_conf("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
    }

    /// The list form back-fills below the first key and `>` fills after the last one
    /// (the 2.8+ semantics; older releases overwrote the last explicit interval).
    #[test]
    fn roundup_list_new_semantics() {
        let c = CachingConfig::from_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
            .unwrap();
        let d = c.roundup_power2_divisions;
        assert!(d[..9].iter().all(|&x| x == 1), "{d:?}");
        assert_eq!(d[9], 2);
        assert_eq!(d[10], 4);
        assert!(d[11..].iter().all(|&x| x == 8), "{d:?}");
        // 700 MiB is in [512 MiB, 1 GiB): index 9.
        assert_eq!(c.divisions_for(700 * MIB), 2);
        assert_eq!(c.divisions_for(100), 1);
    }

    /// Bad values get PyTorch's messages.
    #[test]
    fn bad_values_get_pytorch_messages() {
        let cases = [
            (
                "max_split_size_mb:5",
                "CachingAllocator option max_split_size_mb too small, must be >= 20",
            ),
            (
                "max_non_split_rounding_mb:3",
                "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20",
            ),
            (
                "garbage_collection_threshold:1.5",
                "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
            ),
            (
                "roundup_power2_divisions:3",
                "For roundups, the divisions has to be power of 2 ",
            ),
            (
                "roundup_power2_divisions:[3:4]",
                "For roundups, the intervals have to be power of 2 ",
            ),
            (
                "roundup_power2_divisions:[4:3]",
                "For roundups, the divisions has to be power of 2 or 0 to disable roundup ",
            ),
            (
                "expandable_segments:true",
                "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'",
            ),
            ("foo:1", "Unrecognized key 'foo' in CUDA allocator config."),
            (
                "backend:magic",
                "Unknown allocator backend, options are native and cudaMallocAsync",
            ),
            (
                "per_process_memory_fraction:2",
                "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
            ),
            (
                "max_split_size_mb",
                "Index out of bounds in ConfigTokenizer",
            ),
        ];
        for (conf, message) in cases {
            let err = CachingConfig::from_alloc_conf(conf).unwrap_err();
            assert_eq!(err.to_string(), message, "for {conf:?}");
        }
    }

    /// Values are read with C++ `stoull` semantics: a numeric prefix is enough.
    #[test]
    fn stoull_prefix_semantics() {
        assert_eq!(stoull("64abc").unwrap(), 64);
        assert!(stoull("abc").is_err());
        assert_eq!(stoull("-1").unwrap(), u64::MAX);
    }

    /// A limit from a fraction is floor(f × total) in double arithmetic, which can land
    /// one byte under the cap it came from (so a cap on a 2 MiB boundary refuses it).
    #[test]
    fn fraction_limit_is_floor_of_double_product() {
        let mut c = CachingConfig::default();
        let total = 85_017_493_504u64;
        let cap = 5_368_709_120u64;
        c.memory_limit = MemoryLimit::Fraction(cap as f64 / total as f64);
        let allowed = c.allowed_bytes(total).unwrap();
        assert_eq!(allowed, ((cap as f64 / total as f64) * total as f64) as u64);
        c.memory_limit = MemoryLimit::Fraction(1.0);
        assert_eq!(c.allowed_bytes(total), None);
    }

    /// Re-applying a string resets the three resettable keys but keeps expandable segments.
    #[test]
    fn reparse_resets_some_keys() {
        let mut c = CachingConfig::from_alloc_conf("max_split_size_mb:64,expandable_segments:True")
            .unwrap();
        c.apply_alloc_conf("release_lock_on_cudamalloc:False")
            .unwrap();
        assert_eq!(c.max_split_size_bytes, u64::MAX);
        assert!(c.expandable_segments);
    }

    /// The rendering reads back to the same settings.
    #[test]
    fn to_alloc_conf_round_trips() {
        let c = CachingConfig::from_alloc_conf(
            "max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:True,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert_eq!(
            CachingConfig::from_alloc_conf(&c.to_alloc_conf()).unwrap(),
            c
        );
    }

    /// Regression: the rendering left out `release_lock_on_cudamalloc` and `backend`,
    /// left out a default oversize tolerance that differs from the segment size it would
    /// otherwise follow, wrote out a tolerance below PyTorch's minimum (following a
    /// smaller segment size), and put a split size below 20 MiB before the smaller
    /// segment size it needs; each read back to another configuration or not at all.
    #[test]
    fn to_alloc_conf_reads_back_in_corner_cases() {
        for conf in [
            "release_lock_on_cudamalloc:True,backend:cudaMallocAsync",
            "max_non_split_rounding_mb:20,large_segment_size_mb:40",
            "large_segment_size_mb:14",
            "large_segment_size_mb:12,max_split_size_mb:15,large_segment_size_mb:30",
        ] {
            let c = CachingConfig::from_alloc_conf(conf).unwrap();
            let rendered = c.to_alloc_conf();
            assert_eq!(
                CachingConfig::from_alloc_conf(&rendered).as_ref(),
                Ok(&c),
                "{conf} rendered as {rendered}"
            );
        }
    }

    /// Every key the options table documents is one PyTorch's parsers accept.
    #[test]
    fn documented_keys_are_accepted() {
        for doc in CachingConfig::docs() {
            if matches!(doc.name, "cap" | "memory_fraction") {
                continue;
            }
            let message = CachingConfig::from_alloc_conf(&format!("{}:1", doc.name))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                !message.contains("Unrecognized key"),
                "{}: {message}",
                doc.name
            );
        }
    }
}
