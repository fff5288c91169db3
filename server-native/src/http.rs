//! The HTTP API: `POST /sync/connect` and `GET /ready`.
//!
//! Order of checks on connect: body size (refused before parsing) and arrival within
//! `Config::body_timeout` (503 `request_body_timeout`), JSON, protocol version
//! (426 before anything else), bearer JWT (401), request members (400), then the schema
//! dispatch of the protocol core. Responses and logs never carry user, client or scope ids,
//! tokens or row values; errors use the spec's `{"error":{"code","message","retryable",...}}`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use synchro_protocol::dispatch::{
    dispatch, ConnectOutcome, ConnectRequest, SchemaAction, ServerView,
};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::MAX_JSON_COUNTER;
use tokio_postgres::Client;

use crate::auth::Authenticator;
use synchro_protocol::manifest::SchemaRef;
use synchro_protocol::token::Keyring;

/// Server settings.
#[derive(Clone)]
pub struct Config {
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Minimum client runtime (SemVer); clients below it get 426.
    pub min_client_version: Option<String>,
    /// Push bounds (each violation is 400 before any work).
    pub push_limits: crate::push::PushLimits,
    /// Connection caps and the header and idle timeouts (see [`crate::serve`]).
    pub connections: crate::serve::ConnectionLimits,
    /// The whole request body must arrive within this once the head is in; otherwise 503
    /// `temporary_unavailable`, reason `request_body_timeout`, and the connection closes.
    pub body_timeout: std::time::Duration,
    /// Open `POST /sync/events` streams at most, server-wide.
    pub max_event_streams: usize,
    /// Open `POST /sync/events` streams per (user, client ID) at most.
    pub max_event_streams_per_client: usize,
    /// Rebuild sessions in progress per (user, client ID) at most; a new rebuild of a scope
    /// replaces the client's earlier session of that scope.
    pub max_rebuild_sessions_per_client: u32,
    /// `Retry-After` (seconds) of every 503 refused for load.
    pub retry_after_seconds: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 1_048_576,
            min_client_version: None,
            push_limits: crate::push::PushLimits::default(),
            connections: crate::serve::ConnectionLimits::default(),
            body_timeout: std::time::Duration::from_secs(30),
            max_event_streams: 2048,
            max_event_streams_per_client: 4,
            max_rebuild_sessions_per_client: 8,
            retry_after_seconds: 2,
        }
    }
}

/// Shared state of the HTTP handlers.
pub struct AppState {
    /// Adapter connection (member of synchro_adapter only).
    pub db: Client,
    /// Connection as the owner of the registered assignment function, which evaluates it
    /// with its owner's privileges and never synchro_owner's (spec 003). Without one, a
    /// registered function makes connect fail closed.
    pub assignment_db: Option<Client>,
    /// Adapter connections for pull's and rebuild's read-only REPEATABLE READ snapshots
    /// (a transaction needs exclusive use of its connection).
    pub snapshot_db: SnapshotPool,
    /// Bearer verification.
    pub auth: Authenticator,
    /// Keys for scope cursors.
    pub cursor_keys: Keyring,
    /// Settings.
    pub config: Config,
    /// Wakes change-notification streams (`POST /sync/events`).
    pub events: crate::events::Notifier,
    /// A connection as the capture worker's login, which push uses to evaluate a written
    /// row's scopes with the membership function as its owner (in a transaction that is
    /// always rolled back). Without one, push answers 503 `push_unavailable`.
    pub membership_db: Option<tokio::sync::Mutex<Client>>,
}

/// A fixed set of connections handed out one transaction at a time: a free one if any,
/// otherwise the next in turn once it is released.
pub struct SnapshotPool {
    clients: Vec<tokio::sync::Mutex<Client>>,
    next: std::sync::atomic::AtomicUsize,
}

