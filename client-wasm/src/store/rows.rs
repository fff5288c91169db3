//! Synced rows: the visible row in the application's table, its server layer in
//! `_synchro_rows` (server version and verified row digest), and the shadow of a row with
//! unresolved local intent (`_synchro_shadow`).
//!
//! A row with unresolved intent is protected: pull and rebuild keep updating its server
//! layer but leave the visible row alone, and record the server's latest state as its shadow,
//! which is what the visible row returns to when the intent ends in a conflict or a rejection.

use std::collections::{HashMap, HashSet};

use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Transaction};
use synchro_protocol::digest::row_digest_of_values;
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::migration::quote_ident;
use synchro_protocol::value::TypedValue;

use super::enums::MutationState;
use super::index::ScopeIndex;
use super::values::{decode, decode_row, to_sql, Bind};
use super::{run, Storage};
use crate::error::StorageError;

/// Keys (table ID, key wire text) of rows with unresolved local intent: their visible row
/// is the application's until the intent resolves; only the server layer changes.
pub(super) type Pending = HashSet<(String, String)>;

/// Keys of rows with unresolved local intent.
pub(super) fn pending_keys(conn: &Connection) -> rusqlite::Result<Pending> {
    let mut q = conn.prepare_cached(
        r#"SELECT DISTINCT "table_id", "pk" FROM "_synchro_mutations" WHERE "state" = ?"#,
    )?;
    let out = q
        .query_map([MutationState::Pending], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(out)
}

pub(super) fn has_intent(pending: &Pending, table: &Table, pk_text: &str) -> bool {
    !pending.is_empty() && pending.contains(&(table.table_id.clone(), pk_text.to_owned()))
}

/// Inserts or replaces one row of `table`; `values` are in the order of its fields.
pub(super) fn write_row(
    conn: &Connection,
    table: &Table,
    values: impl IntoIterator<Item = Value>,
) -> rusqlite::Result<usize> {
    let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
    run(
        conn,
        &format!(
            "INSERT OR REPLACE INTO {} ({}) VALUES ({})",
            quote_ident(&table.name),
            columns.join(", "),
            vec!["?"; columns.len()].join(", ")
        ),
        params_from_iter(values),
    )
}

/// [`write_row`] for typed values in the order of the table's fields, bound by reference
/// through one cached statement per table.
pub(super) fn write_row_bound(
    conn: &Connection,
    table: &Table,
    values: &[TypedValue],
) -> rusqlite::Result<usize> {
    let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
    let sql = format!(
        "INSERT OR REPLACE INTO {} ({}) VALUES ({})",
        quote_ident(&table.name),
        columns.join(", "),
        vec!["?"; columns.len()].join(", ")
    );
    conn.prepare_cached(&sql)?
        .execute(params_from_iter(values.iter().map(Bind)))
}

/// Deletes the visible row.
pub(super) fn delete_row(
    conn: &Connection,
    table: &Table,
    pk: &TypedValue,
) -> rusqlite::Result<()> {
    run(
        conn,
        &format!(
            "DELETE FROM {} WHERE {} = ?",
            quote_ident(&table.name),
            quote_ident(&table.primary_key().name)
        ),
        [to_sql(pk)],
    )?;
    Ok(())
}

/// Whether the visible row exists.
pub(super) fn row_exists(
    conn: &Connection,
    table: &Table,
    pk: &TypedValue,
) -> rusqlite::Result<bool> {
    conn.query_row(
        &format!(
            "SELECT count(*) > 0 FROM {} WHERE {} = ?",
            quote_ident(&table.name),
            quote_ident(&table.primary_key().name)
        ),
        [to_sql(pk)],
        |r| r.get(0),
    )
}

/// Records a verified server row of `table`: its version and row digest (in the scope
/// index too).
pub(super) fn record_server_row(
    conn: &Connection,
    ix: &mut ScopeIndex,
    table: &Table,
    pk: &TypedValue,
    pk_text: &str,
    version: &str,
    digest: &[u8; 32],
) -> Result<(), StorageError> {
    run(
        conn,
        r#"INSERT OR REPLACE INTO "_synchro_rows" ("table_id", "pk", "server_version", "digest") VALUES (?, ?, ?, ?)"#,
        params![table.table_id, pk_text, version, &digest[..]],
    )?;
    ix.set_digest(table, pk, *digest)
}

/// The server version of a row the server sent (none for a row it never sent).
pub(super) fn server_version(
    conn: &Connection,
    table_id: &str,
    pk_text: &str,
) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        r#"SELECT "server_version" FROM "_synchro_rows" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table_id, pk_text],
        |r| r.get(0),
    )
    .optional()
}

/// Deletes a row no scope justifies any more, with its version and digest (the visible row
/// stays while it has unresolved local intent).
pub(super) fn forget_row(
    conn: &Connection,
    ix: &mut ScopeIndex,
    table: &Table,
    pk: &TypedValue,
    pending: &Pending,
) -> Result<(), StorageError> {
    let pk_text = pk.to_wire_text();
    if has_intent(pending, table, &pk_text) {
        // The server no longer has the row: that is the state the intent falls back to.
        set_shadow(conn, &table.table_id, &pk_text, None)?;
    } else {
        delete_row(conn, table, pk)?;
    }
    run(
        conn,
        r#"DELETE FROM "_synchro_rows" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table.table_id, pk_text],
    )?;
    ix.forget(table, pk)
}

