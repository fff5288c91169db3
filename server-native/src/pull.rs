//! `POST /sync/pull` (spec 001 terminal rules, spec 003 cursors, limits and reconciliation).
//!
//! Order: body, protocol (426), bearer (401), members and `limit` 1..=1000 (400), exact
//! current schema (422 `schema_mismatch`), client generation (409), every presented cursor
//! (a malformed, forged or misbound one is 400 and nothing is written), then assignment
//! reconciliation and the page. Everything is read in one REPEATABLE READ snapshot, so the
//! rows, the new cursor positions and the terminal scope digests describe one boundary.

use std::collections::{BTreeMap, BTreeSet};

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::token::{CursorStatus, Principal, ScopeCursor, ScopeStreamState};
use synchro_protocol::value::TypedValue;

use crate::http::{ApiError, AppState};

/// Largest page (spec 003 "Pull and rebuild limits are fixed at 1..1000").
pub const MAX_LIMIT: u64 = 1000;

pub(crate) struct PullRequest {
    pub client_id: String,
    pub client_generation: u64,
    pub schema: Json,
    pub cursors: BTreeMap<String, Option<String>>,
    pub limit: u64,
}

/// The members pull and rebuild share: `client_id`, `client_generation` and `limit`
/// (1..=1000), each a 400 `invalid_request` when missing or malformed.
pub(crate) fn common_members(req: &Json) -> Result<(String, u64, u64), ApiError> {
    let bad = ApiError::invalid_request;
    let client_id = match req.get("client_id") {
        Some(Json::String(s)) if !s.is_empty() && s.len() <= 256 => s.clone(),
        _ => {
            return Err(bad(
                "client_id must be a nonempty string of at most 256 bytes",
            ))
        }
    };
    let client_generation = req
        .get("client_generation")
        .and_then(crate::http::positive_integer)
        .ok_or_else(|| bad("client_generation must be a positive integer"))?;
    let limit = req
        .get("limit")
        .and_then(crate::http::positive_integer)
        .filter(|l| *l <= MAX_LIMIT)
        .ok_or_else(|| bad("limit must be an integer from 1 to 1000"))?;
    Ok((client_id, client_generation, limit))
}

pub(crate) fn parse(req: &Json) -> Result<PullRequest, ApiError> {
    let bad = ApiError::invalid_request;
    let (client_id, client_generation, limit) = common_members(req)?;
    let mut cursors = BTreeMap::new();
    match req.get("scope_cursors") {
        None | Some(Json::Null) => {}
        Some(Json::Object(m)) => {
            for (scope, c) in m {
                let c = match c {
                    Json::Null => None,
                    Json::String(s) => Some(s.clone()),
                    _ => return Err(bad("scope_cursors values must be strings or null")),
                };
                cursors.insert(scope.clone(), c);
            }
        }
        Some(_) => return Err(bad("scope_cursors must be an object")),
    }
    Ok(PullRequest {
        client_id,
        client_generation,
        schema: req.get("schema").cloned().unwrap_or(Json::Null),
        cursors,
        limit,
    })
}

