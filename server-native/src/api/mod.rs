//! The HTTP API of protocol version 3: `POST /sync/connect`, `/sync/pull`, `/sync/rebuild`,
//! `/sync/push`, `/sync/events` and `GET /ready`.
//!
//! Every request goes through [`preamble`] (body size and arrival, JSON, protocol version —
//! 426 before anything else —, NUL characters, bearer JWT — 401 —, then the request's
//! members through its `synchro_protocol::wire` type — 400), then its endpoint. Endpoints
//! after connect share [`gates`] (exact current schema 422, client generation 409, the
//! assignment). Every response body is written through a `wire` type; every error is an
//! [`ApiError`] (the spec's code, status and retryability). Responses and logs never carry
//! user, client or scope ids, tokens or row values.
//!
//! | file | owns |
//! |---|---|
//! | `state.rs` | [`Config`], [`AppState`], [`ConnectionPool`] |
//! | `error.rs` | [`ApiError`]; a database error converted once (SQLSTATE logged, 503) |
//! | `preamble.rs` | the shared request preamble |
//! | `gates.rs` | schema and generation gates, the assigned scope set |
//! | `metrics.rs` | request counts per endpoint (`GET /metrics`), the correlation ID's log span |
//! | `rows.rs` | what endpoints share about served rows: key identities, cursor issue times |
//! | `connect.rs` `pull.rs` `rebuild.rs` `push.rs` `events.rs` `ready.rs` | one endpoint each |

mod checksums;
mod connect;
pub mod cors;
mod error;
mod events;
mod gates;
mod metrics;
mod notifier;
mod preamble;
pub mod pull;
pub mod push;
mod ready;
pub mod rebuild;
mod rows;
mod seeds;
mod state;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use synchro_protocol::json::Json;
use synchro_protocol::wire::Message;

pub use error::ApiError;
pub(crate) use error::Integrity;
pub use notifier::Notifier;
pub use state::{
    AppState, Caches, Config, ConnectionLimits, ConnectionPool, Pooled, SharedConnection,
    SnapshotPool,
};

pub(crate) use gates::{assigned_scopes, gates, gates_and_assignment, still_current, Gates};
pub(crate) use preamble::has_nul;

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let counts = Arc::new(metrics::RequestCounts::default());
    let cors = Arc::new(state.config.cors_origins.clone());
    Router::new()
        .route("/sync/connect", post(connect))
        .route("/sync/pull", post(pull))
        .route("/sync/rebuild", post(rebuild))
        .route("/sync/push", post(push))
        .route("/sync/events", post(events))
        .route("/ready", get(ready::ready))
        .route("/seeds/{name}", get(seed))
        .with_state(state)
        .merge(
            Router::new()
                .route("/metrics", get(metrics::metrics))
                .with_state(counts.clone()),
        )
        .layer(axum::middleware::from_fn_with_state(counts, metrics::count))
        .layer(axum::middleware::from_fn_with_state(cors, cors::cors))
}

pub(crate) fn json_response(status: StatusCode, body: &Json) -> Response {
    (
        status,
        [("content-type", "application/json")],
        synchro_protocol::jcs::to_output_string(body),
    )
        .into_response()
}

fn message_response(body: &impl Message) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        body.to_json_string(),
    )
        .into_response()
}

async fn connect(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    async {
        let r = preamble::preamble(&state, &headers, body).await?;
        let body = connect::connect(&state, &r.user_id, r.request).await?;
        Ok::<_, ApiError>(message_response(&body))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `?v=` of `GET /seeds/{name}`.
#[derive(serde::Deserialize)]
struct SeedQuery {
    v: Option<String>,
}

async fn seed(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<SeedQuery>,
    headers: HeaderMap,
) -> Response {
    seeds::seed(&state, &name, query.v.as_deref(), &headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn pull(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    async {
        let r = preamble::preamble(&state, &headers, body).await?;
        let body = pull::pull(&state, &r.user_id, r.request).await?;
        Ok::<_, ApiError>(message_response(&body))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

async fn push(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    async {
        let r = preamble::preamble(&state, &headers, body).await?;
        push::push(&state, &r.user_id, r.request).await
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The rebuild session's row count on every rebuild page: what a client's progress shows as
/// its total (not a protocol member: the bodies stay exactly spec 000's).
pub use synchro_protocol::wire::SCOPE_ROWS_HEADER;

async fn rebuild(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    async {
        let r = preamble::preamble(&state, &headers, body).await?;
        let (text, rows) = rebuild::rebuild(&state, &r.user_id, r.request).await?;
        Ok::<_, ApiError>(
            (
                StatusCode::OK,
                [
                    ("content-type", "application/json".to_owned()),
                    (SCOPE_ROWS_HEADER, rows.to_string()),
                ],
                text,
            )
                .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

async fn events(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    async {
        let r = preamble::preamble(&state, &headers, body).await?;
        events::events(state.clone(), r.user_id, r.expires_at, r.request).await
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}
