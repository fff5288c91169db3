//! `POST /sync/pull` (spec 001 terminal rules, spec 003 cursors and limits).

use std::collections::BTreeMap;

use super::{
    bad, boolean, checksum, checksum_json, cursor_map, cursor_map_json, id, num, object, positive,
    s, string, string_array, strings, version_3, Members, Message, WireError, MAX_ID_BYTES,
    MAX_PAGE,
};
use crate::checksum::Checksum;
use crate::json::Json;

/// A pull request.
#[derive(Debug, Clone, PartialEq)]
pub struct PullRequest {
    /// The client ID (1..=256 bytes).
    pub client_id: String,
    /// The current client generation ([`super::ABSENT_GENERATION`] when the request has none).
    pub client_generation: u64,
    /// The schema reference as presented (the exact-current gate judges it).
    pub schema: Json,
    /// Scope → cursor (null: no cursor yet).
    pub scope_cursors: BTreeMap<String, Option<String>>,
    /// Page size, 1..=1000.
    pub limit: u64,
}

/// The members pull and rebuild requests share: `client_id`, `client_generation`, `schema`
/// and `limit`.
pub(crate) fn common(m: &mut Members<'_>) -> Result<(String, u64, Json, u64), WireError> {
    version_3(m)?;
    let client_id = id(
        m.get("client_id"),
        MAX_ID_BYTES,
        "client_id must be a nonempty string of at most 256 bytes",
    )?;
    let client_generation = super::request_generation(m)?;
    let schema = m.get("schema").cloned().unwrap_or(Json::Null);
    let limit = m
        .get("limit")
        .and_then(super::positive_integer)
        .filter(|l| *l <= MAX_PAGE)
        .ok_or(bad("limit must be an integer from 1 to 1000"))?;
    Ok((client_id, client_generation, schema, limit))
}

impl Message for PullRequest {
    fn from_json(body: &Json) -> Result<PullRequest, WireError> {
        let mut m = Members::of(body, "the body is not a valid JSON object")?;
        let (client_id, client_generation, schema, limit) = common(&mut m)?;
        let scope_cursors = match m.optional("scope_cursors") {
            None => BTreeMap::new(),
            v => cursor_map(v, "scope_cursors must map scopes to strings or null")?,
        };
        m.finish("the request has an unknown member")?;
        Ok(PullRequest {
            client_id,
            client_generation,
            schema,
            scope_cursors,
            limit,
        })
    }

    fn to_json(&self) -> Json {
        object(vec![
            ("protocol_version", num(3)),
            ("client_id", s(&self.client_id)),
            (
                "client_generation",
                super::generation_json(self.client_generation),
            ),
            ("schema", self.schema.clone()),
            ("scope_cursors", cursor_map_json(&self.scope_cursors)),
            ("limit", num(self.limit)),
        ])
    }
}

/// `scope_updates`: scopes added to and removed from the assignment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScopeUpdates {
    /// Newly assigned scopes.
    pub added: Vec<String>,
    /// Scopes no longer assigned.
    pub removed: Vec<String>,
}

impl ScopeUpdates {
    pub(crate) fn from_json(v: Option<&Json>) -> Result<ScopeUpdates, WireError> {
        let mut m = Members::of(
            v.ok_or(bad("scope_updates is required"))?,
            "scope_updates is an object",
        )?;
        let added = strings(m.get("added"), "scope_updates.added is an array of strings")?;
        let removed = strings(
            m.get("removed"),
            "scope_updates.removed is an array of strings",
        )?;
        m.finish("scope_updates has an unknown member")?;
        Ok(ScopeUpdates { added, removed })
    }

    pub(crate) fn to_json(&self) -> Json {
        object(vec![
            ("added", string_array(&self.added)),
            ("removed", string_array(&self.removed)),
        ])
    }
}

/// What a change does to a row in a scope.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeOp {
    /// The row (by field ID) and its row checksum.
    Upsert {
        /// The row object.
        row: Json,
        /// Its row digest.
        row_checksum: Checksum,
    },
    /// The row left the scope.
    Delete,
}

/// One entry of `changes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The scope the change belongs to.
    pub scope_id: String,
    /// The table.
    pub table_id: String,
    /// The key's wire value.
    pub pk: Json,
    /// The row's server version.
    pub server_version: String,
    /// Upsert or delete.
    pub op: ChangeOp,
}

impl Change {
    fn from_json(v: &Json) -> Result<Change, WireError> {
        let mut m = Members::of(v, "a change is an object")?;
        let scope_id = string(m.get("scope_id"), "a change's scope_id must be a string")?;
        let table_id = string(m.get("table_id"), "a change's table_id must be a string")?;
        let pk = m.required("pk", "a change has a pk")?.clone();
        let server_version = string(
            m.get("server_version"),
            "a change's server_version must be a string",
        )?;
        let op = match m.get("op").and_then(Json::as_str) {
            Some("upsert") => ChangeOp::Upsert {
                row: match m.get("row") {
                    Some(row @ Json::Object(_)) => row.clone(),
                    _ => return Err(bad("an upsert's row must be an object")),
                },
                row_checksum: checksum(
                    m.get("row_checksum"),
                    "an upsert's row_checksum must be a checksum object",
                )?,
            },
            Some("delete") => ChangeOp::Delete,
            _ => return Err(bad("a change's op must be upsert or delete")),
        };
        m.finish("a change has an unknown member")?;
        Ok(Change {
            scope_id,
            table_id,
            pk,
            server_version,
            op,
        })
    }

