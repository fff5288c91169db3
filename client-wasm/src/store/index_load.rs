//! The SQL side of the scope index (`index`, which holds none): the connection's stamp the
//! index is current at, loading the index from the provenance tables and the stored row
//! digests when it is first needed, and a scope's digest from the tables alone (what the
//! index is checked against).

use rusqlite::Connection;
use synchro_protocol::digest::RowIdentity;
use synchro_protocol::manifest::Manifest;

use super::index::{Loading, ScopeIndex, Stamp};
use super::rows::stored_digests;
use super::scopes::{provenance, scope_keys};
use super::values::from_sql;
use crate::error::StorageError;

/// The connection's stamp: its total row changes, `PRAGMA data_version` and
/// `PRAGMA schema_version`.
pub(super) fn stamp(conn: &Connection) -> rusqlite::Result<Stamp> {
    Ok(Stamp {
        changes: conn.total_changes(),
        data_version: conn.query_row("PRAGMA data_version", [], |r| r.get(0))?,
        schema_version: conn.query_row("PRAGMA schema_version", [], |r| r.get(0))?,
    })
}

/// Loads the index from `conn` (inside the caller's transaction) unless it is there under
/// `manifest`.
pub(super) fn ensure(
    ix: &mut ScopeIndex,
    conn: &Connection,
    manifest: &Manifest,
) -> Result<(), StorageError> {
    ix.for_manifest(manifest);
    if !ix.is_built() {
        ix.install(load(conn, manifest)?);
    }
    Ok(())
}

/// The digest of `scope` from the index, loaded first if needed.
pub(super) fn scope_digest(
    ix: &mut ScopeIndex,
    conn: &Connection,
    manifest: &Manifest,
    scope: &str,
) -> Result<[u8; 32], StorageError> {
    ensure(ix, conn, manifest)?;
    ix.scope_digest(scope)
}

/// Reads every provenance edge and the stored digest of every row an edge names.
fn load(conn: &Connection, manifest: &Manifest) -> Result<Loading, StorageError> {
    let mut loading = Loading::new(manifest, !conn.is_autocommit());
    for table in &manifest.tables {
        let stored = stored_digests(conn, table)?;
        let mut q = conn.prepare(&format!(
            "SELECT \"scope_id\", \"pk\" FROM {}",
            provenance(table)
        ))?;
        let mut rows = q.query([])?;
        while let Some(r) = rows.next()? {
            let scope: String = r.get(0)?;
            let pk = from_sql(&table.primary_key().spec, r.get_ref(1)?).ok_or(
                StorageError::Verification("a stored key does not match its type"),
            )?;
            loading.edge(table, &pk, scope, || {
                stored.get(&pk.to_wire_text()).copied()
            })?;
        }
    }
    Ok(loading)
}

/// The digest of `scope` computed from the tables alone, without the index: every
/// provenance edge of the scope with the digest stored for its row, sorted and streamed.
pub(super) fn digest_from_tables(
    conn: &Connection,
    manifest: &Manifest,
    scope: &str,
) -> Result<[u8; 32], StorageError> {
    let mut entries = Vec::new();
    for table in &manifest.tables {
        let digests = stored_digests(conn, table)?;
        for pk in scope_keys(conn, table, scope)? {
            let digest: [u8; 32] =
                digests
                    .get(&pk.to_wire_text())
                    .copied()
                    .ok_or(StorageError::Verification(
                        "a provenance edge without its row",
                    ))?;
            entries.push((
                RowIdentity::new(table, &pk)
                    .map_err(|_| StorageError::Verification("a key cannot form a row identity"))?,
                digest,
            ));
        }
    }
    synchro_protocol::digest::scope_digest(&manifest.schema_hash(), scope, &mut entries, false)
        .map(|d| d.digest)
        .map_err(|_| StorageError::Verification("the scope digest cannot be computed"))
}
