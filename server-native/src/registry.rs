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
    /// Columns that are not synced: server-only, or without a portable type (never the key).
    pub server_only: Vec<String>,
    /// Server-owned lifecycle columns: `created_at`, `updated_at`, `deleted_at` → column.
    pub lifecycle: std::collections::BTreeMap<String, String>,
    /// How `timestamp` (without time zone) columns are read: column (or `*` for every one) →
    /// a time zone name, or `text` (a string of PostgreSQL's text); UTC when not named.
    pub timestamp_zones: std::collections::BTreeMap<String, String>,
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
            server_only: Vec::new(),
            lifecycle: Default::default(),
            timestamp_zones: Default::default(),
        }
    }
}

/// A registration failure.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The spec's administrative error, `{"error":{"code":"invalid_registration","reason",...}}`
    /// with a reason of its closed list, or a column refusal the list has no entry for,
    /// `{"error":{"code":"invalid_column","reason":"unsupported_column_type"|"missing_field"|
    /// "unrepresentable_value","column",...}}`.
    /// With the SQLSTATE, and the hint for a person (why, and the way out) when the database
    /// gave one.
    #[error("invalid registration: {0}")]
    Invalid(Value, String, Option<String>),
    /// Any other database failure (permissions, connection).
    #[error("registration failed: {0}")]
    Database(String),
}

impl RegistrationError {
    /// The `reason` of an invalid registration.
    pub fn reason(&self) -> Option<&str> {
        match self {
            RegistrationError::Invalid(v, ..) => v["error"]["reason"].as_str(),
            RegistrationError::Database(_) => None,
        }
    }

    /// The SQLSTATE, when the database gave one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            RegistrationError::Invalid(_, code, _) => Some(code),
            RegistrationError::Database(_) => None,
        }
    }
}

/// Whether a registry transaction lost a deadlock or a serialization conflict (with the
/// capture worker: its activation and rule evaluations lock the projection and its views in
/// the opposite order). PostgreSQL rolled it back whole; it is run again.
fn conflicted(e: &RegistrationError) -> bool {
    // `install::describe` writes "<message> (SQLSTATE <code>)", then "; <hint>" when there is
    // one (a deadlock's is "See server log for query details.").
    matches!(e, RegistrationError::Database(m)
        if m.contains("(SQLSTATE 40P01)") || m.contains("(SQLSTATE 40001)"))
}

/// A failure of the publish step: its database error's message and SQLSTATE when it was
/// one (so a conflict is recognized), else the whole chain.
fn from_anyhow(e: anyhow::Error) -> RegistrationError {
    match e
        .chain()
        .find_map(|c| c.downcast_ref::<tokio_postgres::Error>())
        .filter(|pg| pg.as_db_error().is_some())
    {
        Some(pg) => RegistrationError::Database(crate::install::describe(pg)),
        None => RegistrationError::Database(format!("{e:#}")),
    }
}

/// Attempts of a registry transaction that conflicted (see [`conflicted`]).
const ATTEMPTS: u64 = 5;

/// Awaits `$attempt` (an expression evaluated afresh each time) again while it fails with
/// a conflict, backing off 50 ms more each time, at most [`ATTEMPTS`] times.
macro_rules! retrying {
    ($attempt:expr) => {{
        let mut attempt = 1;
        loop {
            match $attempt.await {
                Err(e) if attempt < ATTEMPTS && conflicted(&e) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                    attempt += 1;
                }
                outcome => break outcome,
            }
        }
    }};
}

/// [`retrying`] for an outcome whose error carries the index of the request it refused.
macro_rules! retrying_many {
    ($attempt:expr) => {{
        let mut attempt = 1;
        loop {
            match $attempt.await {
                Err((_, e)) if attempt < ATTEMPTS && conflicted(&e) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                    attempt += 1;
                }
                outcome => break outcome,
            }
        }
    }};
}

