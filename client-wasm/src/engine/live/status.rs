//! What a live session tells the application: [`LiveStatus`] as it changes, a failure as
//! [`LiveError`] (a code and a status, never a value, key, identifier or token), and how
//! the session ended ([`LiveEnd`]).

use crate::engine::{ClientError, UpgradeReason};

/// A failure as the application sees it: the stable code (as [`ClientError::code`]), the
/// HTTP status when the server answered, and whether waiting helps. Never a value, key,
/// identifier or token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveError {
    /// The stable code (`network_error`, `temporary_unavailable`, `unauthorized`, ...).
    pub code: String,
    /// The HTTP status of a server's refusal.
    pub status: Option<u16>,
    /// Whether the server (or the network) said trying again can succeed.
    pub retryable: bool,
}

impl LiveError {
    pub(super) fn of(e: &ClientError) -> LiveError {
        LiveError {
            code: e.code().to_owned(),
            status: match e {
                ClientError::Server { status, .. } => Some(*status),
                _ => None,
            },
            retryable: e.retryable(),
        }
    }
}

/// What a live session is doing, reported to its status callback when it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveStatus {
    /// Connecting (the first time, or because the protocol asked for it).
    Connecting,
    /// A round is running (push, rebuild, pull).
    Syncing,
    /// Connected and caught up, the events stream open.
    Live,
    /// Something failed; the next attempt follows after `retry_in_ms`.
    Offline {
        /// What failed last.
        error: LiveError,
        /// The wait before the next attempt.
        retry_in_ms: u64,
        /// Failures in a row (1 for the first).
        failures: u32,
    },
    /// The session ended.
    Stopped,
}

/// How a live session ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveEnd {
    /// [`LiveHandle::stop`] was called.
    Stopped,
    /// The server refused this client (HTTP 426) or its schema history (`unsupported`):
    /// nothing more is sent until the application is upgraded; queue and data are kept.
    UpgradeRequired(UpgradeReason),
}
