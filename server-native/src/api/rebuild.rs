//! `POST /sync/rebuild` (spec 001 terminal rules 5 and 6, spec 003 "Error and Action
//! Dispatch"): a snapshot-bound session that pages one scope's rows in canonical row-identity
//! order, then ends with `final_scope_cursor` and the scope `checksum` of exactly that
//! snapshot.
//!
//! The first request stores the scope's rows as of one REPEATABLE READ snapshot (with the
//! stream watermark of that snapshot) in a session; continuation tokens (HMAC, purpose
//! `rebuild`) name the session and the next ordinal. A session invalidated by a schema,
//! stream, membership or client-generation change, or by the scope's removal, answers
//! 409 `rebuild_restart_required`. Rebuild does not reconcile the assignment: it checks the
//! stored set (a new request for an unassigned scope is 400).
//!
//! Sessions are bounded per client (migration 25): a new rebuild of a scope replaces the
//! client's earlier session of it, and a client may have at most
//! `Config::max_rebuild_sessions_per_client` sessions in progress; over that, 503
//! `temporary_unavailable` with reason `too_many_rebuild_sessions`, checked before the
//! snapshot is read. Serving the final page completes a session: its rows are dropped and a
//! later continuation of it restarts.

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, sort_by_identity, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::token::{self, Principal, Purpose, ScopeCursor};
use synchro_protocol::value::TypedValue;

use synchro_protocol::wire::{RebuildEnd, RebuildRecord, RebuildRequest, RebuildResponse};

use super::{gates, ApiError, AppState, Gates};

fn restart(scope: &str) -> ApiError {
    ApiError::rebuild_restart(scope)
}

/// Handles one rebuild request for an authenticated user; returns the 200 body.
pub(crate) async fn rebuild(
    state: &AppState,
    user_id: &str,
    req: RebuildRequest,
) -> Result<RebuildResponse, ApiError> {
    let Gates {
        lineage,
        stored_assigned,
        stream,
    } = gates(
        state,
        user_id,
        &req.client_id,
        req.client_generation,
        &req.schema,
    )
    .await?;
    let current = lineage
        .current()
        .expect("gates checked the current manifest");
    let schema_hash = current.schema_hash_hex();
    let db = &state.db;
    // The scope's own membership and retention generations bind the session and its cursor.
    let scope_generations = db
        .query_one(
            "SELECT membership_generation, retention_generation FROM synchro.synchro_scope_retention(ARRAY[$1])",
            &[&req.scope_id],
        )
        .await
        ?;
    let stream = synchro_protocol::token::ScopeStreamState {
        membership_generation: scope_generations.get::<_, i64>(0) as u64,
        retention_generation: scope_generations.get::<_, i64>(1) as u64,
        ..stream
    };
    let (session_id, from) = match &req.continuation {
        None => {
            if !stored_assigned.contains(&req.scope_id) {
                return Err(ApiError::invalid_request(
                    "the scope is not assigned to this client",
                ));
            }
            // Refused before the snapshot is read; start_session checks again atomically.
            let in_progress: i64 = db
                .query_one(
                    "SELECT synchro.synchro_rebuild_sessions_in_progress($1, $2, $3, $4)",
                    &[
                        &user_id,
                        &req.client_id,
                        &(req.client_generation as i64),
                        &req.scope_id,
                    ],
                )
                .await?
                .get(0);
            if in_progress >= i64::from(state.config.max_rebuild_sessions_per_client) {
                return Err(too_many_sessions(state));
            }
            (
                start_session(state, user_id, &req, &stream, current).await?,
                0,
            )
        }
        Some(t) => {
            let payload = token::open(Purpose::RebuildContinuation, &state.cursor_keys, t)
                .map_err(|_| ApiError::invalid_request("the continuation token is invalid"))?;
            let field = |n: &str| payload.get(n).and_then(Json::as_str).map(str::to_owned);
            let (Some(session), Some(scope), Some(user), Some(client), Some(next)) = (
                field("session_id"),
                field("scope_id"),
                field("user_id"),
                field("client_id"),
                field("next_ordinal").and_then(|n| n.parse::<i32>().ok()),
            ) else {
                return Err(ApiError::invalid_request(
                    "the continuation token is invalid",
                ));
            };
            if scope != req.scope_id || user != user_id || client != req.client_id {
                return Err(ApiError::invalid_request(
                    "the continuation token is invalid",
                ));
            }
            if !stored_assigned.contains(&req.scope_id) {
                return Err(restart(&req.scope_id));
            }
            (session, next)
        }
    };
    let s = db
        .query_opt(
            "SELECT * FROM synchro.synchro_rebuild_session($1)",
            &[&session_id],
        )
        .await?
        .ok_or_else(|| restart(&req.scope_id))?;
    let bound_generation = s.get::<_, i64>(2) as u64;
    if s.get::<_, String>(0) != user_id
        || s.get::<_, String>(1) != req.client_id
        || s.get::<_, String>(3) != req.scope_id
    {
        return Err(ApiError::invalid_request(
            "the continuation token is invalid",
        ));
    }
    if bound_generation != req.client_generation
        || s.get::<_, String>(4) != schema_hash
        || s.get::<_, i64>(5) as u64 != stream.stream_generation
        || s.get::<_, i64>(6) as u64 != stream.membership_generation
    {
        return Err(restart(&req.scope_id));
    }
    let watermark = s.get::<_, i64>(7) as u64;
    let row_count = s.get::<_, i32>(8);
    let rows = db
        .query(
            "SELECT * FROM synchro.synchro_rebuild_page($1, $2, $3)",
            &[&session_id, &from, &((req.limit + 1) as i32)],
        )
        .await?;
    let has_more = rows.len() as u64 > req.limit;
    // A concurrent request completed the session (its rows are gone) after the check above.
    if !has_more && i64::from(from) + rows.len() as i64 != i64::from(row_count) {
        return Err(restart(&req.scope_id));
    }
    let mut records = Vec::new();
    for r in rows.iter().take(req.limit as usize) {
        let (table_id, pk, row_json, version): (String, String, String, String) =
            (r.get(1), r.get(2), r.get(3), r.get(4));
        let pk = Json::parse(&pk).map_err(|_| ApiError::integrity())?;
        let row = Json::parse(&row_json).map_err(|_| ApiError::integrity())?;
        let d = row_digest(current, &table_id, &pk, &row, &version)
            .map_err(|_| ApiError::integrity())?;
        records.push(RebuildRecord {
            table_id,
            pk,
            row,
            server_version: version,
            row_checksum: Checksum(d.digest),
        });
    }
    let who = Principal {
        user_id: user_id.to_owned(),
        client_id: req.client_id.clone(),
        client_generation: req.client_generation,
    };
    let end = if has_more {
        let next = from + req.limit as i32;
        let t = token::sign(
            Purpose::RebuildContinuation,
            &state.cursor_keys,
            vec![
                ("kind".into(), Json::String("rebuild_continuation".into())),
                ("session_id".into(), Json::String(session_id)),
                ("scope_id".into(), Json::String(req.scope_id.clone())),
                ("user_id".into(), Json::String(user_id.to_owned())),
                ("client_id".into(), Json::String(req.client_id.clone())),
                ("next_ordinal".into(), Json::String(next.to_string())),
            ],
        );
        RebuildEnd::More { continuation: t }
    } else {
        // The checksum of exactly this snapshot: every session row.
        let all = db
            .query(
                "SELECT * FROM synchro.synchro_rebuild_page($1, 0, 2147483647)",
                &[&session_id],
            )
            .await?;
        if all.len() as i64 != i64::from(row_count) {
            return Err(restart(&req.scope_id));
        }
        // Session rows: (ordinal, table_id, pk, row_json, server_version).
        let digest = super::pull::digest_columns(current, &req.scope_id, &all, 1)?;
        // Complete: the rows go; the header keeps pinning retention at the watermark.
        db.execute(
            "SELECT synchro.synchro_rebuild_complete($1)",
            &[&session_id],
        )
        .await?;
        let cursor = ScopeCursor {
            scope_id: req.scope_id.clone(),
            stream_generation: stream.stream_generation,
            membership_generation: stream.membership_generation,
            retention_generation: stream.retention_generation,
            position: watermark,
            schema_hash: current.schema_hash(),
            principal: who,
            issued_at: super::pull::now_datetime(),
        };
        RebuildEnd::Final {
            final_scope_cursor: cursor.sign(&state.cursor_keys),
            checksum: digest,
        }
    };
    tracing::info!(status = 200, has_more, "rebuild");
    Ok(RebuildResponse {
        scope_id: req.scope_id,
        records,
        end,
    })
}

