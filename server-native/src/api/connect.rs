//! `POST /sync/connect` (spec 000 "Connect-Time Schema Decision", spec 003 client
//! generations and the cursor bridge). The schema decision is the protocol core's
//! [`dispatch`]; this file reads the request, gathers the server's view, records the
//! client's generation and assignment, and writes the response.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::dispatch::{
    dispatch, ConnectOutcome, CursorUpdate, SchemaAction, ServerView,
};
use synchro_protocol::json::Json;
use synchro_protocol::lineage::Lineage;
use synchro_protocol::manifest::SchemaRef;
use synchro_protocol::token::{Principal, ScopeCursor};
use synchro_protocol::wire::{ConnectRequest, ConnectResponse, SchemaOutcome, ScopeUpdates};

use super::gates::{assigned_scopes, serving_lineage};
use super::{ApiError, AppState};

/// Handles one connect request for an authenticated user; returns the 200 body.
///
/// The phases: check the client's runtime and open its cursors (a bad one is 400 before
/// anything is written), read the server's view, check the cursors' bindings, dispatch,
/// record the client's generation and assignment, bridge the cursors it may keep.
pub(crate) async fn connect(
    state: &AppState,
    user_id: &str,
    req: ConnectRequest,
) -> Result<ConnectResponse, ApiError> {
    let runtime_ok = runtime_supported(state, &req)?;
    let opened = open_cursors(state, &req)?;
    let db = state.db.get().await?;
    let db = &*db;
    let known = read_view(state, db, user_id, &req.client_id).await?;
    // A cursor can be bridged only when every binding but the schema is current: same user,
    // client and (kept) generation, current stream, membership and retention generations,
    // at or above the floor, issued under the schema the client presents.
    let keeps_generation = known.previous_generation.is_some()
        && !known.expired
        && req.client_generation == known.previous_generation;
    let (stale, positions) = cursor_bindings(
        state,
        user_id,
        &req.client_id,
        req.client_generation.unwrap_or(0),
        &opened,
        &req.schema,
        keeps_generation,
    )
    .await?;
    let presented: BTreeSet<String> = opened.keys().cloned().collect();
    let (action, cursor_updates) =
        decide(state, user_id, &req, &known, runtime_ok, &presented, &stale).await?;
    let kind = matches!(action, SchemaAction::Unsupported { .. }).then_some("unsupported");
    hold(state, user_id, &req.client_id, kind, &req.schema).await?;
    let recorded = record(state, db, user_id, &req, &known, &action).await?;
    acknowledge(db, user_id, &req.client_id, recorded.generation, &positions).await?;
    let mut scope_cursor_updates = bridge_cursors(
        state,
        user_id,
        &req.client_id,
        recorded.generation,
        &known.lineage,
        cursor_updates,
        &opened,
        &positions,
    );
    let who = Principal {
        user_id: user_id.to_owned(),
        client_id: req.client_id.clone(),
        client_generation: recorded.generation,
    };
    // A known client given a new generation (it was expired, or presented another one)
    // rebuilds every scope it keeps: each existing assignment gets a null cursor (spec 003:
    // "returns affected assignments with null cursors"; added ones are in scope_updates).
    if recorded.new_generation && known.previous_generation.is_some() {
        for scope in known.assigned.intersection(&known.previous) {
            scope_cursor_updates.insert(scope.clone(), None);
        }
    }
    scope_cursor_updates.extend(seed_cursors(state, db, &who, &known, &req.seed_receipts).await?);
    tracing::info!(
        status = 200,
        action = action.name(),
        new_generation = recorded.new_generation,
        "connect"
    );
    let (schema, schema_definition, affected_scopes) = schema_outcome(&action);
    Ok(ConnectResponse {
        client_generation: recorded.generation,
        scope_set_version: recorded.scope_set_version,
        scope_updates: ScopeUpdates {
            added: known
                .assigned
                .difference(&known.previous)
                .cloned()
                .collect(),
            // A scope the client holds from a seed but is not assigned is taken away like
            // one whose assignment ended (docs/protocol-decisions.md, "Seed receipts").
            removed: known
                .previous
                .iter()
                .chain(req.seed_receipts.keys())
                .filter(|s| !known.assigned.contains(*s))
                .cloned()
                .collect::<BTreeSet<String>>()
                .into_iter()
                .collect(),
        },
        schema,
        schema_definition,
        affected_scopes,
        scope_cursor_updates,
    })
}

