//! `POST /sync/pull` (spec 001 terminal rules, spec 003 cursors, limits and reconciliation).
//!
//! Order: body, protocol (426), bearer (401), members and `limit` 1..=1000 (400), exact
//! current schema (422 `schema_mismatch`), client generation (409), every presented cursor
//! (a malformed, forged or misbound one is 400 and nothing is written), then assignment
//! reconciliation and the page. Everything is read in one REPEATABLE READ snapshot, so the
//! rows, the new cursor positions and the terminal scope digests describe one boundary.
//!
//! The phases, in order: `open_cursors`, `reconcile`, then in the snapshot `scope_streams`,
//! `read_page`, `cursor_updates` and the terminal checksums (`api/checksums.rs`); after it,
//! `acknowledge`.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::row_digest;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::token::{CursorStatus, Principal, ScopeCursor, ScopeStreamState};
use synchro_protocol::wire::{Change, ChangeOp, PullRequest, PullResponse, ScopeUpdates};

use super::checksums::scope_checksum;
use super::rows::now_datetime;
use super::{still_current, ApiError, AppState, Gates, Integrity};

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
    let (gated, assigned) = super::gates_and_assignment(
        state,
        user_id,
        &req.client_id,
        req.client_generation,
        &req.schema,
    )
    .await;
    let Gates {
        lineage,
        stored_assigned: previous,
        stream,
    } = gated?;
    let current = lineage
        .current()
        .expect("gates checked the current manifest");
    let bound = Bindings {
        who: Principal {
            user_id: user_id.to_owned(),
            client_id: req.client_id.clone(),
            client_generation: req.client_generation,
        },
        stream,
    };
    let mut presented = open_cursors(state, &req, &bound)?;
    // Writes happen only after validation passed.
    let assigned = assigned?;
    let scope_set_version = reconcile(
        db,
        user_id,
        &req.client_id,
        &assigned,
        current,
        state.config.max_clients_per_user,
    )
    .await?;
    presented.keep_assigned(&assigned);

    // One read-only REPEATABLE READ snapshot for retention, effects, rows and digests.
    let mut snapshot_db = state.snapshot_db.lock().await?;
    let snap = snapshot_db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let streams = scope_streams(
        state,
        &snap,
        current,
        &req.schema,
        &assigned,
        &bound,
        &mut presented,
    )
    .await?;
    let page = read_page(state, &snap, current, &streams.positions, req.limit).await?;
    let mut high = page.high;
    if !page.has_more {
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
    let scope_cursor_updates = cursor_updates(state, &high, &streams.generations, &bound);
    let checksums = if page.has_more {
        None
    } else {
        let mut map = BTreeMap::new();
        for scope in &assigned {
            let checksum = scope_checksum(&state.caches.digests, &snap, current, scope).await?;
            map.insert(scope.clone(), checksum);
        }
        Some(map)
    };
    let changes = page.changes.len();
    let body = PullResponse {
        scope_set_version,
        scope_updates: ScopeUpdates {
            added: assigned.difference(&previous).cloned().collect(),
            removed: previous.difference(&assigned).cloned().collect(),
        },
        changes: page.changes,
        has_more: page.has_more,
        scope_cursor_updates,
        rebuild_scopes: presented.rebuild.iter().cloned().collect(),
        checksums,
    };
    snap.commit().await?;
    drop(snapshot_db);
    acknowledge(db, user_id, &req, &streams.acknowledged).await?;
    tracing::info!(status = 200, changes, has_more = body.has_more, "pull");
    Ok(body)
}

/// What every cursor of the request is bound to: its principal and the stream's state.
struct Bindings {
    who: Principal,
    stream: ScopeStreamState,
}

/// The presented cursors, sorted by what the request asks of each scope.
struct Presented {
    /// Cursors that verified and may resume (their retention is checked in the snapshot).
    opened: BTreeMap<String, ScopeCursor>,
    /// Scopes presented with a null cursor (never synced).
    null_cursors: BTreeSet<String>,
    /// Scopes the client must rebuild.
    rebuild: BTreeSet<String>,
}

impl Presented {
    /// Forgets every scope no longer assigned.
    fn keep_assigned(&mut self, assigned: &BTreeSet<String>) {
        self.opened.retain(|s, _| assigned.contains(s));
        self.null_cursors.retain(|s| assigned.contains(s));
        self.rebuild.retain(|s| assigned.contains(s));
    }
}

