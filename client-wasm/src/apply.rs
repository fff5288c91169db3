//! Verified application of pull pages (spec 001 client rules): every row digest is
//! recomputed before anything is applied, a page is applied in one transaction, and on the
//! terminal page every scope digest is recomputed from the local rows before that scope's
//! cursor is installed. A digest mismatch invalidates only its scope (cursor cleared,
//! rebuild scheduled); a terminal map whose key set is not exactly the assigned scopes, or any
//! row whose checksum does not verify, rejects the whole page with nothing written.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, OptionalExtension};
use synchro_protocol::digest::{row_digest, row_digest_of_values, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::migration::quote_ident;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{ChangeOp, Message, PullResponse, RebuildEnd, RebuildResponse};

use crate::storage::{from_sql, run, to_sql, write_row, Storage, StorageError};

/// Client tables the engine keeps beside the plan's `_synchro_schema` and provenance.
pub(crate) const METADATA_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_scopes" ("scope_id" TEXT NOT NULL PRIMARY KEY, "cursor" TEXT, "pending_cursor" TEXT, "rebuild" INTEGER NOT NULL DEFAULT 1 CHECK ("rebuild" IN (0, 1))) STRICT, WITHOUT ROWID"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_rows" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_rebuild_rows" ("scope_id" TEXT NOT NULL, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "row" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("scope_id", "table_id", "pk")) STRICT, WITHOUT ROWID"#,
];

/// What applying one page did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Row upserts and deletes applied.
    pub changes: usize,
    /// Scopes whose terminal digest verified (their cursor is installed).
    pub verified: BTreeSet<String>,
    /// Scopes that must rebuild (a mismatch, or listed by the server).
    pub rebuild: BTreeSet<String>,
}

fn integrity(what: &'static str) -> StorageError {
    StorageError::Verification(what)
}

/// A verified upsert: its values by field ID, server version and row digest.
type Upsert = (Vec<(String, TypedValue)>, String, [u8; 32]);

struct Change<'a> {
    scope: String,
    table: &'a Table,
    pk: TypedValue,
    pk_text: String,
    upsert: Option<Upsert>,
}

fn provenance(table: &Table) -> String {
    quote_ident(&format!("_synchro_provenance:{}", table.table_id))
}

/// Keys (table ID, key wire text) of rows with unresolved local intent: their visible row
/// is the application's until the intent resolves; only the server layer changes.
type Pending = std::collections::HashSet<(String, String)>;

fn has_intent(pending: &Pending, table: &Table, pk_text: &str) -> bool {
    !pending.is_empty() && pending.contains(&(table.table_id.clone(), pk_text.to_owned()))
}

/// Deletes a row no scope justifies any more, with its version and digest (the visible row
/// stays while it has unresolved local intent).
fn forget_row(
    conn: &rusqlite::Connection,
    table: &Table,
    pk: &TypedValue,
    pending: &Pending,
) -> Result<(), StorageError> {
    let pk_text = pk.to_wire_text();
    if has_intent(pending, table, &pk_text) {
        // The server no longer has the row: that is the state the intent falls back to.
        crate::queue::set_shadow(conn, &table.table_id, &pk_text, None)?;
    } else {
        run(
            conn,
            &format!(
                "DELETE FROM {} WHERE {} = ?",
                quote_ident(&table.name),
                quote_ident(&table.primary_key().name)
            ),
            [to_sql(pk)],
        )?;
    }
    run(
        conn,
        r#"DELETE FROM "_synchro_rows" WHERE "table_id" = ? AND "pk" = ?"#,
        params![table.table_id, pk_text],
    )?;
    Ok(())
}

/// Recomputes every stored row digest under `manifest` from the local values (row digests
/// bind the schema hash). A migration without rebuild runs this in its DDL transaction, so
/// the rows kept in place verify under the target schema without being downloaded again.
/// Returns the number of rows.
pub(crate) fn redigest_rows(
    tx: &rusqlite::Transaction<'_>,
    manifest: &Manifest,
) -> Result<u64, StorageError> {
    let hash = manifest.schema_hash();
    let pending = crate::queue::pending_keys(tx)?;
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
            let mut values = Vec::with_capacity(table.fields.len());
            for (i, f) in table.fields.iter().enumerate() {
                values.push(from_sql(&f.spec, r.get_ref(i)?).ok_or_else(|| {
                    StorageError::Corrupt {
                        table_id: table.table_id.clone(),
                        field_id: f.field_id.clone(),
                    }
                })?);
            }
            let pk = values[pk_index].to_wire_text();
            // A row with unresolved intent shows local values, not the server's: its old
            // digest stays, so its scope fails the next terminal check and rebuilds after the
            // push (push first). A row the server never sent has no digest to carry.
            if has_intent(&pending, table, &pk) {
                continue;
            }
            let Some(v): Option<String> = version
                .query_row(params![table.table_id, pk], |r| r.get(0))
                .optional()?
            else {
                continue;
            };
            let d = row_digest_of_values(&hash, table, &values, &v)
                .map_err(|_| integrity("a stored row cannot be digested"))?;
            update.execute(params![d.digest.to_vec(), table.table_id, pk])?;
            count += 1;
        }
    }
    Ok(count)
}