/// Every stored row digest of `table`, by key wire text (one scan).
pub(super) fn stored_digests(
    conn: &Connection,
    table: &Table,
) -> Result<HashMap<String, [u8; 32]>, StorageError> {
    let mut q =
        conn.prepare_cached(r#"SELECT "pk", "digest" FROM "_synchro_rows" WHERE "table_id" = ?"#)?;
    let mut rows = q.query([&table.table_id])?;
    let mut map = HashMap::new();
    while let Some(r) = rows.next()? {
        let digest: [u8; 32] = r
            .get_ref(1)?
            .as_blob()
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(StorageError::Verification("a stored digest is malformed"))?;
        map.insert(r.get(0)?, digest);
    }
    Ok(map)
}

/// Recomputes every stored row digest under `manifest` from the local values (row digests
/// bind the schema hash). A migration without rebuild runs this in its DDL transaction, so
/// the rows kept in place verify under the target schema without being downloaded again.
/// Returns the number of rows.
pub(super) fn redigest_rows(
    tx: &Transaction<'_>,
    manifest: &Manifest,
) -> Result<u64, StorageError> {
    let hash = manifest.schema_hash();
    let pending = pending_keys(tx)?;
    let mut count = 0;
    for table in &manifest.tables {
        let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
        let pk_index = table
            .fields
            .iter()
            .position(|f| f.field_id == table.primary_key_field_id)
            .expect("a validated table has its primary key");
        let mut rows = tx.prepare(&format!(
            "SELECT {} FROM {}",
            columns.join(", "),
            quote_ident(&table.name)
        ))?;
        let mut version = tx.prepare(
            r#"SELECT "server_version" FROM "_synchro_rows" WHERE "table_id" = ? AND "pk" = ?"#,
        )?;
        let mut update = tx.prepare(
            r#"UPDATE "_synchro_rows" SET "digest" = ? WHERE "table_id" = ? AND "pk" = ?"#,
        )?;
        let mut cursor = rows.query([])?;
        while let Some(r) = cursor.next()? {
            // A required field the migration added has no local value yet (spec 000: nullable
            // storage, no invented default): the row cannot be digested under the target and
            // keeps its old digest. Its scope is affected and rebuilds; were it not, its
            // terminal check would fail and rebuild it.
            let values = match decode_row(table, r) {
                Ok(v) => v,
                Err(StorageError::Corrupt { .. }) => continue,
                Err(e) => return Err(e),
            };
            let pk = values[pk_index].to_wire_text();
            // A row the server never sent has no digest to carry.
            let Some(v): Option<String> = version
                .query_row(params![table.table_id, pk], |r| r.get(0))
                .optional()?
            else {
                continue;
            };
            let d = if has_intent(&pending, table, &pk) {
                // A row with unresolved intent shows local values, not the server's: its digest
                // is the server's last row (its shadow) under the target schema — fields the
                // migration added are null, retired ones gone. Without a shadow its old digest
                // stays, and its scope rebuilds after the push if the check fails.
                let Some(Some(server)) = shadow(tx, &table.table_id, &pk)? else {
                    continue;
                };
                let Ok(Json::Object(members)) = Json::parse(&server) else {
                    return Err(StorageError::Verification(
                        "a stored shadow row is malformed",
                    ));
                };
                let row = Json::Object(
                    table
                        .fields
                        .iter()
                        .map(|f| {
                            let value = members
                                .iter()
                                .find(|(id, _)| *id == f.field_id)
                                .map_or(Json::Null, |(_, v)| v.clone());
                            (f.field_id.clone(), value)
                        })
                        .collect(),
                );
                let Ok(key) = Json::parse(&pk) else {
                    return Err(StorageError::Verification("a stored key is malformed"));
                };
                match synchro_protocol::digest::row_digest(
                    manifest,
                    &table.table_id,
                    &key,
                    &row,
                    &v,
                ) {
                    Ok(d) => d,
                    // (A required field the migration added has no value in the shadow.)
                    Err(_) => continue,
                }
            } else {
                row_digest_of_values(&hash, table, &values, &v)
                    .map_err(|_| StorageError::Verification("a stored row cannot be digested"))?
            };
            update.execute(params![d.digest.to_vec(), table.table_id, pk])?;
            count += 1;
        }
    }
    Ok(count)
}

/// Records the server's latest state of a row that has unresolved intent (`None`: the
/// server has no such row).
pub(super) fn set_shadow(
    conn: &Connection,
    table_id: &str,
    pk: &str,
    row: Option<&str>,
) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT OR REPLACE INTO "_synchro_shadow" VALUES (?, ?, ?)"#,
        params![table_id, pk, row],
    )?;
    Ok(())
}

