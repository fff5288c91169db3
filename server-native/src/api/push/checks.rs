//! What push decides about a mutation before it reaches the database: authored-schema
//! compatibility against the current manifest (`schema_incompatible` with the sorted
//! incompatible field IDs, never values), writability (`not_writable`) and canonical values
//! (`invalid_value`). A mutation that passes becomes a [`Prepared`] write.

use synchro_protocol::json::Json;
use synchro_protocol::lineage::Lineage;
use synchro_protocol::manifest::{Field, Manifest, Table};
use synchro_protocol::types::FieldSpec;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{AuthoredSchema, Incompatible, Mutation, Operation, Outcome};

use super::rejected;
use crate::api::{ApiError, Integrity};

/// A mutation that passed every check, in the forms the database write takes.
pub(super) struct Prepared<'a> {
    /// The mutation.
    pub(super) m: &'a Mutation,
    /// Its table in the current manifest.
    pub(super) table: &'a Table,
    /// The key as a typed value.
    pub(super) pk: TypedValue,
    /// The key's text input form.
    pub(super) key: String,
    /// The key's wire JSON text (the projection's key).
    pub(super) pk_wire: String,
    /// The written fields' IDs, in the mutation's order.
    pub(super) field_ids: Vec<&'a str>,
    /// Their PostgreSQL text input forms (`None` for null).
    pub(super) values: Vec<Option<String>>,
}

fn schema_ref(version: u64, hash: String) -> AuthoredSchema {
    AuthoredSchema { version, hash }
}

/// Whether `authored` can be written as `current` (same type; a decimal no narrower).
pub(super) fn compatible(authored: &FieldSpec, current: &FieldSpec) -> bool {
    if authored.ty != current.ty {
        return false;
    }
    match (authored.decimal, current.decimal) {
        (Some(a), Some(c)) => c.scale >= a.scale && c.precision - c.scale >= a.precision - a.scale,
        (None, None) => true,
        _ => false,
    }
}

/// The key's text input form (its wire string or number token).
fn key_text(pk: &Json) -> Option<String> {
    match pk {
        Json::String(v) => Some(v.clone()),
        Json::Number(t) => Some(t.clone()),
        _ => None,
    }
}

/// A value's PostgreSQL text input form; `None` for null.
fn input_text(v: &TypedValue) -> Option<String> {
    use synchro_protocol::value::Scalar;
    Some(match v.scalar()? {
        Scalar::String(x)
        | Scalar::Decimal(x)
        | Scalar::Datetime(x)
        | Scalar::Date(x)
        | Scalar::Time(x)
        | Scalar::Json(x) => x.clone(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Int64(i) => i.to_string(),
        Scalar::Float(f) => format!("{f:e}"),
        Scalar::Boolean(b) => b.to_string(),
        Scalar::Bytes(b) => format!("\\x{}", hex::encode(b)),
    })
}

/// The write `m` becomes, or the outcome it gets without reaching the database.
pub(super) fn prepare<'a>(
    lineage: &Lineage,
    current: &'a Manifest,
    m: &'a Mutation,
) -> Result<Result<Prepared<'a>, Outcome>, ApiError> {
    let id = m.mutation_id.as_str();
    let authored = lineage.manifests().find(|a| {
        a.schema_version == m.authored_schema.version
            && a.schema_hash_hex() == m.authored_schema.hash
    });
    let Some(authored) = authored else {
        return Ok(Err(rejected(
            id,
            "invalid_authored_schema",
            "the authored schema is not in this server's manifest history",
        )));
    };
    // Authored-schema compatibility against the current manifest.
    let incompatible = |ids: Vec<String>| {
        let mut ids = ids;
        ids.sort();
        Outcome::Rejected {
            mutation_id: id.to_owned(),
            code: "schema_incompatible".to_owned(),
            message: "authored mutation cannot be represented by the current schema".to_owned(),
            incompatible: Some(Incompatible {
                outcome_schema: schema_ref(current.schema_version, current.schema_hash_hex()),
                authored_schema: schema_ref(authored.schema_version, authored.schema_hash_hex()),
                current_schema: schema_ref(current.schema_version, current.schema_hash_hex()),
                incompatible_field_ids: ids,
            }),
        }
    };
    let Some(table) = current.table(&m.table_id) else {
        let ids = m.columns.iter().map(|c| c.field_id.clone()).collect();
        return Ok(Err(incompatible(if m.operation == Operation::Delete {
            Vec::new()
        } else {
            ids
        })));
    };
    let authored_table = authored.table(&m.table_id);
    let mut bad_fields = Vec::new();
    let mut fields: Vec<&Field> = Vec::with_capacity(m.columns.len());
    for field_id in m.columns.iter().map(|c| &c.field_id) {
        let a = authored_table.and_then(|t| t.field(field_id));
        match (a, table.field(field_id)) {
            (Some(a), Some(c)) if compatible(&a.spec, &c.spec) => fields.push(c),
            _ => bad_fields.push(field_id.clone()),
        }
    }
    let key_ok = authored_table
        .map(|t| compatible(&t.primary_key().spec, &table.primary_key().spec))
        .unwrap_or(false);
    if !key_ok {
        bad_fields.push(table.primary_key_field_id.clone());
    }
    if !bad_fields.is_empty() {
        return Ok(Err(incompatible(bad_fields)));
    }
    if fields
        .iter()
        .any(|f| !f.writable || f.field_id == table.primary_key_field_id)
    {
        return Ok(Err(rejected(id, "not_writable", "a field is not writable")));
    }
    // Canonical values. PostgreSQL text cannot hold NUL (binding one fails the statement).
    if crate::api::has_nul(&m.pk) || m.columns.iter().any(|c| crate::api::has_nul(&c.value)) {
        return Ok(Err(rejected(
            id,
            "invalid_value",
            "a value contains a NUL character, which the database cannot store",
        )));
    }
    let Ok(pk) = TypedValue::from_wire(&table.primary_key().spec, &m.pk) else {
        return Ok(Err(rejected(
            id,
            "invalid_value",
            "the key is not a canonical value of its type",
        )));
    };
    let mut values = Vec::with_capacity(m.columns.len());
    for (c, f) in m.columns.iter().zip(&fields) {
        match TypedValue::from_wire(&f.spec, &c.value) {
            Ok(t) => values.push(input_text(&t)),
            Err(_) => {
                return Ok(Err(rejected(
                    id,
                    "invalid_value",
                    "a value is not a canonical value of its field",
                )))
            }
        }
    }
    let key = key_text(&pk.to_wire()).ok_or_else(|| ApiError::integrity(Integrity::StoredRow))?;
    let pk_wire = pk.to_wire_text();
    Ok(Ok(Prepared {
        m,
        table,
        key,
        pk_wire,
        pk,
        field_ids: fields.iter().map(|f| f.field_id.as_str()).collect(),
        values,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use synchro_protocol::types::PortableType;

    #[test]
    fn decimals_widen_but_never_narrow() {
        let d = |p, s| FieldSpec::decimal(true, p, s).unwrap();
        assert!(compatible(&d(10, 2), &d(12, 2)));
        assert!(compatible(&d(10, 2), &d(11, 3)));
        assert!(!compatible(&d(10, 2), &d(10, 1)));
        assert!(!compatible(&d(10, 2), &d(10, 3)));
        let plain = FieldSpec::new(PortableType::Int, true).unwrap();
        assert!(!compatible(
            &plain,
            &FieldSpec::new(PortableType::Int64, true).unwrap()
        ));
        assert!(compatible(
            &plain,
            &FieldSpec::new(PortableType::Int, false).unwrap()
        ));
    }
}