pub(crate) fn now_datetime() -> String {
    // Issue time for cursors, UTC with microseconds.
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// What every pull and rebuild request is checked against, in the spec's order.
pub(crate) struct Gates {
    /// The manifest history (its current manifest is the request's schema).
    pub lineage: synchro_protocol::lineage::Lineage,
    /// The client's stored assigned scopes.
    pub stored_assigned: BTreeSet<String>,
    /// The stream state cursors and sessions bind (floor 0: nothing is compacted yet).
    pub stream: ScopeStreamState,
}

/// Exact current schema (422) and current client generation (409).
pub(crate) async fn gates(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    client_generation: u64,
    schema: &Json,
) -> Result<Gates, ApiError> {
    let db = &state.db;
    let lineage = crate::publish::load_serving_lineage(db)
        .await
        .map_err(|_| ApiError::unavailable())?;
    let current = lineage.current().ok_or_else(ApiError::unavailable)?;
    let exact = synchro_protocol::lineage::PresentedSchema::from_json(schema).ok()
        == Some(synchro_protocol::lineage::PresentedSchema::Exact(
            current.schema_ref(),
        ));
    if !exact {
        return Err(ApiError::schema_mismatch(current.schema_ref(), schema));
    }
    let stored = db
        .query_opt(
            "SELECT client_generation, assigned_scopes, expired FROM synchro.synchro_client_state($1, $2)",
            &[&user_id, &client_id],
        )
        .await
        .map_err(|_| ApiError::unavailable())?
        .ok_or(ApiError::generation_expired(None))?;
    let stored_generation = stored.get::<_, i64>(0) as u64;
    if stored_generation != client_generation || stored.get::<_, bool>(2) {
        return Err(ApiError::generation_expired(Some(stored_generation)));
    }
    let stream = db
        .query_one("SELECT * FROM synchro.synchro_stream_state()", &[])
        .await
        .map_err(|_| ApiError::unavailable())?;
    let stream = ScopeStreamState {
        stream_generation: stream.get::<_, i64>(0) as u64,
        membership_generation: stream.get::<_, i64>(1) as u64,
        retention_generation: 1,
        resume_floor: 0,
        schema_hash: current.schema_hash(),
    };
    Ok(Gates {
        stored_assigned: stored.get::<_, Vec<String>>(1).into_iter().collect(),
        lineage,
        stream,
    })
}

/// Runs a pull for an authenticated user. Returns the 200 body or the wire error.
pub(crate) async fn pull(
    state: &AppState,
    user_id: &str,
    req: PullRequest,
) -> Result<Json, ApiError> {
    let db = &state.db;
    let Gates {
        lineage,
        stored_assigned,
        stream: scope_state,
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
    for (scope, token) in &req.cursors {
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
    let assigned = crate::http::assigned_scopes(state, user_id).await?;
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
        .map_err(|_| ApiError::unavailable())?;
    let scope_set_version: i64 = row.get(1);
    opened.retain(|s, _| assigned.contains(s));
    null_cursors.retain(|s| assigned.contains(s));
    rebuild.retain(|s| assigned.contains(s));

    // One read-only REPEATABLE READ snapshot for retention, effects, rows and digests.
    let mut snapshot_db = state.snapshot_db.lock().await;
    let snap = snapshot_db
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|_| ApiError::unavailable())?;
    let retention = snap
        .query(
            "SELECT scope_id, retention_generation, resume_floor, membership_generation
               FROM synchro.synchro_scope_retention($1)",
            &[&assigned.iter().cloned().collect::<Vec<_>>()],
        )
        .await
        .map_err(|_| ApiError::unavailable())?;
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
        .await
        .map_err(|_| ApiError::unavailable())?;
    let has_more = rows.len() as u64 > req.limit;
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
        let pk_json = Json::parse(&pk).map_err(|_| ApiError::unavailable())?;
        let mut change = vec![
            ("scope_id".to_owned(), Json::String(scope)),
            ("table_id".to_owned(), Json::String(table_id.clone())),
            ("pk".to_owned(), pk_json.clone()),
        ];
        match (kind.as_str(), row_json) {
            ("upsert", Some(text)) => {
                let row = Json::parse(&text).map_err(|_| ApiError::unavailable())?;
                let d = row_digest(current, &table_id, &pk_json, &row, &version)
                    .map_err(|_| ApiError::integrity())?;
                change.push(("op".into(), Json::String("upsert".into())));
                change.push(("row".into(), row));
                change.push(("server_version".into(), Json::String(version)));
                change.push((
                    "row_checksum".into(),
                    Json::parse(&Checksum(d.digest).to_json_string()).expect("checksum JSON"),
                ));
            }
            _ => {
                change.push(("op".into(), Json::String("delete".into())));
                change.push(("server_version".into(), Json::String(version)));
            }
        }
        changes.push(Json::Object(change));
    }
    if !has_more {
        // Every resumable scope is current through the snapshot's high-watermark.
        let hw: i64 = snap
            .query_one(
                "SELECT effect_position FROM synchro.synchro_pull_watermark()",
                &[],
            )
            .await
            .map_err(|_| ApiError::unavailable())?
            .get(0);
        for p in high.values_mut() {
            *p = (*p).max(hw as u64);
        }
    }
    let issued_at = now_datetime();
    let cursor_updates: Vec<(String, Json)> = high
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
            (scope.clone(), Json::String(c.sign(&state.cursor_keys)))
        })
        .collect();
    let strings = |items: Vec<&String>| {
        Json::Array(items.into_iter().map(|s| Json::String(s.clone())).collect())
    };
    let mut body = vec![
        ("protocol_version".to_owned(), Json::Number("3".into())),
        (
            "scope_set_version".to_owned(),
            Json::Number(scope_set_version.to_string()),
        ),
        (
            "scope_updates".to_owned(),
            Json::Object(vec![
                (
                    "added".into(),
                    strings(assigned.difference(&previous).collect()),
                ),
                (
                    "removed".into(),
                    strings(previous.difference(&assigned).collect()),
                ),
            ]),
        ),
        ("changes".to_owned(), Json::Array(changes)),
        ("has_more".to_owned(), Json::Bool(has_more)),
        (
            "scope_cursor_updates".to_owned(),
            Json::Object(cursor_updates),
        ),
        (
            "rebuild_scopes".to_owned(),
            strings(rebuild.iter().collect()),
        ),
    ];
    if !has_more {
        let mut checksums = Vec::new();
        for scope in &assigned {
            let digest = scope_checksum(&snap, current, scope).await?;
            checksums.push((
                scope.clone(),
                Json::parse(&digest.to_json_string()).expect("checksum JSON"),
            ));
        }
        body.push(("checksums".to_owned(), Json::Object(checksums)));
    }
    snap.commit().await.map_err(|_| ApiError::unavailable())?;
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
        .await
        .map_err(|_| ApiError::unavailable())?;
    }
    tracing::info!(
        status = 200,
        changes = rows.len().min(req.limit as usize),
        has_more,
        "pull"
    );
    Ok(Json::Object(body))
}

