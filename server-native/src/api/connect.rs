//! `POST /sync/connect` (spec 000 "Connect-Time Schema Decision", spec 003 client
//! generations and the cursor bridge). The schema decision is the protocol core's
//! [`dispatch`]; this file reads the request, gathers the server's view, records the
//! client's generation and assignment, and writes the response.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::dispatch::{
    dispatch, ConnectOutcome, CursorUpdate, SchemaAction, ServerView,
};
use synchro_protocol::json::Json;
use synchro_protocol::token::{Principal, ScopeCursor};
use synchro_protocol::wire::{ConnectRequest, ConnectResponse, SchemaOutcome, ScopeUpdates};

use super::gates::{assigned_scopes, serving_lineage};
use super::{ApiError, AppState};

/// Handles one connect request for an authenticated user; returns the 200 body.
pub(crate) async fn connect(
    state: &AppState,
    user_id: &str,
    req: ConnectRequest,
) -> Result<ConnectResponse, ApiError> {
    let runtime_ok = match (&state.config.min_client_version, &req.client_version) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(min), Some(v)) => synchro_protocol::semver::compare(v, min)
            .map_err(|_| {
                ApiError::invalid_request("client_version must be a SemVer 2.0.0 version")
            })?
            .is_ge(),
    };
    // Presented cursors: a malformed or forged one is 400 before anything is written.
    let mut opened: BTreeMap<String, ScopeCursor> = BTreeMap::new();
    for (scope, token) in &req.scope_cursors {
        if let Some(t) = token {
            let c = ScopeCursor::open(&state.cursor_keys, t)
                .map_err(|_| ApiError::invalid_request("a scope cursor is invalid"))?;
            opened.insert(scope.clone(), c);
        }
    }
    let presented: BTreeSet<String> = opened.keys().cloned().collect();
    let schema = &req.schema;

    let db = state.db.get().await?;
    let db = &*db;
    let stored = db
        .query_opt(
            "SELECT client_generation, assigned_scopes, expired FROM synchro.synchro_client_state($1, $2)",
            &[&user_id, &req.client_id],
        )
        .await?;
    let assigned = assigned_scopes(state, user_id).await?;
    let lineage = serving_lineage(db).await?;
    let transition_scopes = crate::publish::transition_scopes(db, &lineage)
        .await
        .map_err(|_| {
            tracing::warn!("the affected scopes of the manifest history could not be read");
            ApiError::unavailable()
        })?;
    let (previous_generation, expired) = match &stored {
        Some(row) => (Some(row.get::<_, i64>(0) as u64), row.get::<_, bool>(2)),
        None => (None, false),
    };
    // A cursor can be bridged only when every binding but the schema is current: same user,
    // client and (kept) generation, current stream, membership and retention generations,
    // at or above the floor, issued under the schema the client presents.
    let keeps_generation =
        previous_generation.is_some() && !expired && req.client_generation == previous_generation;
    let (stale, positions) = cursor_bindings(
        state,
        user_id,
        &req.client_id,
        req.client_generation.unwrap_or(0),
        &opened,
        schema,
        keeps_generation,
    )
    .await?;
    let view = ServerView {
        identity_known: stored.is_some(),
        client_runtime_supported: runtime_ok,
        lineage: &lineage,
        transition_scopes: &transition_scopes,
        assigned_scopes: &assigned,
        presented_cursor_scopes: &presented,
        stale_cursor_scopes: &stale,
    };
    let request = synchro_protocol::dispatch::ConnectRequest {
        protocol_version: Some(u64::from(synchro_protocol::PROTOCOL_VERSION)),
        schema: schema.clone(),
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
    let (action, cursor_updates) = match outcome {
        ConnectOutcome::Schema {
            action,
            cursor_updates,
        } => (action, cursor_updates),
        ConnectOutcome::UpgradeRequired {
            received_protocol_version,
            client_runtime,
        } => {
            if client_runtime {
                hold(
                    state,
                    user_id,
                    &req.client_id,
                    Some("client_runtime"),
                    schema,
                )
                .await?;
            }
            tracing::info!(status = 426, "connect: refused by schema dispatch");
            return Err(ApiError::upgrade_required(
                received_protocol_version,
                client_runtime,
            ));
        }
        ConnectOutcome::InvalidSchemaReference { reason } => {
            tracing::info!(status = 400, "connect: refused by schema dispatch");
            return Err(ApiError::invalid_schema_reference(reason, schema));
        }
    };

    let kind = matches!(action, SchemaAction::Unsupported { .. }).then_some("unsupported");
    hold(state, user_id, &req.client_id, kind, schema).await?;

    let previous: BTreeSet<String> = stored
        .as_ref()
        .map(|row| row.get::<_, Vec<String>>(1))
        .unwrap_or_default()
        .into_iter()
        .collect();
    let new_generation =
        previous_generation.is_none() || expired || req.client_generation != previous_generation;
    let installed = match action {
        SchemaAction::Unsupported { .. } => None,
        _ => lineage.current().map(|m| m.schema_ref()),
    };
    let row = db
        .query_one(
            "SELECT client_generation, scope_set_version FROM synchro.synchro_client_connect($1, $2, $3, $4, $5, $6)",
            &[
                &user_id,
                &req.client_id,
                &new_generation,
                &assigned.iter().cloned().collect::<Vec<_>>(),
                &installed.map(|r| r.version as i64),
                &installed.map(|r| hex::encode(r.hash)),
            ],
        )
        .await?;
    let generation = row.get::<_, i64>(0) as u64;
    let scope_set_version = row.get::<_, i64>(1) as u64;

    // Bridged cursors: the same position re-signed under the current schema hash.
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
                        client_id: req.client_id.clone(),
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
    let current = match &action {
        SchemaAction::None { current } | SchemaAction::Unsupported { current, .. } => *current,
        SchemaAction::Replace { manifest } | SchemaAction::RebuildLocal { manifest, .. } => {
            manifest.schema_ref()
        }
    };
    let (schema_definition, affected_scopes, reason) = match &action {
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
    tracing::info!(
        status = 200,
        action = action.name(),
        new_generation,
        "connect"
    );
    Ok(ConnectResponse {
        client_generation: generation,
        scope_set_version,
        scope_updates: ScopeUpdates {
            added: assigned.difference(&previous).cloned().collect(),
            removed: previous.difference(&assigned).cloned().collect(),
        },
        schema: SchemaOutcome {
            action: action.kind(),
            version: current.version,
            hash: hex::encode(current.hash),
            reason,
        },
        schema_definition,
        affected_scopes,
        scope_cursor_updates,
    })
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
    let stream_generation: i64 = db
        .query_one(
            "SELECT stream_generation FROM synchro.synchro_stream_state()",
            &[],
        )
        .await?
        .get(0);
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