/// Whether the client's runtime is at least the configured minimum (a `client_version`
/// that is not SemVer is 400).
fn runtime_supported(state: &AppState, req: &ConnectRequest) -> Result<bool, ApiError> {
    Ok(
        match (&state.config.min_client_version, &req.client_version) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(min), Some(v)) => synchro_protocol::semver::compare(v, min)
                .map_err(|_| {
                    ApiError::invalid_request("client_version must be a SemVer 2.0.0 version")
                })?
                .is_ge(),
        },
    )
}

/// The presented cursors, opened: a malformed or forged one is 400 before anything is
/// written.
fn open_cursors(
    state: &AppState,
    req: &ConnectRequest,
) -> Result<BTreeMap<String, ScopeCursor>, ApiError> {
    let mut opened = BTreeMap::new();
    for (scope, token) in &req.scope_cursors {
        if let Some(t) = token {
            let c = ScopeCursor::open(&state.cursor_keys, t)
                .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?;
            opened.insert(scope.clone(), c);
        }
    }
    Ok(opened)
}

/// What the server knows of the client and serves, read before the decision.
struct Known {
    /// The client's identity is stored.
    identity_known: bool,
    /// Its stored generation.
    previous_generation: Option<u64>,
    /// Its stored generation expired.
    expired: bool,
    /// The scopes it was last assigned.
    previous: BTreeSet<String>,
    /// The scopes it is assigned now.
    assigned: BTreeSet<String>,
    /// The served manifest history.
    lineage: Lineage,
    /// The scopes each transition of the history affects.
    transition_scopes: BTreeMap<SchemaRef, BTreeSet<String>>,
}

/// Reads the client's stored state, its assignment and the served history.
async fn read_view(
    state: &AppState,
    db: &tokio_postgres::Client,
    user_id: &str,
    client_id: &str,
) -> Result<Known, ApiError> {
    let stored = db
        .query_opt(
            "SELECT client_generation, assigned_scopes, expired FROM synchro.synchro_client_state($1, $2)",
            &[&user_id, &client_id],
        )
        .await?;
    let assigned = assigned_scopes(state, user_id).await?;
    let lineage = serving_lineage(state, db).await?;
    let transition_scopes = crate::publish::transition_scopes(db, &lineage)
        .await
        .map_err(|_| {
            tracing::warn!("the affected scopes of the manifest history could not be read");
            ApiError::unavailable()
        })?;
    Ok(Known {
        identity_known: stored.is_some(),
        previous_generation: stored.as_ref().map(|row| row.get::<_, i64>(0) as u64),
        expired: stored.as_ref().is_some_and(|row| row.get::<_, bool>(2)),
        previous: stored
            .as_ref()
            .map(|row| row.get::<_, Vec<String>>(1))
            .unwrap_or_default()
            .into_iter()
            .collect(),
        assigned,
        lineage,
        transition_scopes,
    })
}

/// The protocol core's schema decision; a refusal (426, 400) is answered here (a runtime
/// below the minimum is held for the rollout advisor first).
async fn decide<'a>(
    state: &AppState,
    user_id: &str,
    req: &ConnectRequest,
    known: &'a Known,
    runtime_ok: bool,
    presented: &'a BTreeSet<String>,
    stale: &'a BTreeSet<String>,
) -> Result<(SchemaAction<'a>, BTreeMap<String, CursorUpdate>), ApiError> {
    let view = ServerView {
        identity_known: known.identity_known,
        client_runtime_supported: runtime_ok,
        lineage: &known.lineage,
        transition_scopes: &known.transition_scopes,
        assigned_scopes: &known.assigned,
        presented_cursor_scopes: presented,
        stale_cursor_scopes: stale,
    };
    let request = synchro_protocol::dispatch::ConnectRequest {
        protocol_version: Some(u64::from(synchro_protocol::PROTOCOL_VERSION)),
        schema: req.schema.clone(),
        client_generation: req.client_generation,
        schema_reset: req.schema_reset,
    };
    let outcome = dispatch(&request, &view).map_err(|e| {
        // (The protocol core's bounded error code: never the client's values.)
        tracing::error!(
            code = e.code(),
            "connect dispatch refused the server's own lineage"
        );
        ApiError::unavailable()
    })?;
    match outcome {
        ConnectOutcome::Schema {
            action,
            cursor_updates,
        } => Ok((action, cursor_updates)),
        ConnectOutcome::UpgradeRequired {
            received_protocol_version,
            client_runtime,
        } => {
            if client_runtime {
                let kind = Some("client_runtime");
                hold(state, user_id, &req.client_id, kind, &req.schema).await?;
            }
            tracing::info!(status = 426, "connect: refused by schema dispatch");
            Err(ApiError::upgrade_required(
                received_protocol_version,
                client_runtime,
            ))
        }
        ConnectOutcome::InvalidSchemaReference { reason } => {
            tracing::info!(status = 400, "connect: refused by schema dispatch");
            Err(ApiError::invalid_schema_reference(reason, &req.schema))
        }
    }
}