impl SnapshotPool {
    /// A pool of these connections (at least one).
    pub fn new(clients: Vec<Client>) -> SnapshotPool {
        assert!(!clients.is_empty(), "a snapshot pool needs a connection");
        SnapshotPool {
            clients: clients.into_iter().map(tokio::sync::Mutex::new).collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Exclusive use of one connection.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Client> {
        for c in &self.clients {
            if let Ok(guard) = c.try_lock() {
                return guard;
            }
        }
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.clients.len();
        self.clients[i].lock().await
    }
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/sync/connect", post(connect))
        .route("/sync/pull", post(pull))
        .route("/sync/rebuild", post(rebuild))
        .route("/sync/push", post(push))
        .route("/sync/events", post(events))
        .route("/ready", get(ready))
        .with_state(state)
}

/// A wire error with the spec's exact status, code and retryability.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: &'static str,
    retryable: bool,
    extra: Vec<(String, Json)>,
    /// `Retry-After` seconds and the `reason`, for refusals under load.
    retry_after: Option<(u64, &'static str)>,
    /// Close the connection after answering (the request body was not read to its end).
    close: bool,
}

impl ApiError {
    fn new(status: u16, code: &'static str, message: &'static str, retryable: bool) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(status).expect("valid status"),
            code,
            message,
            retryable,
            extra: Vec::new(),
            retry_after: None,
            close: false,
        }
    }

    pub(crate) fn invalid_request(message: &'static str) -> ApiError {
        ApiError::new(400, "invalid_request", message, false)
    }

    pub(crate) fn unavailable() -> ApiError {
        ApiError::new(
            503,
            "temporary_unavailable",
            "the service is temporarily unavailable",
            true,
        )
    }

    /// 503 `temporary_unavailable` with a `reason`.
    pub(crate) fn unavailable_because(reason: &str) -> ApiError {
        let mut e = ApiError::unavailable();
        e.extra = vec![("reason".into(), Json::String(reason.to_owned()))];
        e
    }

    /// 503 `temporary_unavailable` with a `reason` and `Retry-After`: a load limit.
    pub(crate) fn overloaded(reason: &'static str, retry_after_seconds: u64) -> ApiError {
        let mut e = ApiError::unavailable_because(reason);
        e.retry_after = Some((retry_after_seconds, reason));
        e
    }

    /// The error body, `{"error":{...}}`, as sent.
    pub(crate) fn body_text(&self) -> String {
        let mut members = vec![
            ("code".to_owned(), Json::String(self.code.into())),
            ("message".to_owned(), Json::String(self.message.into())),
            ("retryable".to_owned(), Json::Bool(self.retryable)),
        ];
        members.extend(self.extra.iter().cloned());
        jcs::to_output_string(&Json::Object(vec![("error".into(), Json::Object(members))]))
    }

    pub(crate) fn integrity() -> ApiError {
        ApiError::new(
            500,
            "sync_integrity_failure",
            "scope assignment could not be evaluated",
            false,
        )
    }
}

impl ApiError {
    /// 422 `schema_mismatch` with the current and received references.
    pub(crate) fn schema_mismatch(current: SchemaRef, received: &Json) -> ApiError {
        let mut e = ApiError::new(
            422,
            "schema_mismatch",
            "the request schema is not current",
            false,
        );
        e.extra = vec![
            (
                "current_schema".into(),
                Json::Object(vec![
                    ("version".into(), Json::Number(current.version.to_string())),
                    ("hash".into(), Json::String(hex::encode(current.hash))),
                ]),
            ),
            ("received_schema".into(), received.clone()),
        ];
        e
    }

    /// 409 `rebuild_restart_required` for a scope.
    pub(crate) fn rebuild_restart(scope_id: &str) -> ApiError {
        let mut e = ApiError::new(
            409,
            "rebuild_restart_required",
            "the rebuild session is no longer valid; start again",
            false,
        );
        e.extra = vec![("scope_id".into(), Json::String(scope_id.to_owned()))];
        e
    }

    /// 409 `client_generation_expired` with the current generation (null when none).
    pub(crate) fn generation_expired(current: Option<u64>) -> ApiError {
        let mut e = ApiError::new(
            409,
            "client_generation_expired",
            "the client generation is not current; reconnect",
            false,
        );
        e.extra = vec![(
            "current_client_generation".into(),
            current.map_or(Json::Null, |g| Json::Number(g.to_string())),
        )];
        e
    }
}

