//! The durable mutation queue (spec 000 "Authored-Schema Queued Mutations"): every local
//! write to a synced table changes the visible row and appends the mutation that records the
//! intent, in one SQLite transaction, so a crash can never keep one without the other.
//!
//! A mutation keeps, for its whole life: batch_id, mutation_id (UUIDv7 from injected clock
//! and randomness), table_id, typed primary key, operation, base_version (the server version
//! the intent was made against), client_version (a per-row local counter), the ordered
//! `(field_id, value)` columns the application gave (an absent field is absent, a null is
//! present), the authored schema reference and its local order. Mutations collect in the
//! open batch; sealing fixes a batch's request content for ever. Before sealing, only the
//! server-owned base_version of a mutation may be refreshed (when a predecessor for the same
//! row is accepted); nothing changes after.
//!
//! Rows with unresolved intent are protected: pull and rebuild keep updating the server
//! layer (`_synchro_rows`, provenance, cursors, digests) but leave the visible row alone.

use std::collections::HashSet;

use rusqlite::{params, OptionalExtension};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::migration::quote_ident;
use synchro_protocol::value::TypedValue;

use crate::storage::{run, to_sql, Storage, StorageError};

/// Queue tables; they exist before any schema is installed and survive every migration.
pub(crate) const QUEUE_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_batches" ("batch_id" TEXT NOT NULL PRIMARY KEY, "seq" INTEGER NOT NULL UNIQUE, "sealed" INTEGER NOT NULL DEFAULT 0 CHECK ("sealed" IN (0, 1)), "request" TEXT, "completed" INTEGER NOT NULL DEFAULT 0 CHECK ("completed" IN (0, 1))) STRICT"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_mutations" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "batch_id" TEXT NOT NULL, "local_order" INTEGER NOT NULL UNIQUE, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "operation" TEXT NOT NULL CHECK ("operation" IN ('insert', 'update', 'delete')), "base_version" TEXT, "client_version" INTEGER NOT NULL, "columns" TEXT NOT NULL, "authored_version" INTEGER NOT NULL, "authored_hash" TEXT NOT NULL, "state" TEXT NOT NULL DEFAULT 'pending' CHECK ("state" IN ('pending', 'applied', 'conflict', 'rejected_terminal'))) STRICT"#,
    r#"CREATE INDEX IF NOT EXISTS "_synchro_mutations_row" ON "_synchro_mutations" ("table_id", "pk", "state")"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_outcomes" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "status" TEXT NOT NULL, "code" TEXT, "outcome" TEXT NOT NULL) STRICT"#,
];

/// A local write's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new row.
    Insert,
    /// Change the given fields of an existing row.
    Update,
    /// Remove the row.
    Delete,
}

impl Operation {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Insert => "insert",
            Operation::Update => "update",
            Operation::Delete => "delete",
        }
    }
}

/// One local write through the engine.
#[derive(Debug, Clone, Copy)]
pub struct LocalWrite<'a> {
    /// Logical table ID.
    pub table_id: &'a str,
    /// Insert, update or delete.
    pub operation: Operation,
    /// The row's key.
    pub pk: &'a TypedValue,
    /// `(field_id, value)` in the application's order, the key field excluded.
    pub columns: &'a [(String, TypedValue)],
}

/// One queued mutation as stored (for inspection).
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    /// UUIDv7.
    pub mutation_id: String,
    /// The batch it is (or will be) sent in.
    pub batch_id: String,
    /// Position in the local write order.
    pub local_order: i64,
    /// Logical table ID.
    pub table_id: String,
    /// The key's wire JSON text.
    pub pk: String,
    /// `insert`, `update` or `delete`.
    pub operation: String,
    /// The server version the intent was made against (none for a row the server never
    /// sent).
    pub base_version: Option<String>,
    /// Per-row local counter.
    pub client_version: i64,
    /// `[{"field_id","value"}]` in the order given, as JSON text.
    pub columns: String,
    /// The schema the intent was authored under.
    pub authored: (u64, String),
    /// `pending`, `applied`, `conflict` or `rejected_terminal`.
    pub state: String,
}

