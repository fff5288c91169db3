//! The checks every endpoint after connect shares, and the assignment they reconcile: the
//! exact current schema (422), the current client generation (409), and the authoritative
//! assigned scope set (defaults, grants, shared scopes and the assignment function's).

use std::collections::BTreeSet;

use synchro_protocol::json::Json;
use synchro_protocol::token::ScopeStreamState;

use super::{ApiError, AppState, Integrity};

/// What every pull and rebuild request is checked against, in the spec's order.
pub(crate) struct Gates {
    /// The manifest history (its current manifest is the request's schema).
    pub lineage: synchro_protocol::lineage::Lineage,
    /// The client's stored assigned scopes.
    pub stored_assigned: BTreeSet<String>,
    /// The stream state cursors and sessions bind (floor 0: nothing is compacted yet).
    pub stream: ScopeStreamState,
}

/// [`gates`] and the user's current [`assigned_scopes`], read at once (both only read);
/// the caller checks the gates first and uses the assignment only after them.
pub(crate) async fn gates_and_assignment(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    client_generation: u64,
    schema: &Json,
) -> (Result<Gates, ApiError>, Result<BTreeSet<String>, ApiError>) {
    futures_util::join!(
        gates(state, user_id, client_id, client_generation, schema),
        assigned_scopes(state, user_id),
    )
}

/// Exact current schema (422), current client generation (409), and capture not blocked
/// (503 `temporary_unavailable`, reason `capture_blocked`).
pub(crate) async fn gates(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    client_generation: u64,
    schema: &Json,
) -> Result<Gates, ApiError> {
    let db = state.db.get().await?;
    let db = &*db;
    // Every read of the gates goes out at once (one round trip); they are checked in order.
    let who: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&user_id, &client_id];
    let (lineage, stored, blocked, stream) = futures_util::join!(
        serving_lineage(state, db),
        db.query_opt(
            "SELECT client_generation, assigned_scopes, expired FROM synchro.synchro_client_state($1, $2)",
            &who,
        ),
        db.query_one("SELECT synchro.synchro_capture_blocked()", &[]),
        db.query_one("SELECT * FROM synchro.synchro_stream_state()", &[]),
    );
    let lineage = lineage?;
    let current = lineage.current().ok_or_else(ApiError::unavailable)?;
    let exact = synchro_protocol::lineage::PresentedSchema::from_json(schema).ok()
        == Some(synchro_protocol::lineage::PresentedSchema::Exact(
            current.schema_ref(),
        ));
    if !exact {
        return Err(ApiError::schema_mismatch(current.schema_ref(), schema));
    }
    let stored = stored?.ok_or(ApiError::generation_expired(None))?;
    let stored_generation = stored.get::<_, i64>(0) as u64;
    if stored_generation != client_generation || stored.get::<_, bool>(2) {
        return Err(ApiError::generation_expired(Some(stored_generation)));
    }
    // Spec 000 error table: while capture is blocked nothing is served as current.
    let blocked: bool = blocked?.get(0);
    if blocked {
        return Err(ApiError::unavailable_because("capture_blocked"));
    }
    let stream = stream?;
    let stream = ScopeStreamState {
        stream_generation: stream.get::<_, i64>(0) as u64,
        membership_generation: stream.get::<_, i64>(1) as u64,
        retention_generation: 1,
        resume_floor: 0,
        schema_hash: current.schema_hash(),
        bridged: bridges(&stream),
    };
    Ok(Gates {
        stored_assigned: stored.get::<_, Vec<String>>(1).into_iter().collect(),
        lineage,
        stream,
    })
}

/// The authoritative assigned set: defaults, grants, shared scopes and the assignment
/// function's scopes.
pub(crate) async fn assigned_scopes(
    state: &AppState,
    user_id: &str,
) -> Result<BTreeSet<String>, ApiError> {
    // Both reads go out together (one round trip).
    let user: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&user_id];
    let db = state.db.get().await?;
    let (assigned, by_function) = futures_util::join!(
        db.query_one("SELECT synchro.synchro_assigned_scopes($1)", &user),
        assigned_by_function(state, user_id)
    );
    let assigned: Vec<String> = assigned?.get(0);
    let mut assigned: BTreeSet<String> = assigned.into_iter().collect();
    assigned.extend(by_function?);
    Ok(assigned)
}

