//! Connect-time schema dispatch (spec 000 "Connect-Time Schema Decision", "Explicit
//! Incompatible-Schema Reset"; spec 003 "Protocol 3 Schema Dispatch", "Error and Action
//! Dispatch") and the per-scope cursor bridge.
//!
//! [`dispatch`] maps one connect request and the server's view to exactly one row of the
//! dispatch table. The action type carries exactly its required members: `none` and
//! `unsupported` cannot hold a manifest, `replace` cannot hold affected scopes, and
//! `rebuild_local` cannot be built with an empty scope list.
//!
//! Decisions where the spec leaves room (docs/protocol-decisions.md): a client below the
//! minimum runtime gets 426 `upgrade_required` before any schema decision; a valid reset
//! takes the reset row even when the presented schema is current; a Class 3 transition with
//! no recorded affected-scope set affects every assigned scope.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::json::Json;
use crate::lineage::{Lineage, PresentedSchema};
use crate::manifest::{Manifest, SchemaRef, TransitionClass};
use crate::wire::SchemaActionKind;

/// A connect request's schema-relevant members.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectRequest {
    /// `protocol_version`; `None` when absent or not a nonnegative integer.
    pub protocol_version: Option<u64>,
    /// The presented `schema` object, unvalidated.
    pub schema: Json,
    /// `client_generation`, when present.
    pub client_generation: Option<u64>,
    /// `schema_reset` (absent means false).
    pub schema_reset: bool,
}

/// What the server knows when it dispatches.
#[derive(Debug, Clone, Copy)]
pub struct ServerView<'a> {
    /// The authenticated client identity has a prior generation or installed schema.
    pub identity_known: bool,
    /// The client runtime meets the configured minimum client version.
    pub client_runtime_supported: bool,
    /// The manifest history; its newest manifest is current.
    pub lineage: &'a Lineage,
    /// For each Class 3 transition (keyed by the reference of its child manifest), the
    /// scopes it affects.
    pub transition_scopes: &'a BTreeMap<SchemaRef, BTreeSet<String>>,
    /// The client's authoritative assigned scopes after reconciliation.
    pub assigned_scopes: &'a BTreeSet<String>,
    /// Assigned scopes for which the client presented a historical-schema cursor.
    pub presented_cursor_scopes: &'a BTreeSet<String>,
    /// Scopes whose presented cursor has a stale user, client, generation, stream,
    /// membership, retention or resume-floor binding.
    pub stale_cursor_scopes: &'a BTreeSet<String>,
}

/// Why a known or unknown history cannot continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsupportedReason {
    /// The presented reference is not on the current manifest's lineage.
    UnknownSchemaLineage,
    /// The path to the current manifest crosses a Class 4 transition.
    IncompatibleSchemaTransition,
}

impl UnsupportedReason {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            UnsupportedReason::UnknownSchemaLineage => "unknown_schema_lineage",
            UnsupportedReason::IncompatibleSchemaTransition => "incompatible_schema_transition",
        }
    }
}

/// A nonempty, deduplicated list of scope IDs in unsigned UTF-8 byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffectedScopes(Vec<String>);

impl AffectedScopes {
    /// `None` when the set is empty (rebuild_local needs at least one scope).
    pub fn new(scopes: BTreeSet<String>) -> Option<AffectedScopes> {
        // BTreeSet<String> orders by bytes and holds no duplicates.
        (!scopes.is_empty()).then(|| AffectedScopes(scopes.into_iter().collect()))
    }

    /// The scopes, sorted.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

/// The schema action of a 200 connect response, with exactly its required members.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaAction<'a> {
    /// The presented schema is current.
    None {
        /// The current reference.
        current: SchemaRef,
    },
    /// Install the current manifest; no scope rebuild.
    Replace {
        /// The current manifest, sent inline.
        manifest: &'a Manifest,
    },
    /// Install the current manifest, then rebuild exactly these scopes.
    RebuildLocal {
        /// The current manifest, sent inline.
        manifest: &'a Manifest,
        /// The scopes to rebuild.
        affected_scopes: AffectedScopes,
    },
    /// The client cannot continue on this history; it enters upgrade_required.
    Unsupported {
        /// The current reference.
        current: SchemaRef,
        /// Why.
        reason: UnsupportedReason,
    },
}

