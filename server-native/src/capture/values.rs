//! PostgreSQL text output (as pgoutput sends it) to canonical wire values.
//!
//! The decoding session must use `TimeZone=UTC`, `DateStyle=ISO`, `IntervalStyle=postgres`,
//! `extra_float_digits=1` and `bytea_output=hex` ([`SESSION_SETTINGS`]), so every output
//! function is deterministic. A value the portable type cannot represent (NaN, infinity, a
//! BC or five-digit year, `24:00:00`, JSON outside the I-JSON domain) is an error: capture
//! blocks on it rather than inventing a value.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use synchro_protocol::json::Json;
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::TypedValue;
use synchro_protocol::{decimal, jcs};

/// Settings the decoding session needs so output functions are deterministic.
pub const SESSION_SETTINGS: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; \
    SET IntervalStyle = 'postgres'; SET extra_float_digits = 1; SET bytea_output = 'hex'";

/// PostgreSQL's `float4` type OID: its text is the shortest single-precision form.
pub const FLOAT4_OID: u32 = 700;

/// PostgreSQL's `timestamp` (without time zone) type OID: its text has no offset, and is read
/// as UTC.
pub const TIMESTAMP_OID: u32 = 1114;

/// Why a source value cannot become a wire value; names no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("source value of type {ty} is not representable: {reason}")]
pub struct ValueError {
    /// The portable type.
    pub ty: PortableType,
    /// Why.
    pub reason: &'static str,
}

fn err(ty: PortableType, reason: &'static str) -> ValueError {
    ValueError { ty, reason }
}

/// Pads `HH:MM:SS[.f{1,6}]` to exactly six fractional digits; `None` on anything else.
fn canonical_time(t: &str) -> Option<String> {
    let (hms, frac) = t.split_once('.').unwrap_or((t, ""));
    if hms.len() != 8 || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(format!("{hms}.{frac:0<6}"))
}

/// How a column's text is read (`synchro.synchro_value_source`).
#[derive(Debug, Clone, PartialEq)]
pub enum ValueSource {
    /// A scalar of this type OID (the column's type through its domains).
    Scalar(u32),
    /// A `timestamp` (without time zone) read as a local time of this zone.
    Zoned(jiff::tz::TimeZone),
    /// An array (a `json` field) of elements of this spec and base type OID.
    Array {
        /// The elements' portable type (nullable; a decimal's precision and scale).
        element: FieldSpec,
        /// The elements' type OID through domains.
        oid: u32,
    },
}

impl ValueSource {
    /// Parses `synchro_value_source`'s text: `<oid>`, `1114 <zone>`, or `array <type> <oid>[
    /// <p> <s>]`. A zone the system's tz database does not know is `None`.
    pub fn parse(text: &str) -> Option<ValueSource> {
        let mut words = text.split(' ');
        let first = words.next()?;
        if first != "array" {
            let oid: u32 = first.parse().ok()?;
            return match words.next() {
                None => Some(ValueSource::Scalar(oid)),
                Some(zone) if oid == TIMESTAMP_OID && words.next().is_none() => {
                    jiff::tz::TimeZone::get(zone).ok().map(ValueSource::Zoned)
                }
                Some(_) => None,
            };
        }
        let ty = PortableType::parse(words.next()?)?;
        let oid = words.next()?.parse().ok()?;
        let element = match ty {
            PortableType::Decimal => FieldSpec::decimal(
                true,
                words.next()?.parse().ok()?,
                words.next()?.parse().ok()?,
            )
            .ok()?,
            _ => FieldSpec::new(ty, true).ok()?,
        };
        words
            .next()
            .is_none()
            .then_some(ValueSource::Array { element, oid })
    }
}

