//! `POST /sync/push` (spec 000 "Authored-Schema Queued Mutations", spec 003 strict limits;
//! outcomes per spec-gaps "ADR 002").

use std::collections::BTreeSet;

use super::{
    bad, checksum, checksum_json, id, num, object, positive, s, string, string_array, strings,
    version_3, Members, Message, WireError, MAX_ID_BYTES, MAX_MUTATION_ID_BYTES,
};
use crate::checksum::Checksum;
use crate::json::Json;
use crate::manifest::SchemaRef;

/// A schema reference `{version, hash}` with a positive version and 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthoredSchema {
    /// The schema version.
    pub version: u64,
    /// The schema hash, lowercase hex.
    pub hash: String,
}

impl AuthoredSchema {
    fn from_json(v: Option<&Json>, what: &'static str) -> Result<AuthoredSchema, WireError> {
        let mut m = Members::of(v.ok_or(bad(what))?, what)?;
        let version = positive(m.get("version"), what)?;
        let hash = match m.get("hash") {
            Some(Json::String(h))
                if h.len() == 64
                    && h.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                h.clone()
            }
            _ => return Err(bad(what)),
        };
        m.finish(what)?;
        Ok(AuthoredSchema { version, hash })
    }

    /// `{"version", "hash"}`.
    pub fn to_json(&self) -> Json {
        object(vec![
            ("version", num(self.version)),
            ("hash", s(&self.hash)),
        ])
    }
}

impl From<SchemaRef> for AuthoredSchema {
    fn from(r: SchemaRef) -> AuthoredSchema {
        AuthoredSchema {
            version: r.version,
            hash: hex::encode(r.hash),
        }
    }
}

/// insert, update or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new row.
    Insert,
    /// A change of listed fields.
    Update,
    /// Removal (no columns).
    Delete,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 3] = [Operation::Insert, Operation::Update, Operation::Delete];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Insert => "insert",
            Operation::Update => "update",
            Operation::Delete => "delete",
        }
    }

    /// The operation named `name` on the wire.
    pub fn parse(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == name)
    }
}

/// One written field: its ID and wire value (null kept apart from absence).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The field.
    pub field_id: String,
    /// Its wire value.
    pub value: Json,
}

impl Column {
    /// Reads a mutation's `columns` strictly: an array of `{field_id, value}`, no field twice.
    pub fn list_from_json(v: Option<&Json>) -> Result<Vec<Column>, WireError> {
        let Some(Json::Array(cols)) = v else {
            return Err(bad("columns must be an array"));
        };
        let mut seen = BTreeSet::new();
        let mut columns = Vec::with_capacity(cols.len());
        for c in cols {
            let mut cm = Members::of(c, "a column is an object")?;
            let field_id = id(cm.get("field_id"), MAX_ID_BYTES, "field_id is required")?;
            let value = cm.required("value", "value is required")?.clone();
            cm.finish("a column has an unknown member")?;
            if !seen.insert(field_id.clone()) {
                return Err(bad("a field appears twice in one mutation"));
            }
            columns.push(Column { field_id, value });
        }
        Ok(columns)
    }

    /// `[{"field_id", "value"}]` in the order given.
    pub fn list_to_json(columns: &[Column]) -> Json {
        Json::Array(
            columns
                .iter()
                .map(|c| {
                    object(vec![
                        ("field_id", s(&c.field_id)),
                        ("value", c.value.clone()),
                    ])
                })
                .collect(),
        )
    }
}

/// One queued mutation.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    /// Unique per client (1..=128 bytes).
    pub mutation_id: String,
    /// The table.
    pub table_id: String,
    /// The key's wire value.
    pub pk: Json,
    /// The operation.
    pub operation: Operation,
    /// The row version the client last saw (none for an insert).
    pub base_version: Option<String>,
    /// Per-row local version.
    pub client_version: u64,
    /// Order among the client's mutations.
    pub local_order: u64,
    /// Written fields, in the order given (empty for a delete).
    pub columns: Vec<Column>,
    /// The schema the mutation was authored under.
    pub authored_schema: AuthoredSchema,
}

