//! Device profiles: what `allocsim probe` measured on a GPU, in YAML, turned into
//! [`SimDeviceOptions`]. The H100 profile ships built in (`--device h100`).

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
}

/// A profile file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ProfileError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

const BUILTIN: &[(&str, &str)] = &[
    ("h100", include_str!("../profiles/h100.yaml")),
    ("h200", include_str!("../profiles/h200.yaml")),
];

impl DeviceProfile {
    /// Reads a profile file.
    ///
    /// # Errors
    /// Unreadable file, YAML that is not a profile (with line and column), or
    /// inconsistent figures.
    pub fn read(path: &Path) -> Result<DeviceProfile, ProfileError> {
        let err = |message: String| ProfileError {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        DeviceProfile::parse(&text).map_err(err)
    }

    /// A built-in profile by name (`h100`, `h200`).
    pub fn builtin(name: &str) -> Option<DeviceProfile> {
        BUILTIN
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, text)| DeviceProfile::parse(text).expect("built-in profile is valid"))
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    fn parse(text: &str) -> Result<DeviceProfile, String> {
        let p: DeviceProfile = serde_yaml::from_str(text).map_err(|e| match e.location() {
            Some(l) => format!("line {} column {}: {e}", l.line(), l.column()),
            None => e.to_string(),
        })?;
        if p.usable_bytes > p.total_bytes || p.page_bytes == 0 || !p.page_bytes.is_power_of_two() {
            return Err("inconsistent profile: usable_bytes must not exceed total_bytes and page_bytes must be a power of two".into());
        }
        Ok(p)
    }

    /// Writes the profile as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("profile serializes")
    }

    /// The simulated device this profile describes.
    pub fn to_options(&self) -> SimDeviceOptions {
        SimDeviceOptions {
            name: self.name.clone(),
            capacity_bytes: self.usable_bytes,
            total_bytes: self.total_bytes,
            page_bytes: self.page_bytes,
            small_alloc_max_bytes: self.small_alloc_max_bytes,
            small_alloc_align_bytes: self.small_alloc_align_bytes,
            unusable_free_bytes: self.free_at_start_bytes - self.usable_bytes,
            address_model: AddressModel::TopDown,
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
        assert_eq!(DeviceProfile::parse(&p.to_yaml()).unwrap(), p);
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
        assert_eq!(DeviceProfile::parse(&p.to_yaml()).unwrap(), p);
        assert_eq!(DeviceProfile::builtin_names(), ["h100", "h200"]);
    }

    /// A profile with an unknown field or bad figures is refused with its place.
    #[test]
    fn bad_profiles_are_refused() {
        let bad = DeviceProfile::parse("name: x\nbogus: 1\n").unwrap_err();
        assert!(bad.contains("line"), "{bad}");
        let text =
            include_str!("../profiles/h100.yaml").replace("page_bytes: 2097152", "page_bytes: 3");
        assert!(DeviceProfile::parse(&text)
            .unwrap_err()
            .contains("power of two"));
    }
}