/// Registers one relation; returns `{"relation_id","table_id"?,"fields":[...]}`.
pub async fn register(db: &Client, r: &RegisterRequest) -> Result<Value, RegistrationError> {
    retrying!(register_once(db, r))
}

async fn register_once(db: &Client, r: &RegisterRequest) -> Result<Value, RegistrationError> {
    register_in(db, r).await
}

/// Registers several relations in one transaction: all of them, or (on the first refusal,
/// returned with the index of the request it refused) none.
pub async fn register_all(
    db: &mut Client,
    requests: &[RegisterRequest],
) -> Result<Vec<Value>, (usize, RegistrationError)> {
    retrying_many!(register_all_once(db, requests))
}

async fn register_all_once(
    db: &mut Client,
    requests: &[RegisterRequest],
) -> Result<Vec<Value>, (usize, RegistrationError)> {
    let database =
        |e: tokio_postgres::Error| (0, RegistrationError::Database(crate::install::describe(&e)));
    let tx = db.transaction().await.map_err(database)?;
    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        out.push(register_in(&tx, r).await.map_err(|e| (i, e))?);
    }
    tx.commit().await.map_err(database)?;
    Ok(out)
}

/// What registering each relation would do, changing nothing (`registry register --check`):
/// per relation `{"relation","ok","columns":[{"column","sql_type","type","precision"?,
/// "scale"?,"server_only"?,"hint"?}],"error"?,"hint"?}`, every column at once, each relation
/// tried on its own (one refusal hides no other), all rolled back.
pub async fn check_registrations(
    db: &mut Client,
    requests: &[RegisterRequest],
) -> Result<Vec<Value>, RegistrationError> {
    let database =
        |e: tokio_postgres::Error| RegistrationError::Database(crate::install::describe(&e));
    let mut tx = db.transaction().await.map_err(database)?;
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        let columns: Vec<Value> = tx
            .query(
                "SELECT column_name, sql_type, portable_type, decimal_precision, decimal_scale, server_only, hint
                   FROM synchro.synchro_column_report($1, $2, $3, $4::text::jsonb)",
                &[
                    &r.schema,
                    &r.relation,
                    &r.server_only,
                    &serde_json::to_string(&r.timestamp_zones).expect("a map of strings"),
                ],
            )
            .await
            .map_err(database)?
            .iter()
            .map(|c| {
                let mut column = serde_json::json!({
                    "column": c.get::<_, String>(0),
                    "sql_type": c.get::<_, String>(1),
                    "type": c.get::<_, Option<String>>(2),
                });
                if let (Some(p), Some(s)) = (c.get::<_, Option<i32>>(3), c.get::<_, Option<i32>>(4)) {
                    column["precision"] = p.into();
                    column["scale"] = s.into();
                }
                if c.get::<_, bool>(5) {
                    column["server_only"] = true.into();
                }
                if let Some(h) = c.get::<_, Option<String>>(6) {
                    column["hint"] = h.into();
                }
                column
            })
            .collect();
        let sp = tx.savepoint("synchro_check").await.map_err(database)?;
        let tried = register_in(&sp, r).await;
        sp.rollback().await.map_err(database)?;
        let mut report = serde_json::json!({
            "relation": format!("{}.{}", r.schema, r.relation),
            "ok": tried.is_ok(),
            "columns": columns,
        });
        match tried {
            Ok(_) => {}
            Err(RegistrationError::Invalid(body, _, hint)) => {
                report["error"] = body["error"].clone();
                if let Some(h) = hint {
                    report["hint"] = h.into();
                }
            }
            Err(e) => return Err(e),
        }
        out.push(report);
    }
    tx.rollback().await.map_err(database)?;
    Ok(out)
}