/// Converts one text-form column value of `spec`'s type, read as `source` says.
pub fn text_to_wire(
    spec: &FieldSpec,
    source: &ValueSource,
    text: &[u8],
) -> Result<TypedValue, ValueError> {
    let type_oid = match source {
        ValueSource::Scalar(oid) => *oid,
        ValueSource::Zoned(zone) => return zoned_to_wire(spec, zone, text),
        ValueSource::Array { element, oid } => return array_to_wire(spec, element, *oid, text),
    };
    let ty = spec.ty;
    let s = std::str::from_utf8(text).map_err(|_| err(ty, "not UTF-8"))?;
    let wire = match ty {
        PortableType::String => Json::String(s.to_owned()),
        PortableType::Int | PortableType::Int64 => {
            let n: i64 = s.parse().map_err(|_| err(ty, "not an integer"))?;
            if ty == PortableType::Int {
                Json::Number(
                    i32::try_from(n)
                        .map_err(|_| err(ty, "out of int32 range"))?
                        .to_string(),
                )
            } else {
                Json::String(n.to_string())
            }
        }
        PortableType::Decimal => {
            let c = decimal::canonicalize(s).map_err(|_| err(ty, "not a finite decimal"))?;
            Json::String(c)
        }
        PortableType::Float => {
            let v = if type_oid == FLOAT4_OID {
                f64::from(s.parse::<f32>().map_err(|_| err(ty, "not a number"))?)
            } else {
                s.parse::<f64>().map_err(|_| err(ty, "not a number"))?
            };
            if !v.is_finite() {
                return Err(err(ty, "not finite"));
            }
            Json::Number(jcs::format_f64(v))
        }
        PortableType::Boolean => match s {
            "t" => Json::Bool(true),
            "f" => Json::Bool(false),
            _ => return Err(err(ty, "not t or f")),
        },
        PortableType::Date => {
            if s.len() != 10 {
                return Err(err(ty, "not a four-digit-year AD date"));
            }
            Json::String(s.to_owned())
        }
        PortableType::Time => {
            Json::String(canonical_time(s).ok_or(err(ty, "not HH:MM:SS[.ffffff]"))?)
        }
        PortableType::Datetime => {
            // ISO output in UTC: "YYYY-MM-DD HH:MM:SS[.ffffff]+00"; a timestamp without
            // time zone has no offset and is read as UTC.
            let body = if type_oid == TIMESTAMP_OID {
                s
            } else {
                s.strip_suffix("+00")
                    .ok_or(err(ty, "not a UTC timestamp"))?
            };
            let (date, time) = body.split_once(' ').ok_or(err(ty, "not a timestamp"))?;
            if date.len() != 10 {
                return Err(err(ty, "not a four-digit-year AD timestamp"));
            }
            let time = canonical_time(time).ok_or(err(ty, "not HH:MM:SS[.ffffff]"))?;
            Json::String(format!("{date}T{time}Z"))
        }
        PortableType::Json => {
            Json::String(jcs::canonicalize(s).map_err(|_| err(ty, "not I-JSON"))?)
        }
        PortableType::Bytes => {
            let hex_digits = s
                .strip_prefix("\\x")
                .ok_or(err(ty, "not hex bytea output"))?;
            let bytes = hex::decode(hex_digits).map_err(|_| err(ty, "bad hex"))?;
            Json::String(URL_SAFE_NO_PAD.encode(bytes))
        }
    };
    // The canonical wire validator is the final judge (grammar, calendar, precision/scale).
    TypedValue::from_wire(spec, &wire).map_err(|_| err(ty, "outside the portable type"))
}

/// A `timestamp` (without time zone) read as a local time of `zone`: its UTC instant. A local
/// time the zone skips (a daylight-saving gap) has none that comes back to it: an error, as
/// the fence refuses writing one. Of a repeated local time, the earlier instant.
fn zoned_to_wire(
    spec: &FieldSpec,
    zone: &jiff::tz::TimeZone,
    text: &[u8],
) -> Result<TypedValue, ValueError> {
    let ty = spec.ty;
    let s = std::str::from_utf8(text).map_err(|_| err(ty, "not UTF-8"))?;
    let local: jiff::civil::DateTime = s.parse().map_err(|_| err(ty, "not a timestamp"))?;
    let instant = zone
        .to_ambiguous_timestamp(local)
        .compatible()
        .map_err(|_| err(ty, "outside the time zone's range"))?;
    if zone.to_datetime(instant) != local {
        return Err(err(ty, "a local time the time zone skips"));
    }
    let utc = jiff::tz::TimeZone::UTC.to_datetime(instant);
    let wire = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        utc.year(),
        utc.month(),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second(),
        utc.subsec_nanosecond() / 1000
    );
    TypedValue::from_wire(spec, &Json::String(wire))
        .map_err(|_| err(ty, "outside the portable type"))
}

