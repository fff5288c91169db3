//! `POST /sync/connect` (spec 000 "Exact Error And Action Dispatch", spec 003 cursors and
//! client generations). The schema decision itself is [`crate::dispatch`]'s.

use std::collections::BTreeMap;

use super::pull::ScopeUpdates;
use super::{
    bad, boolean, cursor_map, cursor_map_json, id, num, object, positive, s, string, string_array,
    strings, version_3, Members, Message, WireError, MAX_ID_BYTES,
};
use crate::json::Json;

/// A connect request.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectRequest {
    /// The client ID.
    pub client_id: String,
    /// The generation the client holds, if any.
    pub client_generation: Option<u64>,
    /// The schema reference as presented (the fresh sentinel, an exact reference, or
    /// anything: dispatch answers a malformed one with `invalid_schema_reference`).
    pub schema: Json,
    /// An explicit incompatible-schema reset.
    pub schema_reset: bool,
    /// The app runtime's SemVer, compared with the server's minimum.
    pub client_version: Option<String>,
    /// Presented cursors (null: none for that scope).
    pub scope_cursors: BTreeMap<String, Option<String>>,
    /// Portable seed continuation receipts (`sc1.`) of the scopes a seed installed, for the
    /// server to turn into cursors at the seed's boundary (`seed_receipts`; a scope here
    /// has no cursor in `scope_cursors`).
    pub seed_receipts: BTreeMap<String, String>,
}

impl Message for ConnectRequest {
    fn from_json(body: &Json) -> Result<ConnectRequest, WireError> {
        let mut m = Members::of(body, "the body is not a valid JSON object")?;
        version_3(&mut m)?;
        let client_id = id(
            m.get("client_id"),
            MAX_ID_BYTES,
            "client_id must be a nonempty string of at most 256 bytes",
        )?;
        let client_generation = match m.optional("client_generation") {
            None => None,
            v => Some(positive(v, "client_generation must be a positive integer")?),
        };
        let schema = m.get("schema").cloned().unwrap_or(Json::Null);
        let schema_reset = match m.optional("schema_reset") {
            None => false,
            v => boolean(v, "schema_reset must be a boolean")?,
        };
        let client_version = match m.optional("client_version") {
            None => None,
            v => Some(string(v, "client_version must be a string")?),
        };
        let scope_cursors = match m.optional("scope_cursors") {
            None => BTreeMap::new(),
            v => cursor_map(v, "scope_cursors values must be strings or null")?,
        };
        let seed_receipts = match m.optional("seed_receipts") {
            None => BTreeMap::new(),
            v => cursor_map(v, "seed_receipts values must be strings")?
                .into_iter()
                .map(|(scope, r)| r.map(|r| (scope, r)))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("seed_receipts values must be strings"))?,
        };
        if seed_receipts
            .keys()
            .any(|s| scope_cursors.get(s).is_some_and(Option::is_some))
        {
            return Err(bad("a scope has both a cursor and a seed receipt"));
        }
        m.finish("the request has an unknown member")?;
        Ok(ConnectRequest {
            client_id,
            client_generation,
            schema,
            schema_reset,
            client_version,
            scope_cursors,
            seed_receipts,
        })
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("protocol_version", num(3)),
            ("client_id", s(&self.client_id)),
            ("schema", self.schema.clone()),
        ];
        if let Some(g) = self.client_generation {
            members.push(("client_generation", num(g)));
        }
        if self.schema_reset {
            members.push(("schema_reset", Json::Bool(true)));
        }
        if let Some(v) = &self.client_version {
            members.push(("client_version", s(v)));
        }
        if !self.scope_cursors.is_empty() {
            members.push(("scope_cursors", cursor_map_json(&self.scope_cursors)));
        }
        if !self.seed_receipts.is_empty() {
            members.push((
                "seed_receipts",
                Json::Object(
                    self.seed_receipts
                        .iter()
                        .map(|(scope, r)| (scope.clone(), s(r)))
                        .collect(),
                ),
            ));
        }
        object(members)
    }
}

/// Which schema action a 200 connect response names (`schema.action`); the decision with
/// its members is [`crate::dispatch::SchemaAction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SchemaActionKind {
    /// The presented schema is current (the default: nothing to do).
    #[default]
    None,
    /// Install the current manifest; every scope keeps its rows.
    Replace,
    /// Install the current manifest; the affected scopes rebuild.
    RebuildLocal,
    /// The history crossed an incompatible change: the client enters upgrade_required.
    Unsupported,
}

impl SchemaActionKind {
    /// Every action.
    pub const ALL: [SchemaActionKind; 4] = [
        SchemaActionKind::None,
        SchemaActionKind::Replace,
        SchemaActionKind::RebuildLocal,
        SchemaActionKind::Unsupported,
    ];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaActionKind::None => "none",
            SchemaActionKind::Replace => "replace",
            SchemaActionKind::RebuildLocal => "rebuild_local",
            SchemaActionKind::Unsupported => "unsupported",
        }
    }

    /// The action spelled `name` on the wire.
    pub fn parse(name: &str) -> Option<SchemaActionKind> {
        SchemaActionKind::ALL
            .into_iter()
            .find(|a| a.as_str() == name)
    }
}