/// Removes every provenance edge of `scope`, and every row that no other scope justifies
/// any more unless `kept(table_id, pk_wire_text)` says it is about to be written again.
fn release_scope(
    tx: &rusqlite::Transaction<'_>,
    manifest: &Manifest,
    scope: &str,
    kept: &dyn Fn(&str, &str) -> bool,
    pending: &Pending,
) -> Result<(), StorageError> {
    for table in &manifest.tables {
        let prov = provenance(table);
        let old: Vec<TypedValue> = {
            let mut q = tx.prepare(&format!("SELECT \"pk\" FROM {prov} WHERE \"scope_id\" = ?"))?;
            let out = q
                .query_map([scope], |r| {
                    Ok(from_sql(&table.primary_key().spec, r.get_ref(0)?))
                })?
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| integrity("a stored key does not match its type"))?;
            out
        };
        run(
            tx,
            &format!("DELETE FROM {prov} WHERE \"scope_id\" = ?"),
            [scope],
        )?;
        for pk in old {
            let remaining: i64 = tx.query_row(
                &format!("SELECT count(*) FROM {prov} WHERE \"pk\" = ?"),
                [to_sql(&pk)],
                |r| r.get(0),
            )?;
            if remaining == 0 && !kept(&table.table_id, &pk.to_wire_text()) {
                forget_row(tx, table, &pk, pending)?;
            }
        }
    }
    Ok(())
}

/// Takes away a scope the server no longer assigns: its provenance, the rows nothing else
/// justifies, its staged rebuild rows and its cursor state.
fn drop_scope(
    tx: &rusqlite::Transaction<'_>,
    manifest: &Manifest,
    scope: &str,
    pending: &Pending,
) -> Result<(), StorageError> {
    release_scope(tx, manifest, scope, &|_, _| false, pending)?;
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
    Ok(())
}

impl Storage {
    /// Applies one pull response body for a client whose assigned scopes (after the page's
    /// scope updates) are `assigned`.
    pub fn apply_pull(
        &mut self,
        manifest: &Manifest,
        page: &Json,
        assigned: &BTreeSet<String>,
    ) -> Result<Applied, StorageError> {
        // The one parser of the wire (terminal rules 1 and 2 and every checksum object's
        // shape are part of it).
        let page = PullResponse::from_json(page).map_err(|e| integrity(e.message))?;
        self.apply_pull_page(manifest, &page, assigned)
    }

