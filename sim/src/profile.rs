//! Device profiles: what `allocsim probe` measured on a GPU, in YAML, turned into
//! [`SimDeviceOptions`]. Built in (`--gpu-profile NAME`, listed by `allocsim gpus`): the
//! H100 and H200 as measured, and nominal profiles of common cards (A100, L4, T4, ...)
//! whose total memory comes from published `cudaMemGetInfo` / deviceQuery figures and
//! whose context is assumed equal to the measured H100's (each says where each figure
//! comes from, in [`DeviceProfile::sources`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::device::{AddressModel, SimDeviceOptions};

/// A measured GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Device name as the driver reports it.
    pub name: String,
    /// When and how it was measured.
    #[serde(default)]
    pub measured: Option<String>,
    /// `cuDriverGetVersion` (e.g. 13000 = CUDA 13.0).
    #[serde(default)]
    pub driver_version: Option<u32>,
    /// Not measured by `allocsim probe`: figures taken from published sources and
    /// assumptions, listed in [`DeviceProfile::sources`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nominal: bool,
    /// Where each figure of a nominal profile comes from, one line per figure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// `cuMemGetInfo` total.
    pub total_bytes: u64,
    /// `cuMemGetInfo` free right after the context was created.
    pub free_at_start_bytes: u64,
    /// Bytes that could really be allocated when the card was filled: the capacity.
    pub usable_bytes: u64,
    /// Driver page size (2 MiB).
    pub page_bytes: u64,
    /// Allocations up to this size share pages.
    pub small_alloc_max_bytes: u64,
    /// Alignment of packed small allocations.
    pub small_alloc_align_bytes: u64,
    /// `cuMemGetAllocationGranularity` (minimum) for device memory.
    pub vmm_granularity_bytes: u64,
    /// Granularity of the driver's address-space chunks: the address gap between
    /// consecutive `cuMemAlloc`s of 20 MiB (32 MiB on H100; the default when a profile
    /// does not say).
    #[serde(default = "default_va_chunk")]
    pub va_chunk_bytes: u64,
    /// The spread of usable memory between processes: the largest minus the smallest
    /// number of bytes that could be allocated from the same free memory, over several
    /// processes (`allocsim probe --processes N`, or `tools/gpu/page_fill.py` run in
    /// several processes). The driver's hold-back is not the same in every process on
    /// some cards (H200: 3 276 800 bytes in some, one or two 2 MiB pages more in others,
    /// so 4 MiB; H100: the same in eight of eight, 0). `usable_bytes` is one process's
    /// figure, so another process may get up to this much less or more: a run whose
    /// outcome changes within that band is marginal ([`crate::boundary`]). 0 or absent:
    /// one figure held in every process measured, or only one process was measured.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub usable_spread_bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The largest spread of usable memory a profile may give: each marginal check replays
/// the trace once per 2 MiB page of it, so it stays small (the H200's is 4 MiB).
pub const MAX_USABLE_SPREAD_BYTES: u64 = 64 << 20;

fn default_va_chunk() -> u64 {
    crate::address::DEFAULT_CHUNK_BYTES
}

