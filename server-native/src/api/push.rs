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

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use synchro_protocol::wire::{
    AuthoredSchema, Incompatible, Message, Mutation, Operation, Outcome, OutcomeRow, PushRequest,
    PushResponse,
};

use super::{ApiError, AppState};

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

fn bad(message: &'static str) -> ApiError {
    ApiError::invalid_request(message)
}

/// The server's bounds on a request the wire type already read, and the batch's identity:
/// the SHA-256 of the canonical `{batch_id, mutations, schema}` (not the generation, so a
/// replay after a generation change is still exact).
fn check_limits(r: &PushRequest, limits: &PushLimits) -> Result<String, ApiError> {
    if r.mutations.len() > limits.mutations {
        return Err(bad("the batch has too many or no mutations"));
    }
    let mutations: Vec<Json> = r.mutations.iter().map(Mutation::to_json).collect();
    for m in &r.mutations {
        if m.columns.len() > limits.columns {
            return Err(bad("a mutation has too many columns"));
        }
    }
    if mutations
        .iter()
        .any(|m| to_output_string(m).len() > limits.mutation_bytes)
    {
        return Err(bad("a mutation exceeds the configured size"));
    }
    let content = Json::Object(vec![
        ("batch_id".into(), Json::String(r.batch_id.clone())),
        ("mutations".into(), Json::Array(mutations)),
        ("schema".into(), r.schema.clone()),
    ]);
    Ok(hex::encode(Sha256::digest(
        to_output_string(&content).as_bytes(),
    )))
}

