//! Typed SQLite storage.
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
use rusqlite::{params_from_iter, Connection, OptionalExtension};
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::migration::{quote_ident, MigrationPlan, RESERVED_PREFIX};
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::{Scalar, TypedValue};

pub use crate::error::StorageError;

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

/// Executes `sql` through the connection's prepared-statement cache (the hot paths run
/// the same few statements once per row).
pub(crate) fn run<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Inserts or replaces one row of `table`; `values` are in the order of its fields.
pub(crate) fn write_row(
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

/// Every schema object that belongs to synchro: `_synchro_` objects and the synced tables
/// with their indexes and triggers.
/// One `sqlite_schema` row: type, name, table name, SQL.
type SchemaObject = (String, String, String, Option<String>);

fn protected_schema(conn: &Connection, synced: &[String]) -> rusqlite::Result<Vec<SchemaObject>> {
    let mut q =
        conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name")?;
    let all = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<Vec<SchemaObject>>>()?;
    let protected = |n: &str| n.starts_with(RESERVED_PREFIX) || synced.iter().any(|s| s == n);
    Ok(all
        .into_iter()
        .filter(|(_, name, tbl, _)| protected(name) || protected(tbl))
        .collect())
}

/// A local database.
pub struct Storage {
    conn: Connection,
}

impl Storage {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Storage, StorageError> {
        Ok(Storage {
            conn: Connection::open(path)?,
        })
    }

    /// A private in-memory database.
    pub fn open_in_memory() -> Result<Storage, StorageError> {
        Ok(Storage {
            conn: Connection::open_in_memory()?,
        })
    }

    /// The underlying connection (for tests and queries by the application).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The installed manifest, verified against its recorded hash; `None` before install.
    pub fn active_schema(&self) -> Result<Option<Manifest>, StorageError> {
        let exists: bool = self.conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = '_synchro_schema'",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(None);
        }
        let row: Option<(i64, String, String)> = self
            .conn
            .query_row(
                "SELECT version, hash, body FROM \"_synchro_schema\" WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((version, hash, body)) = row else {
            return Ok(None);
        };
        let manifest = Manifest::parse(&body)?;
        if manifest.schema_hash_hex() != hash || manifest.schema_version as i64 != version {
            return Err(StorageError::Schema(
                "the recorded schema does not match its hash".into(),
            ));
        }
        Ok(Some(manifest))
    }

    /// Installs a fresh database from `manifest`: the plan's DDL and the schema record in
    /// one transaction (all or nothing). Refuses a database that already has a schema.
    pub fn install(&mut self, manifest: &Manifest) -> Result<(), StorageError> {
        if self.active_schema()?.is_some() {
            return Err(StorageError::Schema(
                "the database already has a schema; migrate instead".into(),
            ));
        }
        let plan = MigrationPlan::derive(None, manifest, false)?;
        let tx = self.conn.transaction()?;
        for statement in plan.render() {
            tx.execute_batch(&statement)?;
        }
        for statement in crate::apply::METADATA_DDL
            .iter()
            .chain(crate::queue::QUEUE_DDL)
        {
            tx.execute_batch(statement)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Evolves the application's own local-only tables with `ladder`: rung `i` (1-based)
    /// takes `PRAGMA user_version` from `i - 1` to `i` in its own transaction, together with
    /// the version bump. A database from a newer ladder (a version above `ladder.len()`) is
    /// refused untouched, and a rung that creates, alters or drops a synced table or
    /// anything named `_synchro_` is rolled back with its error. Returns the version after.
    pub fn migrate_local(&mut self, ladder: &[&str]) -> Result<u32, StorageError> {
        let mut version: u32 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version as usize > ladder.len() {
            return Err(StorageError::Schema(format!(
                "the local tables are at version {version}, newer than this application's {}",
                ladder.len()
            )));
        }
        let synced: Vec<String> = self
            .active_schema()?
            .map(|m| m.tables.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        while (version as usize) < ladder.len() {
            let tx = self.conn.transaction()?;
            let before = protected_schema(&tx, &synced)?;
            tx.execute_batch(ladder[version as usize])?;
            if protected_schema(&tx, &synced)? != before {
                return Err(StorageError::Schema(format!(
                    "local migration {} changes a synced or synchro table",
                    version + 1
                )));
            }
            version += 1;
            tx.pragma_update(None, "user_version", version)?;
            tx.commit()?;
        }
        Ok(version)
    }

    fn table<'m>(manifest: &'m Manifest, table_id: &str) -> Result<&'m Table, StorageError> {
        manifest
            .table(table_id)
            .ok_or_else(|| StorageError::UnknownTable(table_id.to_owned()))
    }

    /// Writes (inserts or replaces) one row given as `(field_id, value)` for every field of
    /// the table, each checked against its spec before anything is written.
    pub fn put_row(
        &mut self,
        manifest: &Manifest,
        table_id: &str,
        row: &[(String, TypedValue)],
    ) -> Result<(), StorageError> {
        let table = Self::table(manifest, table_id)?;
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
        write_row(&self.conn, table, values)?;
        Ok(())
    }

    /// Reads one row by primary key, every value re-validated against its field.
    pub fn get_row(
        &self,
        manifest: &Manifest,
        table_id: &str,
        pk: &TypedValue,
    ) -> Result<Option<Vec<(String, TypedValue)>>, StorageError> {
        let table = Self::table(manifest, table_id)?;
        let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
        let sql = format!(
            "SELECT {} FROM {} WHERE {} = ?",
            columns.join(", "),
            quote_ident(&table.name),
            quote_ident(&table.primary_key().name)
        );
        let mut statement = self.conn.prepare(&sql)?;
        let mut rows = statement.query([to_sql(pk)])?;
        let Some(r) = rows.next()? else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(table.fields.len());
        for (i, field) in table.fields.iter().enumerate() {
            let value =
                from_sql(&field.spec, r.get_ref(i)?).ok_or_else(|| StorageError::Corrupt {
                    table_id: table.table_id.clone(),
                    field_id: field.field_id.clone(),
                })?;
            out.push((field.field_id.clone(), value));
        }
        Ok(Some(out))
    }
}
