//! A scripted stand-in for the server, for tests of the client's local durability (the
//! journal, recovery, the ladder) where the server is a collaborator, not the subject. It
//! answers connect, pull and rebuild from an in-memory lineage and row set; every checksum
//! it sends is computed with `synchro_protocol::digest` from its own rows. The engine's
//! behaviour against the real server is tested in server-native/tests/client_engine.rs.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use synchro_client::engine::{Response, Transport, TransportError};
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;

/// One server row: scope, table ID, key wire value, row object (by field ID), version.
#[derive(Clone)]
pub struct Row {
    pub scope: String,
    pub table_id: String,
    pub pk: String,
    pub row: String,
    pub version: String,
}

#[derive(Default)]
pub struct State {
    /// Manifest history; the last is current.
    pub lineage: Vec<Manifest>,
    /// For each manifest version reached by a rebuild-requiring transition: its scopes.
    pub rebuild_scopes: BTreeMap<u64, BTreeSet<String>>,
    /// Versions whose transition is incompatible (unsupported).
    pub incompatible: BTreeSet<u64>,
    pub scopes: BTreeSet<String>,
    pub rows: Vec<Row>,
    /// Every request path, in order.
    pub requests: Vec<String>,
    /// Refuse everything with a network error.
    pub offline: bool,
}

#[derive(Clone, Default)]
pub struct Fake(pub Rc<RefCell<State>>);

fn s(v: &str) -> Json {
    Json::String(v.to_owned())
}

fn n(v: u64) -> Json {
    Json::Number(v.to_string())
}

