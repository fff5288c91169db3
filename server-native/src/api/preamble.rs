//! What every endpoint does first, in the spec's order: the body (size, arrival within the
//! body timeout, JSON), the protocol version (426 before anything else), NUL characters
//! (PostgreSQL text cannot hold them), the bearer token (401), then the request's members
//! through its `wire` type (400). Everything after the body's arrival is
//! `synchro_protocol::wire::gate`, shared with the edge gateway.

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
    /// The token's `exp` (Unix seconds): a long-lived response ends by then.
    pub expires_at: u64,
}

/// Runs the preamble for a request of type `R`: the body's size and arrival here, the rest
/// through the shared gate ([`wire::gate`], which the edge gateway runs too).
pub(crate) async fn preamble<R: Message>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Authenticated<R>, ApiError> {
    // The token is checked before the body is read, only to bound the wait: a request
    // without a valid one gets the short body bound and 401 past it. Its body, when it
    // arrives in time, is still checked first (a wrong protocol version is 426 before 401).
    let verified = state.auth.verify(headers).await;
    let bytes = read_body(headers, body, &state.config, verified.is_some()).await?;
    let req = wire::gate::read_request(&bytes)?;
    let Some((user_id, expires_at)) = verified else {
        return Err(ApiError::unauthorized());
    };
    let request = wire::gate::parse_request(&req)?;
    Ok(Authenticated {
        request,
        user_id,
        expires_at,
    })
}

/// The request body: at most `config.max_body_bytes`, all of it within
/// `config.body_timeout` (`config.unauthenticated_body_timeout` when the request has no
/// valid token: then 401 past it).
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    config: &Config,
    authenticated: bool,
) -> Result<axum::body::Bytes, ApiError> {
    let limit = config.max_body_bytes;
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(wire::gate::body_too_large().into());
    }
    let bound = if authenticated {
        config.body_timeout
    } else {
        config.unauthenticated_body_timeout.min(config.body_timeout)
    };
    let Ok(read) = tokio::time::timeout(bound, axum::body::to_bytes(body, limit)).await else {
        // The rest of the body may still be on its way: answer, then close.
        if !authenticated {
            return Err(ApiError::unauthorized().closing());
        }
        return Err(
            ApiError::overloaded("request_body_timeout", config.retry_after_seconds).closing(),
        );
    };
    read.map_err(|_| wire::gate::body_too_large().into())
}

/// Whether any string or member name in `v` contains NUL.
pub(crate) fn has_nul(v: &Json) -> bool {
    wire::gate::has_nul(v)
}
