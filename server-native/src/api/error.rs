//! The one error type of the HTTP API: a [`wire::ErrorBody`](synchro_protocol::wire::ErrorBody)
//! (the spec's code, status and retryability) plus how to answer it (`Retry-After` for load
//! limits, closing the connection when a body was not read to its end).
//!
//! A database error becomes an [`ApiError`] in one place ([`From<tokio_postgres::Error>`]):
//! 503 `temporary_unavailable`, logged with its SQLSTATE class only (a server message can
//! quote a value).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::SchemaRef;
use synchro_protocol::wire::{ErrorBody, ErrorCode, Message};

/// A wire error with the spec's exact status, code and retryability.
#[derive(Debug)]
pub struct ApiError {
    body: ErrorBody,
    /// `Retry-After` seconds and the `reason`, for refusals under load.
    retry_after: Option<(u64, &'static str)>,
    /// Close the connection after answering (the request body was not read to its end).
    close: bool,
}

impl From<ErrorBody> for ApiError {
    fn from(body: ErrorBody) -> ApiError {
        ApiError {
            body,
            retry_after: None,
            close: false,
        }
    }
}

/// Whether a database error comes from the connection or the server going away or being
/// overloaded (closed, SQLSTATE class 08 connection exception, 57 operator intervention such
/// as a shutdown or a terminated session, 53 insufficient resources), not from the statement:
/// the request may succeed when retried.
pub(crate) fn transient(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || e.as_db_error()
            .is_some_and(|d| matches!(&d.code().code()[..2], "08" | "57" | "53"))
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> ApiError {
        match e.as_db_error() {
            Some(d) => tracing::warn!(
                sqlstate_class = &d.code().code()[..2],
                sqlstate = d.code().code(),
                "database error"
            ),
            None if e.is_closed() => tracing::warn!("database connection closed"),
            None => tracing::warn!("database error without SQLSTATE"),
        }
        ApiError::unavailable()
    }
}

impl ApiError {
    fn new(code: ErrorCode, message: &'static str) -> ApiError {
        ErrorBody::new(code, message).into()
    }

    /// 400 `invalid_request`.
    pub(crate) fn invalid_request(message: &'static str) -> ApiError {
        synchro_protocol::wire::gate::invalid_request(message).into()
    }

    /// 401 `unauthorized`.
    pub(crate) fn unauthorized() -> ApiError {
        synchro_protocol::wire::gate::unauthorized().into()
    }

    /// 503 `temporary_unavailable`.
    pub(crate) fn unavailable() -> ApiError {
        ErrorBody::unavailable(None).into()
    }

    /// 503 `temporary_unavailable` with a `reason`.
    pub(crate) fn unavailable_because(reason: &str) -> ApiError {
        ErrorBody::unavailable(Some(reason)).into()
    }

    /// 503 `temporary_unavailable` with a `reason` and `Retry-After`: a load limit.
    pub(crate) fn overloaded(reason: &'static str, retry_after_seconds: u64) -> ApiError {
        let mut e = ApiError::unavailable_because(reason);
        e.retry_after = Some((retry_after_seconds, reason));
        e
    }

    /// This error, and close the connection after answering it.
    pub(crate) fn closing(mut self) -> ApiError {
        self.close = true;
        self
    }

    /// 500 `sync_integrity_failure`: something the server must verify could not be. The
    /// bounded reason is logged (never a value, key or identity) and says what in the message.
    pub(crate) fn integrity(why: Integrity) -> ApiError {
        tracing::error!(reason = why.as_str(), "sync integrity failure");
        ApiError::new(ErrorCode::SyncIntegrityFailure, why.message())
    }

    /// 422 `schema_mismatch` with the current and received references.
    pub(crate) fn schema_mismatch(current: SchemaRef, received: &Json) -> ApiError {
        ErrorBody::new(
            ErrorCode::SchemaMismatch,
            "the request schema is not current",
        )
        .with(
            "current_schema",
            Json::Object(vec![
                ("version".into(), Json::Number(current.version.to_string())),
                ("hash".into(), Json::String(hex::encode(current.hash))),
            ]),
        )
        .with("received_schema", received.clone())
        .into()
    }

    /// 409 `rebuild_restart_required` for a scope.
    pub(crate) fn rebuild_restart(scope_id: &str) -> ApiError {
        ErrorBody::new(
            ErrorCode::RebuildRestartRequired,
            "the rebuild session is no longer valid; start again",
        )
        .with("scope_id", Json::String(scope_id.to_owned()))
        .into()
    }

    /// 409 `client_generation_expired` with the current generation (null when none).
    pub(crate) fn generation_expired(current: Option<u64>) -> ApiError {
        ErrorBody::generation_expired(current).into()
    }

    /// 426 `upgrade_required`: the protocol version, or the client runtime, is too old.
    pub(crate) fn upgrade_required(
        received_protocol_version: Option<u64>,
        runtime: bool,
    ) -> ApiError {
        synchro_protocol::wire::gate::upgrade_required(received_protocol_version, runtime).into()
    }

    /// 400 `invalid_schema_reference` echoing the presented reference.
    pub(crate) fn invalid_schema_reference(reason: &'static str, received: &Json) -> ApiError {
        ErrorBody::new(ErrorCode::InvalidSchemaReference, reason)
            .with("received_schema", received.clone())
            .into()
    }

    /// The error body, `{"error":{...}}`, as sent.
    pub(crate) fn body_text(&self) -> String {
        self.body.to_json_string()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.body.code;
        tracing::info!(
            status = code.status(),
            code = code.as_str(),
            reason = self.retry_after.map(|(_, reason)| reason),
            "request refused"
        );
        let mut response = (
            StatusCode::from_u16(code.status()).expect("a valid status"),
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

/// Why a response could not be verified (`sync_integrity_failure`): a bounded reason for the
/// log and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Integrity {
    /// The registered assignment function is missing or changed since its registration.
    AssignmentChanged,
    /// The assignment function failed.
    AssignmentFailed,
    /// The assignment function returned a null, blank or `user:` scope.
    AssignmentInvalidScope,
    /// The assignment function returned more scopes than its bound.
    AssignmentBoundExceeded,
    /// A stored row, key, value or outcome does not read under the current manifest.
    StoredRow,
    /// A row or scope digest could not be computed (a duplicate identity, a bad value).
    Digest,
    /// The database answered other rows than were asked for.
    Answer,
    /// A thread rendering a rebuild page failed.
    Render,
}

impl Integrity {
    /// The code logged.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Integrity::AssignmentChanged => "assignment_changed",
            Integrity::AssignmentFailed => "assignment_failed",
            Integrity::AssignmentInvalidScope => "assignment_invalid_scope",
            Integrity::AssignmentBoundExceeded => "assignment_bound_exceeded",
            Integrity::StoredRow => "stored_row",
            Integrity::Digest => "digest",
            Integrity::Answer => "answer",
            Integrity::Render => "render",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Integrity::AssignmentChanged
            | Integrity::AssignmentFailed
            | Integrity::AssignmentInvalidScope
            | Integrity::AssignmentBoundExceeded => "scope assignment could not be evaluated",
            Integrity::StoredRow => "a stored row could not be read under the current schema",
            Integrity::Digest => "a checksum could not be computed",
            Integrity::Answer => "the database answered inconsistently",
            Integrity::Render => "a page could not be rendered",
        }
    }
}
