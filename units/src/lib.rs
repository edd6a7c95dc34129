//! Byte sizes as people write them: `512`, `4KiB`, `20MiB`, `80GiB`, `1.5GiB`.
//! Units are binary (KiB = 1024); `K`, `KB`, `M`, `MB`, ... are accepted as the same
//! binary units, as PyTorch's option names use "MB" for MiB.
//!
//! Parsing is exact: a decimal is read as a decimal, not through floating point, so
//! `9007199254740993.0` is 9007199254740993 bytes and `1.5GiB` is 1610612736; a value
//! that is not a whole number of bytes, or does not fit in 64 bits, is refused rather
//! than rounded or clamped.
//!
//! A crate of its own because two leaf crates need it and neither may depend on the
//! other: `workloads` (sizes in traces and generator options) and `policies` (sizes in
//! policy options such as `buddy:min_block=4KiB`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// The least a unitless device-memory size may be ([`parse_memory_size`]): 1 MiB.
pub const UNITLESS_MEMORY_MIN_BYTES: u64 = 1 << 20;

/// A size that could not be read. Messages quote the text (control characters escaped,
/// long text shortened) and say what would be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a number followed by an optional unit.
    #[error("'{}' is not a size (expected e.g. 512, 4KiB, 20MiB, 80GiB)", shown(.text))]
    NotASize {
        /// The text.
        text: String,
    },
    /// A number with a unit that is not one of the binary units.
    #[error("'{}' has an unknown unit '{}' (use B, KiB, MiB, GiB or TiB)", shown(.text), shown(.unit))]
    UnknownUnit {
        /// The text.
        text: String,
        /// The unit as written.
        unit: String,
    },
    /// More bytes than 64 bits hold.
    #[error("'{}' is too large (at most 18446744073709551615 bytes, 16 EiB minus one byte)", shown(.text))]
    TooLarge {
        /// The text.
        text: String,
    },
    /// A decimal that is not a whole number of bytes (`0.3`, `1.0000001KiB`).
    #[error("'{}' is not a whole number of bytes", shown(.text))]
    NotWholeBytes {
        /// The text.
        text: String,
    },
    /// A device-memory size written without a unit and below
    /// [`UNITLESS_MEMORY_MIN_BYTES`]: `16` is 16 bytes, almost certainly meant as 16 GiB.
    #[error(
        "'{}' has no unit, so it means {bytes} bytes, too little device memory to be meant; \
         write the unit: {bytes}GiB, {bytes}MiB, or {bytes}B if you do mean bytes",
        shown(.text)
    )]
    UnitlessTooSmall {
        /// The text.
        text: String,
        /// The bytes it would mean.
        bytes: u64,
    },
}

/// Parses a size. Accepts a plain integer or a number (integer or decimal) followed by
/// one of `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`
/// (case-insensitive, optional space, `_` between digits). Decimals are read exactly and
/// must come out as whole bytes.
///
/// # Errors
/// [`SizeError`]: not a size, an unknown unit, more than `u64::MAX` bytes, or a fraction
/// of a byte.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    parse(text).map(|(bytes, _)| bytes)
}

/// Parses a size of device memory (a capacity, a memory limit, a device total): as
/// [`parse_size`], but a number without a unit below [`UNITLESS_MEMORY_MIN_BYTES`]
/// (`--capacity 16`) is refused as a likely mistake; `16B` says bytes on purpose.
///
/// # Errors
/// As [`parse_size`], and [`SizeError::UnitlessTooSmall`].
pub fn parse_memory_size(text: &str) -> Result<u64, SizeError> {
    let (bytes, has_unit) = parse(text)?;
    if !has_unit && bytes < UNITLESS_MEMORY_MIN_BYTES {
        return Err(SizeError::UnitlessTooSmall {
            text: text.to_string(),
            bytes,
        });
    }
    Ok(bytes)
}

/// The bytes `text` means, and whether it had a unit.
fn parse(text: &str) -> Result<(u64, bool), SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let not_a_size = || SizeError::NotASize {
        text: text.to_string(),
    };
    let unit = unit.trim();
    let shift: u32 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ if number.is_empty() => return Err(not_a_size()),
        other => {
            return Err(SizeError::UnknownUnit {
                text: text.to_string(),
                unit: other.to_string(),
            })
        }
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    let digits = |s: &str| s.bytes().filter(|&b| b != b'_').collect::<Vec<u8>>();
    let (whole, fraction) = (digits(whole), digits(fraction));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains(&b'.') {
        return Err(not_a_size());
    }
    let too_large = || SizeError::TooLarge {
        text: text.to_string(),
    };
    // The whole part, checked against u64 at every digit (no clamping, no float).
    let mut value: u128 = 0;
    for d in whole {
        value = value * 10 + u128::from(d - b'0');
        if value > u128::from(u64::MAX) {
            return Err(too_large());
        }
    }
    let mut bytes = value << shift;
    // The fraction f / 10^k times 2^shift is whole only if k <= shift (f without
    // trailing zeros is not a multiple of 10, so 5^k | f leaves no factor 2 in f) and
    // 5^k divides f; then it is (f / 5^k) << (shift - k). Long division keeps every
    // intermediate below 10 × 5^40.
    let fraction = match fraction.iter().rposition(|&d| d != b'0') {
        Some(last) => &fraction[..=last],
        None => &[][..],
    };
    let k = fraction.len() as u32;
    if k > shift {
        return Err(SizeError::NotWholeBytes {
            text: text.to_string(),
        });
    }
    if k > 0 {
        let divisor = 5u128.pow(k);
        let (mut quotient, mut remainder) = (0u128, 0u128);
        for &d in fraction {
            remainder = remainder * 10 + u128::from(d - b'0');
            quotient = quotient * 10 + remainder / divisor;
            remainder %= divisor;
        }
        if remainder != 0 {
            return Err(SizeError::NotWholeBytes {
                text: text.to_string(),
            });
        }
        bytes += quotient << (shift - k);
    }
    let bytes = u64::try_from(bytes).map_err(|_| too_large())?;
    Ok((bytes, !unit.is_empty()))
}