/// What [`record`] stored.
struct Recorded {
    generation: u64,
    scope_set_version: u64,
    /// A new generation was issued.
    new_generation: bool,
}

/// Records the client's generation (a new one unless it presented its current one), its
/// assignment and the schema it installs (none for `unsupported`).
async fn record(
    state: &AppState,
    db: &tokio_postgres::Client,
    user_id: &str,
    req: &ConnectRequest,
    known: &Known,
    action: &SchemaAction<'_>,
) -> Result<Recorded, ApiError> {
    let new_generation = known.previous_generation.is_none()
        || known.expired
        || req.client_generation != known.previous_generation;
    let installed = match action {
        SchemaAction::Unsupported { .. } => None,
        _ => known.lineage.current().map(|m| m.schema_ref()),
    };
    let row = db
        .query_one(
            "SELECT client_generation, scope_set_version FROM synchro.synchro_client_connect($1, $2, $3, $4, $5, $6, $7)",
            &[
                &user_id,
                &req.client_id,
                &new_generation,
                &known.assigned.iter().cloned().collect::<Vec<_>>(),
                &installed.map(|r| r.version as i64),
                &installed.map(|r| hex::encode(r.hash)),
                &state.config.max_clients_per_user,
            ],
        )
        .await?;
    Ok(Recorded {
        generation: row.get::<_, i64>(0) as u64,
        scope_set_version: row.get::<_, i64>(1) as u64,
        new_generation,
    })
}

/// Bridged cursors: the same position re-signed under the current schema hash (null for a
/// cursor that cannot be bridged: its scope rebuilds).
#[allow(clippy::too_many_arguments)]
fn bridge_cursors(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    generation: u64,
    lineage: &Lineage,
    cursor_updates: BTreeMap<String, CursorUpdate>,
    opened: &BTreeMap<String, ScopeCursor>,
    positions: &BTreeMap<String, Bound>,
) -> BTreeMap<String, Option<String>> {
    let mut scope_cursor_updates = BTreeMap::new();
    for (scope, update) in cursor_updates {
        let value = match (update, lineage.current()) {
            (CursorUpdate::Reissue, Some(current)) => {
                let (position, membership_generation, retention_generation) = positions[&scope];
                let cursor = ScopeCursor {
                    scope_id: scope.clone(),
                    stream_generation: opened[&scope].stream_generation,
                    membership_generation,
                    retention_generation,
                    position,
                    schema_hash: current.schema_hash(),
                    principal: Principal {
                        user_id: user_id.to_owned(),
                        client_id: client_id.to_owned(),
                        client_generation: generation,
                    },
                    issued_at: super::rows::now_datetime(),
                };
                Some(cursor.sign(&state.cursor_keys))
            }
            _ => None,
        };
        scope_cursor_updates.insert(scope, value);
    }
    scope_cursor_updates
}