/// An array's output text (`{a,"b c",NULL,{...}}`, as `array_out` writes it) as the canonical
/// json array of its elements' wire values, dimensions nested, NULL kept. A lower bound other
/// than 1 (`[0:1]={...}`) has no JSON form: an error (the fence refuses writing one).
fn array_to_wire(
    spec: &FieldSpec,
    element: &FieldSpec,
    oid: u32,
    text: &[u8],
) -> Result<TypedValue, ValueError> {
    let ty = spec.ty;
    let mut parser = ArrayText { text, at: 0 };
    let parsed = parser
        .array(0)
        .ok_or(err(ty, "not an array with lower bounds 1"))?;
    if parser.at != text.len() {
        return Err(err(ty, "not an array with lower bounds 1"));
    }
    let json = parsed.into_wire(element, oid)?;
    let canonical = jcs::to_canonical_string(&json).map_err(|_| err(ty, "not I-JSON"))?;
    TypedValue::from_wire(spec, &Json::String(canonical))
        .map_err(|_| err(ty, "outside the portable type"))
}

/// An array's output text parsed: elements (their text, or NULL) and sub-arrays.
enum ArrayItem {
    Null,
    Text(Vec<u8>),
    Array(Vec<ArrayItem>),
}

impl ArrayItem {
    fn into_wire(self, element: &FieldSpec, oid: u32) -> Result<Json, ValueError> {
        Ok(match self {
            ArrayItem::Null => Json::Null,
            ArrayItem::Text(t) => text_to_wire(element, &ValueSource::Scalar(oid), &t)?.to_wire(),
            ArrayItem::Array(items) => Json::Array(
                items
                    .into_iter()
                    .map(|i| i.into_wire(element, oid))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

/// A cursor over `array_out` text (delimiter `,`: every type with a portable type uses it).
struct ArrayText<'a> {
    text: &'a [u8],
    at: usize,
}

impl ArrayText<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// `{item,item,...}` at nesting `depth` (PostgreSQL allows 6 dimensions).
    fn array(&mut self, depth: usize) -> Option<ArrayItem> {
        if depth > 6 || self.peek()? != b'{' {
            return None;
        }
        self.at += 1;
        let mut items = Vec::new();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(ArrayItem::Array(items));
        }
        loop {
            items.push(match self.peek()? {
                b'{' => self.array(depth + 1)?,
                b'"' => self.quoted()?,
                _ => self.bare()?,
            });
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(ArrayItem::Array(items));
                }
                _ => return None,
            }
        }
    }

