//! Typed values in SQLite (spec 000 "Portable To SQLite Mapping").
//!
//! | portable type | SQLite | binding |
//! |---|---|---|
//! | string, decimal, datetime, date, time, json | TEXT | the canonical text |
//! | int | INTEGER | signed 32-bit |
//! | int64 | INTEGER | native signed 64-bit (never through a binary64) |
//! | float | REAL | finite binary64 |
//! | boolean | INTEGER | only 0 or 1 |
//! | bytes | BLOB | raw bytes |
//!
//! Reading back re-validates every value against its field's spec (storage class, range,
//! canonical text, nullability): a value that does not fit is a [`StorageError::Corrupt`]
//! naming only the table and field IDs, never the value.

use rusqlite::types::{Value, ValueRef};
use synchro_protocol::manifest::{Field, Table};
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::{Scalar, TypedValue};

use crate::error::StorageError;

/// The SQLite value a typed value is stored as.
pub fn to_sql(value: &TypedValue) -> Value {
    match value.scalar() {
        None => Value::Null,
        Some(Scalar::String(s))
        | Some(Scalar::Decimal(s))
        | Some(Scalar::Datetime(s))
        | Some(Scalar::Date(s))
        | Some(Scalar::Time(s))
        | Some(Scalar::Json(s)) => Value::Text(s.clone()),
        Some(Scalar::Int(i)) => Value::Integer(i64::from(*i)),
        Some(Scalar::Int64(i)) => Value::Integer(*i),
        Some(Scalar::Float(f)) => Value::Real(*f),
        Some(Scalar::Boolean(b)) => Value::Integer(i64::from(*b)),
        Some(Scalar::Bytes(b)) => Value::Blob(b.clone()),
    }
}

/// A typed value bound to a statement by reference (its text or bytes are not copied).
pub(super) struct Bind<'a>(pub &'a TypedValue);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            match self.0.scalar() {
                None => ValueRef::Null,
                Some(Scalar::String(s))
                | Some(Scalar::Decimal(s))
                | Some(Scalar::Datetime(s))
                | Some(Scalar::Date(s))
                | Some(Scalar::Time(s))
                | Some(Scalar::Json(s)) => ValueRef::Text(s.as_bytes()),
                Some(Scalar::Int(i)) => ValueRef::Integer(i64::from(*i)),
                Some(Scalar::Int64(i)) => ValueRef::Integer(*i),
                Some(Scalar::Float(f)) => ValueRef::Real(*f),
                Some(Scalar::Boolean(b)) => ValueRef::Integer(i64::from(*b)),
                Some(Scalar::Bytes(b)) => ValueRef::Blob(b),
            },
        ))
    }
}

/// Decodes a stored value by its field spec; `None` when it does not fit.
pub fn from_sql(spec: &FieldSpec, value: ValueRef<'_>) -> Option<TypedValue> {
    let text = |v: ValueRef<'_>| match v {
        ValueRef::Text(t) => std::str::from_utf8(t).ok().map(str::to_owned),
        _ => None,
    };
    let scalar = match (spec.ty, value) {
        (_, ValueRef::Null) => {
            return spec.nullable.then(|| TypedValue::null(spec.ty));
        }
        (PortableType::String, v) => Scalar::String(text(v)?),
        (PortableType::Decimal, v) => Scalar::Decimal(text(v)?),
        (PortableType::Datetime, v) => Scalar::Datetime(text(v)?),
        (PortableType::Date, v) => Scalar::Date(text(v)?),
        (PortableType::Time, v) => Scalar::Time(text(v)?),
        (PortableType::Json, v) => Scalar::Json(text(v)?),
        (PortableType::Int, ValueRef::Integer(i)) => Scalar::Int(i32::try_from(i).ok()?),
        (PortableType::Int64, ValueRef::Integer(i)) => Scalar::Int64(i),
        (PortableType::Float, ValueRef::Real(f)) => Scalar::Float(f),
        (PortableType::Boolean, ValueRef::Integer(0)) => Scalar::Boolean(false),
        (PortableType::Boolean, ValueRef::Integer(1)) => Scalar::Boolean(true),
        (PortableType::Bytes, ValueRef::Blob(b)) => Scalar::Bytes(b.to_vec()),
        _ => return None,
    };
    let typed = TypedValue::from_scalar(scalar).ok()?;
    typed.check(spec).ok()?;
    // from_scalar normalizes (-0.0 to 0.0, for one); stored bytes must already be canonical.
    same(&to_sql(&typed), value).then_some(typed)
}

/// Whether a stored value is exactly (same storage class and bits) this value.
fn same(a: &Value, b: ValueRef<'_>) -> bool {
    match (a, b) {
        (Value::Null, ValueRef::Null) => true,
        (Value::Integer(x), ValueRef::Integer(y)) => *x == y,
        (Value::Real(x), ValueRef::Real(y)) => x.to_bits() == y.to_bits(),
        (Value::Text(x), ValueRef::Text(y)) => x.as_bytes() == y,
        (Value::Blob(x), ValueRef::Blob(y)) => x.as_slice() == y,
        _ => false,
    }
}

/// [`from_sql`] for a column of a synced table: a value that does not fit is
/// [`StorageError::Corrupt`].
pub(crate) fn decode(
    table: &Table,
    field: &Field,
    value: ValueRef<'_>,
) -> Result<TypedValue, StorageError> {
    from_sql(&field.spec, value).ok_or_else(|| StorageError::Corrupt {
        table_id: table.table_id.clone(),
        field_id: field.field_id.clone(),
    })
}

/// Every field of a row selected as `SELECT <every field, in order>`, decoded.
pub(crate) fn decode_row(
    table: &Table,
    row: &rusqlite::Row<'_>,
) -> Result<Vec<TypedValue>, StorageError> {
    let mut values = Vec::with_capacity(table.fields.len());
    for (i, f) in table.fields.iter().enumerate() {
        values.push(decode(table, f, row.get_ref(i)?)?);
    }
    Ok(values)
}