/// A UUIDv7 (RFC 9562) from a millisecond Unix time and 16 random bytes.
pub fn uuid_v7(unix_ms: u64, random: [u8; 16]) -> String {
    let mut b = random;
    b[..6].copy_from_slice(&unix_ms.to_be_bytes()[2..]);
    b[6] = 0x70 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Keys (table ID, key wire text) of rows with unresolved local intent.
pub(crate) fn pending_keys(
    conn: &rusqlite::Connection,
) -> rusqlite::Result<HashSet<(String, String)>> {
    let mut q = conn.prepare_cached(
        r#"SELECT DISTINCT "table_id", "pk" FROM "_synchro_mutations" WHERE "state" = 'pending'"#,
    )?;
    let out = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(out)
}

fn invalid(field_id: &str) -> StorageError {
    StorageError::InvalidValue {
        field_id: field_id.to_owned(),
    }
}

impl Storage {
    /// Writes locally and queues the intent, in one transaction. `columns` are
    /// `(field_id, value)` in the application's order (the key field excluded: it is `pk`);
    /// a field not listed is absent (an insert stores NULL there, an update leaves it).
    /// Returns the mutation ID.
    pub(crate) fn write_local(
        &mut self,
        manifest: &Manifest,
        write: &LocalWrite<'_>,
        (mutation_id, new_batch_id): (String, String),
    ) -> Result<String, StorageError> {
        let LocalWrite {
            table_id,
            operation,
            pk,
            columns,
        } = *write;
        let table = manifest
            .table(table_id)
            .ok_or_else(|| StorageError::UnknownTable(table_id.to_owned()))?;
        let key_field = table.primary_key();
        pk.check(&key_field.spec)
            .map_err(|_| invalid(&key_field.field_id))?;
        if operation == Operation::Delete && !columns.is_empty() {
            return Err(invalid("(columns of a delete)"));
        }
        let mut seen = HashSet::new();
        for (field_id, value) in columns {
            let field = table
                .field(field_id)
                .filter(|f| f.field_id != table.primary_key_field_id)
                .ok_or_else(|| invalid(field_id))?;
            if !field.writable || !seen.insert(field_id.as_str()) {
                return Err(invalid(field_id));
            }
            value.check(&field.spec).map_err(|_| invalid(field_id))?;
        }
        let pk_text = pk.to_wire_text();
        let tx = self.conn_mut().transaction()?;
        let exists = local_row_exists(&tx, table, pk)?;
        match (operation, exists) {
            (Operation::Insert, true) => return Err(invalid(&key_field.field_id)),
            (Operation::Update | Operation::Delete, false) => {
                return Err(StorageError::Schema("no such row".into()))
            }
            _ => {}
        }
        // The visible row.
        match operation {
            Operation::Insert => {
                let mut names = vec![quote_ident(&key_field.name)];
                let mut values = vec![to_sql(pk)];
                for f in &table.fields {
                    if f.field_id == table.primary_key_field_id {
                        continue;
                    }
                    match columns.iter().find(|(id, _)| *id == f.field_id) {
                        Some((_, v)) => {
                            names.push(quote_ident(&f.name));
                            values.push(to_sql(v));
                        }
                        None if f.spec.nullable => {}
                        None => return Err(invalid(&f.field_id)),
                    }
                }
                run(
                    &tx,
                    &format!(
                        "INSERT INTO {} ({}) VALUES ({})",
                        quote_ident(&table.name),
                        names.join(", "),
                        vec!["?"; names.len()].join(", ")
                    ),
                    rusqlite::params_from_iter(values),
                )?;
            }
            Operation::Update if !columns.is_empty() => {
                let sets: Vec<String> = columns
                    .iter()
                    .map(|(id, _)| {
                        format!(
                            "{} = ?",
                            quote_ident(&table.field(id).expect("checked").name)
                        )
                    })
                    .collect();
                let mut values: Vec<_> = columns.iter().map(|(_, v)| to_sql(v)).collect();
                values.push(to_sql(pk));
                run(
                    &tx,
                    &format!(
                        "UPDATE {} SET {} WHERE {} = ?",
                        quote_ident(&table.name),
                        sets.join(", "),
                        quote_ident(&key_field.name)
                    ),
                    rusqlite::params_from_iter(values),
                )?;
            }
            Operation::Update => {}
            Operation::Delete => {
                run(
                    &tx,
                    &format!(
                        "DELETE FROM {} WHERE {} = ?",
                        quote_ident(&table.name),
                        quote_ident(&key_field.name)
                    ),
                    [to_sql(pk)],
                )?;
            }
        }
        // The intent.
        let base_version: Option<String> = tx
            .query_row(
                r#"SELECT "server_version" FROM "_synchro_rows" WHERE "table_id" = ? AND "pk" = ?"#,
                params![table_id, pk_text],
                |r| r.get(0),
            )
            .optional()?;
        let client_version: i64 = tx.query_row(
            r#"SELECT count(*) + 1 FROM "_synchro_mutations" WHERE "table_id" = ? AND "pk" = ?"#,
            params![table_id, pk_text],
            |r| r.get(0),
        )?;
        let open: Option<String> = tx
            .query_row(
                r#"SELECT "batch_id" FROM "_synchro_batches" WHERE "sealed" = 0"#,
                [],
                |r| r.get(0),
            )
            .optional()?;
        let batch_id = match open {
            Some(b) => b,
            None => {
                run(
                    &tx,
                    r#"INSERT INTO "_synchro_batches" ("batch_id", "seq") VALUES (?, (SELECT coalesce(max("seq"), 0) + 1 FROM "_synchro_batches"))"#,
                    [&new_batch_id],
                )?;
                new_batch_id
            }
        };
        let columns_json = to_output_string(&Json::Array(
            columns
                .iter()
                .map(|(id, v)| {
                    Json::Object(vec![
                        ("field_id".into(), Json::String(id.clone())),
                        ("value".into(), v.to_wire()),
                    ])
                })
                .collect(),
        ));
        run(
            &tx,
            r#"INSERT INTO "_synchro_mutations" ("mutation_id", "batch_id", "local_order", "table_id", "pk", "operation",
                   "base_version", "client_version", "columns", "authored_version", "authored_hash")
               VALUES (?, ?, (SELECT coalesce(max("local_order"), 0) + 1 FROM "_synchro_mutations"), ?, ?, ?, ?, ?, ?, ?, ?)"#,
            params![
                mutation_id,
                batch_id,
                table_id,
                pk_text,
                operation.as_str(),
                base_version,
                client_version,
                columns_json,
                manifest.schema_version as i64,
                manifest.schema_hash_hex(),
            ],
        )?;
        tx.commit()?;
        Ok(mutation_id)
    }

    /// Every queued mutation in local order (all states), for inspection.
    pub fn mutations(&self) -> Result<Vec<Mutation>, StorageError> {
        let mut q = self.connection().prepare(
            r#"SELECT "mutation_id", "batch_id", "local_order", "table_id", "pk", "operation", "base_version",
                      "client_version", "columns", "authored_version", "authored_hash", "state"
                 FROM "_synchro_mutations" ORDER BY "local_order""#,
        )?;
        let out = q
            .query_map([], |r| {
                Ok(Mutation {
                    mutation_id: r.get(0)?,
                    batch_id: r.get(1)?,
                    local_order: r.get(2)?,
                    table_id: r.get(3)?,
                    pk: r.get(4)?,
                    operation: r.get(5)?,
                    base_version: r.get(6)?,
                    client_version: r.get(7)?,
                    columns: r.get(8)?,
                    authored: (r.get::<_, i64>(9)? as u64, r.get(10)?),
                    state: r.get(11)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(out)
    }
}

fn local_row_exists(
    conn: &rusqlite::Connection,
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