impl Mutation {
    fn from_json(v: &Json) -> Result<Mutation, WireError> {
        let mut m = Members::of(v, "a mutation is an object")?;
        let mutation_id = id(
            m.get("mutation_id"),
            MAX_MUTATION_ID_BYTES,
            "mutation_id must be a nonempty string",
        )?;
        let table_id = id(m.get("table_id"), MAX_ID_BYTES, "table_id is required")?;
        let pk = m.required("pk", "pk is required")?.clone();
        let operation = m
            .get("operation")
            .and_then(Json::as_str)
            .and_then(Operation::parse)
            .ok_or(bad("operation must be insert, update or delete"))?;
        let base_version = match m.optional("base_version") {
            None => None,
            Some(Json::String(v)) if !v.is_empty() => Some(v.clone()),
            Some(_) => return Err(bad("base_version must be a string or null")),
        };
        let positive_or = |v: Option<&Json>| {
            positive(
                v,
                "client_version and local_order must be positive integers",
            )
        };
        let client_version = positive_or(m.get("client_version"))?;
        let local_order = positive_or(m.get("local_order"))?;
        let columns = Column::list_from_json(m.get("columns"))?;
        if operation == Operation::Delete && !columns.is_empty() {
            return Err(bad("a delete has no columns"));
        }
        let authored_schema = AuthoredSchema::from_json(
            m.get("authored_schema"),
            "authored_schema must be {version, hash}",
        )?;
        m.finish("a mutation has an unknown member")?;
        Ok(Mutation {
            mutation_id,
            table_id,
            pk,
            operation,
            base_version,
            client_version,
            local_order,
            columns,
            authored_schema,
        })
    }

    /// The mutation as JSON.
    pub fn to_json(&self) -> Json {
        object(vec![
            ("mutation_id", s(&self.mutation_id)),
            ("table_id", s(&self.table_id)),
            ("pk", self.pk.clone()),
            ("operation", s(self.operation.as_str())),
            (
                "base_version",
                self.base_version.as_deref().map_or(Json::Null, s),
            ),
            ("client_version", num(self.client_version)),
            ("local_order", num(self.local_order)),
            ("columns", Column::list_to_json(&self.columns)),
            ("authored_schema", self.authored_schema.to_json()),
        ])
    }
}

/// A push request: one sealed batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRequest {
    /// The client ID.
    pub client_id: String,
    /// The current client generation ([`super::ABSENT_GENERATION`] when the request has none).
    pub client_generation: u64,
    /// The schema reference as presented.
    pub schema: Json,
    /// The batch's ID (1..=128 bytes).
    pub batch_id: String,
    /// At least one mutation, IDs distinct.
    pub mutations: Vec<Mutation>,
}

impl Message for PushRequest {
    fn from_json(body: &Json) -> Result<PushRequest, WireError> {
        let mut m = Members::of(body, "the body is not a valid JSON object")?;
        version_3(&mut m)?;
        let client_id = id(
            m.get("client_id"),
            MAX_ID_BYTES,
            "client_id must be a nonempty string of at most 256 bytes",
        )?;
        let client_generation = super::request_generation(&mut m)?;
        let schema = m.get("schema").cloned().unwrap_or(Json::Null);
        let batch_id = id(
            m.get("batch_id"),
            MAX_MUTATION_ID_BYTES,
            "batch_id must be a nonempty string",
        )?;
        let Some(Json::Array(items)) = m.get("mutations") else {
            return Err(bad("mutations must be an array"));
        };
        if items.is_empty() {
            return Err(bad("the batch has too many or no mutations"));
        }
        let mut seen = BTreeSet::new();
        let mut mutations = Vec::with_capacity(items.len());
        for item in items {
            let mutation = Mutation::from_json(item)?;
            if !seen.insert(mutation.mutation_id.clone()) {
                return Err(bad("a mutation_id appears twice"));
            }
            mutations.push(mutation);
        }
        m.finish("the request has an unknown member")?;
        Ok(PushRequest {
            client_id,
            client_generation,
            schema,
            batch_id,
            mutations,
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
            ("batch_id", s(&self.batch_id)),
            (
                "mutations",
                Json::Array(self.mutations.iter().map(Mutation::to_json).collect()),
            ),
        ])
    }
}

/// A row an outcome carries: its version, the row and its row digest.
#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeRow {
    /// The row's server version.
    pub server_version: String,
    /// The row by field ID.
    pub row: Json,
    /// Its row digest.
    pub row_checksum: Checksum,
}

