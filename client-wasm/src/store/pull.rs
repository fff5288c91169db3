//! Verified application of pull pages (spec 001 client rules): every row digest is
//! recomputed before anything is applied, a page is applied in one transaction, and on the
//! terminal page every scope digest is recomputed from the local rows before that scope's
//! cursor is installed. A digest mismatch invalidates only its scope (cursor cleared,
//! rebuild scheduled); a terminal map whose key set is not exactly the assigned scopes, or any
//! row whose checksum does not verify, rejects the whole page with nothing written.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::digest::{row_values, RowHasher, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{self, ChangeOp, PullResponse};

use super::rows::{
    forget_row, has_intent, pending_keys, record_server_row, set_shadow, write_row_bound,
};
use super::scopes::{
    add_edge, drop_scope, install_verified, mark_rebuild, remove_edge, set_pending_cursor,
};
use super::{index_load, Storage};
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

/// A terminal page's checksum map and cursors, between [`Storage::apply_pull_rows`] and
/// [`Storage::verify_terminal`] (empty for a page that is not terminal).
#[derive(Debug, Default)]
pub struct Terminal {
    checksums: BTreeMap<String, [u8; 32]>,
    cursors: BTreeMap<String, String>,
}

/// A verified upsert: its values in field order, server version and row digest.
type Upsert = (Vec<TypedValue>, String, [u8; 32]);

/// One verified change, ready to write.
struct Change<'a> {
    scope: String,
    table: &'a Table,
    pk: TypedValue,
    pk_text: String,
    upsert: Option<Upsert>,
}

/// Verifies every change of a page (known table, typed key, row checksum recomputed from
/// the typed values, which are what gets written), consuming the wire changes.
fn verify(
    manifest: &Manifest,
    changes: Vec<wire::Change>,
) -> Result<Vec<Change<'_>>, StorageError> {
    let hash = manifest.schema_hash();
    let mut hasher = RowHasher::new();
    let mut out = Vec::with_capacity(changes.len());
    for c in changes {
        let table = manifest
            .table(&c.table_id)
            .ok_or_else(|| integrity("a change names an unknown table"))?;
        let pk = TypedValue::from_wire(&table.primary_key().spec, &c.pk)
            .map_err(|_| integrity("a key does not match its type"))?;
        let upsert = match c.op {
            ChangeOp::Delete => None,
            ChangeOp::Upsert { row, row_checksum } => {
                let unfit = |_| integrity("a row does not match its table");
                let identity = RowIdentity::new(table, &pk).map_err(unfit)?;
                let values = row_values(table, row, &pk).map_err(unfit)?;
                let d = hasher
                    .digest(&hash, table, &identity, &values, &c.server_version)
                    .map_err(unfit)?;
                if d != row_checksum.0 {
                    return Err(integrity("a row checksum does not match its row"));
                }
                Some((values, c.server_version, d))
            }
        };
        out.push(Change {
            scope: c.scope_id,
            table,
            pk_text: pk.to_wire_text(),
            pk,
            upsert,
        });
    }
    Ok(out)
}

impl Storage {
    /// Applies one pull response body for a client whose assigned scopes (after the page's
    /// scope updates) are `assigned`. The body is consumed (its rows are moved, not copied).
    pub fn apply_pull(
        &mut self,
        manifest: &Manifest,
        page: Json,
        assigned: &BTreeSet<String>,
    ) -> Result<Applied, StorageError> {
        // The one parser of the wire (terminal rules 1 and 2 and every checksum object's
        // shape are part of it).
        let page = PullResponse::from_json_owned(page).map_err(|e| integrity(e.message))?;
        self.apply_pull_page(manifest, page, assigned)
    }

    /// [`Storage::apply_pull`] for a page already read by [`PullResponse`]'s parser: its rows
    /// ([`Storage::apply_pull_rows`]), then its terminal digests
    /// ([`Storage::verify_terminal`]).
    pub fn apply_pull_page(
        &mut self,
        manifest: &Manifest,
        page: PullResponse,
        assigned: &BTreeSet<String>,
    ) -> Result<Applied, StorageError> {
        let (mut applied, terminal) = self.apply_pull_rows(manifest, page, assigned)?;
        self.verify_terminal(manifest, terminal, &mut applied)?;
        Ok(applied)
    }