fn obj(members: Vec<(&str, Json)>) -> Json {
    Json::Object(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

impl State {
    fn current(&self) -> &Manifest {
        self.lineage.last().expect("a manifest")
    }

    fn checksum(&self, scope: &str) -> Json {
        let m = self.current();
        let mut entries = Vec::new();
        for r in self.rows.iter().filter(|r| r.scope == scope) {
            let table = m.table(&r.table_id).unwrap();
            let pk = Json::String(r.pk.clone());
            let d = row_digest(
                m,
                &r.table_id,
                &pk,
                &Json::parse(&r.row).unwrap(),
                &r.version,
            )
            .unwrap();
            let key = TypedValue::from_wire(&table.primary_key().spec, &pk).unwrap();
            entries.push((RowIdentity::new(table, &key).unwrap(), d.digest));
        }
        let d = scope_digest(&m.schema_hash(), scope, &mut entries, false).unwrap();
        checksum(d.digest)
    }

    fn record(&self, r: &Row) -> Json {
        let m = self.current();
        let pk = Json::String(r.pk.clone());
        let row = Json::parse(&r.row).unwrap();
        let d = row_digest(m, &r.table_id, &pk, &row, &r.version).unwrap();
        obj(vec![
            ("scope_id", s(&r.scope)),
            ("table_id", s(&r.table_id)),
            ("pk", pk),
            ("op", s("upsert")),
            ("row", row),
            ("server_version", s(&r.version)),
            ("row_checksum", checksum(d.digest)),
        ])
    }

    fn cursor(&self, scope: &str) -> Json {
        s(&format!(
            "cursor:{scope}:v{}",
            self.current().schema_version
        ))
    }

    fn connect(&self, req: &Json) -> Json {
        let current = self.current();
        let presented = req
            .get("schema")
            .and_then(|x| x.get("version"))
            .and_then(|v| match v {
                Json::Number(t) => t.parse::<u64>().ok(),
                _ => None,
            })
            .unwrap_or(0);
        let later = |v: u64| presented < v && v <= current.schema_version;
        let mut affected: BTreeSet<String> = self
            .rebuild_scopes
            .iter()
            .filter(|(v, _)| later(**v))
            .flat_map(|(_, s)| s.iter().cloned())
            .collect();
        affected.retain(|x| self.scopes.contains(x));
        let action = if presented == current.schema_version {
            "none"
        } else if presented != 0 && self.incompatible.iter().any(|v| later(*v)) {
            "unsupported"
        } else if presented != 0 && !affected.is_empty() {
            "rebuild_local"
        } else {
            "replace"
        };
        let previous: BTreeSet<String> = match req.get("client_generation") {
            Some(_) => self.scopes.clone(),
            None => BTreeSet::new(),
        };
        let mut schema = vec![
            ("version", n(current.schema_version)),
            ("hash", s(&current.schema_hash_hex())),
            ("action", s(action)),
        ];
        if action == "unsupported" {
            schema.push(("reason", s("incompatible_schema_transition")));
        }
        let mut body = vec![
            ("protocol_version", n(3)),
            ("client_generation", n(1)),
            ("scope_set_version", n(1)),
            (
                "scope_updates",
                obj(vec![
                    (
                        "added",
                        Json::Array(self.scopes.difference(&previous).map(|x| s(x)).collect()),
                    ),
                    ("removed", Json::Array(vec![])),
                ]),
            ),
            ("schema", obj(schema)),
        ];
        if action == "replace" || action == "rebuild_local" {
            body.push(("schema_definition", current.definition_json()));
        }
        if action == "rebuild_local" {
            body.push((
                "affected_scopes",
                Json::Array(affected.iter().map(|x| s(x)).collect()),
            ));
        }
        let mut updates = Vec::new();
        if action != "none" {
            if let Some(Json::Object(cursors)) = req.get("scope_cursors") {
                for (scope, _) in cursors {
                    let u = if affected.contains(scope) || action == "unsupported" {
                        Json::Null
                    } else {
                        self.cursor(scope)
                    };
                    updates.push((scope.as_str(), u));
                }
            }
        }
        body.push(("scope_cursor_updates", obj(updates)));
        obj(body)
    }

    pub fn pull(&self) -> Json {
        let mut cursors = Vec::new();
        let mut sums = Vec::new();
        for scope in &self.scopes {
            cursors.push((scope.as_str(), self.cursor(scope)));
            sums.push((scope.as_str(), self.checksum(scope)));
        }
        obj(vec![
            ("protocol_version", n(3)),
            ("scope_set_version", n(1)),
            (
                "scope_updates",
                obj(vec![
                    ("added", Json::Array(vec![])),
                    ("removed", Json::Array(vec![])),
                ]),
            ),
            // Every row again, every time: re-sending a row is always valid.
            (
                "changes",
                Json::Array(self.rows.iter().map(|r| self.record(r)).collect()),
            ),
            ("has_more", Json::Bool(false)),
            ("scope_cursor_updates", obj(cursors)),
            ("rebuild_scopes", Json::Array(vec![])),
            ("checksums", obj(sums)),
        ])
    }

    /// Rebuild pages of two records each; the continuation is the next offset.
    pub fn rebuild(&self, req: &Json) -> Json {
        let scope = req.get("scope_id").and_then(Json::as_str).unwrap();
        let offset: usize = req
            .get("continuation")
            .and_then(Json::as_str)
            .map_or(0, |c| c.parse().unwrap());
        let rows: Vec<&Row> = self.rows.iter().filter(|r| r.scope == scope).collect();
        let page: Vec<Json> = rows
            .iter()
            .skip(offset)
            .take(2)
            .map(|r| self.record(r))
            .collect();
        let more = offset + 2 < rows.len();
        let mut body = vec![
            ("protocol_version", n(3)),
            ("scope_id", s(scope)),
            ("records", Json::Array(page)),
            ("has_more", Json::Bool(more)),
        ];
        if more {
            body.push(("continuation", s(&(offset + 2).to_string())));
        } else {
            body.push(("checksum", self.checksum(scope)));
            body.push(("final_scope_cursor", self.cursor(scope)));
        }
        obj(body)
    }
}

impl Transport for Fake {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let mut st = self.0.borrow_mut();
        st.requests.push(path.to_owned());
        if st.offline {
            return Err(TransportError("offline".into()));
        }
        let req = Json::parse(&body).expect("the client sends JSON");
        let presented = req.get("schema").cloned().unwrap_or(Json::Null);
        let current = st.current().clone();
        let exact =
            presented.get("hash").and_then(Json::as_str) == Some(&current.schema_hash_hex());
        let body = match path {
            "/sync/connect" => st.connect(&req),
            _ if !exact => {
                return Ok(Response {
                    status: 422,
                    body: obj(vec![(
                        "error",
                        obj(vec![
                            ("code", s("schema_mismatch")),
                            ("retryable", Json::Bool(false)),
                        ]),
                    )]),
                })
            }
            "/sync/pull" => st.pull(),
            // Every pushed mutation applies (rowless outcomes); the rows themselves are the
            // test's business.
            "/sync/push" => {
                let outcomes = match req.get("mutations") {
                    Some(Json::Array(ms)) => ms
                        .iter()
                        .enumerate()
                        .map(|(i, m)| {
                            obj(vec![
                                ("mutation_id", m.get("mutation_id").cloned().unwrap()),
                                ("status", s("applied")),
                                ("server_version", s(&format!("p{i}"))),
                            ])
                        })
                        .collect(),
                    _ => vec![],
                };
                obj(vec![
                    ("protocol_version", n(3)),
                    ("batch_id", req.get("batch_id").cloned().unwrap()),
                    ("outcomes", Json::Array(outcomes)),
                ])
            }
            "/sync/rebuild" => st.rebuild(&req),
            other => panic!("unexpected path {other}"),
        };
        // Round-trip through text like a real response.
        let body = Json::parse(&to_output_string(&body)).unwrap();
        Ok(Response { status: 200, body })
    }
}

/// A wire checksum object, built by the protocol core's strict type.
fn checksum(digest: [u8; 32]) -> Json {
    Json::parse(&synchro_protocol::checksum::Checksum(digest).to_json_string())
        .expect("checksum JSON")
}