impl SchemaAction<'_> {
    /// Which action this is, without its members.
    pub fn kind(&self) -> SchemaActionKind {
        match self {
            SchemaAction::None { .. } => SchemaActionKind::None,
            SchemaAction::Replace { .. } => SchemaActionKind::Replace,
            SchemaAction::RebuildLocal { .. } => SchemaActionKind::RebuildLocal,
            SchemaAction::Unsupported { .. } => SchemaActionKind::Unsupported,
        }
    }

    /// Wire spelling of the action.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// What happens to one presented historical-schema cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorUpdate {
    /// Re-issue the cursor at the same position under the current schema hash.
    Reissue,
    /// Null: the scope must rebuild.
    Null,
}

/// The outcome of connect dispatch.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnectOutcome<'a> {
    /// HTTP 426 `upgrade_required`.
    UpgradeRequired {
        /// The protocol version received, if it was an integer.
        received_protocol_version: Option<u64>,
        /// True when the protocol matched but the client runtime is below the minimum.
        client_runtime: bool,
    },
    /// HTTP 400 `invalid_schema_reference`.
    InvalidSchemaReference {
        /// Which rule the reference broke.
        reason: &'static str,
    },
    /// HTTP 200 with a schema action.
    Schema {
        /// The action.
        action: SchemaAction<'a>,
        /// `scope_cursor_updates` for presented historical-schema cursors.
        cursor_updates: BTreeMap<String, CursorUpdate>,
    },
}

impl ConnectOutcome<'_> {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            ConnectOutcome::UpgradeRequired { .. } => 426,
            ConnectOutcome::InvalidSchemaReference { .. } => 400,
            ConnectOutcome::Schema { .. } => 200,
        }
    }

    /// The response body members this decision fixes (errors in the spec's error shape;
    /// for 200, `schema`, `schema_definition`, `affected_scopes`, `scope_cursor_updates`
    /// with `"reissue"` standing for a re-issued cursor). `received_schema` echoes the
    /// presented reference.
    pub fn to_json(&self, received_schema: &Json) -> Json {
        let s = |v: &str| Json::String(v.to_owned());
        let num = |n: u64| Json::Number(n.to_string());
        let error = |members: Vec<(String, Json)>| {
            Json::Object(vec![("error".into(), Json::Object(members))])
        };
        match self {
            ConnectOutcome::UpgradeRequired {
                received_protocol_version,
                client_runtime,
            } => error(vec![
                ("code".into(), s("upgrade_required")),
                (
                    "message".into(),
                    s(if *client_runtime {
                        "the client runtime is below the minimum supported version"
                    } else {
                        "protocol version 3 is required"
                    }),
                ),
                ("retryable".into(), Json::Bool(false)),
                (
                    "required_protocol_version".into(),
                    num(u64::from(crate::PROTOCOL_VERSION)),
                ),
                (
                    "received_protocol_version".into(),
                    received_protocol_version.map_or(Json::Null, num),
                ),
            ]),
            ConnectOutcome::InvalidSchemaReference { reason } => error(vec![
                ("code".into(), s("invalid_schema_reference")),
                ("message".into(), s(reason)),
                ("retryable".into(), Json::Bool(false)),
                ("received_schema".into(), received_schema.clone()),
            ]),
            ConnectOutcome::Schema {
                action,
                cursor_updates,
            } => {
                let current = match action {
                    SchemaAction::None { current } | SchemaAction::Unsupported { current, .. } => {
                        *current
                    }
                    SchemaAction::Replace { manifest }
                    | SchemaAction::RebuildLocal { manifest, .. } => manifest.schema_ref(),
                };
                let mut schema = vec![
                    ("version".into(), num(current.version)),
                    ("hash".into(), s(&hex::encode(current.hash))),
                    ("action".into(), s(action.name())),
                ];
                let mut body = Vec::new();
                match action {
                    SchemaAction::None { .. } => {}
                    SchemaAction::Unsupported { reason, .. } => {
                        schema.push(("reason".into(), s(reason.as_str())))
                    }
                    SchemaAction::Replace { manifest } => {
                        body.push(("schema_definition".into(), manifest.definition_json()))
                    }
                    SchemaAction::RebuildLocal {
                        manifest,
                        affected_scopes,
                    } => {
                        body.push(("schema_definition".into(), manifest.definition_json()));
                        body.push((
                            "affected_scopes".into(),
                            Json::Array(affected_scopes.as_slice().iter().map(|x| s(x)).collect()),
                        ));
                    }
                }
                body.insert(0, ("schema".into(), Json::Object(schema)));
                body.push((
                    "scope_cursor_updates".into(),
                    Json::Object(
                        cursor_updates
                            .iter()
                            .map(|(k, v)| {
                                (
                                    k.clone(),
                                    if *v == CursorUpdate::Reissue {
                                        s("reissue")
                                    } else {
                                        Json::Null
                                    },
                                )
                            })
                            .collect(),
                    ),
                ));
                Json::Object(body)
            }
        }
    }
}

