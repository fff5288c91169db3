//! `POST /sync/pull` (spec 001 terminal rules, spec 003 cursors, limits and reconciliation).
//!
//! Order: body, protocol (426), bearer (401), members and `limit` 1..=1000 (400), exact
//! current schema (422 `schema_mismatch`), client generation (409), every presented cursor
//! (a malformed, forged or misbound one is 400 and nothing is written), then assignment
//! reconciliation and the page. Everything is read in one REPEATABLE READ snapshot, so the
//! rows, the new cursor positions and the terminal scope digests describe one boundary.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::token::{CursorStatus, Principal, ScopeCursor, ScopeStreamState};

use synchro_protocol::wire::{Change, ChangeOp, PullRequest, PullResponse, ScopeUpdates};

use super::rows::{key_identity, now_datetime};
use super::{gates, still_current, ApiError, AppState, Gates, Integrity};

/// Runs a pull for an authenticated user. Returns the 200 body or the wire error.
pub(crate) async fn pull(
    state: &AppState,
    user_id: &str,
    req: PullRequest,
) -> Result<PullResponse, ApiError> {
    let db = state.db.get().await?;
    let db = &*db;
    // The assignment is read alongside the gates (both only read); it is used only once
    // the gates and every presented cursor passed.
    let (gated, assigned) = futures_util::join!(
        gates(
            state,
            user_id,
            &req.client_id,
            req.client_generation,
            &req.schema,
        ),
        super::assigned_scopes(state, user_id),
    );
    let Gates {
        lineage,
        stored_assigned,
        stream: scope_state,
    } = gated?;
    let current = lineage
        .current()
        .expect("gates checked the current manifest");
    let who = Principal {
        user_id: user_id.to_owned(),
        client_id: req.client_id.clone(),
        client_generation: req.client_generation,
    };
    // Every presented cursor first: a bad one fails the request before anything is written.
    // Retention (floor and retention generation) is checked again inside the snapshot below,
    // so a compaction that commits meanwhile can only turn a cursor stale, never skip effects.
    let mut opened: BTreeMap<String, ScopeCursor> = BTreeMap::new();
    let mut rebuild: BTreeSet<String> = BTreeSet::new();
    let mut null_cursors: BTreeSet<String> = BTreeSet::new();
    for (scope, token) in &req.scope_cursors {
        let Some(token) = token else {
            null_cursors.insert(scope.clone());
            continue;
        };
        let cursor = ScopeCursor::open(&state.cursor_keys, token)
            .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?;
        // Per-scope bindings (retention, floor, membership) are checked in the snapshot.
        let unbounded = ScopeStreamState {
            retention_generation: cursor.retention_generation,
            membership_generation: cursor.membership_generation,
            resume_floor: 0,
            ..scope_state.clone()
        };
        match cursor
            .check(scope, &who, &unbounded)
            .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?
        {
            CursorStatus::Resumable(_) => {
                opened.insert(scope.clone(), cursor);
            }
            CursorStatus::Stale(_) => {
                rebuild.insert(scope.clone());
            }
        }
    }
    // Reconcile the assignment (writes happen only after validation passed).
    let assigned = assigned?;
    let previous = stored_assigned;
    let row = db
        .query_one(
            "SELECT client_generation, scope_set_version FROM synchro.synchro_client_connect($1, $2, false, $3, $4, $5)",
            &[
                &user_id,
                &req.client_id,
                &assigned.iter().cloned().collect::<Vec<_>>(),
                &(current.schema_version as i64),
                &current.schema_hash_hex(),
            ],
        )
        .await
        ?;
    let scope_set_version: i64 = row.get(1);
    opened.retain(|s, _| assigned.contains(s));
    null_cursors.retain(|s| assigned.contains(s));
    rebuild.retain(|s| assigned.contains(s));

    // One read-only REPEATABLE READ snapshot for retention, effects, rows and digests.
    let mut snapshot_db = state.snapshot_db.lock().await?;
    let snap = snapshot_db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // (Both go out together, one round trip.)
    let assigned_list = assigned.iter().cloned().collect::<Vec<_>>();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&assigned_list];
    let (retention, current_still) = futures_util::join!(
        snap.query(
            "SELECT scope_id, retention_generation, resume_floor, membership_generation
               FROM synchro.synchro_scope_retention($1)",
            &params,
        ),
        still_current(&snap, current, &req.schema),
    );
    current_still?;
    let retention = retention?;
    let mut positions: BTreeMap<String, u64> = BTreeMap::new();
    let mut acknowledged: BTreeMap<String, u64> = BTreeMap::new();
    let mut generations: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in &retention {
        let scope: String = r.get(0);
        let scope_state = ScopeStreamState {
            retention_generation: r.get::<_, i64>(1) as u64,
            resume_floor: r.get::<_, i64>(2) as u64,
            membership_generation: r.get::<_, i64>(3) as u64,
            ..scope_state.clone()
        };
        generations.insert(
            scope.clone(),
            (
                scope_state.membership_generation,
                scope_state.retention_generation,
            ),
        );
        if let Some(cursor) = opened.get(&scope) {
            match cursor.check(&scope, &who, &scope_state) {
                Ok(CursorStatus::Resumable(p)) => {
                    positions.insert(scope.clone(), p);
                    acknowledged.insert(scope, p);
                }
                _ => {
                    rebuild.insert(scope);
                }
            }
        } else if null_cursors.contains(&scope) && scope_state.resume_floor == 0 {
            // Nothing of this scope was ever compacted: replaying its whole effect log
            // yields its complete current state, like a rebuild.
            positions.insert(scope, 0);
        } else if !rebuild.contains(&scope) {
            rebuild.insert(scope);
        }
    }
    let rows = snap
        .query(
            "SELECT * FROM synchro.synchro_pull_page($1, $2, $3)",
            &[
                &positions.keys().cloned().collect::<Vec<_>>(),
                &positions.values().map(|p| *p as i64).collect::<Vec<_>>(),
                &((req.limit + 1) as i32),
            ],
        )
        .await?;
    let has_more = rows.len() as u64 > req.limit;
    let schema_hash = current.schema_hash();
    // The page's row digests, kept for the terminal digest that follows (a scope index
    // brought forward, or built again, looks them up by row version instead of digesting).
    let mut digested = Vec::new();
    let mut changes = Vec::new();
    let mut high: BTreeMap<String, u64> = positions.clone();
    for r in rows.iter().take(req.limit as usize) {
        let (position, scope, table_id, pk, kind, version, row_json): (
            i64,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
        );
        high.insert(scope.clone(), position as u64);
        let pk_json = Json::parse(&pk).map_err(|_| ApiError::integrity(Integrity::StoredRow))?;
        let op = match (kind.as_str(), row_json) {
            ("upsert", Some(text)) => {
                let row =
                    Json::parse(&text).map_err(|_| ApiError::integrity(Integrity::StoredRow))?;
                let d = row_digest(current, &table_id, &pk_json, &row, &version)
                    .map_err(|_| ApiError::integrity(Integrity::Digest))?;
                digested.push((
                    crate::digest_cache::key(&schema_hash, &table_id, &pk, &version),
                    d.digest,
                ));
                ChangeOp::Upsert {
                    row,
                    row_checksum: Checksum(d.digest),
                }
            }
            _ => ChangeOp::Delete,
        };
        changes.push(Change {
            scope_id: scope,
            table_id,
            pk: pk_json,
            server_version: version,
            op,
        });
    }
    crate::digest_cache::put_many(digested);
    if !has_more {
        // Every resumable scope is current through the snapshot's high-watermark.
        let hw: i64 = snap
            .query_one(
                "SELECT effect_position FROM synchro.synchro_pull_watermark()",
                &[],
            )
            .await?
            .get(0);
        for p in high.values_mut() {
            *p = (*p).max(hw as u64);
        }
    }
    let issued_at = now_datetime();
    let scope_cursor_updates: BTreeMap<String, String> = high
        .iter()
        .map(|(scope, position)| {
            let c = ScopeCursor {
                scope_id: scope.clone(),
                stream_generation: scope_state.stream_generation,
                membership_generation: generations[scope].0,
                retention_generation: generations[scope].1,
                position: *position,
                schema_hash: scope_state.schema_hash,
                principal: who.clone(),
                issued_at: issued_at.clone(),
            };
            (scope.clone(), c.sign(&state.cursor_keys))
        })
        .collect();
    let checksums = if has_more {
        None
    } else {
        let mut map = BTreeMap::new();
        for scope in &assigned {
            map.insert(scope.clone(), scope_checksum(&snap, current, scope).await?);
        }
        Some(map)
    };
    let body = PullResponse {
        scope_set_version: scope_set_version as u64,
        scope_updates: ScopeUpdates {
            added: assigned.difference(&previous).cloned().collect(),
            removed: previous.difference(&assigned).cloned().collect(),
        },
        changes,
        has_more,
        scope_cursor_updates,
        rebuild_scopes: rebuild.iter().cloned().collect(),
        checksums,
    };
    snap.commit().await?;
    drop(snapshot_db);
    // The presented positions are acknowledged: they pin this scope's history.
    if !acknowledged.is_empty() {
        db.execute(
            "SELECT synchro.synchro_record_acks($1, $2, $3, $4, $5)",
            &[
                &user_id,
                &req.client_id,
                &(req.client_generation as i64),
                &acknowledged.keys().cloned().collect::<Vec<_>>(),
                &acknowledged.values().map(|p| *p as i64).collect::<Vec<_>>(),
            ],
        )
        .await?;
    }
    tracing::info!(
        status = 200,
        changes = rows.len().min(req.limit as usize),
        has_more,
        "pull"
    );
    Ok(body)
}