/// The authoritative assigned set: defaults, grants, shared scopes and the assignment
/// function's scopes.
pub(crate) async fn assigned_scopes(
    state: &AppState,
    user_id: &str,
) -> Result<BTreeSet<String>, ApiError> {
    let assigned: Vec<String> = state
        .db
        .query_one("SELECT synchro.synchro_assigned_scopes($1)", &[&user_id])
        .await
        .map_err(|_| ApiError::unavailable())?
        .get(0);
    let mut assigned: BTreeSet<String> = assigned.into_iter().collect();
    assigned.extend(assigned_by_function(state, user_id).await?);
    Ok(assigned)
}

/// The scopes the registered assignment function returns for `user_id`, validated: each
/// non-null, nonempty after trim, not `user:`-prefixed, and at most `max_scopes` distinct.
async fn assigned_by_function(state: &AppState, user_id: &str) -> Result<Vec<String>, ApiError> {
    let Some(check) = state
        .db
        .query_opt(
            "SELECT function_schema::text, function_name::text, max_scopes, intact
               FROM synchro.synchro_assignment_function_check()",
            &[],
        )
        .await
        .map_err(|_| ApiError::unavailable())?
    else {
        return Ok(Vec::new());
    };
    let (schema, name, max, intact): (String, String, Option<i32>, bool) =
        (check.get(0), check.get(1), check.get(2), check.get(3));
    if !intact {
        tracing::error!("assignment function missing or changed since registration");
        return Err(ApiError::integrity());
    }
    let Some(owner_db) = &state.assignment_db else {
        tracing::error!(
            "an assignment function is registered but no evaluator connection is configured"
        );
        return Err(ApiError::integrity());
    };
    let limit = max.map_or(String::new(), |m| format!(" LIMIT {}", i64::from(m) + 1));
    let sql = format!(
        "SELECT DISTINCT s FROM {}.{}($1) AS s{limit}",
        crate::install::quote_ident(&schema),
        crate::install::quote_ident(&name)
    );
    let rows = owner_db.query(&sql, &[&user_id]).await.map_err(|_| {
        tracing::error!("assignment function evaluation failed");
        ApiError::integrity()
    })?;
    let mut scopes = Vec::with_capacity(rows.len());
    for row in rows {
        let scope: Option<String> = row.get(0);
        match scope {
            Some(s) if !s.trim().is_empty() && !s.starts_with("user:") => scopes.push(s),
            _ => {
                tracing::error!("assignment function returned an invalid scope");
                return Err(ApiError::integrity());
            }
        }
    }
    if max.is_some_and(|m| scopes.len() > m as usize) {
        tracing::error!("assignment function returned more scopes than its bound");
        return Err(ApiError::integrity());
    }
    Ok(scopes)
}

fn json_response(status: StatusCode, body: &Json) -> Response {
    (
        status,
        [("content-type", "application/json")],
        jcs::to_output_string(body),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        tracing::info!(
            status = self.status.as_u16(),
            code = self.code,
            reason = self.retry_after.map(|(_, reason)| reason),
            "request refused"
        );
        let mut response = (
            self.status,
            [("content-type", "application/json")],
            self.body_text(),
        )
            .into_response();
        let headers = response.headers_mut();
        if let Some((seconds, _)) = self.retry_after {
            headers.insert("retry-after", seconds.into());
        }
        if self.close {
            headers.insert("connection", "close".parse().expect("header value"));
        }
        response
    }
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let ok = matches!(
        state
            .db
            .query_one("SELECT synchro.synchro_readiness()", &[])
            .await
            .map(|r| r.get::<_, bool>(0)),
        Ok(true)
    );
    let (status, text) = if ok {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unready")
    };
    json_response(
        status,
        &Json::Object(vec![("status".into(), Json::String(text.into()))]),
    )
}

