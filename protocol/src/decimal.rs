//! Exact decimals as canonical text (spec 001 "Canonical exact decimal text").
//!
//! All work is on digit strings: no binary floating point and no fixed-width integer ever
//! holds a decimal's value, so any precision survives. Sizes are bounded by PostgreSQL's
//! `numeric` limits (131072 integer digits, 16383 fractional digits) so hostile exponents
//! cannot allocate without bound.

use crate::error::{Error, Result};
use crate::types::DecimalSpec;

/// Most integer digits a decimal may have (PostgreSQL `numeric`).
pub const MAX_INTEGER_DIGITS: usize = 131_072;
/// Most fractional digits a decimal may have (PostgreSQL `numeric`).
pub const MAX_FRACTION_DIGITS: usize = 16_383;

fn invalid(reason: &'static str) -> Error {
    Error::InvalidDecimal { reason }
}

/// Consumes an optional `+`/`-` at `b[*i]`; true for `-`.
fn take_sign(b: &[u8], i: &mut usize) -> bool {
    match b.get(*i) {
        Some(b'-') => {
            *i += 1;
            true
        }
        Some(b'+') => {
            *i += 1;
            false
        }
        _ => false,
    }
}

/// Converts a source spelling (`1.2300`, `123e-2`, `+7`, `0.01230e2`, …) to canonical
/// decimal text. Accepted grammar: optional sign, digits with an optional fraction (at
/// least one digit in all), optional exponent `e`/`E` with optional sign and digits.
pub fn canonicalize(source: &str) -> Result<String> {
    let b = source.as_bytes();
    let mut i = 0;
    let negative = take_sign(b, &mut i);
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = &b[int_start..i];
    let mut frac_digits: &[u8] = &[];
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = &b[s..i];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(invalid("no digits"));
    }
    let mut exponent: i64 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        let exp_negative = take_sign(b, &mut i);
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            // Saturate: anything this large is rejected below unless the value is zero.
            exponent = exponent
                .saturating_mul(10)
                .saturating_add(i64::from(b[i] - b'0'))
                .min(i64::from(u32::MAX));
            i += 1;
        }
        if i == s {
            return Err(invalid("exponent has no digits"));
        }
        if exp_negative {
            exponent = -exponent;
        }
    }
    if i != b.len() {
        return Err(invalid("unexpected character"));
    }

    // value = digits × 10^(exponent − frac_len), with leading and trailing zeros removed.
    let all: Vec<u8> = int_digits.iter().chain(frac_digits).copied().collect();
    let first = all.iter().position(|&d| d != b'0');
    let Some(first) = first else {
        return Ok("0".to_owned());
    };
    let last = all.iter().rposition(|&d| d != b'0').unwrap_or(first);
    let sig = &all[first..=last];
    let trailing_zeros = (all.len() - 1 - last) as i64;
    let exp10 = exponent - frac_digits.len() as i64 + trailing_zeros;

    let sig_len = sig.len() as i64;
    let int_len = sig_len + exp10; // digits before the point (may be ≤ 0)
    let frac_len = (-exp10).max(0); // digits after the point
    if int_len > MAX_INTEGER_DIGITS as i64 {
        return Err(Error::LimitExceeded {
            what: "decimal integer digits",
        });
    }
    if frac_len > MAX_FRACTION_DIGITS as i64 {
        return Err(Error::LimitExceeded {
            what: "decimal fractional digits",
        });
    }

    let mut out = String::with_capacity(int_len.max(1) as usize + frac_len as usize + 2);
    if negative {
        out.push('-');
    }
    let sig = std::str::from_utf8(sig).expect("ASCII digits");
    if exp10 >= 0 {
        out.push_str(sig);
        out.extend(std::iter::repeat_n('0', exp10 as usize));
    } else if int_len > 0 {
        let (ip, fp) = sig.split_at(int_len as usize);
        out.push_str(ip);
        out.push('.');
        out.push_str(fp);
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-int_len) as usize));
        out.push_str(sig);
    }
    Ok(out)
}

/// Canonicalizes a source spelling and checks it against a field's precision and scale.
pub fn canonicalize_with(source: &str, spec: Option<DecimalSpec>) -> Result<String> {
    let canonical = canonicalize(source)?;
    if let Some(spec) = spec {
        check_bounds(&canonical, spec)?;
    }
    Ok(canonical)
}

