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

/// Converts one text-form column value of `spec`'s type (source type OID `type_oid`, seen
/// through domains).
pub fn text_to_wire(
    spec: &FieldSpec,
    type_oid: u32,
    text: &[u8],
) -> Result<TypedValue, ValueError> {
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
