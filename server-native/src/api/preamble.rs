//! What every endpoint does first, in the spec's order: the body (size, arrival within the
//! body timeout, JSON), the protocol version (426 before anything else), NUL characters
//! (PostgreSQL text cannot hold them), the bearer token (401), then the request's members
//! through its `wire` type (400).

use axum::body::Body;
use axum::http::HeaderMap;
use synchro_protocol::json::Json;
use synchro_protocol::wire::{self, Message};

use super::{ApiError, AppState, Config};

/// A request that passed the preamble.
pub(crate) struct Authenticated<R> {
    /// The request, read strictly.
    pub request: R,
    /// The canonical user ID of its bearer token.
    pub user_id: String,
}

/// Runs the preamble for a request of type `R`.
pub(crate) async fn preamble<R: Message>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Authenticated<R>, ApiError> {
    let req = read_body(headers, body, &state.config).await?;
    if !matches!(req, Json::Object(_)) {
        return Err(ApiError::invalid_request(
            "the body is not a valid JSON object",
        ));
    }
    // Protocol compatibility comes before everything else (spec 000).
    let protocol_version = wire::protocol_version(&req);
    if protocol_version != Some(u64::from(synchro_protocol::PROTOCOL_VERSION)) {
        return Err(ApiError::upgrade_required(protocol_version, false));
    }
    // PostgreSQL text cannot hold NUL: refuse it here rather than fail a statement later
    // (which would look like an outage). Pushed row values are judged per mutation.
    if request_has_nul(&req) {
        return Err(ApiError::invalid_request(
            "a string in the request contains a NUL character",
        ));
    }
    let Some(user_id) = state.auth.user_id(headers) else {
        return Err(ApiError::unauthorized());
    };
    let request = R::from_json(&req).map_err(|e| ApiError::invalid_request(e.message))?;
    Ok(Authenticated { request, user_id })
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
        return Err(
            ApiError::overloaded("request_body_timeout", config.retry_after_seconds).closing(),
        );
    };
    let bytes = read.map_err(|_| {
        ApiError::invalid_request("the request body exceeds the configured maximum")
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::invalid_request("the body is not UTF-8"))?;
    Json::parse(text).map_err(|_| ApiError::invalid_request("the body is not a valid JSON object"))
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