    /// [`Change::from_json`] for a change the caller gives away: its row is moved, not
    /// copied (the same checks, the same result).
    fn from_json_owned(mut v: Json) -> Result<Change, WireError> {
        // Take the row object out, read the rest strictly with an empty object in its place,
        // then put the row back.
        let row = take_member(&mut v, "row", |row| matches!(row, Json::Object(_)));
        let mut change = Change::from_json(&v)?;
        if let (ChangeOp::Upsert { row: slot, .. }, Some(row)) = (&mut change.op, row) {
            *slot = row;
        }
        Ok(change)
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("scope_id", s(&self.scope_id)),
            ("table_id", s(&self.table_id)),
            ("pk", self.pk.clone()),
            ("server_version", s(&self.server_version)),
        ];
        match &self.op {
            ChangeOp::Upsert { row, row_checksum } => {
                members.push(("op", s("upsert")));
                members.push(("row", row.clone()));
                members.push(("row_checksum", checksum_json(row_checksum)));
            }
            ChangeOp::Delete => members.push(("op", s("delete"))),
        }
        object(members)
    }
}

/// A pull response page. `checksums` is present exactly on the terminal page (terminal
/// rules 1 and 2 are part of parsing; rule 3, the key set, needs the client's assignment).
#[derive(Debug, Clone, PartialEq)]
pub struct PullResponse {
    /// The assignment's version.
    pub scope_set_version: u64,
    /// Assignment changes this response carries.
    pub scope_updates: ScopeUpdates,
    /// Changes in stream order.
    pub changes: Vec<Change>,
    /// Whether more pages follow.
    pub has_more: bool,
    /// New cursors per scope.
    pub scope_cursor_updates: BTreeMap<String, String>,
    /// Scopes the client must rebuild.
    pub rebuild_scopes: Vec<String>,
    /// The terminal map (scope → scope digest), on the terminal page only.
    pub checksums: Option<BTreeMap<String, Checksum>>,
}

/// Replaces the member `name` of an object by an empty value of the same kind and returns
/// it, when `take` accepts it (a member of any other kind stays for the strict reader to
/// refuse).
fn take_member(v: &mut Json, name: &str, take: impl Fn(&Json) -> bool) -> Option<Json> {
    let Json::Object(members) = v else {
        return None;
    };
    let (_, value) = members.iter_mut().find(|(k, _)| k == name)?;
    if !take(value) {
        return None;
    }
    let empty = match value {
        Json::Array(_) => Json::Array(Vec::new()),
        _ => Json::Object(Vec::new()),
    };
    Some(std::mem::replace(value, empty))
}

impl PullResponse {
    /// [`Message::from_json`] for a body the caller gives away: the changes and their rows
    /// are moved into the page, not copied (the same checks, the same result).
    pub fn from_json_owned(mut body: Json) -> Result<PullResponse, WireError> {
        let changes = take_member(&mut body, "changes", |c| matches!(c, Json::Array(_)));
        let mut page = PullResponse::from_json(&body)?;
        if let Some(Json::Array(items)) = changes {
            page.changes = items
                .into_iter()
                .map(Change::from_json_owned)
                .collect::<Result<_, _>>()?;
        }
        Ok(page)
    }
}

impl Message for PullResponse {
    fn from_json(body: &Json) -> Result<PullResponse, WireError> {
        let mut m = Members::of(body, "a pull response is an object")?;
        version_3(&mut m)?;
        let scope_set_version = positive(
            m.get("scope_set_version"),
            "scope_set_version must be a positive integer",
        )?;
        let scope_updates = ScopeUpdates::from_json(m.get("scope_updates"))?;
        let changes = match m.get("changes") {
            Some(Json::Array(items)) => items
                .iter()
                .map(Change::from_json)
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("changes must be an array")),
        };
        let has_more = boolean(m.get("has_more"), "has_more must be a boolean")?;
        let scope_cursor_updates = match m.get("scope_cursor_updates") {
            Some(Json::Object(members)) => members
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|c| (k.clone(), c.to_owned()))
                        .ok_or(bad("scope_cursor_updates values must be strings"))
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("scope_cursor_updates must be an object")),
        };
        let rebuild_scopes = strings(
            m.get("rebuild_scopes"),
            "rebuild_scopes must be an array of strings",
        )?;
        let checksums = match (has_more, m.get("checksums")) {
            (true, None) => None,
            (true, Some(_)) => return Err(bad("a page with has_more = true omits checksums")),
            (false, Some(Json::Object(members))) => Some(
                members
                    .iter()
                    .map(|(k, v)| {
                        Checksum::from_json(v)
                            .map(|c| (k.clone(), c))
                            .map_err(|_| bad("a terminal checksum is not a checksum object"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            (false, _) => return Err(bad("a page with has_more = false includes checksums")),
        };
        m.finish("a pull response has an unknown member")?;
        Ok(PullResponse {
            scope_set_version,
            scope_updates,
            changes,
            has_more,
            scope_cursor_updates,
            rebuild_scopes,
            checksums,
        })
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("protocol_version", num(3)),
            ("scope_set_version", num(self.scope_set_version)),
            ("scope_updates", self.scope_updates.to_json()),
            (
                "changes",
                Json::Array(self.changes.iter().map(Change::to_json).collect()),
            ),
            ("has_more", Json::Bool(self.has_more)),
            (
                "scope_cursor_updates",
                Json::Object(
                    self.scope_cursor_updates
                        .iter()
                        .map(|(k, v)| (k.clone(), s(v)))
                        .collect(),
                ),
            ),
            ("rebuild_scopes", string_array(&self.rebuild_scopes)),
        ];
        if let Some(map) = &self.checksums {
            members.push((
                "checksums",
                Json::Object(
                    map.iter()
                        .map(|(k, c)| (k.clone(), checksum_json(c)))
                        .collect(),
                ),
            ));
        }
        object(members)
    }
}
