//! Verified application of pull pages (spec 001 client rules): every row digest is
//! recomputed before anything is applied, a page is applied in one transaction, and on the
//! terminal page every scope digest is recomputed from the local rows before that scope's
//! cursor is installed. A digest mismatch invalidates only its scope (cursor cleared,
//! rebuild scheduled); a terminal map whose key set is not exactly the assigned scopes, or any
//! row whose checksum does not verify, rejects the whole page with nothing written.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{ChangeOp, Message, PullResponse};

use super::rows::{
    forget_row, has_intent, pending_keys, record_server_row, set_shadow, stored_digests, write_row,
};
use super::scopes::{
    add_edge, drop_scope, install_verified, mark_rebuild, remove_edge, scope_keys,
    set_pending_cursor,
};
use super::values::to_sql;
use super::Storage;
use crate::error::StorageError;

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

/// One verified change, ready to write.
struct Change<'a> {
    scope: String,
    table: &'a Table,
    pk: TypedValue,
    pk_text: String,
    upsert: Option<Upsert>,
}

/// Verifies every change of `page` (known table, typed key, row checksum, typed values).
fn verify<'m>(
    manifest: &'m Manifest,
    page: &PullResponse,
) -> Result<Vec<Change<'m>>, StorageError> {
    let mut changes = Vec::with_capacity(page.changes.len());
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
    Ok(changes)
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
        let changes = verify(manifest, page)?;
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
        let cursors = &page.scope_cursor_updates;
        let listed_rebuild: BTreeSet<&String> = page.rebuild_scopes.iter().collect();
        let removed = &page.scope_updates.removed;
        if removed.iter().any(|s| assigned.contains(s)) {
            return Err(integrity("a removed scope is still assigned"));
        }
        self.with_tx(|tx| {
            let pending = pending_keys(tx)?;
            // Scopes no longer assigned: their provenance goes, and rows nothing else
            // justifies.
            for scope in removed {
                drop_scope(tx, manifest, scope, &pending)?;
            }
            for c in &changes {
                match &c.upsert {
                    Some((values, version, digest)) => {
                        if has_intent(&pending, c.table, &c.pk_text) {
                            let row = Json::Object(
                                values
                                    .iter()
                                    .map(|(f, v)| (f.clone(), v.to_wire()))
                                    .collect(),
                            );
                            set_shadow(
                                tx,
                                &c.table.table_id,
                                &c.pk_text,
                                Some(&synchro_protocol::jcs::to_output_string(&row)),
                            )?;
                        } else {
                            write_row(tx, c.table, values.iter().map(|(_, v)| to_sql(v)))?;
                        }
                        record_server_row(tx, &c.table.table_id, &c.pk_text, version, digest)?;
                        add_edge(tx, c.table, &c.pk, &c.scope)?;
                    }
                    None => {
                        if remove_edge(tx, c.table, &c.pk, &c.scope)? == 0 {
                            forget_row(tx, c.table, &c.pk, &pending)?;
                        }
                    }
                }
            }
            let mut out = Applied {
                changes: changes.len(),
                ..Applied::default()
            };
            for (scope, cursor) in cursors {
                set_pending_cursor(tx, scope, Some(cursor))?;
            }
            for scope in listed_rebuild {
                mark_rebuild(tx, scope)?;
                out.rebuild.insert(scope.clone());
            }
            // Every stored row digest of each table, read once for all terminal scopes (one
            // scan per table instead of one query per row).
            let mut stored: HashMap<&str, HashMap<String, [u8; 32]>> = HashMap::new();
            if !checksums.is_empty() {
                for table in &manifest.tables {
                    stored.insert(table.table_id.as_str(), stored_digests(tx, table)?);
                }
            }
            for (scope, expected) in &checksums {
                // The scope's local rows: every provenance edge of the scope, with the
                // verified digest stored when its row was applied.
                let mut entries = Vec::new();
                for table in &manifest.tables {
                    let digests = &stored[table.table_id.as_str()];
                    for pk in scope_keys(tx, table, scope)? {
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
                    install_verified(tx, scope, cursors.get(scope).map(String::as_str))?;
                    out.verified.insert(scope.clone());
                } else {
                    mark_rebuild(tx, scope)?;
                    out.rebuild.insert(scope.clone());
                }
            }
            Ok(out)
        })
    }
}