/// One `synchro_register_relation` call on `db` (a session or a transaction).
async fn register_in(
    db: &impl tokio_postgres::GenericClient,
    r: &RegisterRequest,
) -> Result<Value, RegistrationError> {
    let row = db
        .query_one(
            "SELECT synchro.synchro_register_relation($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::jsonb,
                                                      $11::text::jsonb)::text",
            &[
                &r.schema,
                &r.relation,
                &r.fanout_bound,
                &r.impact_bound,
                &r.kind,
                &r.composition,
                &r.push_enabled,
                &r.table_name,
                &r.server_only,
                &serde_json::to_string(&r.lifecycle).expect("a map of strings"),
                &serde_json::to_string(&r.timestamp_zones).expect("a map of strings"),
            ],
        )
        .await
        .map_err(registration_error)?;
    let text: String = row.get(0);
    serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))
}

/// A reconfiguration of one registered synced relation after DDL (see
/// `sql/install/33_reconfigure.sql`).
#[derive(Debug, Clone, Default)]
pub struct ReconfigureRequest {
    /// The registered schema name.
    pub schema: String,
    /// The registered relation name.
    pub relation: String,
    /// Columns that are not synced (`None` keeps the current list).
    pub server_only: Option<Vec<String>>,
    /// Registered columns whose fields are retired (Class 4).
    pub retire: Vec<String>,
    /// A new lifecycle declaration (`None` keeps the current one; a change is Class 4).
    pub lifecycle: Option<std::collections::BTreeMap<String, String>>,
}

/// What a reconfiguration does (or, as a plan, would do).
#[derive(Debug, Clone)]
pub struct ReconfigurePlan {
    /// The registry side: `{"relation_id","table_id","generation","added","changed",
    /// "retired","unchanged","scopes_holding_rows"}`.
    pub change: Value,
    /// The manifest side.
    pub publish: crate::publish::PublishOutcome,
    /// Active clients by installed schema version, each with the connect action it would
    /// get once the change is active (`none`, `replace`, `rebuild_local`, `unsupported`).
    /// Under a Class 3 change the affected scopes are known only at activation, so a
    /// client holding any scope of the table counts as `rebuild_local` (at most).
    pub clients: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, u64>>,
    /// For a retirement: whether the contract is safe now, and what blocks it (as
    /// `synchro.synchro_contract_check` answers, judged before the change).
    pub contract: Option<Value>,
}

impl ReconfigurePlan {
    /// The plan as JSON (counts and IDs of tables and fields only).
    pub fn to_json(&self) -> Value {
        let (class, version) = match &self.publish {
            crate::publish::PublishOutcome::Unchanged { version } => ("class_1", *version),
            crate::publish::PublishOutcome::Published { version, class, .. } => {
                (class.as_str(), *version)
            }
        };
        let affected = match class {
            "class_3" => serde_json::json!({"at_most": self.change["scopes_holding_rows"]}),
            "class_2" | "class_1" => serde_json::json!(0),
            _ => serde_json::json!({"at_most": self.change["scopes_holding_rows"]}),
        };
        serde_json::json!({
            "class": class,
            "schema_version": version,
            "tables": [self.change["table_id"]],
            "registry": self.change,
            "affected_scopes": affected,
            "clients_by_manifest": self.clients,
            "safe_to_contract": self.contract,
        })
    }
}

/// A database error of a registry function: the spec's administrative error body when it is one.
pub(crate) fn registration_error(e: tokio_postgres::Error) -> RegistrationError {
    match e.as_db_error() {
        Some(d)
            if d.message().starts_with("invalid_registration")
                || d.message().starts_with("invalid_column") =>
        {
            let body = d
                .detail()
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or(Value::Null);
            RegistrationError::Invalid(
                body,
                d.code().code().to_owned(),
                d.hint().filter(|h| !h.is_empty()).map(str::to_owned),
            )
        }
        _ => RegistrationError::Database(crate::install::describe(&e)),
    }
}

/// Reconfigures a relation and publishes the result in one transaction; with `apply` false
/// the transaction is rolled back and only the plan is returned (a dry run).
pub async fn reconfigure(
    db: &mut Client,
    r: &ReconfigureRequest,
    apply: bool,
) -> Result<ReconfigurePlan, RegistrationError> {
    retrying!(reconfigure_once(db, r, apply))
}

