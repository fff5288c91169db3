//! The HTTP protocol of version 3 as types: one message per request and response of
//! `POST /sync/connect`, `/sync/pull`, `/sync/rebuild`, `/sync/push` and `/sync/events`, and
//! the error body, each with its parser and its serializer side by side.
//!
//! Parsing is strict: a body that is not an object, a missing required member, a member of
//! the wrong type, an out-of-range integer or an unknown member is a [`WireError`] naming the
//! member (never its value). Which HTTP answer a parse failure becomes is the caller's: a
//! server answers 400 `invalid_request`, a client treats a response it cannot parse as a
//! contract failure. Checksum objects are read and written only through the strict
//! [`crate::checksum::Checksum`]. Serialization is canonical (RFC 8785 via [`crate::jcs`]).
//!
//! The `protocol_version` member is checked first and apart from the rest
//! ([`protocol_version`]), because an incompatible version answers 426 before anything else
//! is looked at.

mod connect;
pub mod cors;

/// A response header of `POST /sync/rebuild` (every page): the rebuild session's row count,
/// the scope's cardinality at its snapshot, so a client can show its progress against a
/// total. An HTTP header beside the exact body members of spec 000, which it does not change.
pub const SCOPE_ROWS_HEADER: &str = "x-synchro-scope-rows";
mod error;
mod events;
pub mod gate;
mod pull;
mod push;
mod rebuild;
mod sse;

pub use connect::{ConnectRequest, ConnectResponse, SchemaActionKind, SchemaOutcome};
pub use error::{ErrorBody, ErrorCode};
pub use events::{EventsRequest, StreamEvent};
pub use pull::{Change, ChangeOp, PullRequest, PullResponse, ScopeUpdates};
pub use push::{
    AuthoredSchema, Column, Incompatible, Mutation, Operation, Outcome, OutcomeRow, PushRequest,
    PushResponse, REJECTION_CODES,
};
pub use rebuild::{
    RebuildEnd, RebuildRecord, RebuildRequest, RebuildResponse, RenderedRebuildPage,
};
pub use sse::{SseDecoder, MAX_EVENT_BYTES};

use std::collections::BTreeMap;

use crate::checksum::Checksum;
use crate::json::Json;
use crate::manifest::MAX_JSON_COUNTER;

/// Longest client ID, scope ID or table ID, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Longest batch or mutation ID, in bytes.
pub const MAX_MUTATION_ID_BYTES: usize = 128;

/// Largest pull or rebuild page (spec 003: `limit` is 1..1000).
pub const MAX_PAGE: u64 = 1000;

/// Why a message could not be read: which member, and what was wrong. Never carries a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    /// A bounded diagnostic naming the member.
    pub message: &'static str,
}

fn bad(message: &'static str) -> WireError {
    WireError { message }
}

/// The `protocol_version` of a request or response body: `Some(n)` for a nonnegative
/// integer token, `None` when absent or anything else.
pub fn protocol_version(body: &Json) -> Option<u64> {
    match body.get("protocol_version") {
        Some(Json::Number(t)) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
            t.parse().ok()
        }
        _ => None,
    }
}

/// A message that is one JSON object on the wire.
pub trait Message: Sized {
    /// Reads a parsed body strictly.
    fn from_json(body: &Json) -> Result<Self, WireError>;
    /// The body as JSON (member order irrelevant: output is canonicalized).
    fn to_json(&self) -> Json;

    /// Parses and reads JSON text.
    fn parse(text: &str) -> Result<Self, WireError> {
        let body = Json::parse(text).map_err(|_| bad("the body is not valid JSON"))?;
        Self::from_json(&body)
    }

    /// The canonical JSON text.
    fn to_json_string(&self) -> String {
        crate::jcs::to_output_string(&self.to_json())
    }
}

/// Reads the members of one object, remembering which were read, so that
/// [`Members::finish`] can refuse any other.
pub(crate) struct Members<'a> {
    members: &'a [(String, Json)],
    used: Vec<bool>,
}

impl<'a> Members<'a> {
    pub(crate) fn of(value: &'a Json, not_object: &'static str) -> Result<Members<'a>, WireError> {
        match value {
            Json::Object(members) => Ok(Members {
                members,
                used: vec![false; members.len()],
            }),
            _ => Err(bad(not_object)),
        }
    }

    /// The member, if present (a JSON null counts as present).
    pub(crate) fn get(&mut self, name: &str) -> Option<&'a Json> {
        let i = self.members.iter().position(|(k, _)| k == name)?;
        self.used[i] = true;
        Some(&self.members[i].1)
    }

    /// The member, absent and null both as `None`.
    pub(crate) fn optional(&mut self, name: &str) -> Option<&'a Json> {
        self.get(name).filter(|v| **v != Json::Null)
    }

    pub(crate) fn required(
        &mut self,
        name: &str,
        missing: &'static str,
    ) -> Result<&'a Json, WireError> {
        self.get(name).ok_or(bad(missing))
    }

    /// Refuses every member not read.
    pub(crate) fn finish(self, unknown: &'static str) -> Result<(), WireError> {
        if self.used.iter().all(|u| *u) {
            Ok(())
        } else {
            Err(bad(unknown))
        }
    }
}