/// Opens every presented cursor first: a bad one fails the request before anything is
/// written. Retention (floor and retention generation) is checked again inside the
/// snapshot ([`scope_streams`]), so a compaction that commits meanwhile can only turn a
/// cursor stale, never skip effects.
fn open_cursors(
    state: &AppState,
    req: &PullRequest,
    bound: &Bindings,
) -> Result<Presented, ApiError> {
    let mut presented = Presented {
        opened: BTreeMap::new(),
        null_cursors: BTreeSet::new(),
        rebuild: BTreeSet::new(),
    };
    for (scope, token) in &req.scope_cursors {
        let Some(token) = token else {
            presented.null_cursors.insert(scope.clone());
            continue;
        };
        let cursor = ScopeCursor::open(&state.cursor_keys, token)
            .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?;
        // Per-scope bindings (retention, floor, membership) are checked in the snapshot.
        let unbounded = ScopeStreamState {
            retention_generation: cursor.retention_generation,
            membership_generation: cursor.membership_generation,
            resume_floor: 0,
            ..bound.stream.clone()
        };
        match cursor
            .check(scope, &bound.who, &unbounded)
            .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?
        {
            CursorStatus::Resumable(_) => {
                presented.opened.insert(scope.clone(), cursor);
            }
            CursorStatus::Stale(_) => {
                presented.rebuild.insert(scope.clone());
            }
        }
    }
    Ok(presented)
}

/// Records the client's assignment (its scope set version moves when the set changed);
/// returns the scope set version.
async fn reconcile(
    db: &tokio_postgres::Client,
    user_id: &str,
    client_id: &str,
    assigned: &BTreeSet<String>,
    current: &Manifest,
    max_clients: i32,
) -> Result<u64, ApiError> {
    let row = db
        .query_one(
            "SELECT client_generation, scope_set_version FROM synchro.synchro_client_connect($1, $2, false, $3, $4, $5, $6)",
            &[
                &user_id,
                &client_id,
                &assigned.iter().cloned().collect::<Vec<_>>(),
                &(current.schema_version as i64),
                &current.schema_hash_hex(),
                &max_clients,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(1) as u64)
}

/// Where each assigned scope's stream stands in the snapshot.
struct ScopeStreams {
    /// The position each scope is read from (resumable cursors, and never-compacted scopes
    /// presented without one).
    positions: BTreeMap<String, u64>,
    /// The presented positions that verified: acknowledged after the snapshot.
    acknowledged: BTreeMap<String, u64>,
    /// Each scope's (membership generation, retention generation), for its new cursor.
    generations: BTreeMap<String, (u64, u64)>,
}

/// Checks, in the snapshot, that the gated manifest is still current and each presented
/// cursor against its scope's retention; a cursor below it, and a scope presented with no
/// usable cursor, is added to `presented.rebuild`.
async fn scope_streams(
    state: &AppState,
    snap: &tokio_postgres::Transaction<'_>,
    current: &Manifest,
    schema: &Json,
    assigned: &BTreeSet<String>,
    bound: &Bindings,
    presented: &mut Presented,
) -> Result<ScopeStreams, ApiError> {
    // (Both go out together, one round trip.)
    let assigned_list = assigned.iter().cloned().collect::<Vec<_>>();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&assigned_list];
    let (retention, current_still) = futures_util::join!(
        snap.query(
            "SELECT scope_id, retention_generation, resume_floor, membership_generation
               FROM synchro.synchro_scope_retention($1)",
            &params,
        ),
        still_current(state, snap, current, schema),
    );
    current_still?;
    let mut streams = ScopeStreams {
        positions: BTreeMap::new(),
        acknowledged: BTreeMap::new(),
        generations: BTreeMap::new(),
    };
    for r in &retention? {
        let scope: String = r.get(0);
        let scope_state = ScopeStreamState {
            retention_generation: r.get::<_, i64>(1) as u64,
            resume_floor: r.get::<_, i64>(2) as u64,
            membership_generation: r.get::<_, i64>(3) as u64,
            ..bound.stream.clone()
        };
        streams.generations.insert(
            scope.clone(),
            (
                scope_state.membership_generation,
                scope_state.retention_generation,
            ),
        );
        if let Some(cursor) = presented.opened.get(&scope) {
            match cursor.check(&scope, &bound.who, &scope_state) {
                Ok(CursorStatus::Resumable(p)) => {
                    streams.positions.insert(scope.clone(), p);
                    streams.acknowledged.insert(scope, p);
                }
                _ => {
                    presented.rebuild.insert(scope);
                }
            }
        } else if presented.null_cursors.contains(&scope) && scope_state.resume_floor == 0 {
            // Nothing of this scope was ever compacted: replaying its whole effect log
            // yields its complete current state, like a rebuild.
            streams.positions.insert(scope, 0);
        } else if !presented.rebuild.contains(&scope) {
            presented.rebuild.insert(scope);
        }
    }
    Ok(streams)
}