async fn reconfigure_once(
    db: &mut Client,
    r: &ReconfigureRequest,
    apply: bool,
) -> Result<ReconfigurePlan, RegistrationError> {
    let tx = db
        .transaction()
        .await
        .map_err(|e| RegistrationError::Database(crate::install::describe(&e)))?;
    let contract = if r.retire.is_empty() {
        None
    } else {
        let text: String = tx
            .query_one(
                "SELECT synchro.synchro_contract_check($1, $2, $3)::text",
                &[&r.schema, &r.relation, &r.retire],
            )
            .await
            .map_err(registration_error)?
            .get(0);
        Some(serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))?)
    };
    let text: String = tx
        .query_one(
            "SELECT synchro.synchro_reconfigure_relation($1, $2, $3, $4, $5::text::jsonb)::text",
            &[
                &r.schema,
                &r.relation,
                &r.server_only,
                &r.retire,
                &r.lifecycle
                    .as_ref()
                    .map(|l| serde_json::to_string(l).expect("a map of strings")),
            ],
        )
        .await
        .map_err(registration_error)?
        .get(0);
    let change: Value =
        serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))?;
    let database = from_anyhow;
    // A dry run classifies without staging: no copy is taken under the table's lock.
    let publish = crate::publish::publish_in(&tx, apply)
        .await
        .map_err(database)?;
    let clients = client_actions(&tx).await.map_err(database)?;
    let done = if apply {
        tx.commit().await
    } else {
        tx.rollback().await
    };
    done.map_err(|e| RegistrationError::Database(crate::install::describe(&e)))?;
    Ok(ReconfigurePlan {
        change,
        publish,
        clients,
        contract,
    })
}

/// Dispatches every active client against the history as it now is in the transaction.
async fn client_actions(
    tx: &tokio_postgres::Transaction<'_>,
) -> anyhow::Result<std::collections::BTreeMap<u64, std::collections::BTreeMap<String, u64>>> {
    use synchro_protocol::dispatch::{dispatch, ConnectOutcome, ServerView};
    use synchro_protocol::json::Json;
    let lineage = crate::publish::load_lineage(tx).await?;
    let mut scopes = crate::publish::transition_scopes(tx, &lineage).await?;
    // The new manifest's affected set is recorded at activation: until then it is unknown,
    // and dispatch counts every assigned scope (an upper bound on rebuild_local).
    if let Some(current) = lineage.current() {
        scopes.remove(&current.schema_ref());
    }
    let mut out: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, u64>> =
        Default::default();
    for row in tx
        .query(
            "SELECT schema_version, schema_hash, assigned_scopes FROM synchro.synchro_active_client_schemas()",
            &[],
        )
        .await?
    {
        let version: i64 = row.get(0);
        let hash: String = row.get(1);
        let assigned: std::collections::BTreeSet<String> =
            row.get::<_, Vec<String>>(2).into_iter().collect();
        let empty = std::collections::BTreeSet::new();
        let view = ServerView {
            identity_known: true,
            client_runtime_supported: true,
            lineage: &lineage,
            transition_scopes: &scopes,
            assigned_scopes: &assigned,
            presented_cursor_scopes: &empty,
            stale_cursor_scopes: &empty,
        };
        let request = synchro_protocol::dispatch::ConnectRequest {
            protocol_version: Some(u64::from(synchro_protocol::PROTOCOL_VERSION)),
            schema: Json::Object(vec![
                ("version".into(), Json::Number(version.to_string())),
                ("hash".into(), Json::String(hash)),
            ]),
            client_generation: Some(1),
            schema_reset: false,
        };
        let action = match dispatch(&request, &view) {
            Ok(ConnectOutcome::Schema { action, .. }) => action.name().to_owned(),
            _ => "unknown".to_owned(),
        };
        *out.entry(version as u64)
            .or_default()
            .entry(action)
            .or_default() += 1;
    }
    Ok(out)
}