/// The members of a `schema_incompatible` rejection (spec 000's example).
#[derive(Debug, Clone, PartialEq)]
pub struct Incompatible {
    /// The schema the outcome is stated in (the current one).
    pub outcome_schema: AuthoredSchema,
    /// The mutation's authored schema.
    pub authored_schema: AuthoredSchema,
    /// The current schema.
    pub current_schema: AuthoredSchema,
    /// The sorted IDs of the fields that cannot be represented.
    pub incompatible_field_ids: Vec<String>,
}

/// The outcome of one mutation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The write happened.
    Applied {
        /// The mutation.
        mutation_id: String,
        /// The row's new version.
        server_version: String,
        /// The row as written (absent for a delete).
        row: Option<(Json, Checksum)>,
    },
    /// A newer write got there first (or the row does not exist, or is not visible).
    Conflict {
        /// The mutation.
        mutation_id: String,
        /// A bounded diagnostic.
        message: String,
        /// The current row, when it exists and the user may see it.
        current: Option<OutcomeRow>,
    },
    /// Refused for ever.
    Rejected {
        /// The mutation.
        mutation_id: String,
        /// `schema_incompatible`, `forbidden`, `invalid_value`, `not_writable`,
        /// `constraint_violation` or `invalid_authored_schema`.
        code: String,
        /// A bounded diagnostic.
        message: String,
        /// For `schema_incompatible`.
        incompatible: Option<Incompatible>,
    },
}

/// The terminal rejection codes.
pub const REJECTION_CODES: [&str; 6] = [
    "schema_incompatible",
    "forbidden",
    "invalid_value",
    "not_writable",
    "constraint_violation",
    "invalid_authored_schema",
];

impl Outcome {
    /// The mutation this outcome is for.
    pub fn mutation_id(&self) -> &str {
        match self {
            Outcome::Applied { mutation_id, .. }
            | Outcome::Conflict { mutation_id, .. }
            | Outcome::Rejected { mutation_id, .. } => mutation_id,
        }
    }

