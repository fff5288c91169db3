//! `POST /sync/push`: queued client intent applied to the application tables (spec 000
//! "Authored-Schema Queued Mutations", spec 003 "Exact Current Schema Gate and Authored
//! Mutation Schema", "Strict Positive Limits"; outcomes per notes/spec-gaps "ADR 002").
//!
//! Order: strict limits (400 before any work) → exact replay of a completed batch (its
//! stored outcomes, before the schema and generation gates, never writing) → exact current
//! schema (422) → current client generation (409) → one transaction for the whole batch:
//! 1. a mutation ID executed in an earlier batch gets that stored outcome again;
//! 2. authored-schema compatibility, writability and canonical values ([`checks`]);
//! 3. the compare-and-swap writes through `synchro_push_write_batch` against the source rows'
//!    versions (`conflict` when a newer write got there first), each authorized by the
//!    row's scopes before and after the write ([`apply`], which has the rule and how a
//!    batch gets it in a few round trips).
//!
//! The batch's outcomes and fingerprint are stored in the same transaction as its writes:
//! a crash before the commit leaves nothing (a replay executes afresh); a lost response is
//! answered by exact replay. Writes go to the application tables, so capture delivers them
//! to every client like any other write. A push waits at most `Config::push_pool_wait` for
//! each database connection it needs (503 `temporary_unavailable`, reason `push_busy`).

mod apply;
mod checks;
mod scopes;

use std::collections::HashMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::wire::{Message, Mutation, Outcome, PushRequest, PushResponse};
use tokio_postgres::types::{ToSql, Type};

use super::{ApiError, AppState, Integrity};

/// Push bounds (spec-gaps: the original project's defaults), shared with the edge gateway.
pub use synchro_protocol::wire::gate::PushLimits;

fn bad(message: &'static str) -> ApiError {
    ApiError::invalid_request(message)
}

/// The server's bounds on a request the wire type already read, and the batch's identity:
/// the SHA-256 of the canonical `{batch_id, mutations, schema}` (not the generation, so a
/// replay after a generation change is still exact).
fn check_limits(r: &PushRequest, limits: &PushLimits) -> Result<String, ApiError> {
    limits.check(r)?;
    let mutations: Vec<Json> = r.mutations.iter().map(Mutation::to_json).collect();
    let content = Json::Object(vec![
        ("batch_id".into(), Json::String(r.batch_id.clone())),
        ("mutations".into(), Json::Array(mutations)),
        ("schema".into(), r.schema.clone()),
    ]);
    Ok(hex::encode(Sha256::digest(
        to_output_string(&content).as_bytes(),
    )))
}

fn rejected(mutation_id: &str, code: &str, message: &str) -> Outcome {
    Outcome::Rejected {
        mutation_id: mutation_id.to_owned(),
        code: code.to_owned(),
        message: message.to_owned(),
        incompatible: None,
    }
}

/// The conflict outcome of an update or delete whose row does not exist (also given for
/// a row the user cannot see).
fn missing_row_conflict(mutation_id: &str) -> Outcome {
    Outcome::Conflict {
        mutation_id: mutation_id.to_owned(),
        message: "the row changed since the base version".to_owned(),
        current: None,
    }
}

fn json_text_response(text: String) -> Response {
    (StatusCode::OK, [("content-type", "application/json")], text).into_response()
}

/// Handles one push request for `user_id`.
pub(crate) async fn push(
    state: &AppState,
    user_id: &str,
    r: PushRequest,
) -> Result<Response, ApiError> {
    let fingerprint = check_limits(&r, &state.config.push_limits)?;
    let Some(membership) = state.membership_db.as_ref() else {
        return Err(ApiError::unavailable_because("push_unavailable"));
    };
    let ids: Vec<&str> = r.mutations.iter().map(|m| m.mutation_id.as_str()).collect();
    let authored = authored_versions(&r);
    // Every read before the writes goes out at once (one round trip on the shared
    // connection); the answers are taken in the order above. Mutation IDs executed in an
    // earlier batch get their stored outcomes again: read here, outside the batch's
    // transaction, which under READ COMMITTED sees exactly what a read inside it would.
    let db = state.db.get().await?;
    let db = &*db;
    let who: [(&(dyn ToSql + Sync), Type); 3] = [
        (&user_id, Type::TEXT),
        (&r.client_id, Type::TEXT),
        (&ids, Type::TEXT_ARRAY),
    ];
    let batch: [&(dyn ToSql + Sync); 3] = [&user_id, &r.client_id, &r.batch_id];
    let (replay, gates, assigned, stored) = futures_util::join!(
        db.query_opt(
            "SELECT fingerprint, outcomes FROM synchro.synchro_push_lookup($1, $2, $3)",
            &batch,
        ),
        super::gates(state, user_id, &r.client_id, r.client_generation, &r.schema),
        super::assigned_scopes(state, user_id),
        db.query_typed(
            "SELECT mutation_id, outcome FROM synchro.synchro_push_mutation_outcomes($1, $2, $3)",
            &who,
        ),
    );
    // Exact replay of a completed batch: before the schema and generation gates.
    if let Some(row) = replay? {
        let (stored, body): (String, String) = (row.get(0), row.get(1));
        if stored != fingerprint {
            return Err(bad("batch_id was already used for a different batch"));
        }
        tracing::info!(status = 200, replay = true, "push");
        return Ok(json_text_response(body));
    }
    let gates = match gates {
        Ok(g) => g,
        Err(e) => {
            // The intents stay queued at the client: the rollout advisor counts them.
            let _ = db
                .execute(
                    "SELECT synchro.synchro_push_seen($1, $2, $3, $4, false)",
                    &[&user_id, &r.client_id, &ids, &authored],
                )
                .await;
            return Err(e);
        }
    };
    let current = gates
        .lineage
        .current()
        .ok_or_else(ApiError::unavailable)?
        .clone();
    let assigned = assigned?;
    let stored: HashMap<String, String> =
        stored?.iter().map(|row| (row.get(0), row.get(1))).collect();

    let busy = || ApiError::overloaded("push_busy", state.config.retry_after_seconds);
    let wait = state.config.push_pool_wait;
    let mut conn = state
        .snapshot_db
        .lock_within(wait)
        .await?
        .ok_or_else(busy)?;
    let mut membership = membership.lock_within(wait).await?.ok_or_else(busy)?;
    let tx = conn.transaction().await?;
    let (mut outcomes, writes) = decided_early(&r, &stored, &gates.lineage, &current)?;
    let cx = apply::Context {
        current: &current,
        assigned: &assigned,
    };
    let written = apply::apply(&tx, &mut membership, &cx, &writes).await?;
    drop(membership);
    // Each mutation's outcome in request order: the ones decided before the writes, and the
    // writes' in their order.
    let mut written = written.into_iter();
    for o in &mut outcomes {
        if o.is_none() {
            *o = written.next();
        }
    }
    let outcomes = outcomes
        .into_iter()
        .collect::<Option<Vec<Outcome>>>()
        .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
    let body = PushResponse {
        batch_id: r.batch_id.clone(),
        outcomes,
    };
    let text = body.to_json_string();
    if !record(&tx, user_id, &r, &fingerprint, &body, &text).await? {
        // The same batch, sent twice at once, was recorded first by the other request:
        // this one's writes are rolled back and it answers as an exact replay.
        tx.rollback().await?;
        let row = db
            .query_one(
                "SELECT fingerprint, outcomes FROM synchro.synchro_push_lookup($1, $2, $3)",
                &batch,
            )
            .await?;
        let (stored, body): (String, String) = (row.get(0), row.get(1));
        if stored != fingerprint {
            return Err(bad("batch_id was already used for a different batch"));
        }
        tracing::info!(status = 200, replay = true, "push");
        return Ok(json_text_response(body));
    }
    tx.commit().await?;
    tracing::info!(status = 200, mutations = ids.len(), "push");
    Ok(json_text_response(text))
}

