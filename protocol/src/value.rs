//! Typed values: strict validation of canonical wire values for all eleven portable types,
//! conversions from source spellings where the spec defines one, and the typed-value
//! octets `type_tag || presence || payload` of spec 001.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use crate::binary::{put_blob, put_text};
use crate::error::{Error, Result};
use crate::json::Json;
use crate::types::{FieldSpec, PortableType};
use crate::{decimal, jcs, temporal};

/// A non-null value of one portable type, held in its canonical form.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    /// string
    String(String),
    /// int
    Int(i32),
    /// int64
    Int64(i64),
    /// decimal, canonical text
    Decimal(String),
    /// float, finite, never negative zero
    Float(f64),
    /// boolean
    Boolean(bool),
    /// datetime, canonical text
    Datetime(String),
    /// date, canonical text
    Date(String),
    /// time, canonical text
    Time(String),
    /// json, canonical RFC 8785 text
    Json(String),
    /// bytes, decoded
    Bytes(Vec<u8>),
}

impl Scalar {
    /// The portable type of this scalar.
    pub fn ty(&self) -> PortableType {
        match self {
            Scalar::String(_) => PortableType::String,
            Scalar::Int(_) => PortableType::Int,
            Scalar::Int64(_) => PortableType::Int64,
            Scalar::Decimal(_) => PortableType::Decimal,
            Scalar::Float(_) => PortableType::Float,
            Scalar::Boolean(_) => PortableType::Boolean,
            Scalar::Datetime(_) => PortableType::Datetime,
            Scalar::Date(_) => PortableType::Date,
            Scalar::Time(_) => PortableType::Time,
            Scalar::Json(_) => PortableType::Json,
            Scalar::Bytes(_) => PortableType::Bytes,
        }
    }
}

/// A validated value of a declared type, possibly SQL null.
#[derive(Debug, Clone, PartialEq)]
pub struct TypedValue {
    ty: PortableType,
    scalar: Option<Scalar>,
}

impl TypedValue {
    /// SQL null of type `ty`.
    pub fn null(ty: PortableType) -> TypedValue {
        TypedValue { ty, scalar: None }
    }

    /// Validates a native scalar (canonical text, finite float, grammar-conforming temporal
    /// values) and wraps it. Negative zero floats become positive zero.
    pub fn from_scalar(scalar: Scalar) -> Result<TypedValue> {
        let ty = scalar.ty();
        let scalar = match scalar {
            Scalar::Float(f) if !f.is_finite() => return Err(Error::OutOfRange { ty }),
            Scalar::Float(f) => Scalar::Float(if f == 0.0 { 0.0 } else { f }),
            Scalar::Decimal(s) => {
                decimal::validate_wire(&s, None)?;
                Scalar::Decimal(s)
            }
            Scalar::Datetime(s) => {
                temporal::validate_datetime(&s)?;
                Scalar::Datetime(s)
            }
            Scalar::Date(s) => {
                temporal::validate_date(&s)?;
                Scalar::Date(s)
            }
            Scalar::Time(s) => {
                temporal::validate_time(&s)?;
                Scalar::Time(s)
            }
            Scalar::Json(s) => {
                if jcs::canonicalize(&s)? != s {
                    return Err(Error::NonCanonical {
                        ty,
                        reason: "json content is not in RFC 8785 canonical form",
                    });
                }
                Scalar::Json(s)
            }
            other => other,
        };
        Ok(TypedValue::some(scalar))
    }

