//! Relation registration through `synchro.synchro_register_relation` (the SQL entry point
//! synchro_operator executes; the CLI calls the same function).

use serde_json::Value;
use tokio_postgres::Client;

/// What to register.
#[derive(Debug, Clone)]
pub struct RegisterRequest {
    /// Exact schema name.
    pub schema: String,
    /// Exact relation name.
    pub relation: String,
    /// `synced` or `capture_dependency`.
    pub kind: String,
    /// `single_scope` or `multi_scope` (synced only).
    pub composition: String,
    /// Whether clients may push to it.
    pub push_enabled: bool,
    /// Membership fanout bound.
    pub fanout_bound: i32,
    /// Impact bound.
    pub impact_bound: i32,
    /// Client-visible table name (default: the relation name).
    pub table_name: Option<String>,
}

impl RegisterRequest {
    /// A synced registration with default bounds.
    pub fn synced(schema: &str, relation: &str, composition: &str) -> RegisterRequest {
        RegisterRequest {
            schema: schema.into(),
            relation: relation.into(),
            kind: "synced".into(),
            composition: composition.into(),
            push_enabled: true,
            fanout_bound: 1000,
            impact_bound: 1000,
            table_name: None,
        }
    }
}

/// A registration failure.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The spec's administrative error: `{"error":{"code":"invalid_registration","reason",...}}`.
    #[error("invalid registration: {0}")]
    Invalid(Value, String),
    /// Any other database failure (permissions, connection).
    #[error("registration failed: {0}")]
    Database(String),
}

impl RegistrationError {
    /// The `reason` of an invalid registration.
    pub fn reason(&self) -> Option<&str> {
        match self {
            RegistrationError::Invalid(v, _) => v["error"]["reason"].as_str(),
            RegistrationError::Database(_) => None,
        }
    }

    /// The SQLSTATE, when the database gave one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            RegistrationError::Invalid(_, code) => Some(code),
            RegistrationError::Database(_) => None,
        }
    }
}

/// Registers one relation; returns `{"relation_id","table_id"?,"fields":[...]}`.
pub async fn register(db: &Client, r: &RegisterRequest) -> Result<Value, RegistrationError> {
    let row = db
        .query_one(
            "SELECT synchro.synchro_register_relation($1, $2, $3, $4, $5, $6, $7, $8)::text",
            &[
                &r.schema,
                &r.relation,
                &r.kind,
                &r.composition,
                &r.push_enabled,
                &r.fanout_bound,
                &r.impact_bound,
                &r.table_name,
            ],
        )
        .await
        .map_err(|e| match e.as_db_error() {
            Some(d) if d.message().starts_with("invalid_registration") => {
                let body = d
                    .detail()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or(Value::Null);
                RegistrationError::Invalid(body, d.code().code().to_owned())
            }
            _ => RegistrationError::Database(crate::install::describe(&e)),
        })?;
    let text: String = row.get(0);
    serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))
}
