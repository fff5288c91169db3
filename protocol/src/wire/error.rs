//! Error bodies: `{"error":{"code","message","retryable", ...}}` with the spec's exact codes,
//! statuses and retryability (spec 000/003 "Exact Error And Action Dispatch").

use super::{bad, num, object, s, Members, WireError};
use crate::json::Json;

/// Every error code of protocol version 3, with its HTTP status and retryability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 400: a malformed request, or a bound exceeded.
    InvalidRequest,
    /// 400: a malformed connect schema reference.
    InvalidSchemaReference,
    /// 401: a missing or invalid bearer token.
    Unauthorized,
    /// 409: the client generation is not current.
    ClientGenerationExpired,
    /// 409: the rebuild session is no longer valid.
    RebuildRestartRequired,
    /// 422: the request schema is not the exact current schema.
    SchemaMismatch,
    /// 426: the protocol version (or the client runtime) is not supported.
    UpgradeRequired,
    /// 500: the server could not evaluate something it must verify.
    SyncIntegrityFailure,
    /// 503: the service (or capture) is temporarily unavailable.
    TemporaryUnavailable,
}

impl ErrorCode {
    /// Every code, for tests and tables.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidSchemaReference,
        ErrorCode::Unauthorized,
        ErrorCode::ClientGenerationExpired,
        ErrorCode::RebuildRestartRequired,
        ErrorCode::SchemaMismatch,
        ErrorCode::UpgradeRequired,
        ErrorCode::SyncIntegrityFailure,
        ErrorCode::TemporaryUnavailable,
    ];

    /// The wire code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidSchemaReference => "invalid_schema_reference",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ClientGenerationExpired => "client_generation_expired",
            ErrorCode::RebuildRestartRequired => "rebuild_restart_required",
            ErrorCode::SchemaMismatch => "schema_mismatch",
            ErrorCode::UpgradeRequired => "upgrade_required",
            ErrorCode::SyncIntegrityFailure => "sync_integrity_failure",
            ErrorCode::TemporaryUnavailable => "temporary_unavailable",
        }
    }

    /// The code for a wire string.
    pub fn from_wire(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest | ErrorCode::InvalidSchemaReference => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::ClientGenerationExpired | ErrorCode::RebuildRestartRequired => 409,
            ErrorCode::SchemaMismatch => 422,
            ErrorCode::UpgradeRequired => 426,
            ErrorCode::SyncIntegrityFailure => 500,
            ErrorCode::TemporaryUnavailable => 503,
        }
    }

    /// Whether a client may retry the same request.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::TemporaryUnavailable)
    }
}

/// An error response body. `details` are the code's further members (`current_schema`,
/// `received_schema`, `current_client_generation`, `scope_id`, `reason`,
/// `required_protocol_version`, `received_protocol_version`), in any order.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBody {
    /// The code (status and retryability follow from it).
    pub code: ErrorCode,
    /// A bounded diagnostic; never a value, key, identity or token.
    pub message: String,
    /// The code's further members.
    pub details: Vec<(String, Json)>,
}

/// The further members each code may carry.
fn allowed_details(code: ErrorCode) -> &'static [&'static str] {
    match code {
        ErrorCode::InvalidSchemaReference => &["received_schema"],
        ErrorCode::SchemaMismatch => &["current_schema", "received_schema"],
        ErrorCode::ClientGenerationExpired => &["current_client_generation"],
        ErrorCode::RebuildRestartRequired => &["scope_id"],
        ErrorCode::UpgradeRequired => &["required_protocol_version", "received_protocol_version"],
        ErrorCode::TemporaryUnavailable => &["reason"],
        ErrorCode::InvalidRequest | ErrorCode::Unauthorized | ErrorCode::SyncIntegrityFailure => {
            &[]
        }
    }
}

impl ErrorBody {
    /// A body with no further members.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// Adds a further member.
    pub fn with(mut self, name: &str, value: Json) -> ErrorBody {
        self.details.push((name.to_owned(), value));
        self
    }

    /// A further member.
    pub fn detail(&self, name: &str) -> Option<&Json> {
        self.details.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// 503 `temporary_unavailable` with a `reason`.
    pub fn unavailable(reason: Option<&str>) -> ErrorBody {
        let body = ErrorBody::new(
            ErrorCode::TemporaryUnavailable,
            "the service is temporarily unavailable",
        );
        match reason {
            Some(r) => body.with("reason", s(r)),
            None => body,
        }
    }

    /// 409 `client_generation_expired` with the current generation (null when none).
    pub fn generation_expired(current: Option<u64>) -> ErrorBody {
        ErrorBody::new(
            ErrorCode::ClientGenerationExpired,
            "the client generation is not current; reconnect",
        )
        .with("current_client_generation", current.map_or(Json::Null, num))
    }
}

impl super::Message for ErrorBody {
    fn from_json(body: &Json) -> Result<ErrorBody, WireError> {
        let mut outer = Members::of(body, "an error body is an object")?;
        let error = outer.required("error", "an error body has an error member")?;
        outer.finish("an error body has only the error member")?;
        let mut m = Members::of(error, "error is an object")?;
        let code = m
            .required("code", "error.code is required")?
            .as_str()
            .and_then(ErrorCode::from_wire)
            .ok_or(bad("error.code is not a protocol 3 code"))?;
        let message = super::string(m.get("message"), "error.message must be a string")?;
        if super::boolean(m.get("retryable"), "error.retryable must be a boolean")?
            != code.retryable()
        {
            return Err(bad("error.retryable does not match its code"));
        }
        let mut details = Vec::new();
        for name in allowed_details(code) {
            if let Some(v) = m.get(name) {
                details.push(((*name).to_owned(), v.clone()));
            }
        }
        m.finish("error has a member its code does not define")?;
        Ok(ErrorBody {
            code,
            message,
            details,
        })
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("code".to_owned(), s(self.code.as_str())),
            ("message".to_owned(), s(&self.message)),
            ("retryable".to_owned(), Json::Bool(self.code.retryable())),
        ];
        members.extend(self.details.iter().cloned());
        object(vec![("error", Json::Object(members))])
    }
}
