//! The eleven portable logical types of protocol version 3 ([`PortableType`], defined in
//! `portable_type.rs`) and the field specification (type, nullability, decimal precision and
//! scale) that every value is validated against.

use crate::error::{Error, Result};
use crate::json::Json;
pub use crate::portable_type::PortableType;

/// Largest decimal precision accepted (PostgreSQL's `numeric` maximum).
pub const MAX_DECIMAL_PRECISION: u32 = 1000;

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