    /// Applies a page's rows, scope updates, waiting cursors and listed rebuilds in one
    /// transaction, after verifying every row (nothing is written if one fails). Its rows are
    /// visible once this returns; no cursor is installed: that is [`Storage::verify_terminal`]'s
    /// step, which the caller runs next with the returned [`Terminal`] (spec 001: "after
    /// atomically applying a terminal page, clients recompute each applicable local scope
    /// digest"). Stopping between the two leaves what a non-terminal page leaves: rows applied,
    /// cursors waiting, the next pull starting from the installed cursors.
    pub fn apply_pull_rows(
        &mut self,
        manifest: &Manifest,
        page: PullResponse,
        assigned: &BTreeSet<String>,
    ) -> Result<(Applied, Terminal), StorageError> {
        // Verify everything before writing anything.
        let changes = verify(manifest, page.changes)?;
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
        let removed = &page.scope_updates.removed;
        if removed.iter().any(|s| assigned.contains(s)) {
            return Err(integrity("a removed scope is still assigned"));
        }
        let cursors = &page.scope_cursor_updates;
        let listed_rebuild: BTreeSet<&String> = page.rebuild_scopes.iter().collect();
        let applied = self.with_index_tx(|tx, ix| {
            // The index is kept through the page, so that the terminal digests need no
            // query (built from the tables on first need).
            index_load::ensure(ix, tx, manifest)?;
            let pending = pending_keys(tx)?;
            // Scopes no longer assigned: their provenance goes, and rows nothing else
            // justifies.
            for scope in removed {
                drop_scope(tx, ix, manifest, scope, &pending)?;
            }
            for c in &changes {
                match &c.upsert {
                    Some((values, version, digest)) => {
                        if has_intent(&pending, c.table, &c.pk_text) {
                            let row = Json::Object(
                                c.table
                                    .fields
                                    .iter()
                                    .zip(values)
                                    .map(|(f, v)| (f.field_id.clone(), v.to_wire()))
                                    .collect(),
                            );
                            set_shadow(
                                tx,
                                &c.table.table_id,
                                &c.pk_text,
                                Some(&synchro_protocol::jcs::to_output_string(&row)),
                            )?;
                        } else {
                            write_row_bound(tx, c.table, values)?;
                        }
                        record_server_row(tx, ix, c.table, &c.pk, &c.pk_text, version, digest)?;
                        add_edge(tx, ix, c.table, &c.pk, &c.scope)?;
                    }
                    None => {
                        if remove_edge(tx, ix, c.table, &c.pk, &c.scope)? == 0 {
                            forget_row(tx, ix, c.table, &c.pk, &pending)?;
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
            Ok(out)
        })?;
        let cursors = page.scope_cursor_updates;
        Ok((applied, Terminal { checksums, cursors }))
    }

    /// A terminal page's second step, after [`Storage::apply_pull_rows`]: every scope of its
    /// checksum map is recomputed from the local rows (the scope index); a scope that matches
    /// gets its cursor installed, one that does not is marked for rebuild. One transaction;
    /// nothing to do for a page that is not terminal.
    pub fn verify_terminal(
        &mut self,
        manifest: &Manifest,
        terminal: Terminal,
        applied: &mut Applied,
    ) -> Result<(), StorageError> {
        if terminal.checksums.is_empty() {
            return Ok(());
        }
        let Terminal { checksums, cursors } = terminal;
        let (verified, rebuild) = self.with_index_tx(|tx, ix| {
            let (mut verified, mut rebuild) = (BTreeSet::new(), BTreeSet::new());
            for (scope, expected) in checksums {
                // The scope's local rows (every provenance edge of the scope, with the
                // verified digest stored when its row was applied), from the index.
                let local = index_load::scope_digest(ix, tx, manifest, &scope)?;
                if local == expected {
                    install_verified(tx, &scope, cursors.get(&scope).map(String::as_str))?;
                    verified.insert(scope);
                } else {
                    mark_rebuild(tx, &scope)?;
                    rebuild.insert(scope);
                }
            }
            Ok((verified, rebuild))
        })?;
        applied.verified.extend(verified);
        applied.rebuild.extend(rebuild);
        Ok(())
    }
}
