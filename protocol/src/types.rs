//! The eleven portable logical types of protocol version 3 and the field specification
//! (type, nullability, decimal precision and scale) that every value is validated against.

use crate::error::{Error, Result};
use crate::json::Json;

/// Largest decimal precision accepted (PostgreSQL's `numeric` maximum).
pub const MAX_DECIMAL_PRECISION: u32 = 1000;

/// A portable logical type (spec 000 "Portable Type System").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortableType {
    /// Unicode text.
    String,
    /// Signed 32-bit integer.
    Int,
    /// Signed 64-bit integer, a decimal string on the wire.
    Int64,
    /// Exact decimal, canonical text on the wire.
    Decimal,
    /// IEEE 754 binary64.
    Float,
    /// true or false.
    Boolean,
    /// UTC instant with microsecond precision.
    Datetime,
    /// Gregorian calendar date.
    Date,
    /// Time of day with microsecond precision.
    Time,
    /// One canonical I-JSON value.
    Json,
    /// Raw octets, base64url on the wire.
    Bytes,
}

impl PortableType {
    /// All types, in tag order.
    pub const ALL: [PortableType; 11] = [
        PortableType::String,
        PortableType::Int,
        PortableType::Int64,
        PortableType::Decimal,
        PortableType::Float,
        PortableType::Boolean,
        PortableType::Datetime,
        PortableType::Date,
        PortableType::Time,
        PortableType::Json,
        PortableType::Bytes,
    ];

    /// The manifest spelling of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            PortableType::String => "string",
            PortableType::Int => "int",
            PortableType::Int64 => "int64",
            PortableType::Decimal => "decimal",
            PortableType::Float => "float",
            PortableType::Boolean => "boolean",
            PortableType::Datetime => "datetime",
            PortableType::Date => "date",
            PortableType::Time => "time",
            PortableType::Json => "json",
            PortableType::Bytes => "bytes",
        }
    }

    /// Parses the exact manifest spelling; aliases, other cases and database names fail.
    pub fn parse(name: &str) -> Option<PortableType> {
        PortableType::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The type tag octet of the typed binary grammar (spec 001).
    pub fn tag(self) -> u8 {
        match self {
            PortableType::String => 0x01,
            PortableType::Int => 0x02,
            PortableType::Int64 => 0x03,
            PortableType::Decimal => 0x04,
            PortableType::Float => 0x05,
            PortableType::Boolean => 0x06,
            PortableType::Datetime => 0x07,
            PortableType::Date => 0x08,
            PortableType::Time => 0x09,
            PortableType::Json => 0x0a,
            PortableType::Bytes => 0x0b,
        }
    }

    /// The type with this tag octet.
    pub fn from_tag(tag: u8) -> Option<PortableType> {
        PortableType::ALL.into_iter().find(|t| t.tag() == tag)
    }

    /// Whether a primary key may have this type (string, int or int64).
    pub fn is_key_type(self) -> bool {
        matches!(
            self,
            PortableType::String | PortableType::Int | PortableType::Int64
        )
    }
}

impl core::fmt::Display for PortableType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Precision and scale of a decimal field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecimalSpec {
    /// Total significant digits, 1..=1000.
    pub precision: u32,
    /// Fractional digits, 0..=precision.
    pub scale: u32,
}

impl DecimalSpec {
    /// Checks the bounds of spec 000: positive precision, scale in 0..=precision.
    pub fn new(precision: u32, scale: u32) -> Result<DecimalSpec> {
        if precision == 0 || precision > MAX_DECIMAL_PRECISION {
            return Err(Error::InvalidFieldSpec {
                reason: format!("decimal precision must be in 1..={MAX_DECIMAL_PRECISION}"),
            });
        }
        if scale > precision {
            return Err(Error::InvalidFieldSpec {
                reason: "decimal scale must be in 0..=precision".into(),
            });
        }
        Ok(DecimalSpec { precision, scale })
    }
}

/// What a value is validated against: its type, nullability, and decimal bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldSpec {
    /// The portable type.
    pub ty: PortableType,
    /// Whether SQL null is allowed.
    pub nullable: bool,
    /// Precision and scale; present exactly when `ty` is decimal.
    pub decimal: Option<DecimalSpec>,
}

impl FieldSpec {
    /// A non-decimal field spec.
    pub fn new(ty: PortableType, nullable: bool) -> Result<FieldSpec> {
        if ty == PortableType::Decimal {
            return Err(Error::InvalidFieldSpec {
                reason: "a decimal field needs precision and scale".into(),
            });
        }
        Ok(FieldSpec {
            ty,
            nullable,
            decimal: None,
        })
    }

    /// A decimal field spec.
    pub fn decimal(nullable: bool, precision: u32, scale: u32) -> Result<FieldSpec> {
        Ok(FieldSpec {
            ty: PortableType::Decimal,
            nullable,
            decimal: Some(DecimalSpec::new(precision, scale)?),
        })
    }

    /// Reads `{type, nullable, precision?, scale?}` strictly: exactly those members, the
    /// exact type spelling, and precision/scale exactly when the type is decimal.
    pub fn from_json(value: &Json) -> Result<FieldSpec> {
        let bad = |reason: &str| Error::InvalidFieldSpec {
            reason: reason.to_owned(),
        };
        let Json::Object(members) = value else {
            return Err(bad("field spec must be an object"));
        };
        let (mut ty, mut nullable, mut precision, mut scale) = (None, None, None, None);
        for (name, v) in members {
            match name.as_str() {
                "type" => {
                    let s = v.as_str().ok_or_else(|| bad("type must be a string"))?;
                    ty = Some(PortableType::parse(s).ok_or_else(|| bad("unknown type"))?);
                }
                "nullable" => match v {
                    Json::Bool(b) => nullable = Some(*b),
                    _ => return Err(bad("nullable must be a boolean")),
                },
                "precision" => precision = Some(json_u32(v).ok_or_else(|| bad("bad precision"))?),
                "scale" => scale = Some(json_u32(v).ok_or_else(|| bad("bad scale"))?),
                _ => return Err(bad("unknown member in field spec")),
            }
        }
        let ty = ty.ok_or_else(|| bad("missing type"))?;
        let nullable = nullable.ok_or_else(|| bad("missing nullable"))?;
        match (ty, precision, scale) {
            (PortableType::Decimal, Some(p), Some(s)) => FieldSpec::decimal(nullable, p, s),
            (PortableType::Decimal, _, _) => Err(bad("a decimal field needs precision and scale")),
            (_, None, None) => FieldSpec::new(ty, nullable),
            _ => Err(bad("only decimal fields have precision and scale")),
        }
    }
}

/// A JSON integer token in u32 range (no sign, fraction or exponent).
pub(crate) fn json_u32(v: &Json) -> Option<u32> {
    match v {
        Json::Number(t)
            if t.bytes().all(|b| b.is_ascii_digit()) && (t == "0" || !t.starts_with('0')) =>
        {
            t.parse().ok()
        }
        _ => None,
    }
}