    /// `applied`, `conflict` or `rejected_terminal`.
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::Conflict { .. } => "conflict",
            Outcome::Rejected { .. } => "rejected_terminal",
        }
    }

    /// The outcome's code (`version_conflict` for a conflict), if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            Outcome::Applied { .. } => None,
            Outcome::Conflict { .. } => Some("version_conflict"),
            Outcome::Rejected { code, .. } => Some(code),
        }
    }

    /// The row the outcome carries: (server version, row, digest).
    pub fn row(&self) -> Option<(&str, &Json, &Checksum)> {
        match self {
            Outcome::Applied {
                server_version,
                row: Some((row, c)),
                ..
            } => Some((server_version, row, c)),
            Outcome::Conflict {
                current: Some(r), ..
            } => Some((&r.server_version, &r.row, &r.row_checksum)),
            _ => None,
        }
    }

    /// Reads one outcome strictly.
    pub fn from_json(v: &Json) -> Result<Outcome, WireError> {
        let mut m = Members::of(v, "an outcome is an object")?;
        let mutation_id = string(m.get("mutation_id"), "an outcome names its mutation")?;
        let status = m.get("status").and_then(Json::as_str);
        let row = |m: &mut Members<'_>| -> Result<Option<(Json, Checksum)>, WireError> {
            match (m.get("row"), m.get("row_checksum")) {
                (None, None) => Ok(None),
                (Some(row @ Json::Object(_)), sum) => Ok(Some((
                    row.clone(),
                    checksum(sum, "a row-bearing outcome carries a checksum object")?,
                ))),
                _ => Err(bad("an outcome's row and row_checksum go together")),
            }
        };
        let terminal_members = |m: &mut Members<'_>, code: &str| -> Result<String, WireError> {
            let message = string(m.get("message"), "an outcome's message must be a string")?;
            if m.get("retryable") != Some(&Json::Bool(false))
                || m.get("code").and_then(Json::as_str) != Some(code)
            {
                return Err(bad(
                    "an outcome's code and retryable do not match its status",
                ));
            }
            Ok(message)
        };
        let outcome = match status {
            Some("applied") => {
                let server_version = string(
                    m.get("server_version"),
                    "an applied outcome carries server_version",
                )?;
                Outcome::Applied {
                    mutation_id,
                    server_version,
                    row: row(&mut m)?,
                }
            }
            Some("conflict") => {
                let message = terminal_members(&mut m, "version_conflict")?;
                let version = m.get("server_version");
                let current = match (version, row(&mut m)?) {
                    (None, None) => None,
                    (Some(Json::String(v)), Some((row, row_checksum))) => Some(OutcomeRow {
                        server_version: v.clone(),
                        row,
                        row_checksum,
                    }),
                    _ => return Err(bad("a conflict carries its row with its version")),
                };
                Outcome::Conflict {
                    mutation_id,
                    message,
                    current,
                }
            }
            Some("rejected_terminal") => {
                let code = m
                    .get("code")
                    .and_then(Json::as_str)
                    .filter(|c| REJECTION_CODES.contains(c))
                    .ok_or(bad("a rejection's code is not a known code"))?
                    .to_owned();
                let message = terminal_members(&mut m, &code)?;
                let incompatible = if code == "schema_incompatible" {
                    let r = |m: &mut Members<'_>, n| {
                        AuthoredSchema::from_json(
                            m.get(n),
                            "schema_incompatible carries schema references",
                        )
                    };
                    Some(Incompatible {
                        outcome_schema: r(&mut m, "outcome_schema")?,
                        authored_schema: r(&mut m, "authored_schema")?,
                        current_schema: r(&mut m, "current_schema")?,
                        incompatible_field_ids: strings(
                            m.get("incompatible_field_ids"),
                            "incompatible_field_ids is an array of strings",
                        )?,
                    })
                } else {
                    None
                };
                Outcome::Rejected {
                    mutation_id,
                    code,
                    message,
                    incompatible,
                }
            }
            _ => return Err(bad("an outcome's status is not known")),
        };
        m.finish("an outcome has an unknown member")?;
        Ok(outcome)
    }

    /// The outcome as JSON.
    pub fn to_json(&self) -> Json {
        let mut members = vec![
            ("mutation_id", s(self.mutation_id())),
            ("status", s(self.status())),
        ];
        let push_row = |members: &mut Vec<(&str, Json)>, row: &Json, c: &Checksum| {
            members.push(("row", row.clone()));
            members.push(("row_checksum", checksum_json(c)));
        };
        match self {
            Outcome::Applied {
                server_version,
                row,
                ..
            } => {
                members.push(("server_version", s(server_version)));
                if let Some((row, c)) = row {
                    push_row(&mut members, row, c);
                }
            }
            Outcome::Conflict {
                message, current, ..
            } => {
                members.push(("code", s("version_conflict")));
                members.push(("message", s(message)));
                members.push(("retryable", Json::Bool(false)));
                if let Some(r) = current {
                    members.push(("server_version", s(&r.server_version)));
                    push_row(&mut members, &r.row, &r.row_checksum);
                }
            }
            Outcome::Rejected {
                code,
                message,
                incompatible,
                ..
            } => {
                members.push(("code", s(code)));
                members.push(("message", s(message)));
                members.push(("retryable", Json::Bool(false)));
                if let Some(i) = incompatible {
                    members.push(("outcome_schema", i.outcome_schema.to_json()));
                    members.push(("authored_schema", i.authored_schema.to_json()));
                    members.push(("current_schema", i.current_schema.to_json()));
                    members.push((
                        "incompatible_field_ids",
                        string_array(&i.incompatible_field_ids),
                    ));
                }
            }
        }
        object(members)
    }
}

/// A push response: one outcome per mutation, in mutation order.
#[derive(Debug, Clone, PartialEq)]
pub struct PushResponse {
    /// The batch.
    pub batch_id: String,
    /// The outcomes.
    pub outcomes: Vec<Outcome>,
}

impl Message for PushResponse {
    fn from_json(body: &Json) -> Result<PushResponse, WireError> {
        let mut m = Members::of(body, "a push response is an object")?;
        version_3(&mut m)?;
        let batch_id = string(m.get("batch_id"), "batch_id must be a string")?;
        let outcomes = match m.get("outcomes") {
            Some(Json::Array(items)) => items
                .iter()
                .map(Outcome::from_json)
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("outcomes must be an array")),
        };
        m.finish("a push response has an unknown member")?;
        Ok(PushResponse { batch_id, outcomes })
    }

    fn to_json(&self) -> Json {
        object(vec![
            ("protocol_version", num(3)),
            ("batch_id", s(&self.batch_id)),
            (
                "outcomes",
                Json::Array(self.outcomes.iter().map(Outcome::to_json).collect()),
            ),
        ])
    }
}