    /// Checks this value against a field spec: same type, null only when nullable, decimal
    /// within precision and scale.
    pub fn check(&self, spec: &FieldSpec) -> Result<()> {
        if self.ty != spec.ty {
            return Err(Error::TypeMismatch { ty: spec.ty });
        }
        match &self.scalar {
            None if !spec.nullable => Err(Error::NullNotAllowed),
            Some(Scalar::Decimal(d)) => match spec.decimal {
                Some(bounds) => decimal::check_bounds(d, bounds),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Wraps a scalar that is already canonical (constructed through this module's checks).
    pub(crate) fn some(scalar: Scalar) -> TypedValue {
        TypedValue {
            ty: scalar.ty(),
            scalar: Some(scalar),
        }
    }

    /// The declared type.
    pub fn ty(&self) -> PortableType {
        self.ty
    }

    /// The value, or `None` for SQL null.
    pub fn scalar(&self) -> Option<&Scalar> {
        self.scalar.as_ref()
    }

    /// Whether this is SQL null.
    pub fn is_null(&self) -> bool {
        self.scalar.is_none()
    }

    /// Validates a raw JSON text as the canonical wire value for `spec`.
    pub fn from_wire_text(spec: &FieldSpec, raw_json: &str) -> Result<TypedValue> {
        TypedValue::from_wire(spec, &Json::parse(raw_json)?)
    }

    /// Validates a parsed JSON value as the canonical wire value for `spec`.
    pub fn from_wire(spec: &FieldSpec, value: &Json) -> Result<TypedValue> {
        let ty = spec.ty;
        if let Json::Null = value {
            return if spec.nullable {
                Ok(TypedValue::null(ty))
            } else {
                Err(Error::NullNotAllowed)
            };
        }
        let mismatch = || Error::TypeMismatch { ty };
        let scalar = match (ty, value) {
            (PortableType::String, Json::String(s)) => Scalar::String(s.clone()),
            (PortableType::Int, Json::Number(t)) => Scalar::Int(wire_int(t)?),
            (PortableType::Int64, Json::String(s)) => Scalar::Int64(wire_int64(s)?),
            (PortableType::Decimal, Json::String(s)) => {
                Scalar::Decimal(decimal::validate_wire(s, spec.decimal)?.to_owned())
            }
            (PortableType::Float, Json::Number(t)) => Scalar::Float(wire_float(t)?),
            (PortableType::Boolean, Json::Bool(b)) => Scalar::Boolean(*b),
            (PortableType::Datetime, Json::String(s)) => {
                temporal::validate_datetime(s)?;
                Scalar::Datetime(s.clone())
            }
            (PortableType::Date, Json::String(s)) => {
                temporal::validate_date(s)?;
                Scalar::Date(s.clone())
            }
            (PortableType::Time, Json::String(s)) => {
                temporal::validate_time(s)?;
                Scalar::Time(s.clone())
            }
            (PortableType::Json, Json::String(s)) => {
                if jcs::canonicalize(s)? != *s {
                    return Err(Error::NonCanonical {
                        ty,
                        reason: "json content is not in RFC 8785 canonical form",
                    });
                }
                Scalar::Json(s.clone())
            }
            (PortableType::Bytes, Json::String(s)) => Scalar::Bytes(wire_bytes(s)?),
            _ => return Err(mismatch()),
        };
        Ok(TypedValue {
            ty,
            scalar: Some(scalar),
        })
    }

    /// [`TypedValue::from_wire`] for a value the caller gives away: text is moved into the
    /// scalar instead of copied (the same checks, the same result).
    pub fn from_wire_owned(spec: &FieldSpec, value: Json) -> Result<TypedValue> {
        let ty = spec.ty;
        let scalar = match (ty, value) {
            (PortableType::String, Json::String(s)) => Scalar::String(s),
            (PortableType::Datetime, Json::String(s)) => {
                temporal::validate_datetime(&s)?;
                Scalar::Datetime(s)
            }
            (PortableType::Date, Json::String(s)) => {
                temporal::validate_date(&s)?;
                Scalar::Date(s)
            }
            (PortableType::Time, Json::String(s)) => {
                temporal::validate_time(&s)?;
                Scalar::Time(s)
            }
            (_, value) => return TypedValue::from_wire(spec, &value),
        };
        Ok(TypedValue {
            ty,
            scalar: Some(scalar),
        })
    }

    /// Appends `type_tag || presence || payload`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.ty.tag());
        let Some(scalar) = &self.scalar else {
            out.push(0x00);
            return;
        };
        out.push(0x01);
        match scalar {
            Scalar::String(s) => put_text(out, s),
            Scalar::Int(i) => out.extend_from_slice(&i.to_be_bytes()),
            Scalar::Int64(i) => out.extend_from_slice(&i.to_be_bytes()),
            Scalar::Float(f) => out.extend_from_slice(&float_bits(*f).to_be_bytes()),
            Scalar::Boolean(b) => out.push(u8::from(*b)),
            Scalar::Decimal(s)
            | Scalar::Datetime(s)
            | Scalar::Date(s)
            | Scalar::Time(s)
            | Scalar::Json(s) => put_text(out, s),
            Scalar::Bytes(b) => put_blob(out, b),
        }
    }

    /// The typed-value octets.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// The canonical wire value as JSON text. Unlike [`jcs::to_canonical_string`], this
    /// admits every finite float: the I-JSON integer limit governs json content, not floats.
    pub fn to_wire_text(&self) -> String {
        jcs::to_output_string(&self.to_wire())
    }

    /// The canonical wire value.
    pub fn to_wire(&self) -> Json {
        match &self.scalar {
            None => Json::Null,
            Some(Scalar::Int(i)) => Json::Number(i.to_string()),
            Some(Scalar::Int64(i)) => Json::String(i.to_string()),
            Some(Scalar::Float(f)) => Json::Number(jcs::format_f64(*f)),
            Some(Scalar::Boolean(b)) => Json::Bool(*b),
            Some(Scalar::Bytes(b)) => Json::String(URL_SAFE_NO_PAD.encode(b)),
            Some(
                Scalar::String(s)
                | Scalar::Decimal(s)
                | Scalar::Datetime(s)
                | Scalar::Date(s)
                | Scalar::Time(s)
                | Scalar::Json(s),
            ) => Json::String(s.clone()),
        }
    }
}

/// IEEE 754 bits with negative zero folded to positive zero.
fn float_bits(f: f64) -> u64 {
    if f == 0.0 {
        0
    } else {
        f.to_bits()
    }
}

fn is_integer_token(t: &str) -> bool {
    !t.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
}

fn wire_int(token: &str) -> Result<i32> {
    let ty = PortableType::Int;
    if !is_integer_token(token) {
        return Err(Error::NonCanonical {
            ty,
            reason: "int has a fraction or exponent",
        });
    }
    if token == "-0" {
        return Err(Error::NonCanonical {
            ty,
            reason: "negative zero",
        });
    }
    token.parse().map_err(|_| Error::OutOfRange { ty })
}

fn wire_int64(s: &str) -> Result<i64> {
    let ty = PortableType::Int64;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::NonCanonical {
            ty,
            reason: "int64 must be a base-10 integer string",
        });
    }
    if (digits.starts_with('0') && digits != "0") || s == "-0" {
        return Err(Error::NonCanonical {
            ty,
            reason: "leading zero or negative zero",
        });
    }
    s.parse().map_err(|_| Error::OutOfRange { ty })
}

fn wire_float(token: &str) -> Result<f64> {
    let v = jcs::token_to_f64(token)?;
    if jcs::format_f64(v) != token {
        return Err(Error::NonCanonical {
            ty: PortableType::Float,
            reason: "float is not the RFC 8785 serialization of its binary64 value",
        });
    }
    Ok(if v == 0.0 { 0.0 } else { v })
}

fn wire_bytes(s: &str) -> Result<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(s.as_bytes())
        .map_err(|_| Error::InvalidBytes)
}