/// Cursors at the seed boundary for the presented receipts (spec 001 "Seed continuation
/// receipt"): a receipt that verifies, of a scope portable now and assigned to this user,
/// under the current schema and the current stream, registry, membership and retention
/// generations, at or above the scope's resume floor, becomes a normal cursor of this user,
/// client and generation at the boundary; any other is null (the scope rebuilds, after the
/// client's pending intent is pushed). A receipt names no user: the cursor binds one.
async fn seed_cursors(
    state: &AppState,
    db: &tokio_postgres::Client,
    who: &Principal,
    known: &Known,
    receipts: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Option<String>>, ApiError> {
    let mut out = BTreeMap::new();
    if receipts.is_empty() {
        return Ok(out);
    }
    let Some(current) = known.lineage.current() else {
        return Ok(receipts.keys().map(|s| (s.clone(), None)).collect());
    };
    // Only receipts of assigned scopes are read (one round trip for all of them): the work
    // a connect asks of the database is bounded by the user's assignment, not by the body.
    let (scopes, tokens): (Vec<String>, Vec<String>) = receipts
        .iter()
        .filter(|(scope, _)| known.assigned.contains(*scope))
        .map(|(scope, receipt)| (scope.clone(), receipt.clone()))
        .unzip();
    out.extend(receipts.keys().map(|s| (s.clone(), None)));
    if scopes.is_empty() {
        return Ok(out);
    }
    // The three reads go out together (one round trip).
    let of_scopes: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&scopes];
    let of_receipts: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&scopes, &tokens];
    let (stream, retention, bound) = futures_util::join!(
        db.query_one(
            "SELECT stream_generation FROM synchro.synchro_stream_state()",
            &[],
        ),
        db.query(
            "SELECT scope_id, retention_generation, resume_floor, membership_generation
               FROM synchro.synchro_scope_retention($1)",
            &of_scopes,
        ),
        db.query(
            "SELECT r.presented, s.* FROM unnest($1::text[], $2::text[]) AS r(presented, receipt)
               CROSS JOIN LATERAL synchro.synchro_seed_receipt(r.receipt) AS s",
            &of_receipts,
        ),
    );
    let stream: i64 = stream?.get(0);
    let retention: BTreeMap<String, (i64, i64, i64)> = retention?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let bound: BTreeMap<String, tokio_postgres::Row> = bound?
        .into_iter()
        .map(|r| (r.get::<_, String>("presented"), r))
        .collect();
    let issued_at = super::rows::now_datetime();
    let mut refused = receipts.len() - scopes.len();
    for scope in &scopes {
        let cursor = bound.get(scope).and_then(|r| {
            let (retention_generation, floor, membership_generation) = *retention.get(scope)?;
            let position: i64 = r.get("boundary_position");
            let ok = r.get::<_, &str>("scope_id") == scope
                && r.get::<_, bool>("portable")
                && r.get::<_, &str>("schema_hash") == current.schema_hash_hex()
                && r.get::<_, i64>("stream_generation") == stream
                && r.get::<_, i64>("registry_generation")
                    == r.get::<_, i64>("current_registry_generation")
                && r.get::<_, i64>("membership_generation") == membership_generation
                && r.get::<_, i64>("retention_generation") == retention_generation
                && position >= floor;
            ok.then(|| {
                ScopeCursor {
                    scope_id: scope.clone(),
                    stream_generation: stream as u64,
                    membership_generation: membership_generation as u64,
                    retention_generation: retention_generation as u64,
                    position: position as u64,
                    schema_hash: current.schema_hash(),
                    principal: who.clone(),
                    issued_at: issued_at.clone(),
                }
                .sign(&state.cursor_keys)
            })
        });
        refused += usize::from(cursor.is_none());
        out.insert(scope.clone(), cursor);
    }
    tracing::info!(receipts = receipts.len(), refused, "connect: seed receipts");
    Ok(out)
}

/// The response's `schema` member, `schema_definition` and `affected_scopes` for `action`.
fn schema_outcome(action: &SchemaAction<'_>) -> (SchemaOutcome, Option<Json>, Option<Vec<String>>) {
    let current = match action {
        SchemaAction::None { current } | SchemaAction::Unsupported { current, .. } => *current,
        SchemaAction::Replace { manifest } | SchemaAction::RebuildLocal { manifest, .. } => {
            manifest.schema_ref()
        }
    };
    let (schema_definition, affected_scopes, reason) = match action {
        SchemaAction::None { .. } => (None, None, None),
        SchemaAction::Unsupported { reason, .. } => (None, None, Some(reason.as_str().to_owned())),
        SchemaAction::Replace { manifest } => (Some(manifest.definition_json()), None, None),
        SchemaAction::RebuildLocal {
            manifest,
            affected_scopes,
        } => (
            Some(manifest.definition_json()),
            Some(affected_scopes.as_slice().to_vec()),
            None,
        ),
    };
    let schema = SchemaOutcome {
        action: action.kind(),
        version: current.version,
        hash: hex::encode(current.hash),
        reason,
    };
    (schema, schema_definition, affected_scopes)
}