/// The request body as JSON: at most `config.max_body_bytes`, all of it within
/// `config.body_timeout`.
async fn read_body(headers: &HeaderMap, body: Body, config: &Config) -> Result<Json, ApiError> {
    let limit = config.max_body_bytes;
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::invalid_request(
            "the request body exceeds the configured maximum",
        ));
    }
    let Ok(read) =
        tokio::time::timeout(config.body_timeout, axum::body::to_bytes(body, limit)).await
    else {
        // The rest of the body may still be on its way: answer, then close.
        let mut e = ApiError::overloaded("request_body_timeout", config.retry_after_seconds);
        e.close = true;
        return Err(e);
    };
    let bytes = read.map_err(|_| {
        ApiError::invalid_request("the request body exceeds the configured maximum")
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::invalid_request("the body is not UTF-8"))?;
    Json::parse(text).map_err(|_| ApiError::invalid_request("the body is not a valid JSON object"))
}

pub(crate) fn positive_integer(v: &Json) -> Option<u64> {
    match v {
        Json::Number(t)
            if !t.starts_with('0') && t.len() <= 16 && t.bytes().all(|b| b.is_ascii_digit()) =>
        {
            t.parse().ok().filter(|n| *n <= MAX_JSON_COUNTER)
        }
        _ => None,
    }
}

