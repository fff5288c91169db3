//! RFC 8785 JSON Canonicalization Scheme over the strict [`Json`] model, with the I-JSON
//! number rules the protocol adds.
//!
//! Numbers are serialized by the ECMAScript `Number.prototype.toString` rule (through
//! `ryu-js`), strings with the minimal RFC 8785 escapes, and object members sorted by the
//! UTF-16 code units of their names. A number is rejected when it is not finite as binary64,
//! or when it is an integer beyond ±(2^53−1): written as an integer token, or serializing to
//! one (see docs/protocol-decisions.md, "json numbers").

use crate::error::{Error, Result};
use crate::json::Json;

/// Largest integer every JSON runtime preserves exactly (2^53 − 1).
pub const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// Canonicalizes a JSON text: parse strictly, then serialize by RFC 8785.
pub fn canonicalize(text: &str) -> Result<String> {
    let value = Json::parse(text)?;
    let mut out = String::with_capacity(text.len());
    write_value(&value, &mut out)?;
    Ok(out)
}

/// Serializes a parsed value by RFC 8785, applying the I-JSON number rules.
pub fn to_canonical_string(value: &Json) -> Result<String> {
    let mut out = String::new();
    write_value(value, &mut out)?;
    Ok(out)
}

/// Serializes a value the protocol emits (responses, conformance results): RFC 8785 for
/// everything in the I-JSON domain, and a number outside it (say, an echoed malformed
/// version such as 9007199254740992) kept as its original token instead of failing.
pub fn to_output_string(value: &Json) -> String {
    let mut out = String::new();
    write_output(value, &mut out);
    out
}

/// Appends the [`to_output_string`] text of `value` to `out`.
pub fn write_output(value: &Json, out: &mut String) {
    write(value, out, false).expect("lenient serialization does not fail");
}

/// Appends the RFC 8785 serialization of `value` to `out`.
pub fn write_value(value: &Json, out: &mut String) -> Result<()> {
    write(value, out, true)
}

fn write(value: &Json, out: &mut String, strict: bool) -> Result<()> {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(token) => match canonical_json_number(token) {
            Ok(text) => out.push_str(&text),
            Err(_) if !strict => out.push_str(token),
            Err(e) => return Err(e),
        },
        Json::String(s) => write_string(s, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out, strict)?;
            }
            out.push(']');
        }
        Json::Object(members) => {
            let mut sorted: Vec<&(String, Json)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write(member, out, strict)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// Appends a string literal with RFC 8785 escaping.
pub fn write_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Runs of characters that need no escape are copied at once; every escaped character
    // is ASCII, so each run ends on a character boundary.
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[run..i]);
        run = i + 1;
        if escaped.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
        } else {
            out.push_str(escaped);
        }
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Parses a JSON number token (already grammar-checked) to the nearest binary64, ties to
/// even, and rejects non-finite results.
pub fn token_to_f64(token: &str) -> Result<f64> {
    let v: f64 = token.parse().map_err(|_| Error::MalformedJson {
        offset: 0,
        reason: "invalid number",
    })?;
    if !v.is_finite() {
        return Err(Error::NumberOutOfDomain {
            reason: "not finite as binary64",
        });
    }
    Ok(v)
}

/// The RFC 8785 (ECMAScript) text of a finite binary64. Negative zero gives "0".
pub fn format_f64(v: f64) -> String {
    debug_assert!(v.is_finite());
    if v == 0.0 {
        return "0".to_owned();
    }
    ryu_js::Buffer::new().format_finite(v).to_owned()
}

fn is_integer_form(token: &str) -> bool {
    !token.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
}

/// Canonical text of a number nested in a json value, under the I-JSON rules.
pub fn canonical_json_number(token: &str) -> Result<String> {
    if is_integer_form(token) {
        let digits = token.trim_start_matches('-');
        if digits.len() > 16 || (digits.len() == 16 && digits > "9007199254740991") {
            return Err(Error::NumberOutOfDomain {
                reason: "integer beyond 2^53-1",
            });
        }
    }
    let v = token_to_f64(token)?;
    let text = format_f64(v);
    if v.abs() > MAX_SAFE_INTEGER && is_integer_form(&text) {
        return Err(Error::NumberOutOfDomain {
            reason: "value serializes as an integer beyond 2^53-1",
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc8785_number_samples() {
        // Appendix B of RFC 8785 (the binary64 bit patterns and their expected text).
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, text) in cases {
            assert_eq!(format_f64(f64::from_bits(bits)), text, "{bits:#x}");
        }
    }

    #[test]
    fn sorts_by_utf16_and_escapes_minimally() {
        assert_eq!(
            canonicalize(r#"{"\uffff":4,"😀":3,"é":1,"e":2}"#).unwrap(),
            "{\"e\":2,\"é\":1,\"😀\":3,\"\u{ffff}\":4}"
        );
        assert_eq!(
            canonicalize(r#""\u001f\u007f\/\u2028""#).unwrap(),
            "\"\\u001f\u{7f}/\u{2028}\""
        );
    }

    #[test]
    fn every_control_character_and_quote_is_escaped_around_any_text() {
        // RFC 8785 3.2.2.2: the two-character escapes where JSON has one, \u00xx (lower-case
        // hex) for every other control character, everything else as is.
        let short = [
            ('"', "\\\""),
            ('\\', "\\\\"),
            ('\u{8}', "\\b"),
            ('\u{c}', "\\f"),
            ('\n', "\\n"),
            ('\r', "\\r"),
            ('\t', "\\t"),
        ];
        for c in (0u8..0x80)
            .map(char::from)
            .chain(['é', '\u{2028}', '😀', '\u{ffff}'])
        {
            let expected = match short.iter().find(|(s, _)| *s == c) {
                Some((_, e)) => e.to_string(),
                None if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32),
                None => c.to_string(),
            };
            for (before, after) in [("", ""), ("aé", ""), ("", "😀b"), ("x\"", "\ty")] {
                let mut out = String::new();
                write_string(&format!("{before}{c}{after}"), &mut out);
                let mut want = String::from("\"");
                for part in [before, "\u{0}", after] {
                    if part == "\u{0}" {
                        want.push_str(&expected);
                        continue;
                    }
                    for p in part.chars() {
                        match short.iter().find(|(s, _)| *s == p) {
                            Some((_, e)) => want.push_str(e),
                            None => want.push(p),
                        }
                    }
                }
                want.push('"');
                assert_eq!(out, want, "{:?}", c);
                // And it parses back to the same text.
                assert_eq!(
                    Json::parse(&out).unwrap(),
                    Json::String(format!("{before}{c}{after}"))
                );
            }
        }
    }

    #[test]
    fn json_number_domain() {
        assert_eq!(canonicalize("[1.0,1e0,10e-1]").unwrap(), "[1,1,1]");
        assert_eq!(canonicalize("[-0]").unwrap(), "[0]");
        assert_eq!(
            canonicalize("[9007199254740991]").unwrap(),
            "[9007199254740991]"
        );
        assert_eq!(canonicalize("[1e21]").unwrap(), "[1e+21]");
        for bad in [
            "[9007199254740992]",
            "[-9007199254740992]",
            "[1e400]",
            "[1e20]",
        ] {
            assert_eq!(
                canonicalize(bad).unwrap_err().code(),
                "number_out_of_domain",
                "{bad}"
            );
        }
    }
}