/// Spec 003: a successful request that presents a newer valid cursor refreshes the client's
/// `last_acknowledged_at` (and the scope's acknowledged position, which pins its history
/// against compaction) — a connect as well as a pull.
async fn acknowledge(
    db: &tokio_postgres::Client,
    user_id: &str,
    client_id: &str,
    generation: u64,
    positions: &BTreeMap<String, Bound>,
) -> Result<(), ApiError> {
    if positions.is_empty() {
        return Ok(());
    }
    db.execute(
        "SELECT synchro.synchro_record_acks($1, $2, $3, $4, $5)",
        &[
            &user_id,
            &client_id,
            &(generation as i64),
            &positions.keys().cloned().collect::<Vec<_>>(),
            &positions.values().map(|b| b.0 as i64).collect::<Vec<_>>(),
        ],
    )
    .await?;
    Ok(())
}

/// Per-scope bindings a resumable position: (position, membership generation, retention
/// generation).
type Bound = (u64, u64, u64);

/// Checks presented connect cursors: misbound (other user, client or scope) is 400;
/// returns the scopes whose cursor is stale, and the bindings of the others.
async fn cursor_bindings(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    client_generation: u64,
    opened: &BTreeMap<String, synchro_protocol::token::ScopeCursor>,
    schema: &Json,
    keeps_generation: bool,
) -> Result<(BTreeSet<String>, BTreeMap<String, Bound>), ApiError> {
    use synchro_protocol::lineage::PresentedSchema;
    use synchro_protocol::token::{CursorStatus, Principal, ScopeStreamState};
    let mut stale = BTreeSet::new();
    let mut positions = BTreeMap::new();
    if opened.is_empty() {
        return Ok((stale, positions));
    }
    let presented_hash = match PresentedSchema::from_json(schema) {
        Ok(PresentedSchema::Exact(r)) => Some(r.hash),
        _ => None,
    };
    let db = state.db.get().await?;
    let db = &*db;
    let stream = db
        .query_one(
            "SELECT stream_generation, bridged_generations, bridged_through FROM synchro.synchro_stream_state()",
            &[],
        )
        .await?;
    let stream_generation: i64 = stream.get(0);
    let bridged = super::gates::bridges(&stream);
    let scopes: Vec<String> = opened.keys().cloned().collect();
    let who = Principal {
        user_id: user_id.to_owned(),
        client_id: client_id.to_owned(),
        client_generation,
    };
    for r in db
        .query(
            "SELECT scope_id, retention_generation, resume_floor, membership_generation
               FROM synchro.synchro_scope_retention($1)",
            &[&scopes],
        )
        .await?
    {
        let scope: String = r.get(0);
        let cursor = &opened[&scope];
        let bindings = ScopeStreamState {
            stream_generation: stream_generation as u64,
            membership_generation: r.get::<_, i64>(3) as u64,
            retention_generation: r.get::<_, i64>(1) as u64,
            resume_floor: r.get::<_, i64>(2) as u64,
            schema_hash: presented_hash.unwrap_or(cursor.schema_hash),
            bridged: bridged.clone(),
        };
        match cursor
            .check(&scope, &who, &bindings)
            .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?
        {
            CursorStatus::Resumable(p) if keeps_generation && presented_hash.is_some() => {
                positions.insert(
                    scope,
                    (
                        p,
                        bindings.membership_generation,
                        bindings.retention_generation,
                    ),
                );
            }
            _ => {
                stale.insert(scope);
            }
        }
    }
    Ok((stale, positions))
}

/// Records (or releases) the rollout advisor's hold of a client at upgrade_required, with
/// the schema version it presented.
async fn hold(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    kind: Option<&str>,
    schema: &Json,
) -> Result<(), ApiError> {
    let version = match schema.get("version") {
        Some(Json::Number(v)) => v.parse::<i64>().ok(),
        _ => None,
    };
    state
        .db
        .get()
        .await?
        .execute(
            "SELECT synchro.synchro_client_hold($1, $2, $3, $4)",
            &[&user_id, &client_id, &kind, &version],
        )
        .await?;
    Ok(())
}