/// The `schema` member of a 200 connect response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaOutcome {
    /// The action.
    pub action: SchemaActionKind,
    /// The current schema version.
    pub version: u64,
    /// The current schema hash (64 lowercase hex).
    pub hash: String,
    /// Why, for `unsupported`.
    pub reason: Option<String>,
}

/// A 200 connect response.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectResponse {
    /// The generation to use from now on.
    pub client_generation: u64,
    /// The assignment's version.
    pub scope_set_version: u64,
    /// Assignment changes since the client's last connect.
    pub scope_updates: ScopeUpdates,
    /// The schema decision.
    pub schema: SchemaOutcome,
    /// The manifest to install (`replace`, `rebuild_local`).
    pub schema_definition: Option<Json>,
    /// Scopes to rebuild after the local migration (`rebuild_local`, nonempty).
    pub affected_scopes: Option<Vec<String>>,
    /// Presented historical-schema cursors: re-issued (a string) or null (rebuild).
    pub scope_cursor_updates: BTreeMap<String, Option<String>>,
}

impl Message for ConnectResponse {
    fn from_json(body: &Json) -> Result<ConnectResponse, WireError> {
        let mut m = Members::of(body, "a connect response is an object")?;
        version_3(&mut m)?;
        let client_generation = positive(
            m.get("client_generation"),
            "client_generation must be a positive integer",
        )?;
        let scope_set_version = positive(
            m.get("scope_set_version"),
            "scope_set_version must be a positive integer",
        )?;
        let scope_updates = ScopeUpdates::from_json(m.get("scope_updates"))?;
        let mut sm = Members::of(
            m.required("schema", "a connect response has a schema")?,
            "schema is an object",
        )?;
        // An unknown action is refused below, after the other members are read (their
        // errors come first, as they always did).
        let action = string(sm.get("action"), "schema.action must be a string")?;
        let action = SchemaActionKind::parse(&action);
        let version = positive(
            sm.get("version"),
            "schema.version must be a positive integer",
        )?;
        let hash = match sm.get("hash") {
            Some(Json::String(h)) if crate::manifest::parse_hex32(h).is_ok() => h.clone(),
            _ => return Err(bad("schema.hash must be 64 lowercase hex characters")),
        };
        let reason = match sm.get("reason") {
            None => None,
            v => Some(string(v, "schema.reason must be a string")?),
        };
        sm.finish("schema has an unknown member")?;
        let schema_definition = m.get("schema_definition").cloned();
        let affected_scopes = match m.get("affected_scopes") {
            None => None,
            v => Some(strings(v, "affected_scopes must be an array of strings")?),
        };
        let needs = |definition: bool, affected: bool, reason_: bool| {
            schema_definition.is_some() == definition
                && affected_scopes.as_ref().is_some_and(|a| !a.is_empty()) == affected
                && (affected || affected_scopes.is_none())
                && reason.is_some() == reason_
        };
        let Some(action) = action else {
            return Err(bad("schema.action is not a known action"));
        };
        let consistent = match action {
            SchemaActionKind::None => needs(false, false, false),
            SchemaActionKind::Replace => needs(true, false, false),
            SchemaActionKind::RebuildLocal => needs(true, true, false),
            SchemaActionKind::Unsupported => needs(false, false, true),
        };
        if !consistent {
            return Err(bad("the members do not match schema.action"));
        }
        let scope_cursor_updates = match m.get("scope_cursor_updates") {
            None => BTreeMap::new(),
            v => cursor_map(v, "scope_cursor_updates values must be strings or null")?,
        };
        m.finish("a connect response has an unknown member")?;
        Ok(ConnectResponse {
            client_generation,
            scope_set_version,
            scope_updates,
            schema: SchemaOutcome {
                action,
                version,
                hash,
                reason,
            },
            schema_definition,
            affected_scopes,
            scope_cursor_updates,
        })
    }

    fn to_json(&self) -> Json {
        let mut schema = vec![
            ("action", s(self.schema.action.as_str())),
            ("version", num(self.schema.version)),
            ("hash", s(&self.schema.hash)),
        ];
        if let Some(r) = &self.schema.reason {
            schema.push(("reason", s(r)));
        }
        let mut members = vec![
            ("protocol_version", num(3)),
            ("client_generation", num(self.client_generation)),
            ("scope_set_version", num(self.scope_set_version)),
            ("scope_updates", self.scope_updates.to_json()),
            ("schema", object(schema)),
            (
                "scope_cursor_updates",
                cursor_map_json(&self.scope_cursor_updates),
            ),
        ];
        if let Some(d) = &self.schema_definition {
            members.push(("schema_definition", d.clone()));
        }
        if let Some(a) = &self.affected_scopes {
            members.push(("affected_scopes", string_array(a)));
        }
        object(members)
    }
}