/// The scope digest of a scope's current membership in the current projection. Row
/// digests come from [`crate::digest_cache`]; only rows not digested before are read in
/// full (in the same snapshot) and digested.
pub(crate) async fn scope_checksum(
    db: &impl tokio_postgres::GenericClient,
    manifest: &synchro_protocol::manifest::Manifest,
    scope: &str,
) -> Result<Checksum, ApiError> {
    let schema_hash = manifest.schema_hash();
    let keys = db
        .query(
            "SELECT table_id, pk, server_version FROM synchro.synchro_scope_keys($1)",
            &[&scope],
        )
        .await
        .map_err(|_| ApiError::unavailable())?;
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
            Some(d) => {
                let table = manifest.table(table_id).ok_or_else(ApiError::integrity)?;
                let key = TypedValue::from_wire_text(&table.primary_key().spec, pk)
                    .map_err(|_| ApiError::integrity())?;
                entries.push((
                    RowIdentity::new(table, &key).map_err(|_| ApiError::integrity())?,
                    *d,
                ));
            }
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
            .map_err(|_| ApiError::unavailable())?;
        if rows.len() != missing_pks.len() {
            return Err(ApiError::integrity());
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
    let d = scope_digest(&schema_hash, scope, &mut entries, false)
        .map_err(|_| ApiError::integrity())?;
    Ok(Checksum(d.digest))
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
    let table = manifest.table(table_id).ok_or_else(ApiError::integrity)?;
    let pk = TypedValue::from_wire_text(&table.primary_key().spec, pk)
        .map_err(|_| ApiError::integrity())?;
    let row = Json::parse(row_json).map_err(|_| ApiError::integrity())?;
    let d = row_digest(manifest, table_id, &pk.to_wire(), &row, version)
        .map_err(|_| ApiError::integrity())?;
    Ok((
        RowIdentity::new(table, &pk).map_err(|_| ApiError::integrity())?,
        d.digest,
    ))
}

/// The scope digest over rows whose columns `first..first + 4` are `(table_id, pk,
/// row_json, server_version)`.
pub(crate) fn digest_columns(
    manifest: &synchro_protocol::manifest::Manifest,
    scope: &str,
    rows: &[tokio_postgres::Row],
    first: usize,
) -> Result<Checksum, ApiError> {
    let mut entries = Vec::with_capacity(rows.len());
    for r in rows {
        entries.push(row_entry(manifest, r, first)?);
    }
    let d = scope_digest(&manifest.schema_hash(), scope, &mut entries, false)
        .map_err(|_| ApiError::integrity())?;
    Ok(Checksum(d.digest))
}
