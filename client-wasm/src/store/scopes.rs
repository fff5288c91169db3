//! Scopes: the assigned scopes with their cursors and rebuild markers (`_synchro_scopes`),
//! the provenance edges that say which scopes justify a row (one
//! `_synchro_provenance:<table_id>` table per synced table, created by the migration plan),
//! and releasing a scope.
//!
//! A scope's cursor is installed only once its terminal digest verified; until then a cursor
//! from a pull page waits as `pending_cursor`. Marking a scope for rebuild clears both.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, Connection, OptionalExtension, Transaction};
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::migration::quote_ident;
use synchro_protocol::value::TypedValue;

use super::index::ScopeIndex;
use super::rows::{forget_row, pending_keys, Pending};
use super::values::{from_sql, to_sql};
use super::{run, Storage};
use crate::error::StorageError;

/// The quoted provenance table of `table`.
pub(super) fn provenance(table: &Table) -> String {
    quote_ident(&format!("_synchro_provenance:{}", table.table_id))
}

/// Records that `scope` justifies the row `pk` (in the scope index too).
pub(super) fn add_edge(
    conn: &Connection,
    ix: &mut ScopeIndex,
    table: &Table,
    pk: &TypedValue,
    scope: &str,
) -> Result<(), StorageError> {
    run(
        conn,
        &format!(
            "INSERT OR IGNORE INTO {} (\"pk\", \"scope_id\") VALUES (?, ?)",
            provenance(table)
        ),
        params![to_sql(pk), scope],
    )?;
    ix.add_edge(table, pk, scope)
}

/// Removes the edge from `scope` to the row `pk` (in the scope index too); returns how
/// many scopes still justify the row.
pub(super) fn remove_edge(
    conn: &Connection,
    ix: &mut ScopeIndex,
    table: &Table,
    pk: &TypedValue,
    scope: &str,
) -> Result<i64, StorageError> {
    let prov = provenance(table);
    run(
        conn,
        &format!("DELETE FROM {prov} WHERE \"pk\" = ? AND \"scope_id\" = ?"),
        params![to_sql(pk), scope],
    )?;
    ix.remove_edge(table, pk, scope)?;
    Ok(edges_of(conn, &prov, pk)?)
}

/// How many scopes justify the row `pk` (`prov` is the quoted provenance table).
fn edges_of(conn: &Connection, prov: &str, pk: &TypedValue) -> rusqlite::Result<i64> {
    conn.query_row(
        &format!("SELECT count(*) FROM {prov} WHERE \"pk\" = ?"),
        [to_sql(pk)],
        |r| r.get(0),
    )
}

/// The keys of `table` that `scope` justifies.
pub(super) fn scope_keys(
    conn: &Connection,
    table: &Table,
    scope: &str,
) -> Result<Vec<TypedValue>, StorageError> {
    let mut q = conn.prepare(&format!(
        "SELECT \"pk\" FROM {} WHERE \"scope_id\" = ?",
        provenance(table)
    ))?;
    let keys = q
        .query_map([scope], |r| {
            Ok(from_sql(&table.primary_key().spec, r.get_ref(0)?))
        })?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or(StorageError::Verification(
            "a stored key does not match its type",
        ))?;
    Ok(keys)
}

/// Marks `scope` for rebuild: its cursors are cleared.
pub(super) fn mark_rebuild(conn: &Connection, scope: &str) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?1, 1)
           ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = NULL, "pending_cursor" = NULL, "rebuild" = 1"#,
        [scope],
    )?;
    Ok(())
}

/// A pull page's cursor for `scope`, waiting for the terminal digest.
pub(super) fn set_pending_cursor(
    conn: &Connection,
    scope: &str,
    cursor: Option<&str>,
) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT INTO "_synchro_scopes" ("scope_id", "pending_cursor") VALUES (?1, ?2)
           ON CONFLICT ("scope_id") DO UPDATE SET "pending_cursor" = ?2"#,
        params![scope, cursor],
    )?;
    Ok(())
}

/// `scope`'s terminal digest verified: its waiting cursor (else the page's `cursor`, else
/// the one it had) is installed.
pub(super) fn install_verified(
    conn: &Connection,
    scope: &str,
    cursor: Option<&str>,
) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, 0)
           ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = coalesce("pending_cursor", ?2, "cursor"),
               "pending_cursor" = NULL, "rebuild" = 0"#,
        params![scope, cursor],
    )?;
    Ok(())
}

/// `scope`'s rebuild verified: its final cursor is installed.
pub(super) fn install_final(
    conn: &Connection,
    scope: &str,
    cursor: Option<&str>,
) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, 0)
           ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = ?2, "pending_cursor" = NULL, "rebuild" = 0"#,
        params![scope, cursor],
    )?;
    Ok(())
}

/// A migration's server-issued replacement cursor for `scope`; `None` means rebuild.
pub(super) fn replace_cursor(
    conn: &Connection,
    scope: &str,
    cursor: Option<&str>,
) -> rusqlite::Result<()> {
    conn.execute(
        r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, ?3)
           ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = ?2, "pending_cursor" = NULL, "rebuild" = ?3"#,
        params![scope, cursor, i64::from(cursor.is_none())],
    )?;
    Ok(())
}

/// Drops every waiting cursor (a cursor under the source schema that got no replacement
/// cannot continue).
pub(super) fn clear_pending_cursors(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute(
        r#"UPDATE "_synchro_scopes" SET "pending_cursor" = NULL"#,
        [],
    )?;
    Ok(())
}