fn schema_ref(version: u64, hash: String) -> AuthoredSchema {
    AuthoredSchema { version, hash }
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
    // Exact replay of a completed batch: before the schema and generation gates.
    if let Some(row) = state
        .db
        .query_opt(
            "SELECT fingerprint, outcomes FROM synchro.synchro_push_lookup($1, $2, $3)",
            &[&user_id, &r.client_id, &r.batch_id],
        )
        .await?
    {
        let (stored, body): (String, String) = (row.get(0), row.get(1));
        if stored != fingerprint {
            return Err(bad("batch_id was already used for a different batch"));
        }
        tracing::info!(status = 200, replay = true, "push");
        return Ok(json_text_response(body));
    }
    let ids: Vec<&str> = r.mutations.iter().map(|m| m.mutation_id.as_str()).collect();
    let authored: Vec<i64> = r
        .mutations
        .iter()
        .map(|m| m.authored_schema.version as i64)
        .collect();
    let gates =
        match super::gates(state, user_id, &r.client_id, r.client_generation, &r.schema).await {
            Ok(g) => g,
            Err(e) => {
                // The intents stay queued at the client: the rollout advisor counts them.
                let _ = state
                    .db
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
    let assigned = super::assigned_scopes(state, user_id).await?;

    let mut conn = state.snapshot_db.lock().await;
    let tx = conn.transaction().await?;
    let mut membership = membership.lock().await;
    let mut outcomes = Vec::with_capacity(r.mutations.len());
    for m in &r.mutations {
        let stored: Option<String> = tx
            .query_one(
                "SELECT synchro.synchro_push_mutation_outcome($1, $2, $3)",
                &[&user_id, &r.client_id, &m.mutation_id],
            )
            .await?
            .get(0);
        if let Some(o) = stored {
            let o = Json::parse(&o)
                .ok()
                .and_then(|j| Outcome::from_json(&j).ok())
                .ok_or_else(ApiError::integrity)?;
            outcomes.push(o);
            continue;
        }
        let o = execute(&tx, &mut membership, &gates.lineage, &current, &assigned, m).await?;
        outcomes.push(o);
    }
    let body = PushResponse {
        batch_id: r.batch_id.clone(),
        outcomes,
    };
    let texts: Vec<String> = body
        .outcomes
        .iter()
        .map(|o| to_output_string(&o.to_json()))
        .collect();
    let text = body.to_json_string();
    tx.execute(
        "SELECT synchro.synchro_push_record($1, $2, $3, $4, $5, $6, $7)",
        &[
            &user_id,
            &r.client_id,
            &r.batch_id,
            &fingerprint,
            &text,
            &ids,
            &texts,
        ],
    )
    .await?;
    tx.execute(
        "SELECT synchro.synchro_push_seen($1, $2, $3, $4, true)",
        &[&user_id, &r.client_id, &ids, &authored],
    )
    .await?;
    tx.commit().await?;
    tracing::info!(status = 200, mutations = ids.len(), "push");
    Ok(json_text_response(text))
}

/// Evaluates and (when everything allows it) performs one mutation.
async fn execute(
    tx: &tokio_postgres::Transaction<'_>,
    membership: &mut Client,
    lineage: &synchro_protocol::lineage::Lineage,
    current: &Manifest,
    assigned: &BTreeSet<String>,
    m: &Mutation,
) -> Result<Outcome, ApiError> {
    let id = m.mutation_id.as_str();
    let authored = lineage.manifests().find(|a| {
        a.schema_version == m.authored_schema.version
            && a.schema_hash_hex() == m.authored_schema.hash
    });
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
        Outcome::Rejected {
            mutation_id: id.to_owned(),
            code: "schema_incompatible".to_owned(),
            message: "authored mutation cannot be represented by the current schema".to_owned(),
            incompatible: Some(Incompatible {
                outcome_schema: schema_ref(current.schema_version, current.schema_hash_hex()),
                authored_schema: schema_ref(authored.schema_version, authored.schema_hash_hex()),
                current_schema: schema_ref(current.schema_version, current.schema_hash_hex()),
                incompatible_field_ids: ids,
            }),
        }
    };
    let Some(table) = current.table(&m.table_id) else {
        let ids = m.columns.iter().map(|c| c.field_id.clone()).collect();
        return Ok(incompatible(if m.operation == Operation::Delete {
            Vec::new()
        } else {
            ids
        }));
    };
    let authored_table = authored.table(&m.table_id);
    let mut bad_fields = Vec::new();
    let mut fields: Vec<&Field> = Vec::with_capacity(m.columns.len());
    for field_id in m.columns.iter().map(|c| &c.field_id) {
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
    if super::has_nul(&m.pk) || m.columns.iter().any(|c| super::has_nul(&c.value)) {
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
    for (c, f) in m.columns.iter().zip(&fields) {
        match TypedValue::from_wire(&f.spec, &c.value) {
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
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    tx.batch_execute("SAVEPOINT synchro_mutation").await?;
    let row = tx
        .query_one(
            "SELECT status, version, pre_image, post_image FROM synchro.synchro_push_write($1, $2, $3, $4, $5, $6, $7)",
            &[
                &table.relation_id,
                &m.operation.as_str(),
                &key,
                &pk_wire,
                &m.base_version,
                &field_ids,
                &values,
            ],
        )
        .await
        ?;
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
    let digest = |row: &Json, version: &str| -> Result<Checksum, ApiError> {
        row_digest(current, &table.table_id, &pk.to_wire(), row, version)
            .map(|d| Checksum(d.digest))
            .map_err(|_| ApiError::integrity())
    };
    match status.as_str() {
        "applied" => {
            tx.batch_execute("RELEASE SAVEPOINT synchro_mutation")
                .await?;
            let version = version.ok_or_else(ApiError::integrity)?;
            let row = match post_row {
                Some(row) => {
                    let c = digest(&row, &version)?;
                    Some((row, c))
                }
                None => None,
            };
            Ok(Outcome::Applied {
                mutation_id: id.to_owned(),
                server_version: version,
                row,
            })
        }
        "conflict" => {
            rollback().await?;
            let mut conflict = missing_row_conflict(id);
            if let (Some(row), Some(version)) = (pre_row, version) {
                if let Outcome::Conflict { current, .. } = &mut conflict {
                    *current = Some(OutcomeRow {
                        row_checksum: digest(&row, &version)?,
                        server_version: version,
                        row,
                    });
                }
            }
            Ok(conflict)
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
