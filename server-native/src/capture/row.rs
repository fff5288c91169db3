//! A source row of a registered relation as the worker writes it: the source's shape of the
//! relation (from a pgoutput Relation message, or the bootstrap's column list), the key as
//! canonical wire text, and the canonical wire row. Values a portable type cannot hold, and
//! a shape that no longer matches the registration, block capture.

use anyhow::{bail, Result};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;

use super::block::{BlockDetail, BlockReason, Blocked};
use super::pgoutput::Value;
use super::registry::{Field, Registered};
use super::values::{text_to_wire, ValueSource};

/// A column of the source relation, in the order the source sends values.
pub(super) struct Column {
    pub(super) name: String,
    pub(super) type_oid: u32,
    pub(super) type_modifier: i32,
}

/// The source's description of a relation.
pub(super) struct RelationShape {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) replica_identity: u8,
    pub(super) columns: Vec<Column>,
}

impl RelationShape {
    /// How the source relation differs from its registration, if it does: another qualified
    /// name or replica identity, a field's column missing or of another type, or (for a
    /// synced relation) a column that is neither a field nor expected.
    pub(super) fn drift(&self, reg: &Registered) -> Option<BlockDetail> {
        if self.namespace != reg.schema || self.name != reg.relation {
            return Some(BlockDetail::RelationRenamed);
        }
        if self.replica_identity != reg.replica_identity {
            return Some(BlockDetail::ReplicaIdentityChanged);
        }
        let mut found = 0;
        for c in &self.columns {
            match reg.fields_by_column.get(&c.name) {
                Some(f) if f.type_oid != c.type_oid || f.type_modifier != c.type_modifier => {
                    return Some(BlockDetail::ColumnTypeChanged)
                }
                Some(_) => found += 1,
                None if reg.synced && !reg.expected_columns.contains(&c.name) => {
                    return Some(BlockDetail::ColumnAdded)
                }
                None => {}
            }
        }
        (found != reg.fields_by_column.len()).then_some(BlockDetail::ColumnMissing)
    }
}

/// The registered field at a source column position, and the type its text is read as (the
/// column's type through its domains; `drift` has checked the column's type is the field's).
struct SourceField<'a> {
    field: &'a Field,
    source: &'a ValueSource,
}

fn field_of<'a>(reg: &'a Registered, shape: &RelationShape, i: usize) -> Option<SourceField<'a>> {
    let column = shape.columns.get(i)?;
    reg.fields_by_column
        .get(&column.name)
        .map(|field| SourceField {
            field,
            source: &field.source,
        })
}

fn key_field<'a>(reg: &'a Registered, shape: &RelationShape, i: usize) -> Option<SourceField<'a>> {
    field_of(reg, shape, i).filter(|f| f.field.is_key)
}

/// The key column's text exactly as the source sent it (what the fence recorded).
pub(super) fn raw_key_text(
    reg: &Registered,
    shape: &RelationShape,
    values: &[Value],
) -> Option<String> {
    values
        .iter()
        .enumerate()
        .find_map(|(i, v)| match (key_field(reg, shape, i), v) {
            (Some(_), Value::Text(t)) => String::from_utf8(t.clone()).ok(),
            _ => None,
        })
}

/// The key as canonical wire text.
pub(super) fn key_text(
    reg: &Registered,
    shape: &RelationShape,
    values: &[Value],
) -> Result<String> {
    for (i, v) in values.iter().enumerate() {
        if let Some(f) = key_field(reg, shape, i) {
            let Value::Text(t) = v else {
                bail!(Blocked(BlockReason::UnrepresentableValue))
            };
            let tv = text_to_wire(&f.field.spec, f.source, t)
                .map_err(|_| Blocked(BlockReason::UnrepresentableValue))?;
            return Ok(tv.to_wire_text());
        }
    }
    bail!(Blocked(BlockReason::RegisteredRelationDrift))
}

/// The canonical wire row (object keyed by field ID), taking unchanged TOAST values from
/// the previous projection row.
pub(super) fn row_json(
    reg: &Registered,
    shape: &RelationShape,
    values: &[Value],
    previous: Option<&str>,
) -> Result<String> {
    let previous = previous.map(Json::parse).transpose().ok().flatten();
    let mut members = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let Some(SourceField { field, source }) = field_of(reg, shape, i) else {
            continue;
        };
        let wire = match v {
            Value::Null if field.spec.nullable => Json::Null,
            Value::Null => bail!(Blocked(BlockReason::UnrepresentableValue)),
            Value::Text(t) => text_to_wire(&field.spec, source, t)
                .map_err(|_| Blocked(BlockReason::UnrepresentableValue))?
                .to_wire(),
            Value::Unchanged => previous
                .as_ref()
                .and_then(|p| p.get(&field.field_id).cloned())
                .ok_or(Blocked(BlockReason::UnrepresentableValue))?,
        };
        members.push((field.field_id.clone(), wire));
    }
    if members.len() != reg.fields_by_column.len() {
        bail!(Blocked(BlockReason::RegisteredRelationDrift));
    }
    Ok(jcs::to_output_string(&Json::Object(members)))
}