async fn connect(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    match connect_inner(&state, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn pull(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let (req, user_id) = match preamble(&state, &headers, body).await? {
            Ok(v) => v,
            Err(response) => return Ok(response),
        };
        let parsed = crate::pull::parse(&req)?;
        let body = crate::pull::pull(&state, &user_id, parsed).await?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &body))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn push(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let (req, user_id) = match preamble(&state, &headers, body).await? {
            Ok(v) => v,
            Err(response) => return Ok(response),
        };
        let body = crate::push::push(&state, &user_id, &req).await?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &body))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn rebuild(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let (req, user_id) = match preamble(&state, &headers, body).await? {
            Ok(v) => v,
            Err(response) => return Ok(response),
        };
        let body = crate::rebuild::rebuild(&state, &user_id, &req).await?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &body))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn events(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let (req, user_id) = match preamble(&state, &headers, body).await? {
            Ok(v) => v,
            Err(response) => return Ok(response),
        };
        crate::events::events(state.clone(), user_id, &req).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
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
    let db = &state.db;
    let stream_generation: i64 = db
        .query_one(
            "SELECT stream_generation FROM synchro.synchro_stream_state()",
            &[],
        )
        .await
        .map_err(|_| ApiError::unavailable())?
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
        .await
        .map_err(|_| ApiError::unavailable())?
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

/// Whether any string or member name in `v` contains NUL.
pub(crate) fn has_nul(v: &Json) -> bool {
    match v {
        Json::String(s) => s.contains('\0'),
        Json::Array(items) => items.iter().any(has_nul),
        Json::Object(members) => members.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// [`has_nul`] for a whole request, except the row data of push mutations (`pk` and each
/// column's `value`), which push refuses per mutation as `invalid_value`.
fn request_has_nul(req: &Json) -> bool {
    let Json::Object(members) = req else {
        return has_nul(req);
    };
    members.iter().any(|(k, v)| {
        k.contains('\0')
            || match (k.as_str(), v) {
                ("mutations", Json::Array(items)) => items.iter().any(mutation_has_nul),
                _ => has_nul(v),
            }
    })
}

fn mutation_has_nul(m: &Json) -> bool {
    let Json::Object(members) = m else {
        return has_nul(m);
    };
    members.iter().any(|(k, v)| {
        k.contains('\0')
            || match (k.as_str(), v) {
                ("pk", _) => false,
                ("columns", Json::Array(columns)) => columns.iter().any(|c| match c {
                    Json::Object(cm) => cm
                        .iter()
                        .any(|(ck, cv)| ck.contains('\0') || (ck != "value" && has_nul(cv))),
                    other => has_nul(other),
                }),
                _ => has_nul(v),
            }
    })
}

/// Body size, JSON object, protocol version (426 first) and bearer token. `Ok(Err(_))`
/// is a finished 426 response.
async fn preamble(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Result<(Json, String), Response>, ApiError> {
    let req = read_body(headers, body, &state.config).await?;
    if !matches!(req, Json::Object(_)) {
        return Err(ApiError::invalid_request(
            "the body is not a valid JSON object",
        ));
    }
    // Protocol compatibility comes before everything else (spec 000).
    let protocol_version = match req.get("protocol_version") {
        Some(Json::Number(t)) if t.bytes().all(|b| b.is_ascii_digit()) => t.parse::<u64>().ok(),
        _ => None,
    };
    if protocol_version != Some(3) {
        let outcome = ConnectOutcome::UpgradeRequired {
            received_protocol_version: protocol_version,
            client_runtime: false,
        };
        tracing::info!(status = 426, "protocol incompatible");
        return Ok(Err(json_response(
            StatusCode::UPGRADE_REQUIRED,
            &outcome.to_json(&Json::Null),
        )));
    }
    // PostgreSQL text cannot hold NUL: refuse it here rather than fail a statement later
    // (which would look like an outage). Pushed row values are judged per mutation.
    if request_has_nul(&req) {
        return Err(ApiError::invalid_request(
            "a string in the request contains a NUL character",
        ));
    }
    let Some(user_id) = state.auth.user_id(headers) else {
        return Err(ApiError::new(
            401,
            "unauthorized",
            "a valid bearer token is required",
            false,
        ));
    };
    Ok(Ok((req, user_id)))
}

async fn connect_inner(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, user_id) = match preamble(state, headers, body).await? {
        Ok(v) => v,
        Err(response) => return Ok(response),
    };
    let protocol_version = Some(3);
    let client_id = match req.get("client_id") {
        Some(Json::String(s)) if !s.is_empty() && s.len() <= 256 => s.clone(),
        _ => {
            return Err(ApiError::invalid_request(
                "client_id must be a nonempty string of at most 256 bytes",
            ))
        }
    };
    let client_generation = match req.get("client_generation") {
        None | Some(Json::Null) => None,
        Some(v) => Some(positive_integer(v).ok_or_else(|| {
            ApiError::invalid_request("client_generation must be a positive integer")
        })?),
    };
    let schema_reset = match req.get("schema_reset") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid_request("schema_reset must be a boolean")),
    };
    let runtime_ok = match (&state.config.min_client_version, req.get("client_version")) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(min), Some(Json::String(v))) => synchro_protocol::semver::compare(v, min)
            .map_err(|_| {
                ApiError::invalid_request("client_version must be a SemVer 2.0.0 version")
            })?
            .is_ge(),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_request("client_version must be a string"))
        }
    };
    // Presented cursors: a malformed or forged one is 400 before anything is written.
    let mut opened: BTreeMap<String, synchro_protocol::token::ScopeCursor> = BTreeMap::new();
    match req.get("scope_cursors") {
        None | Some(Json::Null) => {}
        Some(Json::Object(m)) => {
            for (scope, v) in m {
                match v {
                    Json::Null => {}
                    Json::String(t) => {
                        let c = synchro_protocol::token::ScopeCursor::open(&state.cursor_keys, t)
                            .map_err(|_| {
                            ApiError::invalid_request("a scope cursor is invalid")
                        })?;
                        opened.insert(scope.clone(), c);
                    }
                    _ => {
                        return Err(ApiError::invalid_request(
                            "scope_cursors values must be strings or null",
                        ))
                    }
                }
            }
        }
        Some(_) => return Err(ApiError::invalid_request("scope_cursors must be an object")),
    };
    let presented: BTreeSet<String> = opened.keys().cloned().collect();
    let schema = req.get("schema").cloned().unwrap_or(Json::Null);

    let db = &state.db;
    let stored = db
        .query_opt(
            "SELECT client_generation, assigned_scopes, expired FROM synchro.synchro_client_state($1, $2)",
            &[&user_id, &client_id],
        )
        .await
        .map_err(|_| ApiError::unavailable())?;
    let assigned = assigned_scopes(state, &user_id).await?;
    let lineage = crate::publish::load_serving_lineage(db)
        .await
        .map_err(|_| ApiError::unavailable())?;
    let transition_scopes = BTreeMap::new();
    let (previous_generation, expired) = match &stored {
        Some(row) => (Some(row.get::<_, i64>(0) as u64), row.get::<_, bool>(2)),
        None => (None, false),
    };
    // A cursor can be bridged only when every binding but the schema is current: same user,
    // client and (kept) generation, current stream, membership and retention generations,
    // at or above the floor, issued under the schema the client presents.
    let keeps_generation =
        previous_generation.is_some() && !expired && client_generation == previous_generation;
    let (stale, positions) = cursor_bindings(
        state,
        &user_id,
        &client_id,
        client_generation.unwrap_or(0),
        &opened,
        &schema,
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
    let request = ConnectRequest {
        protocol_version,
        schema: schema.clone(),
        client_generation,
        schema_reset,
    };
    let outcome = dispatch(&request, &view).map_err(|_| ApiError::unavailable())?;
    let ConnectOutcome::Schema { action, .. } = &outcome else {
        tracing::info!(
            status = outcome.status(),
            "connect: refused by schema dispatch"
        );
        return Ok(json_response(
            StatusCode::from_u16(outcome.status()).expect("valid status"),
            &outcome.to_json(&schema),
        ));
    };

    let previous_scopes: Vec<String> = stored
        .as_ref()
        .map(|row| row.get::<_, Vec<String>>(1))
        .unwrap_or_default();
    let new_generation =
        previous_generation.is_none() || expired || client_generation != previous_generation;
    let installed = match action {
        SchemaAction::Unsupported { .. } => None,
        _ => lineage.current().map(|m| m.schema_ref()),
    };
    let row = db
        .query_one(
            "SELECT client_generation, scope_set_version FROM synchro.synchro_client_connect($1, $2, $3, $4, $5, $6)",
            &[
                &user_id,
                &client_id,
                &new_generation,
                &assigned.iter().cloned().collect::<Vec<_>>(),
                &installed.map(|r| r.version as i64),
                &installed.map(|r| hex::encode(r.hash)),
            ],
        )
        .await
        .map_err(|_| ApiError::unavailable())?;
    let generation: i64 = row.get(0);
    let scope_set_version: i64 = row.get(1);
    let previous: BTreeSet<String> = previous_scopes.into_iter().collect();
    let strings = |items: Vec<&String>| {
        Json::Array(items.into_iter().map(|s| Json::String(s.clone())).collect())
    };

    let Json::Object(mut body) = outcome.to_json(&schema) else {
        unreachable!("a schema outcome is an object")
    };
    // Bridged cursors: the same position re-signed under the current schema hash.
    if let (Some(current), Some((_, Json::Object(updates)))) = (
        lineage.current(),
        body.iter_mut().find(|(k, _)| k == "scope_cursor_updates"),
    ) {
        for (scope, value) in updates.iter_mut() {
            if *value != Json::String("reissue".into()) {
                continue;
            }
            let (position, membership_generation, retention_generation) = positions[scope];
            let cursor = synchro_protocol::token::ScopeCursor {
                scope_id: scope.clone(),
                stream_generation: opened[scope].stream_generation,
                membership_generation,
                retention_generation,
                position,
                schema_hash: current.schema_hash(),
                principal: synchro_protocol::token::Principal {
                    user_id: user_id.clone(),
                    client_id: client_id.clone(),
                    client_generation: generation as u64,
                },
                issued_at: crate::pull::now_datetime(),
            };
            *value = Json::String(cursor.sign(&state.cursor_keys));
        }
    }
    body.splice(
        0..0,
        [
            ("protocol_version".to_owned(), Json::Number("3".into())),
            (
                "client_generation".to_owned(),
                Json::Number(generation.to_string()),
            ),
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
        ],
    );
    tracing::info!(
        status = 200,
        action = action.name(),
        new_generation,
        "connect"
    );
    Ok(json_response(StatusCode::OK, &Json::Object(body)))
}