/// The scopes the registered assignment function returns for `user_id`, validated: each
/// non-null, nonempty after trim, not `user:`-prefixed, and at most `max_scopes` distinct.
async fn assigned_by_function(state: &AppState, user_id: &str) -> Result<Vec<String>, ApiError> {
    let Some(check) = state
        .db
        .get()
        .await?
        .query_opt(
            "SELECT max_scopes, intact FROM synchro.synchro_assignment_function_check()",
            &[],
        )
        .await?
    else {
        return Ok(Vec::new());
    };
    let (max, intact): (Option<i32>, bool) = (check.get(0), check.get(1));
    if !intact {
        return Err(ApiError::integrity(Integrity::AssignmentChanged));
    }
    // Through its evaluator, on the adapter's connection: the function runs as its owner
    // (it used to need a connection of the owner's login, `--assignment-url`).
    let db = state.db.get().await?;
    let rows = db
        .query(
            "SELECT s FROM synchro.synchro_assignment_scopes($1) AS s",
            &[&user_id],
        )
        .await
        .map_err(|e| {
            if super::error::transient(&e) {
                return ApiError::from(e); // retryable: the next request connects again
            }
            ApiError::integrity(Integrity::AssignmentFailed)
        })?;
    let mut scopes = Vec::with_capacity(rows.len());
    for row in rows {
        let scope: Option<String> = row.get(0);
        match scope {
            Some(s) if !s.trim().is_empty() && !s.starts_with("user:") => scopes.push(s),
            _ => {
                return Err(ApiError::integrity(Integrity::AssignmentInvalidScope));
            }
        }
    }
    if max.is_some_and(|m| scopes.len() > m as usize) {
        return Err(ApiError::integrity(Integrity::AssignmentBoundExceeded));
    }
    Ok(scopes)
}

/// Checks, inside a request's snapshot, that the manifest the gates passed (read before the
/// snapshot, on another connection) is still the served current one. Otherwise a
/// reconfiguration activated in between, the snapshot's rows may have the new shape, and
/// the request is answered 422 `schema_mismatch` (the client connects and learns its
/// action), never a row digest failure (a 500 `sync_integrity_failure` that blocks the
/// client).
pub(crate) async fn still_current(
    state: &AppState,
    snap: &impl tokio_postgres::GenericClient,
    gated: &synchro_protocol::manifest::Manifest,
    presented: &Json,
) -> Result<(), ApiError> {
    let served = state
        .caches
        .lineage
        .serving_lineage(snap)
        .await
        .map_err(|_| {
            tracing::warn!("the manifest history could not be read");
            ApiError::unavailable()
        })?;
    let current = served.current().ok_or_else(ApiError::unavailable)?;
    if current.schema_ref() != gated.schema_ref() {
        return Err(ApiError::schema_mismatch(current.schema_ref(), presented));
    }
    Ok(())
}

/// The served manifest history (what connect dispatches against and the gates compare
/// with). A failure to read or verify it is 503: the error names no row or manifest.
pub(crate) async fn serving_lineage(
    state: &AppState,
    db: &tokio_postgres::Client,
) -> Result<synchro_protocol::lineage::Lineage, ApiError> {
    state.caches.lineage.serving_lineage(db).await.map_err(|_| {
        tracing::warn!("the manifest history could not be read");
        ApiError::unavailable()
    })
}

/// A lineage reset's bridges from a `synchro_stream_state()` row: the earlier stream
/// generations whose cursors resume, each with the highest position that does.
pub(crate) fn bridges(row: &tokio_postgres::Row) -> Vec<(u64, u64)> {
    let generations: Vec<i64> = row.get("bridged_generations");
    let through: Vec<i64> = row.get("bridged_through");
    generations
        .into_iter()
        .zip(through)
        .map(|(g, t)| (g as u64, t as u64))
        .collect()
}