/// Converts any finite JSON number spelling (`5.0`, `-0.0`, `1E21`, …) to the canonical
/// float wire text: the nearest binary64 (ties to even), serialized by RFC 8785.
pub fn canonical_float(source: &str) -> Result<String> {
    match Json::parse(source)? {
        Json::Number(t) => Ok(jcs::format_f64(jcs::token_to_f64(&t)?)),
        _ => Err(Error::TypeMismatch {
            ty: PortableType::Float,
        }),
    }
}

/// A canonical float value from a native binary64 (NaN and infinities are rejected).
pub fn float_value(v: f64) -> Result<TypedValue> {
    if !v.is_finite() {
        return Err(Error::OutOfRange {
            ty: PortableType::Float,
        });
    }
    Ok(TypedValue::some(Scalar::Float(if v == 0.0 {
        0.0
    } else {
        v
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ty: PortableType) -> FieldSpec {
        FieldSpec::new(ty, true).unwrap()
    }

    #[test]
    fn types_stay_distinct() {
        // The same number in four numeric types gives four different typed values.
        let int = TypedValue::from_wire_text(&spec(PortableType::Int), "1").unwrap();
        let int64 = TypedValue::from_wire_text(&spec(PortableType::Int64), "\"1\"").unwrap();
        let dec =
            TypedValue::from_wire_text(&FieldSpec::decimal(true, 5, 0).unwrap(), "\"1\"").unwrap();
        let float = TypedValue::from_wire_text(&spec(PortableType::Float), "1").unwrap();
        let all = [
            int.to_bytes(),
            int64.to_bytes(),
            dec.to_bytes(),
            float.to_bytes(),
        ];
        for i in 0..all.len() {
            for j in i + 1..all.len() {
                assert_ne!(all[i], all[j]);
            }
        }
        // And a value of one type is not accepted as another.
        assert!(TypedValue::from_wire_text(&spec(PortableType::Int64), "1").is_err());
        assert!(TypedValue::from_wire_text(&spec(PortableType::Int), "\"1\"").is_err());
    }

    #[test]
    fn int64_extremes_round_trip() {
        for v in [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX] {
            let wire = format!("\"{v}\"");
            let tv = TypedValue::from_wire_text(&spec(PortableType::Int64), &wire).unwrap();
            assert_eq!(tv.scalar(), Some(&Scalar::Int64(v)));
            assert_eq!(jcs::to_canonical_string(&tv.to_wire()).unwrap(), wire);
            assert_eq!(&tv.to_bytes()[2..], &v.to_be_bytes());
        }
    }

    #[test]
    fn decimal_never_becomes_binary64() {
        // 0.1 + 0.2 style values and values beyond binary64 precision survive exactly.
        let s = FieldSpec::decimal(true, 60, 30).unwrap();
        for text in [
            "0.1",
            "0.30000000000000004",
            "9007199254740993",
            "123456789012345678901234567890.123456789012345678901234567891",
        ] {
            let tv = TypedValue::from_wire_text(&s, &format!("\"{text}\"")).unwrap();
            let bytes = tv.to_bytes();
            assert_eq!(&bytes[10..], text.as_bytes());
        }
    }

    #[test]
    fn float_conversion_and_canonical_check() {
        for (src, canon) in [
            ("5.0", "5"),
            ("-0.0", "0"),
            ("1e20", "100000000000000000000"),
            ("1E21", "1e+21"),
            ("0.1e1", "1"),
        ] {
            assert_eq!(canonical_float(src).unwrap(), canon);
            assert!(TypedValue::from_wire_text(&spec(PortableType::Float), canon).is_ok());
        }
        assert!(canonical_float("1e999").is_err());
        assert!(canonical_float("\"1\"").is_err());
        assert!(float_value(f64::NAN).is_err());
        assert_eq!(
            float_value(-0.0).unwrap().to_bytes(),
            vec![5, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