/// A profile file that cannot be used: one line naming the file, and the field or the
/// line and column.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read (or is too large to be a profile). Not a `source`:
    /// the message already says why, and a chain printed whole would say it twice.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// Not YAML of a profile (bad syntax, an unknown or missing field).
    #[error("{path}: {at}not a device profile: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// `line L column C: `, or empty.
        at: String,
        /// The parser's message.
        message: String,
    },
    /// A field whose value is impossible or contradicts another.
    #[error("{path}: {field}: {problem}")]
    Invalid {
        /// The file.
        path: String,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

/// What is wrong with one field of a profile ([`DeviceProfile::check`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileProblem {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// The largest profile file read (a measured one is about 4 KiB with its comments).
pub const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// The built-in profiles: measured ones first, then nominal ones by memory size.
const BUILTIN: &[(&str, &str)] = &[
    ("h100", include_str!("../profiles/h100.yaml")),
    ("h200", include_str!("../profiles/h200.yaml")),
    ("t4", include_str!("../profiles/t4.yaml")),
    ("v100-16gb", include_str!("../profiles/v100-16gb.yaml")),
    ("a10", include_str!("../profiles/a10.yaml")),
    ("l4", include_str!("../profiles/l4.yaml")),
    ("a10g", include_str!("../profiles/a10g.yaml")),
    ("rtx-3090", include_str!("../profiles/rtx-3090.yaml")),
    ("rtx-4090", include_str!("../profiles/rtx-4090.yaml")),
    ("v100-32gb", include_str!("../profiles/v100-32gb.yaml")),
    ("a100-40gb", include_str!("../profiles/a100-40gb.yaml")),
    ("l40s", include_str!("../profiles/l40s.yaml")),
    ("h100-pcie", include_str!("../profiles/h100-pcie.yaml")),
    ("a100-80gb", include_str!("../profiles/a100-80gb.yaml")),
];

impl DeviceProfile {
    /// Reads a profile file.
    ///
    /// # Errors
    /// Unreadable file, YAML that is not a profile (with line and column), or
    /// inconsistent figures.
    pub fn read(path: &Path) -> Result<DeviceProfile, ProfileError> {
        let name = path.display().to_string();
        let text = crate::read_small_text(path, MAX_PROFILE_BYTES, "a device profile").map_err(
            |error| ProfileError::Io {
                path: name.clone(),
                error,
            },
        )?;
        DeviceProfile::parse(&text, &name)
    }

    /// A built-in profile by name (`h100`, `h200`).
    pub fn builtin(name: &str) -> Option<DeviceProfile> {
        BUILTIN
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(n, text)| {
                DeviceProfile::parse(text, &format!("built-in profile {n}"))
                    .expect("built-in profile is valid")
            })
    }

    /// The measured built-in profile of a GPU by the name its driver reports
    /// (`cuDeviceGetName`, e.g. `NVIDIA H200`), if there is one. `validate` predicts with
    /// it: GPUs differ in what the driver holds back of the free memory (3 276 800 bytes
    /// on the H200, 2 293 760 on the H100), and a capacity from observed free memory is
    /// only exact with the GPU's own figure.
    pub fn measured_for_gpu(gpu_name: &str) -> Option<DeviceProfile> {
        DeviceProfile::builtins()
            .into_iter()
            .map(|(_, p)| p)
            .find(|p| !p.nominal && p.measured.is_some() && p.name == gpu_name.trim())
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// Every built-in profile with its name, measured ones first, then nominal ones
    /// from the smallest memory up.
    pub fn builtins() -> Vec<(&'static str, DeviceProfile)> {
        BUILTIN
            .iter()
            .map(|(n, _)| (*n, DeviceProfile::builtin(n).expect("built-in profile")))
            .collect()
    }

    /// Bytes the CUDA context and other processes take: total − free at start.
    pub fn context_bytes(&self) -> u64 {
        self.total_bytes - self.free_at_start_bytes
    }

    /// Where the figures come from, in a few words: `allocsim probe` for a measured
    /// profile, else the first source of a nominal one.
    pub fn source(&self) -> String {
        match (self.nominal, self.sources.first()) {
            (true, Some(s)) => s.clone(),
            (true, None) => "nominal".to_string(),
            (false, _) => self
                .measured
                .clone()
                .unwrap_or_else(|| "allocsim probe".to_string()),
        }
    }

    /// Parses and checks a profile's text; `path` names it in messages.
    ///
    /// # Errors
    /// YAML that is not a profile (with line and column), or inconsistent figures.
    pub fn parse(text: &str, path: &str) -> Result<DeviceProfile, ProfileError> {
        let p: DeviceProfile = serde_yaml::from_str(text).map_err(|e| ProfileError::Syntax {
            path: path.to_string(),
            at: e
                .location()
                .map(|l| format!("line {} column {}: ", l.line(), l.column()))
                .unwrap_or_default(),
            message: e.to_string(),
        })?;
        p.check()
            .map_err(|ProfileProblem { field, problem }| ProfileError::Invalid {
                path: path.to_string(),
                field,
                problem,
            })?;
        Ok(p)
    }

    /// Checks that the figures can describe a device: memory figures in order
    /// (`usable_bytes <= free_at_start_bytes <= total_bytes`, usable memory above
    /// zero), sizes that must be powers of two are, and packed allocations are smaller
    /// than a page. [`DeviceProfile::read`] and [`DeviceProfile::builtin`] check every
    /// profile they return.
    ///
    /// # Errors
    /// The first field that is wrong, with its value and the rule it breaks.
    pub fn check(&self) -> Result<(), ProfileProblem> {
        let bad = |field: &'static str, problem: String| Err(ProfileProblem { field, problem });
        let power_of_two = |field: &'static str, v: u64| {
            if v.is_power_of_two() {
                Ok(())
            } else {
                bad(field, format!("{v} is not a power of two"))
            }
        };
        if self.usable_bytes == 0 {
            return bad("usable_bytes", "0: a device must have usable memory".into());
        }
        if self.free_at_start_bytes > self.total_bytes {
            return bad(
                "free_at_start_bytes",
                format!(
                    "{} exceeds total_bytes ({}): more cannot be free than the device has",
                    self.free_at_start_bytes, self.total_bytes
                ),
            );
        }
        if self.usable_bytes > self.free_at_start_bytes {
            return bad(
                "usable_bytes",
                format!(
                    "{} exceeds free_at_start_bytes ({}): the driver cannot hand out more than \
                     was free at start",
                    self.usable_bytes, self.free_at_start_bytes
                ),
            );
        }
        power_of_two("page_bytes", self.page_bytes)?;
        power_of_two("small_alloc_align_bytes", self.small_alloc_align_bytes)?;
        power_of_two("vmm_granularity_bytes", self.vmm_granularity_bytes)?;
        if self.small_alloc_max_bytes >= self.page_bytes {
            return bad(
                "small_alloc_max_bytes",
                format!(
                    "{} is not below page_bytes ({}): only allocations smaller than a page \
                     share pages",
                    self.small_alloc_max_bytes, self.page_bytes
                ),
            );
        }
        if self.va_chunk_bytes == 0
            || self.va_chunk_bytes % crate::address::PLACEMENT_ALIGN_BYTES != 0
            || self.va_chunk_bytes > 1 << 40
        {
            return bad(
                "va_chunk_bytes",
                format!(
                    "{} is not a positive multiple of 2 MiB up to 1 TiB: the driver takes address \
                     space in whole pages",
                    self.va_chunk_bytes
                ),
            );
        }
        if self.usable_spread_bytes > MAX_USABLE_SPREAD_BYTES.min(self.usable_bytes) {
            return bad(
                "usable_spread_bytes",
                format!(
                    "{} exceeds {} (the usable memory, or 64 MiB): a spread that large is \
                     not a driver's variation between processes",
                    self.usable_spread_bytes,
                    MAX_USABLE_SPREAD_BYTES.min(self.usable_bytes)
                ),
            );
        }
        Ok(())
    }

    /// Writes the profile as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("profile serializes")
    }

    /// The simulated device this profile describes (of a profile that passes
    /// [`DeviceProfile::check`], as read and built-in ones do; the unusable free memory
    /// of one that does not is taken as 0 rather than wrapped).
    pub fn to_options(&self) -> SimDeviceOptions {
        SimDeviceOptions {
            name: if self.nominal {
                format!("{} (nominal profile)", self.name)
            } else {
                self.name.clone()
            },
            capacity_bytes: self.usable_bytes,
            total_bytes: self.total_bytes,
            page_bytes: self.page_bytes,
            small_alloc_max_bytes: self.small_alloc_max_bytes,
            small_alloc_align_bytes: self.small_alloc_align_bytes,
            unusable_free_bytes: self.free_at_start_bytes.saturating_sub(self.usable_bytes),
            address_model: AddressModel::Driver,
            va_chunk_bytes: self.va_chunk_bytes,
            usable_spread_bytes: self.usable_spread_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped H100 profile parses and carries the measured capacity.
    #[test]
    fn builtin_h100() {
        let p = DeviceProfile::builtin("H100").unwrap();
        assert_eq!(p.total_bytes, 85_017_493_504);
        let o = p.to_options();
        assert_eq!(o.capacity_bytes, 84_462_796_800);
        assert_eq!(DeviceProfile::parse(&p.to_yaml(), "x").unwrap(), p);
    }

    /// The shipped H200 profile parses and carries the capacity `allocsim probe`
    /// measured on an H200.
    #[test]
    fn builtin_h200() {
        let p = DeviceProfile::builtin("H200").unwrap();
        assert_eq!(p.name, "NVIDIA H200");
        assert_eq!(p.total_bytes, 150_109_880_320);
        let o = p.to_options();
        assert_eq!(o.capacity_bytes, 149_554_200_576);
        assert_eq!(DeviceProfile::parse(&p.to_yaml(), "x").unwrap(), p);
        assert_eq!(&DeviceProfile::builtin_names()[..2], ["h100", "h200"]);
    }

    /// Every built-in profile passes the checks, is nominal exactly when it was not
    /// measured (only h100 and h200 are), says where each nominal figure comes from,
    /// keeps the measured H100's context and unusable tail, and nominal ones come in
    /// order of memory; names are unique.
    #[test]
    fn builtin_catalog() {
        let all = DeviceProfile::builtins();
        let h100 = DeviceProfile::builtin("h100").unwrap();
        let mut last_total = 0;
        for (name, p) in &all {
            assert!(p.check().is_ok(), "{name}");
            assert_eq!(p.nominal, !["h100", "h200"].contains(name), "{name}");
            assert_eq!(DeviceProfile::parse(&p.to_yaml(), name).unwrap(), *p);
            if p.nominal {
                assert_eq!(p.sources.len(), 3, "{name}: one source per figure");
                assert!(p.sources[0].starts_with("total_bytes: "), "{name}");
                assert_eq!(p.context_bytes(), h100.context_bytes(), "{name}");
                assert_eq!(
                    p.free_at_start_bytes - p.usable_bytes,
                    h100.free_at_start_bytes - h100.usable_bytes,
                    "{name}"
                );
                assert!(p.total_bytes > last_total, "{name} out of order");
                last_total = p.total_bytes;
            }
        }
        let mut names = DeviceProfile::builtin_names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        let a100 = DeviceProfile::builtin("A100-40GB").unwrap();
        assert_eq!(a100.total_bytes, 42_505_273_344);
        assert!(a100.source().contains("42505273344"));
        assert!(h100.source().starts_with("allocsim probe"));
    }

    /// A profile with an unknown field or bad figures is refused with its place.
    #[test]
    fn bad_profiles_are_refused() {
        let bad = DeviceProfile::parse("name: x\nbogus: 1\n", "p.yaml")
            .unwrap_err()
            .to_string();
        assert!(bad.starts_with("p.yaml: line 2 column 1: "), "{bad}");
        let text =
            include_str!("../profiles/h100.yaml").replace("page_bytes: 2097152", "page_bytes: 3");
        assert_eq!(
            DeviceProfile::parse(&text, "p.yaml")
                .unwrap_err()
                .to_string(),
            "p.yaml: page_bytes: 3 is not a power of two"
        );
        let text = include_str!("../profiles/h100.yaml")
            .replace("va_chunk_bytes: 33554432", "va_chunk_bytes: 33554433");
        assert!(DeviceProfile::parse(&text, "p.yaml")
            .unwrap_err()
            .to_string()
            .starts_with("p.yaml: va_chunk_bytes: 33554433 is not a positive multiple of 2 MiB"));
        // A profile without the field (an older probe) gets the H100's granularity.
        let text = include_str!("../profiles/h100.yaml").replace("va_chunk_bytes: 33554432\n", "");
        assert_eq!(
            DeviceProfile::parse(&text, "p.yaml")
                .unwrap()
                .va_chunk_bytes,
            32 << 20
        );
    }

    /// A profile whose usable memory exceeds the memory free at start (which
    /// `to_options` subtracted, wrapping in release builds and panicking in debug) is
    /// refused when read, naming the file and the field; so is every other
    /// contradiction between the figures.
    #[test]
    fn contradictory_figures_are_refused_when_read() {
        let dir = std::env::temp_dir().join(format!("allocsim-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("card.yaml");
        let h100 = include_str!("../profiles/h100.yaml");
        let cases = [
            (
                "free_at_start_bytes: 84465090560",
                "free_at_start_bytes: 1000",
                "usable_bytes: 84462796800 exceeds free_at_start_bytes (1000)",
            ),
            (
                "total_bytes: 85017493504",
                "total_bytes: 84465090559",
                "free_at_start_bytes: 84465090560 exceeds total_bytes (84465090559)",
            ),
            (
                "usable_bytes: 84462796800",
                "usable_bytes: 0",
                "usable_bytes: 0",
            ),
            (
                "small_alloc_max_bytes: 2097151",
                "small_alloc_max_bytes: 2097152",
                "small_alloc_max_bytes: 2097152 is not below page_bytes",
            ),
            (
                "small_alloc_align_bytes: 512",
                "small_alloc_align_bytes: 0",
                "small_alloc_align_bytes: 0 is not a power of two",
            ),
        ];
        for (from, to, want) in cases {
            assert!(h100.contains(from), "{from}");
            std::fs::write(&path, h100.replace(from, to)).unwrap();
            let e = DeviceProfile::read(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{}: {want}", path.display())),
                "{to}: {e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        let e = DeviceProfile::read(&dir.join("none.yaml")).unwrap_err();
        assert!(matches!(e, ProfileError::Io { .. }), "{e:?}");
    }

    /// The measured profiles carry the spread of usable memory between processes that
    /// fills measured (docs/validation/2026-11-26-h200-page-fill-repeat: H200 511 to
    /// 509 pages, 4 MiB; docs/validation/2026-11-26-h100-band: an H100's 32-process probe,
    /// one page, 2 MiB), the simulated device carries it, and a profile that does not say
    /// has none.
    #[test]
    fn usable_spread_of_measured_profiles() {
        let h200 = DeviceProfile::builtin("h200").unwrap();
        let h100 = DeviceProfile::builtin("h100").unwrap();
        assert_eq!(h200.usable_spread_bytes, 4 << 20);
        assert_eq!(h200.to_options().usable_spread_bytes, 4 << 20);
        assert_eq!(h100.usable_spread_bytes, 2 << 20);
        assert!(include_str!("../profiles/h100.yaml").contains("\nusable_spread_bytes: 2097152\n"));
        assert!(h200.to_yaml().contains("usable_spread_bytes: 4194304"));
        let text =
            include_str!("../profiles/h100.yaml").replace("usable_spread_bytes: 2097152\n", "");
        assert_eq!(
            DeviceProfile::parse(&text, "p.yaml")
                .unwrap()
                .usable_spread_bytes,
            0
        );
        let text = include_str!("../profiles/h100.yaml").replace(
            "usable_spread_bytes: 2097152",
            "usable_spread_bytes: 67108865",
        );
        assert!(DeviceProfile::parse(&text, "p.yaml")
            .unwrap_err()
            .to_string()
            .starts_with("p.yaml: usable_spread_bytes: 67108865 exceeds 67108864"));
    }

    /// A GPU's measured profile is found by the name its driver reports, with the free
    /// memory its driver holds back (the figures: H200 3 276 800 bytes, H100
    /// 2 293 760); a capacity from observed free memory differs by that between them.
    #[test]
    fn measured_profile_by_gpu_name() {
        let h200 = DeviceProfile::measured_for_gpu("NVIDIA H200").expect("h200");
        let h100 = DeviceProfile::measured_for_gpu("NVIDIA H100 80GB HBM3").expect("h100");
        assert_eq!(h200.to_options().unusable_free_bytes, 3_276_800);
        assert_eq!(h100.to_options().unusable_free_bytes, 2_293_760);
        assert!(DeviceProfile::measured_for_gpu("Mock GPU").is_none());
        let free = 5632u64 << 20;
        assert_eq!(
            h100.to_options().with_free_bytes(free).capacity_bytes
                - h200.to_options().with_free_bytes(free).capacity_bytes,
            983_040
        );
    }
}
