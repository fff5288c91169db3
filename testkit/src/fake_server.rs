//! A scripted stand-in for the server, for tests of the client's local durability (the
//! journal, recovery, the ladder) where the server is a collaborator, not the subject. It
//! answers connect, pull, rebuild and push from an in-memory lineage and row set; every
//! request is read and every response written through `synchro_protocol::wire`, the types
//! the real server uses, and every checksum it sends is computed with
//! `synchro_protocol::digest` from its own rows. The engine's behaviour against the real
//! server is tested in tests/tests/whole_stack.rs.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use synchro_client::engine::{Response, Transport, TransportError};
use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::{
    Change, ChangeOp, ConnectRequest, ConnectResponse, ErrorBody, ErrorCode, Message, Outcome,
    PullRequest, PullResponse, PushRequest, PushResponse, RebuildEnd, RebuildRecord,
    RebuildRequest, RebuildResponse, SchemaActionKind, SchemaOutcome, ScopeUpdates,
};

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

impl State {
    fn current(&self) -> &Manifest {
        self.lineage.last().expect("a manifest")
    }

    fn checksum(&self, scope: &str) -> Checksum {
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
        Checksum(
            scope_digest(&m.schema_hash(), scope, &mut entries, false)
                .unwrap()
                .digest,
        )
    }

    fn record(&self, r: &Row) -> RebuildRecord {
        let m = self.current();
        let pk = Json::String(r.pk.clone());
        let row = Json::parse(&r.row).unwrap();
        let d = row_digest(m, &r.table_id, &pk, &row, &r.version).unwrap();
        RebuildRecord {
            table_id: r.table_id.clone(),
            pk,
            row,
            server_version: r.version.clone(),
            row_checksum: Checksum(d.digest),
        }
    }

    fn change(&self, r: &Row) -> Change {
        let record = self.record(r);
        Change {
            scope_id: r.scope.clone(),
            table_id: record.table_id,
            pk: record.pk,
            server_version: record.server_version,
            op: ChangeOp::Upsert {
                row: record.row,
                row_checksum: record.row_checksum,
            },
        }
    }

    fn cursor(&self, scope: &str) -> String {
        format!("cursor:{scope}:v{}", self.current().schema_version)
    }

