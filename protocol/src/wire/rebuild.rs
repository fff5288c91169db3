//! `POST /sync/rebuild` (spec 001 terminal rules 5 and 6).

use super::{
    bad, boolean, checksum, checksum_json, id, num, object, s, string, version_3, Members, Message,
    WireError, MAX_ID_BYTES,
};
use crate::checksum::Checksum;
use crate::json::Json;

/// A rebuild request: the first page (no continuation) or a later one.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildRequest {
    /// The client ID.
    pub client_id: String,
    /// The current client generation ([`super::ABSENT_GENERATION`] when the request has none).
    pub client_generation: u64,
    /// The schema reference as presented.
    pub schema: Json,
    /// The scope to rebuild.
    pub scope_id: String,
    /// Page size, 1..=1000.
    pub limit: u64,
    /// The previous page's continuation token.
    pub continuation: Option<String>,
}

impl Message for RebuildRequest {
    fn from_json(body: &Json) -> Result<RebuildRequest, WireError> {
        let mut m = Members::of(body, "the body is not a valid JSON object")?;
        let (client_id, client_generation, schema, limit) = super::pull::common(&mut m)?;
        let scope_id = id(
            m.get("scope_id"),
            MAX_ID_BYTES,
            "scope_id must be a nonempty string",
        )?;
        let continuation = match m.optional("continuation") {
            None => None,
            v => Some(string(v, "continuation must be a string")?),
        };
        m.finish("the request has an unknown member")?;
        Ok(RebuildRequest {
            client_id,
            client_generation,
            schema,
            scope_id,
            limit,
            continuation,
        })
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("protocol_version", num(3)),
            ("client_id", s(&self.client_id)),
            (
                "client_generation",
                super::generation_json(self.client_generation),
            ),
            ("schema", self.schema.clone()),
            ("scope_id", s(&self.scope_id)),
            ("limit", num(self.limit)),
        ];
        if let Some(c) = &self.continuation {
            members.push(("continuation", s(c)));
        }
        object(members)
    }
}

/// One record of a rebuild page.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildRecord {
    /// The table.
    pub table_id: String,
    /// The key's wire value.
    pub pk: Json,
    /// The row by field ID.
    pub row: Json,
    /// The row's server version.
    pub server_version: String,
    /// Its row digest.
    pub row_checksum: Checksum,
}

impl RebuildRecord {
    /// The record's output text, as it appears in a page's `records`: what a server that
    /// renders a session's records once, at its start, stores and later sends as a
    /// [`RenderedRebuildPage`].
    pub fn to_output_string(&self) -> String {
        use crate::jcs::{write_output, write_string};
        // `to_json`'s members written in output order (by name), without building it.
        let mut out = String::with_capacity(256);
        out.push_str("{\"pk\":");
        write_output(&self.pk, &mut out);
        out.push_str(",\"row\":");
        write_output(&self.row, &mut out);
        out.push_str(",\"row_checksum\":");
        out.push_str(&self.row_checksum.to_json_string());
        out.push_str(",\"server_version\":");
        write_string(&self.server_version, &mut out);
        out.push_str(",\"table_id\":");
        write_string(&self.table_id, &mut out);
        out.push('}');
        out
    }

    fn from_json(v: &Json) -> Result<RebuildRecord, WireError> {
        let mut m = Members::of(v, "a record is an object")?;
        let r = RebuildRecord {
            table_id: string(m.get("table_id"), "a record's table_id must be a string")?,
            pk: m.required("pk", "a record has a pk")?.clone(),
            row: match m.get("row") {
                Some(row @ Json::Object(_)) => row.clone(),
                _ => return Err(bad("a record's row must be an object")),
            },
            server_version: string(
                m.get("server_version"),
                "a record's server_version must be a string",
            )?,
            row_checksum: checksum(
                m.get("row_checksum"),
                "a record's row_checksum must be a checksum object",
            )?,
        };
        m.finish("a record has an unknown member")?;
        Ok(r)
    }

    fn to_json(&self) -> Json {
        object(vec![
            ("table_id", s(&self.table_id)),
            ("pk", self.pk.clone()),
            ("row", self.row.clone()),
            ("server_version", s(&self.server_version)),
            ("row_checksum", checksum_json(&self.row_checksum)),
        ])
    }
}