/// One page of changes.
struct Page {
    changes: Vec<Change>,
    /// More changes wait after this page.
    has_more: bool,
    /// Each read scope's position after the page.
    high: BTreeMap<String, u64>,
}

/// Reads up to `limit` changes after `positions` (fewer when their rows pass
/// `Config::max_page_bytes`), each upsert with its row checksum (the
/// row digests are kept in the cache for the terminal digest that follows: a scope index
/// brought forward, or built again, looks them up by row version instead of digesting).
async fn read_page(
    state: &AppState,
    snap: &tokio_postgres::Transaction<'_>,
    current: &Manifest,
    positions: &BTreeMap<String, u64>,
    limit: u64,
) -> Result<Page, ApiError> {
    let scopes: Vec<String> = positions.keys().cloned().collect();
    let after: Vec<i64> = positions.values().map(|p| *p as i64).collect();
    let fetch = (limit + 1) as i32;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&scopes, &after, &fetch];
    // Rows are taken as they arrive, up to `limit` of them and, past the first, until the
    // page's rows reach `max_page_bytes`: a page of large rows is cut short (has_more) and
    // the rest of the answer is dropped unread, so memory follows the bound, not the rows.
    let stream = snap
        .query_raw(
            "SELECT * FROM synchro.synchro_pull_page($1, $2, $3)",
            params,
        )
        .await?;
    futures_util::pin_mut!(stream);
    let mut rows = Vec::new();
    let mut bytes = 0usize;
    let mut has_more = false;
    while let Some(r) = futures_util::TryStreamExt::try_next(&mut stream).await? {
        if rows.len() as u64 == limit || (!rows.is_empty() && bytes >= state.config.max_page_bytes)
        {
            has_more = true;
            break;
        }
        bytes += r
            .get::<_, Option<&str>>(6)
            .map_or(0, str::len)
            .saturating_add(r.get::<_, &str>(3).len());
        rows.push(r);
    }
    let schema_hash = current.schema_hash();
    let mut digested = Vec::new();
    let mut page = Page {
        changes: Vec::new(),
        has_more,
        high: positions.clone(),
    };
    for r in &rows {
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
        page.high.insert(scope.clone(), position as u64);
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
        page.changes.push(Change {
            scope_id: scope,
            table_id,
            pk: pk_json,
            server_version: version,
            op,
        });
    }
    state.caches.digests.put_many(digested);
    Ok(page)
}

/// A signed cursor for each read scope at its position after the page.
fn cursor_updates(
    state: &AppState,
    high: &BTreeMap<String, u64>,
    generations: &BTreeMap<String, (u64, u64)>,
    bound: &Bindings,
) -> BTreeMap<String, String> {
    let issued_at = now_datetime();
    high.iter()
        .map(|(scope, position)| {
            let c = ScopeCursor {
                scope_id: scope.clone(),
                stream_generation: bound.stream.stream_generation,
                membership_generation: generations[scope].0,
                retention_generation: generations[scope].1,
                position: *position,
                schema_hash: bound.stream.schema_hash,
                principal: bound.who.clone(),
                issued_at: issued_at.clone(),
            };
            (scope.clone(), c.sign(&state.cursor_keys))
        })
        .collect()
}

/// Acknowledges the presented positions: they pin each scope's history against compaction.
async fn acknowledge(
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &PullRequest,
    acknowledged: &BTreeMap<String, u64>,
) -> Result<(), ApiError> {
    if acknowledged.is_empty() {
        return Ok(());
    }
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
    Ok(())
}
