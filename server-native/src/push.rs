//! `POST /sync/push`: queued client intent applied to the application tables (spec 000
//! "Authored-Schema Queued Mutations", spec 003 "Exact Current Schema Gate and Authored
//! Mutation Schema", "Strict Positive Limits"; outcomes per notes/spec-gaps "ADR 002").
//!
//! Order: strict limits (400 before any work) → exact replay of a completed batch (its
//! stored outcomes, before the schema and generation gates, never writing) → exact current
//! schema (422) → current client generation (409) → one transaction for the whole batch,
//! each mutation in a savepoint:
//! 1. a mutation ID executed in an earlier batch gets that stored outcome again;
//! 2. authored-schema compatibility against the current manifest (`schema_incompatible`
//!    with the sorted incompatible field IDs, never values);
//! 3. writability and canonical values (`not_writable`, `invalid_value`);
//! 4. the compare-and-swap write through `synchro_push_write` against the source row's
//!    version (`conflict` when a newer write got there first);
//! 5. authorization by the row's scopes, evaluated with the table's membership function
//!    over the row before (when it exists) and after (insert, update) the write: a row
//!    that shares no scope with the user before the write is answered exactly like a
//!    missing row (`conflict` without row members), so a push never reveals whether an
//!    invisible row exists; a write that adds the row to any scope the user does not hold
//!    (a scope of the after-image the before-image lacked), or a new row the user could
//!    not see, is rolled back (`forbidden`).
//!
//! The batch's outcomes and fingerprint are stored in the same transaction as its writes:
//! a crash before the commit leaves nothing (a replay executes afresh); a lost response is
//! answered by exact replay. Writes go to the application tables, so capture delivers them
//! to every client like any other write.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};
use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::row_digest;
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Field, Manifest, Table};
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::TypedValue;
use tokio_postgres::Client;

use crate::http::{ApiError, AppState};

/// Push bounds (spec-gaps: the original project's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushLimits {
    /// Mutations per batch.
    pub mutations: usize,
    /// Bytes of one mutation in canonical JSON.
    pub mutation_bytes: usize,
    /// Columns per mutation.
    pub columns: usize,
}

impl Default for PushLimits {
    fn default() -> Self {
        PushLimits {
            mutations: 1000,
            mutation_bytes: 65_536,
            columns: 256,
        }
    }
}

struct Mutation {
    mutation_id: String,
    table_id: String,
    pk: Json,
    operation: String,
    base_version: Option<String>,
    columns: Vec<(String, Json)>,
    authored: (u64, String),
}

struct Request {
    client_id: String,
    client_generation: u64,
    schema: Json,
    batch_id: String,
    fingerprint: String,
    mutations: Vec<Mutation>,
}

fn bad(message: &'static str) -> ApiError {
    ApiError::invalid_request(message)
}

fn text(v: Option<&Json>, max: usize) -> Option<String> {
    v.and_then(Json::as_str)
        .filter(|s| !s.is_empty() && s.len() <= max)
        .map(str::to_owned)
}

