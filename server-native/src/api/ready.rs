//! `GET /ready`: 200 `{"status":"ready"}` when every readiness check passes
//! (`synchro.synchro_readiness()`, and the install ledger is exactly this binary's steps:
//! `schema_installed`), otherwise 503 `{"status":"unready"}`; no detail (the
//! detailed checks are `synchro-server health`, for monitor and operator logins).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use synchro_protocol::json::Json;

use super::{json_response, AppState};

pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let ok = match state.db.get().await {
        Ok(db) => {
            // Both go out together (one round trip).
            let (checks, ledger) = futures_util::join!(
                db.query_one("SELECT synchro.synchro_readiness()", &[]),
                crate::install::ledger_matches(&db)
            );
            matches!(checks.map(|r| r.get::<_, bool>(0)), Ok(true)) && matches!(ledger, Ok(true))
        }
        Err(_) => false,
    };
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