/// The shadow of a row: `None` when it has none, `Some(None)` when the server has no such
/// row.
pub(super) fn shadow(
    conn: &Connection,
    table_id: &str,
    pk: &str,
) -> rusqlite::Result<Option<Option<String>>> {
    conn.query_row(
        r#"SELECT "row" FROM "_synchro_shadow" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table_id, pk],
        |r| r.get(0),
    )
    .optional()
}

/// Whether a row has a shadow.
pub(super) fn has_shadow(conn: &Connection, table_id: &str, pk: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        r#"SELECT count(*) > 0 FROM "_synchro_shadow" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table_id, pk],
        |r| r.get(0),
    )
}

/// Removes a row's shadow (its intent is resolved).
pub(super) fn drop_shadow(conn: &Connection, table_id: &str, pk: &str) -> rusqlite::Result<()> {
    run(
        conn,
        r#"DELETE FROM "_synchro_shadow" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table_id, pk],
    )?;
    Ok(())
}

/// The visible row as `{field_id: wire}` JSON text, if it exists.
pub(super) fn visible_row(
    conn: &Connection,
    table: &Table,
    pk: &TypedValue,
) -> Result<Option<String>, StorageError> {
    let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
    let mut q = conn.prepare_cached(&format!(
        "SELECT {} FROM {} WHERE {} = ?",
        columns.join(", "),
        quote_ident(&table.name),
        quote_ident(&table.primary_key().name)
    ))?;
    let mut rows = q.query([to_sql(pk)])?;
    let Some(r) = rows.next()? else {
        return Ok(None);
    };
    let members = table
        .fields
        .iter()
        .zip(decode_row(table, r)?)
        .map(|(f, v)| (f.field_id.clone(), v.to_wire()))
        .collect();
    Ok(Some(to_output_string(&Json::Object(members))))
}

/// The values of a row given as `{field_id: wire}` JSON, in field order (an absent field is
/// null); `what` names the row in the error.
pub(super) fn wire_row_values(
    table: &Table,
    row: &Json,
    what: &'static str,
) -> Result<Vec<Value>, StorageError> {
    let mut values = Vec::with_capacity(table.fields.len());
    for f in &table.fields {
        let v = TypedValue::from_wire(&f.spec, row.get(&f.field_id).unwrap_or(&Json::Null))
            .map_err(|_| StorageError::Verification(what))?;
        values.push(to_sql(&v));
    }
    Ok(values)
}

/// Writes `row` (`{field_id: wire}` JSON text) as the visible row, or deletes it.
pub(super) fn restore_visible(
    conn: &Connection,
    table: &Table,
    pk: &TypedValue,
    row: Option<&str>,
) -> Result<(), StorageError> {
    match row {
        None => delete_row(conn, table, pk)?,
        Some(text) => {
            let row = Json::parse(text).map_err(|_| StorageError::Verification("a shadow row"))?;
            write_row(conn, table, wire_row_values(table, &row, "a shadow row")?)?;
        }
    }
    Ok(())
}

impl Storage {
    /// Writes (inserts or replaces) one row given as `(field_id, value)` for every field of
    /// the table, each checked against its spec before anything is written.
    pub fn put_row(
        &mut self,
        manifest: &Manifest,
        table_id: &str,
        row: &[(String, TypedValue)],
    ) -> Result<(), StorageError> {
        let table = table_of(manifest, table_id)?;
        let mut values = Vec::with_capacity(table.fields.len());
        for field in &table.fields {
            let value = row
                .iter()
                .find(|(id, _)| *id == field.field_id)
                .map(|(_, v)| v)
                .ok_or_else(|| StorageError::InvalidValue {
                    field_id: field.field_id.clone(),
                })?;
            value
                .check(&field.spec)
                .map_err(|_| StorageError::InvalidValue {
                    field_id: field.field_id.clone(),
                })?;
            values.push(to_sql(value));
        }
        if row.len() != table.fields.len() {
            return Err(StorageError::InvalidValue {
                field_id: "(unknown field)".into(),
            });
        }
        write_row(self.connection(), table, values)?;
        Ok(())
    }

    /// Reads one row by primary key, every value re-validated against its field.
    pub fn get_row(
        &self,
        manifest: &Manifest,
        table_id: &str,
        pk: &TypedValue,
    ) -> Result<Option<Vec<(String, TypedValue)>>, StorageError> {
        let table = table_of(manifest, table_id)?;
        let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
        let sql = format!(
            "SELECT {} FROM {} WHERE {} = ?",
            columns.join(", "),
            quote_ident(&table.name),
            quote_ident(&table.primary_key().name)
        );
        let mut statement = self.connection().prepare(&sql)?;
        let mut rows = statement.query([to_sql(pk)])?;
        let Some(r) = rows.next()? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(table.fields.len());
        for (i, field) in table.fields.iter().enumerate() {
            out.push((field.field_id.clone(), decode(table, field, r.get_ref(i)?)?));
        }
        Ok(Some(out))
    }
}

/// The table `table_id` of `manifest`.
pub(super) fn table_of<'m>(
    manifest: &'m Manifest,
    table_id: &str,
) -> Result<&'m Table, StorageError> {
    manifest
        .table(table_id)
        .ok_or_else(|| StorageError::UnknownTable(table_id.to_owned()))
}