    /// [`Storage::apply_pull`] for a page already read by [`PullResponse`]'s parser.
    pub fn apply_pull_page(
        &mut self,
        manifest: &Manifest,
        page: &PullResponse,
        assigned: &BTreeSet<String>,
    ) -> Result<Applied, StorageError> {
        // Verify everything before writing anything.
        let mut changes = Vec::new();
        for c in &page.changes {
            let table = manifest
                .table(&c.table_id)
                .ok_or_else(|| integrity("a change names an unknown table"))?;
            let pk = TypedValue::from_wire(&table.primary_key().spec, &c.pk)
                .map_err(|_| integrity("a key does not match its type"))?;
            let upsert = match &c.op {
                ChangeOp::Delete => None,
                ChangeOp::Upsert { row, row_checksum } => {
                    let d = row_digest(manifest, &c.table_id, &c.pk, row, &c.server_version)
                        .map_err(|_| integrity("a row does not match its table"))?;
                    if d.digest != row_checksum.0 {
                        return Err(integrity("a row checksum does not match its row"));
                    }
                    let mut values = Vec::with_capacity(table.fields.len());
                    for f in &table.fields {
                        let v = row.get(&f.field_id).unwrap_or(&Json::Null);
                        values.push((
                            f.field_id.clone(),
                            TypedValue::from_wire(&f.spec, v)
                                .map_err(|_| integrity("a value does not match its field"))?,
                        ));
                    }
                    Some((values, c.server_version.clone(), d.digest))
                }
            };
            changes.push(Change {
                scope: c.scope_id.clone(),
                table,
                pk_text: pk.to_wire_text(),
                pk,
                upsert,
            });
        }
        // Terminal rule 3: the terminal map is keyed by exactly the assigned scopes.
        let mut checksums: BTreeMap<String, [u8; 32]> = BTreeMap::new();
        if let Some(map) = &page.checksums {
            checksums.extend(map.iter().map(|(scope, c)| (scope.clone(), c.0)));
            if checksums.keys().cloned().collect::<BTreeSet<_>>() != *assigned {
                return Err(integrity(
                    "the terminal checksum keys are not the assigned scopes",
                ));
            }
        }
        let cursors: BTreeMap<String, Option<String>> = page
            .scope_cursor_updates
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        let listed_rebuild: BTreeSet<String> = page.rebuild_scopes.iter().cloned().collect();
        let removed: Vec<String> = page.scope_updates.removed.clone();
        if removed.iter().any(|s| assigned.contains(s)) {
            return Err(integrity("a removed scope is still assigned"));
        }
        let tx = self.conn_mut().transaction()?;
        let pending = crate::queue::pending_keys(&tx)?;
        // Scopes no longer assigned: their provenance goes, and rows nothing else justifies.
        for scope in &removed {
            drop_scope(&tx, manifest, scope, &pending)?;
        }
        for c in &changes {
            let prov = provenance(c.table);
            match &c.upsert {
                Some((values, version, digest)) => {
                    if has_intent(&pending, c.table, &c.pk_text) {
                        let row = Json::Object(
                            values
                                .iter()
                                .map(|(f, v)| (f.clone(), v.to_wire()))
                                .collect(),
                        );
                        crate::queue::set_shadow(
                            &tx,
                            &c.table.table_id,
                            &c.pk_text,
                            Some(&synchro_protocol::jcs::to_output_string(&row)),
                        )?;
                    } else {
                        write_row(&tx, c.table, values.iter().map(|(_, v)| to_sql(v)))?;
                    }
                    run(
                        &tx,
                        r#"INSERT OR REPLACE INTO "_synchro_rows" ("table_id", "pk", "server_version", "digest") VALUES (?, ?, ?, ?)"#,
                        params![c.table.table_id, c.pk_text, version, digest.to_vec()],
                    )?;
                    run(
                        &tx,
                        &format!(
                            "INSERT OR IGNORE INTO {prov} (\"pk\", \"scope_id\") VALUES (?, ?)"
                        ),
                        params![to_sql(&c.pk), c.scope],
                    )?;
                }
                None => {
                    run(
                        &tx,
                        &format!("DELETE FROM {prov} WHERE \"pk\" = ? AND \"scope_id\" = ?"),
                        params![to_sql(&c.pk), c.scope],
                    )?;
                    let remaining: i64 = tx.query_row(
                        &format!("SELECT count(*) FROM {prov} WHERE \"pk\" = ?"),
                        [to_sql(&c.pk)],
                        |r| r.get(0),
                    )?;
                    if remaining == 0 {
                        forget_row(&tx, c.table, &c.pk, &pending)?;
                    }
                }
            }
        }
        let mut out = Applied {
            changes: changes.len(),
            ..Applied::default()
        };
        for (scope, cursor) in &cursors {
            run(
                &tx,
                r#"INSERT INTO "_synchro_scopes" ("scope_id", "pending_cursor") VALUES (?1, ?2)
                   ON CONFLICT ("scope_id") DO UPDATE SET "pending_cursor" = ?2"#,
                params![scope, cursor],
            )?;
        }
        for scope in &listed_rebuild {
            run(
                &tx,
                r#"INSERT INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?1, 1)
                   ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = NULL, "pending_cursor" = NULL, "rebuild" = 1"#,
                [scope],
            )?;
            out.rebuild.insert(scope.clone());
        }
        // Every stored row digest of each table, read once for all terminal scopes (one
        // scan per table instead of one query per row).
        let mut stored: BTreeMap<&str, std::collections::HashMap<String, [u8; 32]>> =
            BTreeMap::new();
        if !checksums.is_empty() {
            for table in &manifest.tables {
                let mut q = tx.prepare_cached(
                    r#"SELECT "pk", "digest" FROM "_synchro_rows" WHERE "table_id" = ?"#,
                )?;
                let mut rows = q.query([&table.table_id])?;
                let mut map = std::collections::HashMap::new();
                while let Some(r) = rows.next()? {
                    let digest: [u8; 32] = r
                        .get_ref(1)?
                        .as_blob()
                        .ok()
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| integrity("a stored digest is malformed"))?;
                    map.insert(r.get(0)?, digest);
                }
                stored.insert(table.table_id.as_str(), map);
            }
        }
        for (scope, expected) in &checksums {
            // The scope's local rows: every provenance edge of the scope, with the verified
            // digest stored when its row was applied.
            let mut entries = Vec::new();
            for table in &manifest.tables {
                let mut statement = tx.prepare(&format!(
                    "SELECT \"pk\" FROM {} WHERE \"scope_id\" = ?",
                    provenance(table)
                ))?;
                let pks: Vec<TypedValue> = statement
                    .query_map([scope], |r| {
                        Ok(from_sql(&table.primary_key().spec, r.get_ref(0)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| integrity("a stored key does not match its type"))?;
                let digests = &stored[table.table_id.as_str()];
                for pk in pks {
                    let digest: [u8; 32] = digests
                        .get(&pk.to_wire_text())
                        .copied()
                        .ok_or_else(|| integrity("a provenance edge without its row"))?;
                    entries.push((
                        RowIdentity::new(table, &pk)
                            .map_err(|_| integrity("a key cannot form a row identity"))?,
                        digest,
                    ));
                }
            }
            let local = scope_digest(&manifest.schema_hash(), scope, &mut entries, false)
                .map_err(|_| integrity("the scope digest cannot be computed"))?;
            if local.digest == *expected {
                run(
                    &tx,
                    r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, 0)
                       ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = coalesce("pending_cursor", ?2, "cursor"),
                           "pending_cursor" = NULL, "rebuild" = 0"#,
                    params![scope, cursors.get(scope).cloned().flatten()],
                )?;
                out.verified.insert(scope.clone());
            } else {
                run(
                    &tx,
                    r#"INSERT INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?1, 1)
                       ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = NULL, "pending_cursor" = NULL, "rebuild" = 1"#,
                    [scope],
                )?;
                out.rebuild.insert(scope.clone());
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// Applies one rebuild response page for `scope`. Every record's checksum is verified
    /// before it is staged; pages accumulate beside the live rows; the final page's checksum
    /// must equal the digest of exactly the staged rows, and only then, in one transaction,
    /// the scope's provenance is replaced, rows no scope justifies any more are removed, and
    /// the final cursor is installed. A mismatch discards the staged rows and keeps the
    /// scope in rebuild. Returns true when the rebuild completed.
    pub fn apply_rebuild(
        &mut self,
        manifest: &Manifest,
        scope: &str,
        page: &Json,
        first: bool,
    ) -> Result<bool, StorageError> {
        // The one parser of the wire (terminal rules 5 and 6 and every checksum object's
        // shape are part of it).
        let page = RebuildResponse::from_json(page).map_err(|e| integrity(e.message))?;
        self.apply_rebuild_page(manifest, scope, &page, first)
    }

    /// [`Storage::apply_rebuild`] for a page already read by [`RebuildResponse`]'s parser;
    /// it must be for the requested scope.
    pub fn apply_rebuild_page(
        &mut self,
        manifest: &Manifest,
        scope: &str,
        page: &RebuildResponse,
        first: bool,
    ) -> Result<bool, StorageError> {
        if page.scope_id != scope {
            return Err(integrity("a rebuild page names another scope"));
        }
        let mut staged = Vec::new();
        for r in &page.records {
            let table = manifest
                .table(&r.table_id)
                .ok_or_else(|| integrity("a record names an unknown table"))?;
            let pk = TypedValue::from_wire(&table.primary_key().spec, &r.pk)
                .map_err(|_| integrity("a key does not match its type"))?;
            let d = row_digest(manifest, &r.table_id, &r.pk, &r.row, &r.server_version)
                .map_err(|_| integrity("a row does not match its table"))?;
            if d.digest != r.row_checksum.0 {
                return Err(integrity("a row checksum does not match its row"));
            }
            staged.push((
                r.table_id.clone(),
                pk.to_wire_text(),
                synchro_protocol::jcs::to_output_string(&r.row),
                r.server_version.clone(),
                d.digest,
            ));
        }
        let (expected, final_cursor) = match &page.end {
            RebuildEnd::More { .. } => (None, None),
            RebuildEnd::Final {
                final_scope_cursor,
                checksum,
            } => (Some(checksum.0), Some(final_scope_cursor.clone())),
        };
        let tx = self.conn_mut().transaction()?;
        if first {
            run(
                &tx,
                r#"DELETE FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
                [scope],
            )?;
        }
        for (table_id, pk, row, version, digest) in &staged {
            run(
                &tx,
                r#"INSERT OR REPLACE INTO "_synchro_rebuild_rows" VALUES (?, ?, ?, ?, ?, ?)"#,
                params![scope, table_id, pk, row, version, digest.to_vec()],
            )?;
        }
        let Some(expected) = expected else {
            tx.commit()?;
            return Ok(false);
        };
        let rows: Vec<(String, String, String, String, Vec<u8>)> = {
            let mut q = tx.prepare(
                r#"SELECT "table_id", "pk", "row", "server_version", "digest" FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
            )?;
            let out = q
                .query_map([scope], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            out
        };
        let mut entries = Vec::with_capacity(rows.len());
        for (table_id, pk, _, _, digest) in &rows {
            let table = manifest
                .table(table_id)
                .ok_or_else(|| integrity("a staged record names an unknown table"))?;
            let key = TypedValue::from_wire_text(&table.primary_key().spec, pk)
                .map_err(|_| integrity("a staged key does not match its type"))?;
            entries.push((
                RowIdentity::new(table, &key)
                    .map_err(|_| integrity("a key cannot form a row identity"))?,
                <[u8; 32]>::try_from(digest.as_slice())
                    .map_err(|_| integrity("a staged digest"))?,
            ));
        }
        let local = scope_digest(&manifest.schema_hash(), scope, &mut entries, false)
            .map_err(|_| integrity("the scope digest cannot be computed"))?;
        run(
            &tx,
            r#"DELETE FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
            [scope],
        )?;
        if local.digest != expected {
            run(
                &tx,
                r#"INSERT INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?1, 1)
                   ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = NULL, "pending_cursor" = NULL, "rebuild" = 1"#,
                [scope],
            )?;
            tx.commit()?;
            return Err(integrity("the rebuild checksum does not match its rows"));
        }
        // Replace the scope's provenance layer with the verified snapshot.
        let pending = crate::queue::pending_keys(&tx)?;
        release_scope(
            &tx,
            manifest,
            scope,
            &|table_id, pk| rows.iter().any(|(t, k, ..)| t == table_id && k == pk),
            &pending,
        )?;
        for (table_id, pk, row_text, version, digest) in &rows {
            let table = manifest.table(table_id).expect("checked above");
            let row = Json::parse(row_text).map_err(|_| integrity("a staged row"))?;
            let key = TypedValue::from_wire_text(&table.primary_key().spec, pk)
                .map_err(|_| integrity("a staged key does not match its type"))?;
            let mut values = Vec::with_capacity(table.fields.len());
            for f in &table.fields {
                let v = TypedValue::from_wire(&f.spec, row.get(&f.field_id).unwrap_or(&Json::Null))
                    .map_err(|_| integrity("a value does not match its field"))?;
                values.push(to_sql(&v));
            }
            if has_intent(&pending, table, pk) {
                crate::queue::set_shadow(&tx, table_id, pk, Some(row_text))?;
            } else {
                write_row(&tx, table, values)?;
            }
            run(
                &tx,
                r#"INSERT OR REPLACE INTO "_synchro_rows" ("table_id", "pk", "server_version", "digest") VALUES (?, ?, ?, ?)"#,
                params![table_id, pk, version, digest],
            )?;
            run(
                &tx,
                &format!(
                    "INSERT OR IGNORE INTO {} (\"pk\", \"scope_id\") VALUES (?, ?)",
                    provenance(table)
                ),
                params![to_sql(&key), scope],
            )?;
        }
        run(
            &tx,
            r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, 0)
               ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = ?2, "pending_cursor" = NULL, "rebuild" = 0"#,
            params![scope, final_cursor],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// Releases scopes the server no longer assigns (connect's `scope_updates.removed`):
    /// their provenance, the rows nothing else justifies, their staged rebuild rows and
    /// their cursor state, in one transaction.
    pub fn release_scopes(
        &mut self,
        manifest: &Manifest,
        scopes: &[String],
    ) -> Result<(), StorageError> {
        let tx = self.conn_mut().transaction()?;
        let pending = crate::queue::pending_keys(&tx)?;
        for scope in scopes {
            drop_scope(&tx, manifest, scope, &pending)?;
        }
        tx.commit()?;
        Ok(())
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
}