/// Checks that a wire value is canonical decimal text; returns it unchanged.
pub fn validate_wire(text: &str, spec: Option<DecimalSpec>) -> Result<&str> {
    // The canonical form has no '+', exponent, redundant zero or '-0', so a text equal to
    // its own canonicalization is exactly the canonical grammar.
    let canonical = canonicalize(text)?;
    if canonical != text {
        return Err(invalid("not in canonical form"));
    }
    if let Some(spec) = spec {
        check_bounds(text, spec)?;
    }
    Ok(text)
}

/// Checks that a canonical decimal fits `numeric(precision, scale)` exactly, without
/// rounding: at most `scale` fractional digits and `precision − scale` integer digits.
pub fn check_bounds(canonical: &str, spec: DecimalSpec) -> Result<()> {
    let digits = canonical.trim_start_matches('-');
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    let int_digits = if int_part == "0" { 0 } else { int_part.len() };
    if frac_part.len() > spec.scale as usize {
        return Err(Error::ScaleExceeded { scale: spec.scale });
    }
    if int_digits > (spec.precision - spec.scale) as usize {
        return Err(Error::PrecisionExceeded {
            precision: spec.precision,
            scale: spec.scale,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_spellings() {
        for (src, want) in [
            ("1.2300", "1.23"),
            ("123e-2", "1.23"),
            ("0.01230e2", "1.23"),
            ("-0.000", "0"),
            ("+7", "7"),
            ("1e5", "100000"),
            ("0", "0"),
            ("-0", "0"),
            ("0e999999999999999999999", "0"),
            ("00.500", "0.5"),
            (".5", "0.5"),
            ("5.", "5"),
            ("-12.5E-3", "-0.0125"),
            ("1200", "1200"),
            ("12E2", "1200"),
            ("0.000123456", "0.000123456"),
            (
                "12345678901234567890123456789012345678901234567890.5",
                "12345678901234567890123456789012345678901234567890.5",
            ),
        ] {
            assert_eq!(canonicalize(src).unwrap(), want, "{src}");
        }
    }

    #[test]
    fn rejects_bad_sources() {
        for bad in [
            "", "-", "+", ".", "1e", "1e+", "e5", "1.2.3", " 1", "1 ", "NaN", "Infinity", "0x10",
            "1,5", "--1", "1e5.5",
        ] {
            assert_eq!(
                canonicalize(bad).unwrap_err().code(),
                "invalid_decimal",
                "{bad:?}"
            );
        }
        assert_eq!(
            canonicalize("1e999999999999").unwrap_err().code(),
            "limit_exceeded"
        );
        assert_eq!(
            canonicalize("1e-99999").unwrap_err().code(),
            "limit_exceeded"
        );
    }

    #[test]
    fn wire_is_strict() {
        let spec = DecimalSpec::new(8, 3).unwrap();
        assert!(validate_wire("12345.678", Some(spec)).is_ok());
        assert!(validate_wire("-0.001", Some(spec)).is_ok());
        for bad in ["0.0010", "1.", ".5", "00.5", "+1", "-0", "1e2", "1.230"] {
            assert!(validate_wire(bad, Some(spec)).is_err(), "{bad}");
        }
        assert_eq!(
            validate_wire("123456.7", Some(spec)).unwrap_err().code(),
            "precision_exceeded"
        );
        assert_eq!(
            validate_wire("1.2345", Some(spec)).unwrap_err().code(),
            "scale_exceeded"
        );
    }

    #[test]
    fn bounds_are_value_based() {
        let s = DecimalSpec::new(6, 0).unwrap();
        assert_eq!(canonicalize_with("1e5", Some(s)).unwrap(), "100000");
        assert!(canonicalize_with("1e6", Some(s)).is_err());
        let s = DecimalSpec::new(6, 2).unwrap();
        // Trailing zeros in the source do not count against the scale.
        assert_eq!(canonicalize_with("1.2300", Some(s)).unwrap(), "1.23");
        assert!(canonicalize_with("1.234", Some(s)).is_err());
        assert_eq!(canonicalize_with("9999.99", Some(s)).unwrap(), "9999.99");
        assert!(canonicalize_with("10000", Some(s)).is_err());
    }
}