/// A nonempty string of at most `max` bytes.
pub(crate) fn id(
    value: Option<&Json>,
    max: usize,
    what: &'static str,
) -> Result<String, WireError> {
    match value {
        Some(Json::String(s)) if !s.is_empty() && s.len() <= max => Ok(s.clone()),
        _ => Err(bad(what)),
    }
}

/// Any string.
pub(crate) fn string(value: Option<&Json>, what: &'static str) -> Result<String, WireError> {
    match value {
        Some(Json::String(s)) => Ok(s.clone()),
        _ => Err(bad(what)),
    }
}

/// A positive integer token no larger than 2^53 - 1.
pub fn positive_integer(value: &Json) -> Option<u64> {
    match value {
        Json::Number(t)
            if !t.starts_with('0') && t.len() <= 16 && t.bytes().all(|b| b.is_ascii_digit()) =>
        {
            t.parse().ok().filter(|n| *n <= MAX_JSON_COUNTER)
        }
        _ => None,
    }
}

/// The `client_generation` of a push, pull or rebuild request that has none (the member
/// absent or null): no generation equals it, so the server answers 409
/// `client_generation_expired` as for a stale one (spec 000's error table: "missing, stale,
/// or expired client generation"), not 400.
pub const ABSENT_GENERATION: u64 = 0;

/// A push, pull or rebuild request's `client_generation`: [`ABSENT_GENERATION`] when absent
/// or null, else a positive integer (anything else is 400).
pub(crate) fn request_generation(m: &mut Members<'_>) -> Result<u64, WireError> {
    match m.optional("client_generation") {
        None => Ok(ABSENT_GENERATION),
        v => positive(v, "client_generation must be a positive integer"),
    }
}

/// [`request_generation`]'s inverse: null for [`ABSENT_GENERATION`].
pub(crate) fn generation_json(generation: u64) -> Json {
    if generation == ABSENT_GENERATION {
        Json::Null
    } else {
        num(generation)
    }
}

pub(crate) fn positive(value: Option<&Json>, what: &'static str) -> Result<u64, WireError> {
    value.and_then(positive_integer).ok_or(bad(what))
}

pub(crate) fn boolean(value: Option<&Json>, what: &'static str) -> Result<bool, WireError> {
    match value {
        Some(Json::Bool(b)) => Ok(*b),
        _ => Err(bad(what)),
    }
}

pub(crate) fn strings(value: Option<&Json>, what: &'static str) -> Result<Vec<String>, WireError> {
    match value {
        Some(Json::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or(bad(what)))
            .collect(),
        _ => Err(bad(what)),
    }
}

pub(crate) fn checksum(value: Option<&Json>, what: &'static str) -> Result<Checksum, WireError> {
    value
        .and_then(|v| Checksum::from_json(v).ok())
        .ok_or(bad(what))
}

/// A map from scope ID to an optional cursor string.
pub(crate) fn cursor_map(
    value: Option<&Json>,
    what: &'static str,
) -> Result<BTreeMap<String, Option<String>>, WireError> {
    match value {
        Some(Json::Object(members)) => members
            .iter()
            .map(|(scope, v)| match v {
                Json::Null => Ok((scope.clone(), None)),
                Json::String(s) => Ok((scope.clone(), Some(s.clone()))),
                _ => Err(bad(what)),
            })
            .collect(),
        _ => Err(bad(what)),
    }
}

pub(crate) fn s(v: &str) -> Json {
    Json::String(v.to_owned())
}

pub(crate) fn num(n: u64) -> Json {
    Json::Number(n.to_string())
}

pub(crate) fn object(members: Vec<(&str, Json)>) -> Json {
    Json::Object(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

pub(crate) fn string_array(items: &[String]) -> Json {
    Json::Array(items.iter().map(|x| s(x)).collect())
}

pub(crate) fn checksum_json(c: &Checksum) -> Json {
    // The members of `Checksum::to_json_string`, built directly (a test compares them).
    Json::Object(vec![
        ("algorithm".into(), s("sha256")),
        ("digest".into(), Json::String(hex::encode(c.0))),
        ("encoding".into(), s("hex")),
        ("version".into(), Json::Number("1".into())),
    ])
}

pub(crate) fn cursor_map_json(map: &BTreeMap<String, Option<String>>) -> Json {
    Json::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), v.as_deref().map_or(Json::Null, s)))
            .collect(),
    )
}

/// Checks `protocol_version` is exactly 3 (a message body after the 426 gate).
pub(crate) fn version_3(m: &mut Members<'_>) -> Result<(), WireError> {
    match m.get("protocol_version") {
        Some(Json::Number(t)) if t == "3" => Ok(()),
        _ => Err(bad("protocol_version must be 3")),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