    fn connect(&self, req: &ConnectRequest) -> ConnectResponse {
        let current = self.current();
        let presented = req
            .schema
            .get("version")
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
            SchemaActionKind::None
        } else if presented != 0 && self.incompatible.iter().any(|v| later(*v)) {
            SchemaActionKind::Unsupported
        } else if presented != 0 && !affected.is_empty() {
            SchemaActionKind::RebuildLocal
        } else {
            SchemaActionKind::Replace
        };
        let previous: BTreeSet<String> = match req.client_generation {
            Some(_) => self.scopes.clone(),
            None => BTreeSet::new(),
        };
        let migrates = matches!(
            action,
            SchemaActionKind::Replace | SchemaActionKind::RebuildLocal
        );
        let mut scope_cursor_updates = BTreeMap::new();
        if action != SchemaActionKind::None {
            for scope in req.scope_cursors.keys() {
                let u = if affected.contains(scope) || action == SchemaActionKind::Unsupported {
                    None
                } else {
                    Some(self.cursor(scope))
                };
                scope_cursor_updates.insert(scope.clone(), u);
            }
        }
        ConnectResponse {
            client_generation: 1,
            scope_set_version: 1,
            scope_updates: ScopeUpdates {
                added: self.scopes.difference(&previous).cloned().collect(),
                removed: Vec::new(),
            },
            schema: SchemaOutcome {
                action,
                version: current.schema_version,
                hash: current.schema_hash_hex(),
                reason: (action == SchemaActionKind::Unsupported)
                    .then(|| "incompatible_schema_transition".to_owned()),
            },
            schema_definition: migrates.then(|| current.definition_json()),
            affected_scopes: (action == SchemaActionKind::RebuildLocal)
                .then(|| affected.iter().cloned().collect()),
            scope_cursor_updates,
        }
    }

    pub fn pull(&self) -> PullResponse {
        PullResponse {
            scope_set_version: 1,
            scope_updates: ScopeUpdates::default(),
            // Every row again, every time: re-sending a row is always valid.
            changes: self.rows.iter().map(|r| self.change(r)).collect(),
            has_more: false,
            scope_cursor_updates: self
                .scopes
                .iter()
                .map(|scope| (scope.clone(), self.cursor(scope)))
                .collect(),
            rebuild_scopes: Vec::new(),
            checksums: Some(
                self.scopes
                    .iter()
                    .map(|scope| (scope.clone(), self.checksum(scope)))
                    .collect(),
            ),
        }
    }

    /// Rebuild pages of two records each; the continuation is the next offset.
    pub fn rebuild(&self, req: &RebuildRequest) -> RebuildResponse {
        let scope = &req.scope_id;
        let offset: usize = req
            .continuation
            .as_deref()
            .map_or(0, |c| c.parse().unwrap());
        let rows: Vec<&Row> = self.rows.iter().filter(|r| &r.scope == scope).collect();
        let more = offset + 2 < rows.len();
        RebuildResponse {
            scope_id: scope.clone(),
            records: rows
                .iter()
                .skip(offset)
                .take(2)
                .map(|r| self.record(r))
                .collect(),
            end: if more {
                RebuildEnd::More {
                    continuation: (offset + 2).to_string(),
                }
            } else {
                RebuildEnd::Final {
                    final_scope_cursor: self.cursor(scope),
                    checksum: self.checksum(scope),
                }
            },
        }
    }

    /// Every pushed mutation applies (rowless outcomes); the rows themselves are the test's
    /// business.
    fn push(&self, req: &PushRequest) -> PushResponse {
        PushResponse {
            batch_id: req.batch_id.clone(),
            outcomes: req
                .mutations
                .iter()
                .enumerate()
                .map(|(i, m)| Outcome::Applied {
                    mutation_id: m.mutation_id.clone(),
                    server_version: format!("p{i}"),
                    row: None,
                })
                .collect(),
        }
    }
}

fn read<M: Message>(body: &Json) -> M {
    M::from_json(body).unwrap_or_else(|e| panic!("the client sent an invalid request: {e}"))
}

impl Transport for Fake {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let mut st = self.0.borrow_mut();
        st.requests.push(path.to_owned());
        if st.offline {
            return Err(TransportError("offline".into()));
        }
        // The real server's default body limit (`Config::max_body_bytes`), and its answer.
        if body.len() > 1_048_576 {
            let refused = ErrorBody::new(
                ErrorCode::InvalidRequest,
                "the request body exceeds the configured maximum",
            );
            return Ok(Response {
                status: 400,
                body: Json::parse(&refused.to_json_string()).unwrap(),
                scope_rows: None,
            });
        }
        let req = Json::parse(&body).expect("the client sends JSON");
        let presented = req.get("schema").cloned().unwrap_or(Json::Null);
        let current = st.current().clone();
        let exact =
            presented.get("hash").and_then(Json::as_str) == Some(&current.schema_hash_hex());
        let text = match path {
            "/sync/connect" => st.connect(&read(&req)).to_json_string(),
            _ if !exact => {
                let mismatch = ErrorBody::new(
                    ErrorCode::SchemaMismatch,
                    "the request schema is not current",
                )
                .with(
                    "current_schema",
                    Json::parse(&format!(
                        r#"{{"version":{},"hash":"{}"}}"#,
                        current.schema_version,
                        current.schema_hash_hex()
                    ))
                    .unwrap(),
                )
                .with("received_schema", presented);
                return Ok(Response {
                    status: 422,
                    body: Json::parse(&mismatch.to_json_string()).unwrap(),
                    scope_rows: None,
                });
            }
            "/sync/pull" => {
                let _: PullRequest = read(&req);
                st.pull().to_json_string()
            }
            "/sync/push" => st.push(&read(&req)).to_json_string(),
            "/sync/rebuild" => st.rebuild(&read(&req)).to_json_string(),
            other => panic!("unexpected path {other}"),
        };
        // Through text like a real response.
        Ok(Response {
            status: 200,
            body: Json::parse(&text).unwrap(),
            scope_rows: None,
        })
    }
}