/// Decides one connect request. Fails only when the server has no current manifest.
pub fn dispatch<'a>(request: &ConnectRequest, view: &ServerView<'a>) -> Result<ConnectOutcome<'a>> {
    if request.protocol_version != Some(u64::from(crate::PROTOCOL_VERSION)) {
        return Ok(ConnectOutcome::UpgradeRequired {
            received_protocol_version: request.protocol_version,
            client_runtime: false,
        });
    }
    if !view.client_runtime_supported {
        return Ok(ConnectOutcome::UpgradeRequired {
            received_protocol_version: request.protocol_version,
            client_runtime: true,
        });
    }
    let current = view
        .lineage
        .current()
        .ok_or_else(|| Error::lineage("the server has no current manifest"))?;
    let invalid = |reason| Ok(ConnectOutcome::InvalidSchemaReference { reason });
    let presented = match PresentedSchema::from_json(&request.schema) {
        Ok(p) => p,
        Err(Error::InvalidSchemaReference { reason }) => return invalid(reason),
        Err(e) => return Err(e),
    };
    let schema = |action| ConnectOutcome::Schema {
        action,
        cursor_updates: BTreeMap::new(),
    };
    let presented = match presented {
        PresentedSchema::Fresh => {
            if request.client_generation.is_some() {
                return invalid("the fresh sentinel cannot carry a client generation");
            }
            if request.schema_reset {
                return invalid("the fresh sentinel cannot be combined with schema_reset");
            }
            if view.identity_known {
                return invalid("a known client identity must present its installed schema");
            }
            return Ok(schema(SchemaAction::Replace { manifest: current }));
        }
        PresentedSchema::Exact(r) => r,
    };
    if request.client_generation.is_none() && (view.identity_known || request.schema_reset) {
        return invalid("a known client identity must present its client generation");
    }
    let presented_assigned = || {
        view.presented_cursor_scopes
            .intersection(view.assigned_scopes)
    };

    if request.schema_reset {
        let cursor_updates = presented_assigned()
            .map(|s| (s.clone(), CursorUpdate::Null))
            .collect();
        let action = match AffectedScopes::new(view.assigned_scopes.clone()) {
            Some(affected_scopes) => SchemaAction::RebuildLocal {
                manifest: current,
                affected_scopes,
            },
            None => SchemaAction::Replace { manifest: current },
        };
        return Ok(ConnectOutcome::Schema {
            action,
            cursor_updates,
        });
    }
    if presented == current.schema_ref() {
        return Ok(schema(SchemaAction::None { current: presented }));
    }
    let unsupported = |reason| {
        Ok(schema(SchemaAction::Unsupported {
            current: current.schema_ref(),
            reason,
        }))
    };
    let Some(path) = view.lineage.path_from(&presented) else {
        return unsupported(UnsupportedReason::UnknownSchemaLineage);
    };
    if path
        .iter()
        .any(|m| m.transition_class == TransitionClass::Class4)
    {
        return unsupported(UnsupportedReason::IncompatibleSchemaTransition);
    }
    // Every scope any Class 3 transition on the path affects; a transition without a
    // recorded set affects every assigned scope.
    let mut touched: BTreeSet<String> = BTreeSet::new();
    for m in path
        .iter()
        .filter(|m| m.transition_class == TransitionClass::Class3)
    {
        match view.transition_scopes.get(&m.schema_ref()) {
            Some(scopes) => touched.extend(scopes.iter().cloned()),
            None => touched.extend(view.assigned_scopes.iter().cloned()),
        }
    }
    let cursor_updates = presented_assigned()
        .map(|s| {
            let update = if touched.contains(s) || view.stale_cursor_scopes.contains(s) {
                CursorUpdate::Null
            } else {
                CursorUpdate::Reissue
            };
            (s.clone(), update)
        })
        .collect();
    let affected: BTreeSet<String> = touched
        .intersection(view.assigned_scopes)
        .cloned()
        .collect();
    let action = match AffectedScopes::new(affected) {
        Some(affected_scopes) => SchemaAction::RebuildLocal {
            manifest: current,
            affected_scopes,
        },
        None => SchemaAction::Replace { manifest: current },
    };
    Ok(ConnectOutcome::Schema {
        action,
        cursor_updates,
    })
}