/// Removes every provenance edge of `scope`, and every row that no other scope justifies
/// any more unless `kept(table_id, pk_wire_text)` says it is about to be written again.
pub(super) fn release_scope(
    tx: &Transaction<'_>,
    ix: &mut ScopeIndex,
    manifest: &Manifest,
    scope: &str,
    kept: &dyn Fn(&str, &str) -> bool,
    pending: &Pending,
) -> Result<(), StorageError> {
    for table in &manifest.tables {
        let prov = provenance(table);
        let old = scope_keys(tx, table, scope)?;
        run(
            tx,
            &format!("DELETE FROM {prov} WHERE \"scope_id\" = ?"),
            [scope],
        )?;
        ix.clear_scope(table, scope);
        for pk in old {
            if edges_of(tx, &prov, &pk)? == 0 && !kept(&table.table_id, &pk.to_wire_text()) {
                forget_row(tx, ix, table, &pk, pending)?;
            }
        }
    }
    Ok(())
}

/// Takes away a scope the server no longer assigns: its provenance, the rows nothing else
/// justifies, its staged rebuild rows and its cursor state.
pub(super) fn drop_scope(
    tx: &Transaction<'_>,
    ix: &mut ScopeIndex,
    manifest: &Manifest,
    scope: &str,
    pending: &Pending,
) -> Result<(), StorageError> {
    release_scope(tx, ix, manifest, scope, &|_, _| false, pending)?;
    run(
        tx,
        r#"DELETE FROM "_synchro_scopes" WHERE "scope_id" = ?"#,
        [scope],
    )?;
    run(
        tx,
        r#"DELETE FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
        [scope],
    )?;
    run(
        tx,
        r#"DELETE FROM "_synchro_seed_receipts" WHERE "scope_id" = ?"#,
        [scope],
    )?;
    Ok(())
}

/// Releases `scopes` (see [`Storage::release_scopes`]) in `tx`.
fn release(
    tx: &Transaction<'_>,
    ix: &mut ScopeIndex,
    manifest: &Manifest,
    scopes: &[String],
) -> Result<(), StorageError> {
    ix.for_manifest(manifest);
    let pending = pending_keys(tx)?;
    for scope in scopes {
        drop_scope(tx, ix, manifest, scope, &pending)?;
    }
    Ok(())
}

impl Storage {
    /// Releases scopes the server no longer assigns (connect's `scope_updates.removed`):
    /// their provenance, the rows nothing else justifies, their staged rebuild rows and
    /// their cursor state, in one transaction.
    pub fn release_scopes(
        &mut self,
        manifest: &Manifest,
        scopes: &[String],
    ) -> Result<(), StorageError> {
        self.with_index_tx(|tx, ix| release(tx, ix, manifest, scopes))
    }

    /// Installs what a connect that keeps the schema returned, in one transaction: the
    /// client generation and scope set version, the scopes released and added (each added
    /// one marked for rebuild), a rebuild for every scope whose cursor came back null (a
    /// client given a new generation, once expired: spec 003), and the seed receipts
    /// settled. A crash keeps all of it or none: a generation recorded apart from its null
    /// cursors had the client present the old generation's cursors under the new one.
    pub(crate) fn apply_connect(
        &mut self,
        manifest: &Manifest,
        (generation, scope_set_version): (i64, Option<i64>),
        removed: &[String],
        added: &BTreeSet<String>,
        cursors: &BTreeMap<String, Option<String>>,
    ) -> Result<(), StorageError> {
        let receipts = self.seed_receipts()?;
        self.with_index_tx(|tx, ix| {
            super::client::record_client(tx, generation, scope_set_version)?;
            release(tx, ix, manifest, removed)?;
            for s in added {
                run(
                    tx,
                    r#"INSERT OR IGNORE INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?, 1)"#,
                    [s],
                )?;
            }
            for (scope, cursor) in cursors {
                match cursor {
                    None if !removed.contains(scope) => replace_cursor(tx, scope, None)?,
                    Some(c) if receipts.iter().any(|(s, _)| s == scope) => {
                        install_final(tx, scope, Some(c))?
                    }
                    _ => {}
                }
            }
            if !receipts.is_empty() {
                run(tx, r#"DELETE FROM "_synchro_seed_receipts""#, [])?;
            }
            Ok(())
        })
    }

    /// A scope's installed cursor and whether it must rebuild.
    pub fn scope_state(&self, scope: &str) -> Result<Option<(Option<String>, bool)>, StorageError> {
        Ok(self
            .connection()
            .query_row(
                r#"SELECT "cursor", "rebuild" FROM "_synchro_scopes" WHERE "scope_id" = ?"#,
                [scope],
                |r| Ok((r.get(0)?, r.get::<_, i64>(1)? == 1)),
            )
            .optional()?)
    }

    /// Every known scope with `(cursor to present, rebuild)`: the waiting cursor when there
    /// is one, else the installed one.
    pub(crate) fn scopes(&self) -> Result<BTreeMap<String, (Option<String>, bool)>, StorageError> {
        let mut q = self.connection().prepare(
            r#"SELECT "scope_id", coalesce("pending_cursor", "cursor"), "rebuild" FROM "_synchro_scopes""#,
        )?;
        let out = q
            .query_map([], |r| {
                Ok((r.get(0)?, (r.get(1)?, r.get::<_, i64>(2)? == 1)))
            })?
            .collect::<Result<_, _>>()?;
        Ok(out)
    }
}
