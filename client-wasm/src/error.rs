//! The client's errors, one type per layer: [`StorageError`] for everything the local
//! database does (the store), [`ClientError`] for the engine, which wraps it. Each has a
//! stable `code()`; no message repeats a row value, a key, a token or a statement's text.
//! [`UpgradeReason`] says why `upgrade_required` was reached.

use synchro_protocol::wire::{ErrorBody, Message};

use crate::transport::{Response, TransportError};

/// Storage failures, each with a stable [`StorageError::code`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// SQLite refused an operation. The message never repeats the statement text (which
    /// can hold values).
    #[error("local database error: {}", describe(.0))]
    Sqlite(#[from] rusqlite::Error),
    /// A stored value does not match its declared field.
    #[error(
        "a stored value of field {field_id} in table {table_id} does not match its declared type"
    )]
    Corrupt {
        /// Logical table ID.
        table_id: String,
        /// Logical field ID.
        field_id: String,
    },
    /// A value given for a write does not match its declared field.
    #[error("a value for field {field_id} does not match its declared type")]
    InvalidValue {
        /// Logical field ID.
        field_id: String,
    },
    /// A write leaves out a field that may not be null.
    #[error("no value for the required field {field_id}")]
    MissingValue {
        /// Logical field ID.
        field_id: String,
    },
    /// The database already has a schema, or has none where one is needed, or its recorded
    /// manifest does not verify, or its synchro tables are not a layout this engine knows.
    #[error("{0}")]
    Schema(String),
    /// Data from the server failed verification (a row or scope checksum, or the shape of a
    /// page); nothing of it was applied.
    #[error("the pull page failed verification: {0}")]
    Verification(&'static str),
    /// A portable seed failed verification (a corrupt or tampered file, rows that do not
    /// digest to its receipts, or a database that is not a seed); nothing of it was used.
    #[error("the seed failed verification: {0}")]
    Seed(&'static str),
    /// The manifest names no such table.
    #[error("the active schema has no table {0}")]
    UnknownTable(String),
    /// An insert of a key the table holds already, or an update or delete of one it does not.
    #[error("{0}")]
    RowState(&'static str),
    /// A local write larger than one pushed mutation may be (the server's strict limits):
    /// refused before anything is written or queued, since no push could ever carry it.
    #[error("the write is too large to push: {0}")]
    TooLarge(&'static str),
    /// Protocol-level failure (manifest or migration plan).
    #[error(transparent)]
    Protocol(#[from] synchro_protocol::Error),
}

fn describe(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqlInputError { msg, offset, .. } => {
            format!("{msg} (at offset {offset} of the statement)")
        }
        other => other.to_string(),
    }
}

impl StorageError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StorageError::Sqlite(_) => "local_database_error",
            StorageError::Corrupt { .. } => "local_integrity_failure",
            StorageError::InvalidValue { .. } | StorageError::MissingValue { .. } => {
                "invalid_value"
            }
            StorageError::Schema(_) => "local_schema_error",
            StorageError::Verification(_) => "sync_integrity_failure",
            StorageError::Seed(_) => "seed_invalid",
            StorageError::UnknownTable(_) => "unknown_table",
            StorageError::RowState(_) => "invalid_row_state",
            StorageError::TooLarge(_) => "write_too_large",
            StorageError::Protocol(_) => "protocol_error",
        }
    }
}

/// Client failures, each with a stable [`ClientError::code`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Local storage or verification.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The network failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The server answered with an error object.
    #[error("the server refused the request: {status} {code}")]
    Server {
        /// HTTP status.
        status: u16,
        /// The spec's error code.
        code: String,
        /// The server's `retryable`.
        retryable: bool,
    },
    /// The server answered something that is not the protocol.
    #[error("the server response is malformed: {0}")]
    Malformed(&'static str),
    /// The application must be upgraded before this database syncs again (HTTP 426, or the
    /// connect action `unsupported`); local data and the queue are kept. Not retryable: the
    /// same client asks the server nothing more until it is upgraded.
    #[error("this client must be upgraded: {}", .0.describe())]
    UpgradeRequired(UpgradeReason),
    /// The configured `client_version` is not a SemVer 2.0.0 version; the client was not
    /// opened and nothing was written.
    #[error("the client version is not a SemVer 2.0.0 version: {reason}")]
    InvalidClientVersion {
        /// Which SemVer rule it breaks.
        reason: &'static str,
    },
    /// A non-retryable local inconsistency; nothing is sent until it is resolved.
    #[error("the local database is blocked: {0}")]
    Blocked(&'static str),
    /// The state machine refused a transition.
    #[error(transparent)]
    IllegalTransition(synchro_protocol::Error),
    /// An injected crash (tests).
    #[error("injected interruption")]
    Injected,
}

impl ClientError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            ClientError::Storage(e) => e.code(),
            ClientError::Transport(_) => "network_error",
            ClientError::Server { code, .. } => code,
            ClientError::Malformed(_) => "protocol_error",
            ClientError::UpgradeRequired(_) => "upgrade_required",
            ClientError::InvalidClientVersion { .. } => "invalid_client_version",
            ClientError::Blocked(_) => "local_state_inconsistent",
            ClientError::IllegalTransition(_) => "illegal_state_transition",
            ClientError::Injected => "injected",
        }
    }

    /// Why an upgrade is required, for [`ClientError::UpgradeRequired`].
    pub fn upgrade_reason(&self) -> Option<UpgradeReason> {
        match self {
            ClientError::UpgradeRequired(r) => Some(*r),
            _ => None,
        }
    }

    /// Whether trying again later can succeed without a change on this side.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Transport(_) => true,
            ClientError::Server { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The error a non-200 response stands for: the server's error object, or (for a body
    /// that is not a protocol 3 error, a proxy's answer say) `unknown_error`, retryable on a
    /// 5xx.
    pub(crate) fn from_response(r: &Response) -> ClientError {
        match ErrorBody::from_json(&r.body) {
            Ok(e) => ClientError::Server {
                status: r.status,
                code: e.code.as_str().to_owned(),
                retryable: e.code.retryable(),
            },
            Err(_) => ClientError::Server {
                status: r.status,
                code: "unknown_error".to_owned(),
                retryable: r.status >= 500,
            },
        }
    }

    /// Whether the server answered with the error `code`.
    pub(crate) fn is_server(&self, code: &str) -> bool {
        matches!(self, ClientError::Server { code: c, .. } if c == code)
    }
}

/// Why a client must be upgraded ([`ClientError::UpgradeRequired`]), each with a stable
/// [`UpgradeReason::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpgradeReason {
    /// The server refused this client's runtime with HTTP 426 (its `client_version` is
    /// below the server's minimum, or its protocol version is not the server's). A client
    /// opened with a version of higher precedence connects again; nothing else does.
    ClientRuntime,
    /// The server answered `unsupported`: the schema history crossed an incompatible
    /// change. After an application upgrade, the explicit schema reset continues.
    SchemaHistory,
}

impl UpgradeReason {
    /// Stable machine-readable reason: `client_runtime` or `schema_history`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeReason::ClientRuntime => "client_runtime",
            UpgradeReason::SchemaHistory => "schema_history",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            UpgradeReason::ClientRuntime => {
                "the server requires a newer client runtime than this client's version"
            }
            UpgradeReason::SchemaHistory => {
                "the schema history crossed an incompatible change; upgrade, then request the schema reset"
            }
        }
    }
}

impl From<rusqlite::Error> for ClientError {
    fn from(e: rusqlite::Error) -> ClientError {
        ClientError::Storage(StorageError::Sqlite(e))
    }
}