/// The scope digest of a scope's current membership in the current projection: the cached
/// one while the scope's fingerprint is unchanged; otherwise with row digests from
/// [`crate::digest_cache`], reading and digesting in full (in the same snapshot) only rows
/// not digested before.
pub(crate) async fn scope_checksum(
    db: &impl tokio_postgres::GenericClient,
    manifest: &synchro_protocol::manifest::Manifest,
    scope: &str,
) -> Result<Checksum, ApiError> {
    let schema_hash = manifest.schema_hash();
    // An idle scope's digest is reused: O(1) instead of O(scope) per terminal page.
    let fingerprint: i64 = db
        .query_one("SELECT synchro.synchro_scope_fingerprint($1)", &[&scope])
        .await?
        .get(0);
    if let Some(d) = crate::digest_cache::scope_get(&schema_hash, scope, fingerprint) {
        return Ok(Checksum(d));
    }
    // A scope index at an earlier fingerprint: only the rows named since then are read.
    if let Some(mut index) = crate::digest_cache::index_take(&schema_hash, scope) {
        if index.fingerprint > fingerprint {
            // (Built from a later snapshot than this one.)
            crate::digest_cache::index_put(&schema_hash, scope, index);
        } else if advance_index(db, manifest, scope, &mut index, fingerprint).await? {
            let d = index
                .digest(&schema_hash, scope)
                .map_err(|_| ApiError::integrity(Integrity::Digest))?;
            crate::digest_cache::scope_put(&schema_hash, scope, fingerprint, d);
            crate::digest_cache::index_put(&schema_hash, scope, index);
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
    let cached = crate::digest_cache::get_many(&cache_keys);
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
        crate::digest_cache::put_many(fresh);
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut index = crate::digest_cache::ScopeIndex {
        fingerprint,
        // (Refuses a duplicate row identity.)
        rows: synchro_protocol::scope_entries::ScopeEntries::from_sorted(
            entries
                .iter()
                .map(|(identity, digest)| (identity.as_bytes(), *digest)),
        )
        .map_err(|_| ApiError::integrity(Integrity::Digest))?,
    };
    crate::digest_cache::INDEX_BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = index
        .digest(&schema_hash, scope)
        .map_err(|_| ApiError::integrity(Integrity::Digest))?;
    crate::digest_cache::scope_put(&schema_hash, scope, fingerprint, d);
    crate::digest_cache::index_put(&schema_hash, scope, index);
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
    db: &impl tokio_postgres::GenericClient,
    manifest: &synchro_protocol::manifest::Manifest,
    scope: &str,
    index: &mut crate::digest_cache::ScopeIndex,
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
    crate::digest_cache::INDEX_ADVANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(true)
}

/// The row identity and digest of a row whose columns `first..first + 4` are
/// `(table_id, pk, row_json, server_version)`.
fn row_entry(
    manifest: &synchro_protocol::manifest::Manifest,
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