/// The rollout advisor (`synchro.synchro_rollout_report`), and with `retire` the contract
/// check for retiring those columns of a relation: counts only, never identities.
pub async fn rollout(
    db: &Client,
    contract: Option<(&str, &str, &[String])>,
) -> Result<Value, RegistrationError> {
    let text: String = db
        .query_one("SELECT synchro.synchro_rollout_report()::text", &[])
        .await
        .map_err(registration_error)?
        .get(0);
    let mut report: Value =
        serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))?;
    if let Some((schema, relation, columns)) = contract {
        let text: String = db
            .query_one(
                "SELECT synchro.synchro_contract_check($1, $2, $3)::text",
                &[&schema, &relation, &columns],
            )
            .await
            .map_err(registration_error)?
            .get(0);
        report["safe_to_contract"] =
            serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))?;
    }
    Ok(report)
}

/// Declares a local index (`synchro.synchro_declare_index`); the next publish is Class 2.
pub async fn declare_index(
    db: &Client,
    schema: &str,
    relation: &str,
    name: &str,
    columns: &[String],
    unique: bool,
) -> Result<Value, RegistrationError> {
    let text: String = db
        .query_one(
            "SELECT synchro.synchro_declare_index($1, $2, $3, $4, $5)::text",
            &[&schema, &relation, &name, &columns, &unique],
        )
        .await
        .map_err(registration_error)?
        .get(0);
    serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))
}

/// Records the pending retirement of a synced table (`synchro.synchro_retire_relation`) and
/// publishes it (Class 4) in one transaction; capture removes the relation at that boundary.
pub async fn retire(
    db: &mut Client,
    schema: &str,
    relation: &str,
) -> Result<(Value, crate::publish::PublishOutcome), RegistrationError> {
    change_and_publish(db, "synchro_retire_relation", schema, relation).await
}

/// A stream reset of one relation (`synchro.synchro_reset_relation`) staged by a publish in
/// one transaction: capture re-copies it at that boundary, lifts a block found at one of its
/// changes, and every scope holding its rows rebuilds.
pub async fn reset(
    db: &mut Client,
    schema: &str,
    relation: &str,
) -> Result<(Value, crate::publish::PublishOutcome), RegistrationError> {
    change_and_publish(db, "synchro_reset_relation", schema, relation).await
}

/// Calls one of the `(schema, relation) -> jsonb` registry entry points and publishes, in
/// one transaction.
async fn change_and_publish(
    db: &mut Client,
    function: &str,
    schema: &str,
    relation: &str,
) -> Result<(Value, crate::publish::PublishOutcome), RegistrationError> {
    retrying!(change_and_publish_once(db, function, schema, relation))
}

async fn change_and_publish_once(
    db: &mut Client,
    function: &str,
    schema: &str,
    relation: &str,
) -> Result<(Value, crate::publish::PublishOutcome), RegistrationError> {
    let tx = db
        .transaction()
        .await
        .map_err(|e| RegistrationError::Database(crate::install::describe(&e)))?;
    let text: String = tx
        .query_one(
            &format!("SELECT synchro.{function}($1, $2)::text"),
            &[&schema, &relation],
        )
        .await
        .map_err(registration_error)?
        .get(0);
    let change: Value =
        serde_json::from_str(&text).map_err(|e| RegistrationError::Database(e.to_string()))?;
    let outcome = crate::publish::publish_in(&tx, true)
        .await
        .map_err(from_anyhow)?;
    tx.commit()
        .await
        .map_err(|e| RegistrationError::Database(crate::install::describe(&e)))?;
    Ok((change, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlocks_and_serialization_failures_are_retried_whatever_their_hint() {
        let db = |m: &str| RegistrationError::Database(m.to_owned());
        assert!(conflicted(&db(
            "deadlock detected (SQLSTATE 40P01); See server log for query details."
        )));
        assert!(conflicted(&db(
            "could not serialize access due to concurrent update (SQLSTATE 40001)"
        )));
        assert!(!conflicted(&db(
            "permission denied for table x (SQLSTATE 42501)"
        )));
    }
}