    /// `"..."` with `\` escapes.
    fn quoted(&mut self) -> Option<ArrayItem> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(ArrayItem::Text(out));
                }
                b'\\' => {
                    out.push(*self.text.get(self.at + 1)?);
                    self.at += 2;
                }
                b => {
                    out.push(b);
                    self.at += 1;
                }
            }
        }
    }

    /// An unquoted element up to `,` or `}`: `NULL` is SQL null.
    fn bare(&mut self) -> Option<ArrayItem> {
        let start = self.at;
        while !matches!(self.peek()?, b',' | b'}') {
            if matches!(self.peek()?, b'"' | b'{' | b'\\') {
                return None;
            }
            self.at += 1;
        }
        let t = &self.text[start..self.at];
        if t.is_empty() {
            return None;
        }
        Some(if t == b"NULL" {
            ArrayItem::Null
        } else {
            ArrayItem::Text(t.to_vec())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(element: FieldSpec, oid: u32, text: &str) -> Result<String, ValueError> {
        let spec = FieldSpec::new(PortableType::Json, true).unwrap();
        text_to_wire(&spec, &ValueSource::Array { element, oid }, text.as_bytes())
            .map(|v| v.to_wire_text())
    }

    #[test]
    fn arrays_become_canonical_json_arrays_of_wire_values() {
        let string = FieldSpec::new(PortableType::String, true).unwrap();
        assert_eq!(
            wire(string, 25, r#"{a,"b c",NULL,"NULL","q\"uote\\d",""}"#).unwrap(),
            r#""[\"a\",\"b c\",null,\"NULL\",\"q\\\"uote\\\\d\",\"\"]""#
        );
        assert_eq!(wire(string, 25, "{}").unwrap(), r#""[]""#);
        let int = FieldSpec::new(PortableType::Int, true).unwrap();
        assert_eq!(
            wire(int, 23, "{{1,2},{3,NULL}}").unwrap(),
            r#""[[1,2],[3,null]]""#
        );
        let int64 = FieldSpec::new(PortableType::Int64, true).unwrap();
        assert_eq!(
            wire(int64, 20, "{9223372036854775807}").unwrap(),
            r#""[\"9223372036854775807\"]""#
        );
        let float = FieldSpec::new(PortableType::Float, true).unwrap();
        assert_eq!(
            wire(float, FLOAT4_OID, "{1.1}").unwrap(),
            r#""[1.100000023841858]""#
        );
        let datetime = FieldSpec::new(PortableType::Datetime, true).unwrap();
        assert_eq!(
            wire(datetime, TIMESTAMP_OID, r#"{"2024-03-01 01:00:00.5"}"#).unwrap(),
            r#""[\"2024-03-01T01:00:00.500000Z\"]""#
        );
        let decimal = FieldSpec::decimal(true, 10, 2).unwrap();
        assert_eq!(
            wire(decimal, 1700, "{12.50,-0.01}").unwrap(),
            r#""[\"12.5\",\"-0.01\"]""#
        );
    }

    #[test]
    fn zoned_timestamps_are_their_utc_instants() {
        let Some(source) = ValueSource::parse("1114 Europe/Paris") else {
            panic!("no Europe/Paris in the system's tz database");
        };
        let spec = FieldSpec::new(PortableType::Datetime, true).unwrap();
        let wire = |t: &str| text_to_wire(&spec, &source, t.as_bytes()).map(|v| v.to_wire_text());
        assert_eq!(
            wire("2024-01-15 12:00:00.25").unwrap(),
            r#""2024-01-15T11:00:00.250000Z""#
        );
        assert_eq!(
            wire("2024-07-15 12:00:00").unwrap(),
            r#""2024-07-15T10:00:00.000000Z""#
        );
        // The repeated hour at the end of summer time: the earlier instant.
        assert_eq!(
            wire("2024-10-27 02:30:00").unwrap(),
            r#""2024-10-27T00:30:00.000000Z""#
        );
        // The skipped hour at its start, and years the UTC instant leaves: errors.
        assert!(wire("2024-03-31 02:30:00").is_err());
        // (Paris kept local mean time, 0:09:21 ahead of UTC, before 1891.)
        assert!(wire("0001-01-01 00:05:00").is_err());
        assert!(wire("0001-01-01 00:30:00").is_ok());
        assert!(wire("infinity").is_err());
        assert!(ValueSource::parse("1114 Not/AZone").is_none());
        assert!(ValueSource::parse("25 Europe/Paris").is_none());
    }

    #[test]
    fn arrays_json_cannot_carry_are_errors() {
        let int = FieldSpec::new(PortableType::Int, true).unwrap();
        for text in [
            "[0:1]={1,2}",
            "{1,2",
            "{1,,2}",
            "{1}}",
            "1,2",
            "{\"1}",
            "{{{{{{{{1}}}}}}}}",
            "{NaN}",
        ] {
            assert!(wire(int, 23, text).is_err(), "{text}");
        }
        let float = FieldSpec::new(PortableType::Float, true).unwrap();
        assert!(wire(float, 701, "{NaN}").is_err());
        assert!(ValueSource::parse("array decimal 1700").is_none());
        assert_eq!(
            ValueSource::parse("array decimal 1700 10 2"),
            Some(ValueSource::Array {
                element: FieldSpec::decimal(true, 10, 2).unwrap(),
                oid: 1700
            })
        );
        assert_eq!(ValueSource::parse("1114"), Some(ValueSource::Scalar(1114)));
    }
}