/// How a rebuild page ends: with a continuation (rule 5: no final members) or with the
/// final cursor and the checksum of exactly the snapshot (rule 6).
#[derive(Debug, Clone, PartialEq)]
pub enum RebuildEnd {
    /// More pages follow.
    More {
        /// The token for the next page.
        continuation: String,
    },
    /// The last page.
    Final {
        /// The cursor to resume pulling from.
        final_scope_cursor: String,
        /// The scope digest of the whole snapshot.
        checksum: Checksum,
    },
}

/// A rebuild response page.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildResponse {
    /// The scope (the requested one).
    pub scope_id: String,
    /// Records in canonical row-identity order.
    pub records: Vec<RebuildRecord>,
    /// Continuation or final members.
    pub end: RebuildEnd,
}

/// A rebuild page whose records are already serialized, each the
/// [`RebuildRecord::to_output_string`] of its record: its text equals the
/// [`Message::to_json_string`] of the [`RebuildResponse`] holding those records, without
/// parsing them again.
#[derive(Debug, Clone, Copy)]
pub struct RenderedRebuildPage<'a> {
    /// The scope (the requested one).
    pub scope_id: &'a str,
    /// The records' output texts, in canonical row-identity order.
    pub records: &'a [&'a str],
    /// Continuation or final members.
    pub end: &'a RebuildEnd,
}

impl RenderedRebuildPage<'_> {
    /// The page's output text.
    pub fn to_output_string(&self) -> String {
        let shell = RebuildResponse {
            scope_id: self.scope_id.to_owned(),
            records: Vec::new(),
            end: self.end.clone(),
        }
        .to_json();
        let Json::Object(mut members) = shell else {
            unreachable!("a response is an object")
        };
        // The members' names are ASCII: octet order is the output's UTF-16 order.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let size = self.records.iter().map(|r| r.len() + 1).sum::<usize>();
        let mut out = String::with_capacity(size + 512);
        out.push('{');
        for (i, (name, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            crate::jcs::write_string(name, &mut out);
            out.push(':');
            if name == "records" {
                out.push('[');
                for (j, record) in self.records.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    out.push_str(record);
                }
                out.push(']');
            } else {
                out.push_str(&crate::jcs::to_output_string(value));
            }
        }
        out.push('}');
        out
    }
}

impl RebuildResponse {
    /// Whether more pages follow.
    pub fn has_more(&self) -> bool {
        matches!(self.end, RebuildEnd::More { .. })
    }
}

impl Message for RebuildResponse {
    fn from_json(body: &Json) -> Result<RebuildResponse, WireError> {
        let mut m = Members::of(body, "a rebuild response is an object")?;
        version_3(&mut m)?;
        let scope_id = string(m.get("scope_id"), "scope_id must be a string")?;
        let records = match m.get("records") {
            Some(Json::Array(items)) => items
                .iter()
                .map(RebuildRecord::from_json)
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("records must be an array")),
        };
        let has_more = boolean(m.get("has_more"), "has_more must be a boolean")?;
        let (continuation, cursor, sum) = (
            m.get("continuation"),
            m.get("final_scope_cursor"),
            m.get("checksum"),
        );
        let end = if has_more {
            if cursor.is_some() || sum.is_some() {
                return Err(bad(
                    "a page with has_more = true omits final_scope_cursor and checksum",
                ));
            }
            RebuildEnd::More {
                continuation: string(continuation, "a page with more carries a continuation")?,
            }
        } else {
            if continuation.is_some() {
                return Err(bad("the last page carries no continuation"));
            }
            RebuildEnd::Final {
                final_scope_cursor: string(
                    cursor,
                    "a page with has_more = false includes final_scope_cursor",
                )?,
                checksum: checksum(sum, "a page with has_more = false includes its checksum")?,
            }
        };
        m.finish("a rebuild response has an unknown member")?;
        Ok(RebuildResponse {
            scope_id,
            records,
            end,
        })
    }

    fn to_json(&self) -> Json {
        let mut members = vec![
            ("protocol_version", num(3)),
            ("scope_id", s(&self.scope_id)),
            (
                "records",
                Json::Array(self.records.iter().map(RebuildRecord::to_json).collect()),
            ),
            ("has_more", Json::Bool(self.has_more())),
        ];
        match &self.end {
            RebuildEnd::More { continuation } => members.push(("continuation", s(continuation))),
            RebuildEnd::Final {
                final_scope_cursor,
                checksum,
            } => {
                members.push(("final_scope_cursor", s(final_scope_cursor)));
                members.push(("checksum", checksum_json(checksum)));
            }
        }
        object(members)
    }
}