/// Stores the scope's rows as of one snapshot, in row-identity order, as a new session.
async fn start_session(
    state: &AppState,
    user_id: &str,
    req: &RebuildRequest,
    stream: &synchro_protocol::token::ScopeStreamState,
    manifest: &synchro_protocol::manifest::Manifest,
) -> Result<String, ApiError> {
    let mut snapshot_db = state.snapshot_db.lock().await;
    let snap = snapshot_db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let watermark: i64 = snap
        .query_one(
            "SELECT effect_position FROM synchro.synchro_pull_watermark()",
            &[],
        )
        .await?
        .get(0);
    let rows = snap
        .query(
            "SELECT table_id, pk, row_json, server_version FROM synchro.synchro_scope_rows($1)",
            &[&req.scope_id],
        )
        .await?;
    snap.commit().await?;
    drop(snapshot_db);
    // Order by canonical row identity.
    let mut keyed = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let table_id: String = r.get(0);
        let pk: String = r.get(1);
        let table = manifest.table(&table_id).ok_or_else(ApiError::integrity)?;
        let key = TypedValue::from_wire_text(&table.primary_key().spec, &pk)
            .map_err(|_| ApiError::integrity())?;
        let mut ordinal = [0u8; 32];
        ordinal[..8].copy_from_slice(&(i as u64).to_be_bytes());
        keyed.push((
            RowIdentity::new(table, &key).map_err(|_| ApiError::integrity())?,
            ordinal,
        ));
    }
    sort_by_identity(&mut keyed);
    let order: Vec<usize> = keyed
        .iter()
        .map(|(_, o)| u64::from_be_bytes(o[..8].try_into().expect("8 bytes")) as usize)
        .collect();
    let column =
        |c: usize| -> Vec<String> { order.iter().map(|&i| rows[i].get::<_, String>(c)).collect() };
    let max_sessions =
        i32::try_from(state.config.max_rebuild_sessions_per_client).unwrap_or(i32::MAX);
    let id: Option<String> = state
        .db
        .query_one(
            "SELECT synchro.synchro_rebuild_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            &[
                &user_id,
                &req.client_id,
                &(req.client_generation as i64),
                &req.scope_id,
                &manifest.schema_hash_hex(),
                &(stream.stream_generation as i64),
                &(stream.membership_generation as i64),
                &watermark,
                &column(0),
                &column(1),
                &column(2),
                &column(3),
                &max_sessions,
            ],
        )
        .await
        ?
        .get(0);
    id.ok_or_else(|| too_many_sessions(state))
}

fn too_many_sessions(state: &AppState) -> ApiError {
    ApiError::overloaded(
        "too_many_rebuild_sessions",
        state.config.retry_after_seconds,
    )
}
