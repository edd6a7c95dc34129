//! Byte sizes as people write them: `512`, `4KiB`, `20MiB`, `80GiB`, `1.5GiB`.
//! Units are binary (KiB = 1024); `K`, `KB`, `M`, `MB`, ... are accepted as the same
//! binary units, as PyTorch's option names use "MB" for MiB.
//!
//! A crate of its own because two leaf crates need it and neither may depend on the
//! other: `workloads` (sizes in traces and generator options) and `policies` (sizes in
//! policy options such as `buddy:min_block=4KiB`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// Parses a size. Accepts a plain integer or a number (integer or decimal) followed by
/// one of `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`
/// (case-insensitive, optional space). Decimal values must come out as whole bytes.
///
/// # Errors
/// A message saying what is wrong with `text`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number = number.replace('_', "");
    if number.is_empty() {
        return Err(format!(
            "'{text}' is not a size (expected e.g. 512, 4KiB, 20MiB, 80GiB)"
        ));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "'{text}' has an unknown unit '{other}' (use B, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .ok_or_else(|| format!("'{text}' is too large"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (expected e.g. 512, 4KiB, 20MiB, 80GiB)"))?;
    let bytes = value * multiplier as f64;
    if bytes.fract() != 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// Renders a size exactly, with the largest binary unit that divides it
/// (`20MiB`, `1536`, `3GiB`).
pub fn format_size_exact(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Renders a size for people, with two decimals in the largest fitting binary unit
/// (`1.50 GiB`, `512 B`).
pub fn format_size_human(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift {
            return format!("{:.2} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings of the CLI docs parse to their binary values.
    #[test]
    fn parses_documented_spellings() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("20MiB"), Ok(20 << 20));
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_size("1_000"), Ok(1000));
    }

    /// Garbage, unknown units, fractions of a byte and overflow are refused.
    #[test]
    fn refuses_bad_sizes() {
        for bad in ["", "abc", "12XB", "0.3", "-5", "99999999999TiB", "1.2.3"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// Exact rendering reads back to the same value.
    #[test]
    fn exact_format_round_trips() {
        for v in [0, 1, 512, 1536, 4096, 20 << 20, 3 << 30, (1 << 40) + 512] {
            assert_eq!(parse_size(&format_size_exact(v)), Ok(v));
        }
    }
}