fn parse(req: &Json, limits: &PushLimits) -> Result<Request, ApiError> {
    let client_id = text(req.get("client_id"), 256)
        .ok_or_else(|| bad("client_id must be a nonempty string of at most 256 bytes"))?;
    let client_generation = req
        .get("client_generation")
        .and_then(crate::http::positive_integer)
        .ok_or_else(|| bad("client_generation must be a positive integer"))?;
    let batch_id =
        text(req.get("batch_id"), 128).ok_or_else(|| bad("batch_id must be a nonempty string"))?;
    let Some(Json::Array(items)) = req.get("mutations") else {
        return Err(bad("mutations must be an array"));
    };
    if items.is_empty() || items.len() > limits.mutations {
        return Err(bad("the batch has too many or no mutations"));
    }
    let mut seen = BTreeSet::new();
    let mut mutations = Vec::with_capacity(items.len());
    for m in items {
        if to_output_string(m).len() > limits.mutation_bytes {
            return Err(bad("a mutation exceeds the configured size"));
        }
        let mutation_id = text(m.get("mutation_id"), 128)
            .ok_or_else(|| bad("mutation_id must be a nonempty string"))?;
        if !seen.insert(mutation_id.clone()) {
            return Err(bad("a mutation_id appears twice"));
        }
        let table_id = text(m.get("table_id"), 256).ok_or_else(|| bad("table_id is required"))?;
        let pk = m.get("pk").cloned().ok_or_else(|| bad("pk is required"))?;
        let operation = match m.get("operation").and_then(Json::as_str) {
            Some(op @ ("insert" | "update" | "delete")) => op.to_owned(),
            _ => return Err(bad("operation must be insert, update or delete")),
        };
        let base_version = match m.get("base_version") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => return Err(bad("base_version must be a string or null")),
        };
        if m.get("client_version")
            .and_then(crate::http::positive_integer)
            .is_none()
            || m.get("local_order")
                .and_then(crate::http::positive_integer)
                .is_none()
        {
            return Err(bad(
                "client_version and local_order must be positive integers",
            ));
        }
        let Some(Json::Array(cols)) = m.get("columns") else {
            return Err(bad("columns must be an array"));
        };
        if cols.len() > limits.columns {
            return Err(bad("a mutation has too many columns"));
        }
        let mut columns = Vec::with_capacity(cols.len());
        let mut fields = BTreeSet::new();
        for c in cols {
            let field_id =
                text(c.get("field_id"), 256).ok_or_else(|| bad("field_id is required"))?;
            if !fields.insert(field_id.clone()) {
                return Err(bad("a field appears twice in one mutation"));
            }
            let value = c
                .get("value")
                .cloned()
                .ok_or_else(|| bad("value is required"))?;
            columns.push((field_id, value));
        }
        if operation == "delete" && !columns.is_empty() {
            return Err(bad("a delete has no columns"));
        }
        let authored = m.get("authored_schema");
        let version = authored
            .and_then(|a| a.get("version"))
            .and_then(crate::http::positive_integer);
        let hash = authored
            .and_then(|a| a.get("hash"))
            .and_then(Json::as_str)
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        let (Some(version), Some(hash)) = (version, hash) else {
            return Err(bad("authored_schema must be {version, hash}"));
        };
        mutations.push(Mutation {
            mutation_id,
            table_id,
            pk,
            operation,
            base_version,
            columns,
            authored: (version, hash.to_owned()),
        });
    }
    let schema = req.get("schema").cloned().unwrap_or(Json::Null);
    // The batch's identity: its ID, request schema and mutations (not the generation, so a
    // replay after a generation change is still exact).
    let content = Json::Object(vec![
        ("batch_id".into(), Json::String(batch_id.clone())),
        ("mutations".into(), Json::Array(items.clone())),
        ("schema".into(), schema.clone()),
    ]);
    let fingerprint = hex::encode(Sha256::digest(to_output_string(&content).as_bytes()));
    Ok(Request {
        client_id,
        client_generation,
        schema,
        batch_id,
        fingerprint,
        mutations,
    })
}

fn s(v: &str) -> Json {
    Json::String(v.to_owned())
}

fn schema_ref_json(version: u64, hash: &str) -> Json {
    Json::Object(vec![
        ("version".into(), Json::Number(version.to_string())),
        ("hash".into(), s(hash)),
    ])
}

fn outcome(mutation_id: &str, status: &str, members: Vec<(&str, Json)>) -> Json {
    let mut o = vec![
        ("mutation_id".to_owned(), s(mutation_id)),
        ("status".to_owned(), s(status)),
    ];
    o.extend(members.into_iter().map(|(k, v)| (k.to_owned(), v)));
    Json::Object(o)
}

fn rejected(mutation_id: &str, code: &str, message: &str) -> Json {
    outcome(
        mutation_id,
        "rejected_terminal",
        vec![
            ("code", s(code)),
            ("message", s(message)),
            ("retryable", Json::Bool(false)),
        ],
    )
}

/// The conflict outcome of an update or delete whose row does not exist (also given for
/// a row the user cannot see).
fn missing_row_conflict(mutation_id: &str) -> Json {
    outcome(
        mutation_id,
        "conflict",
        vec![
            ("code", s("version_conflict")),
            ("message", s("the row changed since the base version")),
            ("retryable", Json::Bool(false)),
        ],
    )
}

