//! Terminal scope checksums (spec 001 "Scope digest"): the digest of a scope's current
//! membership in the current projection, computed inside the caller's snapshot with what
//! the server's [`DigestCache`] remembers (a scope digest while its inputs are unchanged, a
//! scope index brought forward by the rows changed since, row digests by row version).

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;

use super::rows::key_identity;
use super::{ApiError, Integrity};
use crate::digest_cache::{DigestCache, ScopeIndex};

/// The scope digest of a scope's current membership in the current projection: the cached
/// one while the scope's fingerprint is unchanged; otherwise with row digests from
/// `cache`, reading and digesting in full (in the same snapshot) only rows
/// not digested before.
pub(crate) async fn scope_checksum(
    cache: &DigestCache,
    db: &impl tokio_postgres::GenericClient,
    manifest: &Manifest,
    scope: &str,
) -> Result<Checksum, ApiError> {
    let schema_hash = manifest.schema_hash();
    // An idle scope's digest is reused: O(1) instead of O(scope) per terminal page.
    let fingerprint: i64 = db
        .query_one("SELECT synchro.synchro_scope_fingerprint($1)", &[&scope])
        .await?
        .get(0);
    if let Some(d) = cache.scope_get(&schema_hash, scope, fingerprint) {
        return Ok(Checksum(d));
    }
    // A scope index at an earlier fingerprint: only the rows named since then are read.
    if let Some(mut index) = cache.index_take(&schema_hash, scope) {
        if index.fingerprint > fingerprint {
            // (Built from a later snapshot than this one.)
            cache.index_put(&schema_hash, scope, index);
        } else if advance_index(cache, db, manifest, scope, &mut index, fingerprint).await? {
            let d = index
                .digest(&schema_hash, scope)
                .map_err(|_| ApiError::integrity(Integrity::Digest))?;
            cache.scope_put(&schema_hash, scope, fingerprint, d);
            cache.index_put(&schema_hash, scope, index);
            return Ok(Checksum(d));
        }
    }
    let keys = db
        .query(
            "SELECT table_id, pk, server_version FROM synchro.synchro_scope_keys($1)",
            &[&scope],
        )
        .await?;
    let cache_keys: Vec<_> = keys
        .iter()
        .map(|r| crate::digest_cache::key(&schema_hash, r.get(0), r.get(1), r.get(2)))
        .collect();
    let cached = cache.get_many(&cache_keys);
    let mut entries = Vec::with_capacity(keys.len());
    let (mut missing_tables, mut missing_pks) = (Vec::new(), Vec::new());
    for (r, digest) in keys.iter().zip(&cached) {
        let (table_id, pk): (&str, &str) = (r.get(0), r.get(1));
        match digest {
            Some(d) => entries.push((key_identity(manifest, table_id, pk)?.1, *d)),
            None => {
                missing_tables.push(table_id.to_owned());
                missing_pks.push(pk.to_owned());
            }
        }
    }
    if !missing_pks.is_empty() {
        let rows = db
            .query(
                "SELECT table_id, pk, row_json, server_version FROM synchro.synchro_scope_rows_of($1, $2, $3)",
                &[&scope, &missing_tables, &missing_pks],
            )
            .await
            ?;
        if rows.len() != missing_pks.len() {
            return Err(ApiError::integrity(Integrity::Answer));
        }
        let mut fresh = Vec::with_capacity(rows.len());
        for r in &rows {
            let (identity, digest) = row_entry(manifest, r, 0)?;
            fresh.push((
                crate::digest_cache::key(&schema_hash, r.get(0), r.get(1), r.get(3)),
                digest,
            ));
            entries.push((identity, digest));
        }
        cache.put_many(fresh);
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut index = ScopeIndex {
        fingerprint,
        // (Refuses a duplicate row identity.)
        rows: synchro_protocol::scope_entries::ScopeEntries::from_sorted(
            entries
                .iter()
                .map(|(identity, digest)| (identity.as_bytes(), *digest)),
        )
        .map_err(|_| ApiError::integrity(Integrity::Digest))?,
    };
    cache.count_index_build();
    let d = index
        .digest(&schema_hash, scope)
        .map_err(|_| ApiError::integrity(Integrity::Digest))?;
    cache.scope_put(&schema_hash, scope, fingerprint, d);
    cache.index_put(&schema_hash, scope, index);
    Ok(Checksum(d))
}

/// Rows a scope index is brought forward by, whatever its size, before it is built again
/// instead (see [`advance_index`]).
const ADVANCE_MIN: usize = 1024;

/// Brings a scope index forward to `fingerprint` in this snapshot: every row an effect of
/// the scope after the index's fingerprint names is replaced by its current state (in the
/// scope or not). Every change of a scope's rows or membership writes such an effect, so
/// the rows not named are unchanged. False (and the index unusable) when compaction may
/// have removed some of those effects.
async fn advance_index(
    cache: &DigestCache,
    db: &impl tokio_postgres::GenericClient,
    manifest: &Manifest,
    scope: &str,
    index: &mut ScopeIndex,
    fingerprint: i64,
) -> Result<bool, ApiError> {
    let floor: i64 = db
        .query_one("SELECT synchro.synchro_scope_floor($1)", &[&scope])
        .await?
        .get(0);
    if floor > index.fingerprint {
        return Ok(false);
    }
    let touched = db
        .query(
            "SELECT table_id, pk FROM synchro.synchro_scope_touched($1, $2)",
            &[&scope, &index.fingerprint],
        )
        .await?;
    // Most of the scope changed: reading its keys and versions whole (one join, row digests
    // from the cache) is faster than reading each named row by key.
    if touched.len() > index.rows.len() / 4 + ADVANCE_MIN {
        return Ok(false);
    }
    // Every named row leaves the index, and comes back with its digest if it is still in
    // the scope (one merged change per row).
    let (mut tables, mut pks, mut changes) = (Vec::new(), Vec::new(), Vec::new());
    for r in &touched {
        let (table_id, pk): (&str, &str) = (r.get(0), r.get(1));
        changes.push((key_identity(manifest, table_id, pk)?.1, None));
        tables.push(table_id.to_owned());
        pks.push(pk.to_owned());
    }
    if !pks.is_empty() {
        let rows = db
            .query(
                "SELECT table_id, pk, row_json, server_version FROM synchro.synchro_scope_rows_of($1, $2, $3)",
                &[&scope, &tables, &pks],
            )
            .await?;
        for r in &rows {
            let (identity, digest) = row_entry(manifest, r, 0)?;
            changes.push((identity, Some(digest)));
        }
    }
    index.rows.apply(changes);
    index.fingerprint = fingerprint;
    cache.count_index_advance();
    Ok(true)
}

/// The row identity and digest of a row whose columns `first..first + 4` are
/// `(table_id, pk, row_json, server_version)`.
fn row_entry(
    manifest: &Manifest,
    r: &tokio_postgres::Row,
    first: usize,
) -> Result<(RowIdentity, [u8; 32]), ApiError> {
    let (table_id, pk, row_json, version): (&str, &str, &str, &str) = (
        r.get(first),
        r.get(first + 1),
        r.get(first + 2),
        r.get(first + 3),
    );
    let (pk, identity) = key_identity(manifest, table_id, pk)?;
    let row = Json::parse(row_json).map_err(|_| ApiError::integrity(Integrity::StoredRow))?;
    let d = row_digest(manifest, table_id, &pk.to_wire(), &row, version)
        .map_err(|_| ApiError::integrity(Integrity::Digest))?;
    Ok((identity, d.digest))
}