/// Each mutation's outcome when it is decided before any write (`None` for the others, in
/// the writes returned): a mutation ID executed in an earlier batch gets its stored outcome
/// again; one the authored-schema, writability or value checks refuse gets its rejection.
fn decided_early<'a>(
    r: &'a PushRequest,
    stored: &HashMap<String, String>,
    lineage: &synchro_protocol::lineage::Lineage,
    current: &'a synchro_protocol::manifest::Manifest,
) -> Result<(Vec<Option<Outcome>>, Vec<checks::Prepared<'a>>), ApiError> {
    let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(r.mutations.len());
    let mut writes = Vec::new();
    for m in &r.mutations {
        if let Some(o) = stored.get(&m.mutation_id) {
            let o = Json::parse(o)
                .ok()
                .and_then(|j| Outcome::from_json(&j).ok())
                .ok_or_else(|| ApiError::integrity(Integrity::StoredRow))?;
            outcomes.push(Some(o));
            continue;
        }
        match checks::prepare(lineage, current, m)? {
            Ok(p) => {
                outcomes.push(None);
                writes.push(p);
            }
            Err(o) => outcomes.push(Some(o)),
        }
    }
    Ok((outcomes, writes))
}

/// Records the batch in its transaction: the ledger (fingerprint, response, each
/// mutation's outcome) and the rollout advisor's record of the authored schemas, in one
/// round trip. False: a concurrent request recorded the same batch first.
async fn record(
    tx: &tokio_postgres::Transaction<'_>,
    user_id: &str,
    r: &PushRequest,
    fingerprint: &str,
    body: &PushResponse,
    text: &str,
) -> Result<bool, ApiError> {
    let ids: Vec<&str> = r.mutations.iter().map(|m| m.mutation_id.as_str()).collect();
    let authored = authored_versions(r);
    let texts: Vec<String> = body
        .outcomes
        .iter()
        .map(|o| to_output_string(&o.to_json()))
        .collect();
    let record: [(&(dyn ToSql + Sync), Type); 7] = [
        (&user_id, Type::TEXT),
        (&r.client_id, Type::TEXT),
        (&r.batch_id, Type::TEXT),
        (&fingerprint, Type::TEXT),
        (&text, Type::TEXT),
        (&ids, Type::TEXT_ARRAY),
        (&texts, Type::TEXT_ARRAY),
    ];
    let seen: [(&(dyn ToSql + Sync), Type); 4] = [
        (&user_id, Type::TEXT),
        (&r.client_id, Type::TEXT),
        (&ids, Type::TEXT_ARRAY),
        (&authored, Type::INT8_ARRAY),
    ];
    let (record, seen) = futures_util::join!(
        tx.query_typed(
            "SELECT synchro.synchro_push_record($1, $2, $3, $4, $5, $6, $7)",
            &record
        ),
        tx.query_typed(
            "SELECT synchro.synchro_push_seen($1, $2, $3, $4, true)",
            &seen
        )
    );
    let recorded: bool = record?
        .first()
        .ok_or_else(|| ApiError::integrity(Integrity::Answer))?
        .get(0);
    seen?;
    Ok(recorded)
}

/// Each mutation's authored schema version, in request order.
fn authored_versions(r: &PushRequest) -> Vec<i64> {
    r.mutations
        .iter()
        .map(|m| m.authored_schema.version as i64)
        .collect()
}
