//! Grammars of the canonical datetime, date and time wire strings (spec 000/001).
//!
//! `date` is `YYYY-MM-DD` naming a real proleptic Gregorian day in years 0001..=9999;
//! `time` is `HH:MM:SS.ffffff` with exactly six fractional digits and no leap second;
//! `datetime` is `YYYY-MM-DDTHH:MM:SS.ffffffZ`, always UTC.

use crate::error::{Error, Result};
use crate::types::PortableType;

fn err(ty: PortableType, reason: &'static str) -> Error {
    Error::InvalidTemporal { ty, reason }
}

fn num(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, &d| {
        d.is_ascii_digit().then(|| acc * 10 + u32::from(d - b'0'))
    })
}

fn is_leap(year: u32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn check_date(b: &[u8], ty: PortableType) -> Result<()> {
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(err(ty, "date must be YYYY-MM-DD"));
    }
    let (Some(y), Some(m), Some(d)) = (num(&b[0..4]), num(&b[5..7]), num(&b[8..10])) else {
        return Err(err(ty, "date must be YYYY-MM-DD"));
    };
    if y == 0 {
        return Err(err(ty, "year 0000 does not exist"));
    }
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => return Err(err(ty, "month out of range")),
    };
    if d == 0 || d > days {
        return Err(err(ty, "day out of range"));
    }
    Ok(())
}

fn check_time(b: &[u8], ty: PortableType) -> Result<()> {
    if b.len() != 15 || b[2] != b':' || b[5] != b':' || b[8] != b'.' {
        return Err(err(ty, "time must be HH:MM:SS.ffffff"));
    }
    let (Some(h), Some(m), Some(s), Some(_)) =
        (num(&b[0..2]), num(&b[3..5]), num(&b[6..8]), num(&b[9..15]))
    else {
        return Err(err(ty, "time must be HH:MM:SS.ffffff"));
    };
    if h > 23 || m > 59 {
        return Err(err(ty, "hour or minute out of range"));
    }
    if s > 59 {
        return Err(err(
            ty,
            "second out of range (leap seconds are not allowed)",
        ));
    }
    Ok(())
}

/// Validates a canonical `date` string.
pub fn validate_date(s: &str) -> Result<()> {
    check_date(s.as_bytes(), PortableType::Date)
}

/// Validates a canonical `time` string.
pub fn validate_time(s: &str) -> Result<()> {
    check_time(s.as_bytes(), PortableType::Time)
}

/// Validates a canonical `datetime` string.
pub fn validate_datetime(s: &str) -> Result<()> {
    let b = s.as_bytes();
    let ty = PortableType::Datetime;
    if b.len() != 27 || b[10] != b'T' || b[26] != b'Z' {
        return Err(err(ty, "datetime must be YYYY-MM-DDTHH:MM:SS.ffffffZ"));
    }
    check_date(&b[..10], ty)?;
    check_time(&b[11..26], ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        assert!(validate_date("2000-02-29").is_ok());
        assert!(validate_date("2024-02-29").is_ok());
        assert!(validate_date("0001-01-01").is_ok());
        assert!(validate_date("9999-12-31").is_ok());
        for bad in [
            "1900-02-29",
            "2023-02-29",
            "2020-13-01",
            "2020-00-10",
            "2020-04-31",
            "20-01-01",
            "0000-01-01",
            "2020-1-01",
            "2020/01/01",
            "+020-01-01",
            "2020-01-0a",
            "",
        ] {
            assert!(validate_date(bad).is_err(), "{bad}");
        }
        assert!(validate_time("23:59:59.999999").is_ok());
        for bad in [
            "24:00:00.000000",
            "12:60:00.000000",
            "23:59:60.000000",
            "12:00:00",
            "12:00:00.00000",
            "12:00:00.0000000",
            "12:00:00.000000Z",
            "1:00:00.000000",
            "12:00:00,000000",
        ] {
            assert!(validate_time(bad).is_err(), "{bad}");
        }
        assert!(validate_datetime("2024-02-29T12:34:56.123456Z").is_ok());
        for bad in [
            "2024-02-29T12:34:56.123456+00:00",
            "2024-02-29 12:34:56.123456Z",
            "2024-12-31T23:59:60.000000Z",
            "2020-01-01T00:00:00Z",
            "2020-01-01T24:00:00.000000Z",
            "2024-02-29t12:34:56.123456Z",
            "2024-02-29T12:34:56.123456z",
        ] {
            assert!(validate_datetime(bad).is_err(), "{bad}");
        }
    }
}