/// `text` for a message: control characters escaped, at most 40 characters.
fn shown(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == 40 {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
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
        assert_eq!(parse_size(".5KiB"), Ok(512));
        assert_eq!(parse_size("5."), Ok(5));
        assert_eq!(parse_size("2.50MiB"), Ok(5 << 19));
    }

    /// Garbage, unknown units, fractions of a byte and overflow are refused.
    #[test]
    fn refuses_bad_sizes() {
        for bad in [
            "",
            "abc",
            "12XB",
            "0.3",
            "-5",
            "99999999999TiB",
            "1.2.3",
            ".",
            "GiB",
            "1e3",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// Decimals are exact: a value above 2^53 keeps its last byte, and the smallest
    /// fraction of a TiB that is a whole byte (2^-40, 40 decimals) is one byte.
    #[test]
    fn decimals_are_exact() {
        assert_eq!(parse_size("9007199254740993.0"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_size("9007199254740993"), Ok(9_007_199_254_740_993));
        assert_eq!(
            parse_size("0.0000000000009094947017729282379150390625TiB"),
            Ok(1)
        );
        assert_eq!(
            parse_size("1.0000000000009094947017729282379150390625TiB"),
            Ok((1 << 40) + 1)
        );
        assert_eq!(
            parse_size("0.00000000000090949470177292823791503906251TiB"),
            Err(SizeError::NotWholeBytes {
                text: "0.00000000000090949470177292823791503906251TiB".into()
            })
        );
        assert_eq!(
            parse_size("1.0000001KiB"),
            Err(SizeError::NotWholeBytes {
                text: "1.0000001KiB".into()
            })
        );
        assert_eq!(
            parse_size("0.5"),
            Err(SizeError::NotWholeBytes { text: "0.5".into() })
        );
    }

    /// One byte above u64::MAX is refused, in any spelling, never clamped; u64::MAX
    /// itself is accepted.
    #[test]
    fn above_u64_max_is_refused() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("18446744073709551615B"), Ok(u64::MAX));
        for bad in [
            "18446744073709551616",
            "18446744073709551616B",
            "16777216TiB",
            "17179869184GiB",
            "16777216.0TiB",
            "184467440737095516150000000000000000000000",
        ] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::TooLarge { .. })),
                "{bad}: {:?}",
                parse_size(bad)
            );
        }
        assert!(parse_size("16777215TiB").is_ok());
    }

    /// A device-memory size without a unit below 1 MiB is refused with a hint naming
    /// the units; with a unit, or from 1 MiB up, it is accepted.
    #[test]
    fn unitless_small_memory_sizes_are_refused() {
        let e = parse_memory_size("16").unwrap_err();
        assert_eq!(
            e.to_string(),
            "'16' has no unit, so it means 16 bytes, too little device memory to be meant; \
             write the unit: 16GiB, 16MiB, or 16B if you do mean bytes"
        );
        assert_eq!(parse_memory_size("16B"), Ok(16));
        assert_eq!(parse_memory_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_memory_size("1048576"), Ok(1 << 20));
        assert!(parse_memory_size("1048575").is_err());
        assert_eq!(parse_size("16"), Ok(16));
    }

    /// Messages quote the text with control characters escaped and long text cut.
    #[test]
    fn messages_are_one_safe_line() {
        let e = parse_size("1\u{1b}[31mX").unwrap_err().to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
        assert!(e.contains("\\u{1b}"), "{e}");
        let long = format!("{}x", "9".repeat(10_000));
        let e = parse_size(&long).unwrap_err().to_string();
        assert!(e.len() < 200, "{e}");
    }

    /// Exact rendering reads back to the same value.
    #[test]
    fn exact_format_round_trips() {
        for v in [
            0,
            1,
            512,
            1536,
            4096,
            20 << 20,
            3 << 30,
            (1 << 40) + 512,
            u64::MAX,
        ] {
            assert_eq!(parse_size(&format_size_exact(v)), Ok(v));
        }
    }
}