/// Whether `authored` can be written as `current` (same type; a decimal no narrower).
fn compatible(authored: &FieldSpec, current: &FieldSpec) -> bool {
    if authored.ty != current.ty {
        return false;
    }
    match (authored.decimal, current.decimal) {
        (Some(a), Some(c)) => c.scale >= a.scale && c.precision - c.scale >= a.precision - a.scale,
        (None, None) => true,
        _ => false,
    }
}

/// The key's text input form (its wire string or number token).
fn key_text(pk: &Json) -> Option<String> {
    match pk {
        Json::String(v) => Some(v.clone()),
        Json::Number(t) => Some(t.clone()),
        _ => None,
    }
}

/// A value's PostgreSQL text input form; `None` for null.
fn input_text(v: &TypedValue) -> Option<String> {
    use synchro_protocol::value::Scalar;
    Some(match v.scalar()? {
        Scalar::String(x)
        | Scalar::Decimal(x)
        | Scalar::Datetime(x)
        | Scalar::Date(x)
        | Scalar::Time(x)
        | Scalar::Json(x) => x.clone(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Int64(i) => i.to_string(),
        Scalar::Float(f) => format!("{f:e}"),
        Scalar::Boolean(b) => b.to_string(),
        Scalar::Bytes(b) => format!("\\x{}", hex::encode(b)),
    })
}

/// A source row's fields as text (null for SQL NULL), in attnum order.
type Image = Vec<Option<String>>;

/// A row (by field ID) from a text image of the table's fields in attnum order.
fn row_from_image(
    table: &Table,
    fields: &[(String, u32)],
    image: &[Option<String>],
) -> Result<Json, ApiError> {
    if image.len() != fields.len() {
        return Err(ApiError::unavailable());
    }
    let mut row = Vec::with_capacity(fields.len());
    for ((field_id, oid), text) in fields.iter().zip(image) {
        let Some(field) = table.field(field_id) else {
            continue;
        };
        // `::text` of a boolean is true/false where the output function (pgoutput's form)
        // gives t/f; every other synced type casts through its output function.
        let text = match (field.spec.ty, text.as_deref()) {
            (PortableType::Boolean, Some("true")) => Some("t"),
            (PortableType::Boolean, Some("false")) => Some("f"),
            (_, t) => t,
        };
        let value = match text {
            None => Json::Null,
            Some(t) => crate::capture::values::text_to_wire(&field.spec, *oid, t.as_bytes())
                .map_err(|_| ApiError::integrity())?
                .to_wire(),
        };
        row.push((field_id.clone(), value));
    }
    Ok(Json::Object(row))
}

/// The scopes the table's live membership function gives `row` (its key `pk_wire`),
/// evaluated on the worker-role connection with the row placed in the projection inside a
/// transaction that is rolled back, as the function's owner (never synchro's roles).
async fn candidate_scopes(
    db: &mut Client,
    relation_id: &str,
    pk_wire: &str,
    key: &str,
    row_json: &str,
) -> Result<BTreeSet<String>, ApiError> {
    let fail = |_| ApiError::unavailable();
    let tx = db.transaction().await.map_err(fail)?;
    tx.batch_execute("SET LOCAL ROLE synchro_worker")
        .await
        .map_err(fail)?;
    let Some(f) = tx
        .query_opt(
            "SELECT m.function_oid::regproc::text, r.primary_key_type::regtype::text,
                    pg_catalog.pg_get_userbyid(p.proowner)::text
               FROM synchro.membership_functions m JOIN synchro.relations r USING (relation_id)
               JOIN pg_catalog.pg_proc p ON p.oid = m.function_oid
              WHERE r.relation_id = $1 AND m.live",
            &[&relation_id],
        )
        .await
        .map_err(fail)?
    else {
        // No membership rule: the row would be in no scope.
        return Ok(BTreeSet::new());
    };
    let (function, key_type, owner): (String, String, String) = (f.get(0), f.get(1), f.get(2));
    tx.execute(
        "INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
         VALUES ($1, $2, $3, '0')
         ON CONFLICT (relation_id, pk) DO UPDATE SET row_json = EXCLUDED.row_json",
        &[&relation_id, &pk_wire, &row_json],
    )
    .await
    .map_err(fail)?;
    tx.batch_execute(&format!(
        "SET LOCAL ROLE {}",
        crate::install::quote_ident(&owner)
    ))
    .await
    .map_err(fail)?;
    let rows = tx
        .query(
            &format!("SELECT s::text FROM {function}($1::text::{key_type}) AS s"),
            &[&key],
        )
        .await
        .map_err(fail)?;
    let scopes = rows
        .iter()
        .filter_map(|r| r.get::<_, Option<String>>(0))
        .collect();
    tx.rollback().await.map_err(fail)?;
    Ok(scopes)
}

/// Handles one push request body for `user_id`.
pub(crate) async fn push(state: &AppState, user_id: &str, req: &Json) -> Result<Json, ApiError> {
    let r = parse(req, &state.config.push_limits)?;
    let Some(membership) = state.membership_db.as_ref() else {
        return Err(ApiError::unavailable_because("push_unavailable"));
    };
    // Exact replay of a completed batch: before the schema and generation gates.
    if let Some(row) = state
        .db
        .query_opt(
            "SELECT fingerprint, outcomes FROM synchro.synchro_push_lookup($1, $2, $3)",
            &[&user_id, &r.client_id, &r.batch_id],
        )
        .await
        .map_err(|_| ApiError::unavailable())?
    {
        let (fingerprint, outcomes): (String, String) = (row.get(0), row.get(1));
        if fingerprint != r.fingerprint {
            return Err(bad("batch_id was already used for a different batch"));
        }
        tracing::info!(status = 200, replay = true, "push");
        return Json::parse(&outcomes).map_err(|_| ApiError::unavailable());
    }
    let gates =
        crate::pull::gates(state, user_id, &r.client_id, r.client_generation, &r.schema).await?;
    let current = gates
        .lineage
        .current()
        .ok_or_else(ApiError::unavailable)?
        .clone();
    let assigned = crate::http::assigned_scopes(state, user_id).await?;

    let mut conn = state.snapshot_db.lock().await;
    let tx = conn
        .transaction()
        .await
        .map_err(|_| ApiError::unavailable())?;
    let mut membership = membership.lock().await;
    let mut outcomes = Vec::with_capacity(r.mutations.len());
    for m in &r.mutations {
        let stored: Option<String> = tx
            .query_one(
                "SELECT synchro.synchro_push_mutation_outcome($1, $2, $3)",
                &[&user_id, &r.client_id, &m.mutation_id],
            )
            .await
            .map_err(|_| ApiError::unavailable())?
            .get(0);
        if let Some(o) = stored {
            outcomes.push(Json::parse(&o).map_err(|_| ApiError::unavailable())?);
            continue;
        }
        let o = execute(&tx, &mut membership, &gates.lineage, &current, &assigned, m).await?;
        outcomes.push(o);
    }
    let body = Json::Object(vec![
        ("protocol_version".into(), Json::Number("3".into())),
        ("batch_id".into(), s(&r.batch_id)),
        ("outcomes".into(), Json::Array(outcomes.clone())),
    ]);
    let ids: Vec<&str> = r.mutations.iter().map(|m| m.mutation_id.as_str()).collect();
    let texts: Vec<String> = outcomes.iter().map(to_output_string).collect();
    tx.execute(
        "SELECT synchro.synchro_push_record($1, $2, $3, $4, $5, $6, $7)",
        &[
            &user_id,
            &r.client_id,
            &r.batch_id,
            &r.fingerprint,
            &to_output_string(&body),
            &ids,
            &texts,
        ],
    )
    .await
    .map_err(|_| ApiError::unavailable())?;
    tx.commit().await.map_err(|_| ApiError::unavailable())?;
    tracing::info!(status = 200, mutations = ids.len(), "push");
    Ok(body)
}

/// Evaluates and (when everything allows it) performs one mutation.
async fn execute(
    tx: &tokio_postgres::Transaction<'_>,
    membership: &mut Client,
    lineage: &synchro_protocol::lineage::Lineage,
    current: &Manifest,
    assigned: &BTreeSet<String>,
    m: &Mutation,
) -> Result<Json, ApiError> {
    let id = m.mutation_id.as_str();
    let authored = lineage
        .manifests()
        .find(|a| a.schema_version == m.authored.0 && a.schema_hash_hex() == m.authored.1);
    let Some(authored) = authored else {
        return Ok(rejected(
            id,
            "invalid_authored_schema",
            "the authored schema is not in this server's manifest history",
        ));
    };
    // Authored-schema compatibility against the current manifest.
    let incompatible = |ids: Vec<String>| {
        let mut ids = ids;
        ids.sort();
        outcome(
            id,
            "rejected_terminal",
            vec![
                ("code", s("schema_incompatible")),
                (
                    "message",
                    s("authored mutation cannot be represented by the current schema"),
                ),
                ("retryable", Json::Bool(false)),
                (
                    "outcome_schema",
                    schema_ref_json(current.schema_version, &current.schema_hash_hex()),
                ),
                (
                    "authored_schema",
                    schema_ref_json(authored.schema_version, &authored.schema_hash_hex()),
                ),
                (
                    "current_schema",
                    schema_ref_json(current.schema_version, &current.schema_hash_hex()),
                ),
                (
                    "incompatible_field_ids",
                    Json::Array(ids.into_iter().map(Json::String).collect()),
                ),
            ],
        )
    };
    let Some(table) = current.table(&m.table_id) else {
        let ids = m.columns.iter().map(|(f, _)| f.clone()).collect();
        return Ok(incompatible(if m.operation == "delete" {
            Vec::new()
        } else {
            ids
        }));
    };
    let authored_table = authored.table(&m.table_id);
    let mut bad_fields = Vec::new();
    let mut fields: Vec<&Field> = Vec::with_capacity(m.columns.len());
    for (field_id, _) in &m.columns {
        let a = authored_table.and_then(|t| t.field(field_id));
        match (a, table.field(field_id)) {
            (Some(a), Some(c)) if compatible(&a.spec, &c.spec) => fields.push(c),
            _ => bad_fields.push(field_id.clone()),
        }
    }
    let key_ok = authored_table
        .map(|t| compatible(&t.primary_key().spec, &table.primary_key().spec))
        .unwrap_or(false);
    if !key_ok {
        bad_fields.push(table.primary_key_field_id.clone());
    }
    if !bad_fields.is_empty() {
        return Ok(incompatible(bad_fields));
    }
    if fields
        .iter()
        .any(|f| !f.writable || f.field_id == table.primary_key_field_id)
    {
        return Ok(rejected(id, "not_writable", "a field is not writable"));
    }
    // Canonical values. PostgreSQL text cannot hold NUL (binding one fails the statement).
    if crate::http::has_nul(&m.pk) || m.columns.iter().any(|(_, v)| crate::http::has_nul(v)) {
        return Ok(rejected(
            id,
            "invalid_value",
            "a value contains a NUL character, which the database cannot store",
        ));
    }
    let Ok(pk) = TypedValue::from_wire(&table.primary_key().spec, &m.pk) else {
        return Ok(rejected(
            id,
            "invalid_value",
            "the key is not a canonical value of its type",
        ));
    };
    let mut values = Vec::with_capacity(m.columns.len());
    for ((_, v), f) in m.columns.iter().zip(&fields) {
        match TypedValue::from_wire(&f.spec, v) {
            Ok(t) => values.push(input_text(&t)),
            Err(_) => {
                return Ok(rejected(
                    id,
                    "invalid_value",
                    "a value is not a canonical value of its field",
                ))
            }
        }
    }
    let key = key_text(&pk.to_wire()).ok_or_else(ApiError::integrity)?;
    let pk_wire = pk.to_wire_text();
    let field_ids: Vec<&str> = fields.iter().map(|f| f.field_id.as_str()).collect();
    let image_fields: Vec<(String, u32)> = tx
        .query(
            "SELECT field_id, type_oid FROM synchro.synchro_push_fields($1)",
            &[&table.relation_id],
        )
        .await
        .map_err(|_| ApiError::unavailable())?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    tx.batch_execute("SAVEPOINT synchro_mutation")
        .await
        .map_err(|_| ApiError::unavailable())?;
    let row = tx
        .query_one(
            "SELECT status, version, pre_image, post_image FROM synchro.synchro_push_write($1, $2, $3, $4, $5, $6, $7)",
            &[
                &table.relation_id,
                &m.operation,
                &key,
                &pk_wire,
                &m.base_version,
                &field_ids,
                &values,
            ],
        )
        .await
        .map_err(|_| ApiError::unavailable())?;
    let (status, version): (String, Option<String>) = (row.get(0), row.get(1));
    let (pre, post): (Option<Image>, Option<Image>) = (row.get(2), row.get(3));
    let rollback = || async {
        tx.batch_execute("ROLLBACK TO SAVEPOINT synchro_mutation")
            .await
            .map_err(|_| ApiError::unavailable())
    };
    // Authorization by the row's scopes before the write (when the row exists) and after
    // it (insert, update). A row outside every scope of the user is answered exactly like
    // a missing row, so a push never tells whether an invisible row exists. A write may
    // not put the row into a scope the user does not hold: every scope of the after-image
    // that the before-image lacked must be the user's (and a new row must be visible to
    // its author).
    let mut pre_row = None;
    let mut pre_scopes = BTreeSet::new();
    if let Some(image) = &pre {
        let r = row_from_image(table, &image_fields, image)?;
        pre_scopes = candidate_scopes(
            membership,
            &table.relation_id,
            &pk_wire,
            &key,
            &to_output_string(&r),
        )
        .await?;
        if pre_scopes.is_disjoint(assigned) {
            rollback().await?;
            return Ok(missing_row_conflict(id));
        }
        pre_row = Some(r);
    }
    let mut post_row = None;
    if status == "applied" {
        if let Some(image) = &post {
            let r = row_from_image(table, &image_fields, image)?;
            let post_scopes = candidate_scopes(
                membership,
                &table.relation_id,
                &pk_wire,
                &key,
                &to_output_string(&r),
            )
            .await?;
            let adds_foreign_scope = post_scopes
                .difference(&pre_scopes)
                .any(|scope| !assigned.contains(scope));
            let invisible_new_row = pre.is_none() && post_scopes.is_disjoint(assigned);
            if adds_foreign_scope || invisible_new_row {
                rollback().await?;
                return Ok(rejected(
                    id,
                    "forbidden",
                    "the write would place the row outside the user's scopes",
                ));
            }
            post_row = Some(r);
        }
    }
    let row_bearing = |row: Json, version: &str| -> Result<Vec<(&'static str, Json)>, ApiError> {
        let d = row_digest(current, &table.table_id, &pk.to_wire(), &row, version)
            .map_err(|_| ApiError::integrity())?;
        Ok(vec![
            ("server_version", s(version)),
            ("row", row),
            (
                "row_checksum",
                Json::parse(&Checksum(d.digest).to_json_string()).expect("checksum JSON"),
            ),
        ])
    };
    match status.as_str() {
        "applied" => {
            tx.batch_execute("RELEASE SAVEPOINT synchro_mutation")
                .await
                .map_err(|_| ApiError::unavailable())?;
            let version = version.ok_or_else(ApiError::integrity)?;
            let members = match post_row {
                Some(row) => row_bearing(row, &version)?,
                None => vec![("server_version", s(&version))],
            };
            Ok(outcome(id, "applied", members))
        }
        "conflict" => {
            rollback().await?;
            let Json::Object(mut members) = missing_row_conflict(id) else {
                unreachable!("an outcome is an object")
            };
            if let (Some(row), Some(version)) = (pre_row, version) {
                members.extend(
                    row_bearing(row, &version)?
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v)),
                );
            }
            Ok(Json::Object(members))
        }
        "not_writable" => {
            rollback().await?;
            Ok(rejected(
                id,
                "not_writable",
                "the table or a field is not writable",
            ))
        }
        "invalid_value" => {
            rollback().await?;
            Ok(rejected(
                id,
                "invalid_value",
                "a value cannot be represented",
            ))
        }
        _ => {
            rollback().await?;
            Ok(rejected(
                id,
                "constraint_violation",
                "the database refused the write",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_widen_but_never_narrow() {
        let d = |p, s| FieldSpec::decimal(true, p, s).unwrap();
        assert!(compatible(&d(10, 2), &d(12, 2)));
        assert!(compatible(&d(10, 2), &d(11, 3)));
        assert!(!compatible(&d(10, 2), &d(10, 1)));
        assert!(!compatible(&d(10, 2), &d(10, 3)));
        let plain = FieldSpec::new(PortableType::Int, true).unwrap();
        assert!(!compatible(
            &plain,
            &FieldSpec::new(PortableType::Int64, true).unwrap()
        ));
        assert!(compatible(
            &plain,
            &FieldSpec::new(PortableType::Int, false).unwrap()
        ));
    }
}
