//! Verified application of rebuild pages: every record's checksum is verified before it is
//! staged in `_synchro_rebuild_rows`, beside the live rows; the final page's checksum must
//! equal the digest of exactly the staged rows, and only then, in one transaction, the
//! scope's provenance is replaced, rows no scope justifies any more are removed, and the
//! final cursor is installed.

use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{Message, RebuildEnd, RebuildResponse};

use super::rows::{
    has_intent, pending_keys, record_server_row, set_shadow, wire_row_values, write_row,
};
use super::scopes::{add_edge, install_final, mark_rebuild, release_scope};
use super::{run, Storage};
use crate::error::StorageError;

fn integrity(what: &'static str) -> StorageError {
    StorageError::Verification(what)
}

/// One staged record: table ID, key wire text, row JSON text, server version, digest.
type Staged = (String, String, String, String, Vec<u8>);

/// How the final page ended.
enum End {
    /// More pages follow.
    More,
    /// The scope is rebuilt.
    Done,
    /// The final checksum did not match the staged rows (the rows are discarded and the
    /// scope stays marked).
    Mismatch,
}

impl Storage {
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
            } => (Some(checksum.0), Some(final_scope_cursor.as_str())),
        };
        let end = self.with_index_tx(|tx, ix| {
            ix.for_manifest(manifest);
            if first {
                run(
                    tx,
                    r#"DELETE FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
                    [scope],
                )?;
            }
            for (table_id, pk, row, version, digest) in &staged {
                run(
                    tx,
                    r#"INSERT OR REPLACE INTO "_synchro_rebuild_rows" VALUES (?, ?, ?, ?, ?, ?)"#,
                    rusqlite::params![scope, table_id, pk, row, version, digest.to_vec()],
                )?;
            }
            let Some(expected) = expected else {
                return Ok(End::More);
            };
            let rows: Vec<Staged> = {
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
                tx,
                r#"DELETE FROM "_synchro_rebuild_rows" WHERE "scope_id" = ?"#,
                [scope],
            )?;
            if local.digest != expected {
                mark_rebuild(tx, scope)?;
                return Ok(End::Mismatch);
            }
            // Replace the scope's provenance layer with the verified snapshot.
            let pending = pending_keys(tx)?;
            release_scope(
                tx,
                ix,
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
                let values = wire_row_values(table, &row, "a value does not match its field")?;
                if has_intent(&pending, table, pk) {
                    set_shadow(tx, table_id, pk, Some(row_text))?;
                } else {
                    write_row(tx, table, values)?;
                }
                let digest: &[u8; 32] = digest
                    .as_slice()
                    .try_into()
                    .map_err(|_| integrity("a staged digest"))?;
                record_server_row(tx, ix, table, &key, pk, version, digest)?;
                add_edge(tx, ix, table, &key, scope)?;
            }
            install_final(tx, scope, final_cursor)?;
            Ok(End::Done)
        })?;
        match end {
            End::More => Ok(false),
            End::Done => Ok(true),
            // Committed: the staged rows are gone and the scope is marked.
            End::Mismatch => Err(integrity("the rebuild checksum does not match its rows")),
        }
    }
}
