//! The conformance protocol shared by the `synchro-conformance` binary and the wasm build.
//!
//! Input: `{"cases":[{"id","command","input"}]}`. Output: `{"results":[{"id","output"}]}`,
//! one result per case in order, serialized by RFC 8785 so that two implementations can be
//! compared octet for octet. `output` is `{"valid":true, ...}` or
//! `{"valid":false,"error":{"code","message"}}`. See docs/protocol.md for every command.

use std::collections::{BTreeMap, BTreeSet};

use crate::classify::{classify, TransitionFacts};
use crate::digest::{row_digest, scope_digest, RowIdentity};
use crate::dispatch::{dispatch, ConnectOutcome, ConnectRequest, SchemaAction, ServerView};
use crate::error::{Error, Result};
use crate::jcs;
use crate::json::Json;
use crate::lineage::Lineage;
use crate::manifest::{parse_hex32, Manifest, SchemaRef};
use crate::migration::MigrationPlan;
use crate::types::{DecimalSpec, FieldSpec};
use crate::value::{canonical_float, TypedValue};
use crate::{checksum::Checksum, decimal, semver};

/// The commands understood by [`eval_case`].
pub const COMMANDS: &[&str] = &[
    "typed-value",
    "manifest",
    "row-identity",
    "row-digest",
    "scope-digest",
    "canonical-json",
    "canonical-decimal",
    "canonical-float",
    "checksum",
    "semver-compare",
    "classify",
    "connect-dispatch",
    "migration-plan",
];

/// Evaluates a whole `{"cases":[...]}` document and returns the canonical
/// `{"results":[...]}` text. Fails only when the document itself is malformed.
pub fn eval_document(text: &str) -> Result<String> {
    let doc = Json::parse(text)?;
    let Some(Json::Array(cases)) = doc.get("cases") else {
        return Err(Error::request(
            "document must be an object with a cases array",
        ));
    };
    let results = cases
        .iter()
        .map(|case| {
            let id = case.get("id").cloned().unwrap_or(Json::Null);
            let output = match (
                case.get("command").and_then(Json::as_str),
                case.get("input"),
            ) {
                (Some(command), Some(input)) => eval_case(command, input),
                _ => failure(&Error::request("case needs a command string and an input")),
            };
            Json::Object(vec![("id".into(), id), ("output".into(), output)])
        })
        .collect();
    let out = Json::Object(vec![("results".into(), Json::Array(results))]);
    Ok(jcs::to_output_string(&out))
}

/// Outcome of [`check_document`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Cases evaluated.
    pub total: usize,
    /// One line per case whose output differs from its `expect`, naming the case and member.
    pub mismatches: Vec<String>,
}

/// Evaluates a vector file whose cases carry `expect` objects and compares: `valid` must
/// match, and every other expected member must equal the output's member exactly.
pub fn check_document(text: &str) -> Result<CheckReport> {
    let doc = Json::parse(text)?;
    let Some(Json::Array(cases)) = doc.get("cases") else {
        return Err(Error::request(
            "document must be an object with a cases array",
        ));
    };
    let mut mismatches = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let id = match case.get("id") {
            Some(Json::String(s)) => s.clone(),
            _ => format!("#{i}"),
        };
        let (Some(command), Some(input), Some(Json::Object(expect))) = (
            case.get("command").and_then(Json::as_str),
            case.get("input"),
            case.get("expect"),
        ) else {
            mismatches.push(format!(
                "{id}: case needs command, input and an expect object"
            ));
            continue;
        };
        let output = eval_case(command, input);
        for (name, want) in expect {
            let got = output.get(name);
            if got != Some(want) {
                let got = got.map_or("absent".to_owned(), jcs::to_output_string);
                let want = jcs::to_output_string(want);
                mismatches.push(format!("{id}: {name} is {got}, expected {want}"));
            }
        }
    }
    Ok(CheckReport {
        total: cases.len(),
        mismatches,
    })
}

/// Evaluates one case and returns its `output` object.
pub fn eval_case(command: &str, input: &Json) -> Json {
    match run(command, input) {
        Ok(mut members) => {
            members.insert(0, ("valid".into(), Json::Bool(true)));
            Json::Object(members)
        }
        Err(e) => failure(&e),
    }
}

fn failure(e: &Error) -> Json {
    Json::Object(vec![
        ("valid".into(), Json::Bool(false)),
        (
            "error".into(),
            Json::Object(vec![
                ("code".into(), Json::String(e.code().into())),
                ("message".into(), Json::String(e.to_string())),
            ]),
        ),
    ])
}

type Members = Vec<(String, Json)>;

fn s(v: impl Into<String>) -> Json {
    Json::String(v.into())
}

fn input_str<'a>(input: &'a Json, name: &str) -> Result<&'a str> {
    input
        .get(name)
        .and_then(Json::as_str)
        .ok_or_else(|| Error::request(format!("input.{name} must be a string")))
}

fn input_u32(input: &Json, name: &str) -> Result<Option<u32>> {
    match input.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => crate::types::json_u32(v)
            .map(Some)
            .ok_or_else(|| Error::request(format!("input.{name} must be a nonnegative integer"))),
    }
}

/// Decodes lowercase hexadecimal (uppercase is not canonical and is rejected).
fn lower_hex(s: &str) -> Option<Vec<u8>> {
    if !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    hex::decode(s).ok()
}

/// Runs one command on its input: each command is a function of its own below.
fn run(command: &str, input: &Json) -> Result<Members> {
    let command: fn(&Json) -> Result<Members> = match command {
        "typed-value" => typed_value_command,
        "manifest" => manifest_command,
        "row-identity" => row_identity_command,
        "row-digest" => row_digest_command,
        "scope-digest" => scope_digest_command,
        "canonical-json" => canonical_json_command,
        "canonical-decimal" => canonical_decimal_command,
        "canonical-float" => canonical_float_command,
        "checksum" => checksum_command,
        "semver-compare" => semver_compare_command,
        "classify" => classify_command,
        "connect-dispatch" => connect_dispatch,
        "migration-plan" => migration_plan_command,
        _ => return Err(Error::request("unknown command")),
    };
    command(input)
}

/// `typed-value`: a wire value's canonical typed bytes under its field specification.
fn typed_value_command(input: &Json) -> Result<Members> {
    let spec = FieldSpec::from_json(
        input
            .get("field_spec")
            .ok_or_else(|| Error::request("input.field_spec is required"))?,
    )?;
    let value = TypedValue::from_wire_text(&spec, input_str(input, "raw_json")?)?;
    Ok(vec![(
        "canonical_bytes_hex".into(),
        s(hex::encode(value.to_bytes())),
    )])
}

/// `manifest`: a manifest's canonical bytes and schema hash.
fn manifest_command(input: &Json) -> Result<Members> {
    let m = Manifest::parse(input_str(input, "manifest_json")?)?;
    Ok(vec![
        ("canonical_bytes_hex".into(), s(hex::encode(m.hash_input()))),
        ("schema_hash".into(), s(m.schema_hash_hex())),
    ])
}

/// `row-identity`: the canonical identity of a row of a table.
fn row_identity_command(input: &Json) -> Result<Members> {
    let m = Manifest::parse(input_str(input, "manifest_json")?)?;
    let table = m
        .table(input_str(input, "table_id")?)
        .ok_or(Error::UnknownTable)?;
    let pk = Json::parse(input_str(input, "pk_json")?)?;
    let pk = TypedValue::from_wire(&table.primary_key().spec, &pk)?;
    let identity = RowIdentity::new(table, &pk)?;
    Ok(vec![(
        "row_identity_hex".into(),
        s(hex::encode(identity.as_bytes())),
    )])
}

/// `row-digest`: a row's identity, digest input and digest.
fn row_digest_command(input: &Json) -> Result<Members> {
    let m = Manifest::parse(input_str(input, "manifest_json")?)?;
    let pk = Json::parse(input_str(input, "pk_json")?)?;
    let row = Json::parse(input_str(input, "row_json")?)?;
    let d = row_digest(
        &m,
        input_str(input, "table_id")?,
        &pk,
        &row,
        input_str(input, "server_version")?,
    )?;
    Ok(vec![
        (
            "row_identity_hex".into(),
            s(hex::encode(d.identity.as_bytes())),
        ),
        ("canonical_bytes_hex".into(), s(hex::encode(&d.input))),
        ("sha256".into(), s(hex::encode(d.digest))),
    ])
}

/// `scope-digest`: a scope's digest input, digest and cardinality from its entries.
fn scope_digest_command(input: &Json) -> Result<Members> {
    let schema_hash = parse_hex32(input_str(input, "schema_hash")?)?;
    let scope_id = input_str(input, "scope_id")?;
    let Some(Json::Array(entries)) = input.get("entries") else {
        return Err(Error::request("input.entries must be an array"));
    };
    let mut pairs = entries
        .iter()
        .map(|e| {
            let id_hex = input_str(e, "row_identity_hex")?;
            let id = lower_hex(id_hex).ok_or(Error::InvalidRowIdentity {
                reason: "not lowercase hexadecimal",
            })?;
            let digest = parse_hex32(input_str(e, "row_digest_hex")?)?;
            Ok((RowIdentity::from_bytes(&id)?, digest))
        })
        .collect::<Result<Vec<_>>>()?;
    let d = scope_digest(&schema_hash, scope_id, &mut pairs, true)?;
    Ok(vec![
        (
            "canonical_bytes_hex".into(),
            s(hex::encode(d.input.unwrap_or_default())),
        ),
        ("sha256".into(), s(hex::encode(d.digest))),
        (
            "cardinality".into(),
            Json::Number(d.cardinality.to_string()),
        ),
    ])
}

/// `canonical-json`: RFC 8785 text of a JSON text.
fn canonical_json_command(input: &Json) -> Result<Members> {
    Ok(vec![(
        "canonical".into(),
        s(jcs::canonicalize(input_str(input, "text")?)?),
    )])
}

/// `canonical-decimal`: a decimal's canonical text (under a precision and scale, when given).
fn canonical_decimal_command(input: &Json) -> Result<Members> {
    let spec = match (input_u32(input, "precision")?, input_u32(input, "scale")?) {
        (Some(p), scale) => Some(DecimalSpec::new(p, scale.unwrap_or(0))?),
        (None, None) => None,
        (None, Some(_)) => return Err(Error::request("scale needs a precision")),
    };
    Ok(vec![(
        "canonical".into(),
        s(decimal::canonicalize_with(
            input_str(input, "source")?,
            spec,
        )?),
    )])
}

/// `canonical-float`: a float's canonical text.
fn canonical_float_command(input: &Json) -> Result<Members> {
    Ok(vec![(
        "canonical".into(),
        s(canonical_float(input_str(input, "source")?)?),
    )])
}

/// `checksum`: the digest a wire checksum object carries.
fn checksum_command(input: &Json) -> Result<Members> {
    let c = Checksum::parse(input_str(input, "text")?)?;
    Ok(vec![("digest".into(), s(hex::encode(c.0)))])
}

/// `semver-compare`: the SemVer order of two versions (-1, 0 or 1).
fn semver_compare_command(input: &Json) -> Result<Members> {
    let order = semver::compare(input_str(input, "a")?, input_str(input, "b")?)?;
    Ok(vec![(
        "order".into(),
        Json::Number((order as i8).to_string()),
    )])
}

/// `classify`: the class of a manifest transition and the tables it affects.
fn classify_command(input: &Json) -> Result<Members> {
    let parent = Manifest::parse(input_str(input, "parent_manifest_json")?)?;
    let child = Manifest::parse(input_str(input, "child_manifest_json")?)?;
    let facts = match input.get("facts") {
        None | Some(Json::Null) => TransitionFacts::default(),
        Some(f) => transition_facts(f)?,
    };
    let c = classify(&parent, &child, &facts)?;
    Ok(vec![
        ("class".into(), s(c.class.as_str())),
        ("affected_tables".into(), strings(c.affected_tables.iter())),
    ])
}

/// `migration-plan`: the local migration plan from a source manifest (or none) to a target.
fn migration_plan_command(input: &Json) -> Result<Members> {
    let source = match input.get("source_manifest_json") {
        None | Some(Json::Null) => None,
        Some(Json::String(text)) => Some(Manifest::parse(text)?),
        Some(_) => {
            return Err(Error::request(
                "input.source_manifest_json must be a string or null",
            ))
        }
    };
    let target = Manifest::parse(input_str(input, "target_manifest_json")?)?;
    let reset = input_bool(input, "reset")?;
    let plan = MigrationPlan::derive(source.as_ref(), &target, reset)?;
    Ok(vec![
        ("mode".into(), s(plan.mode.as_str())),
        ("plan_hash".into(), s(hex::encode(plan.plan_hash()))),
        ("statements".into(), strings(plan.render().iter())),
        ("plan".into(), plan.to_json()),
    ])
}

fn strings<'a>(items: impl Iterator<Item = &'a String>) -> Json {
    Json::Array(items.map(|x| Json::String(x.clone())).collect())
}

fn input_bool(input: &Json, name: &str) -> Result<bool> {
    match input.get(name) {
        None | Some(Json::Null) => Ok(false),
        Some(Json::Bool(b)) => Ok(*b),
        Some(_) => Err(Error::request(format!("input.{name} must be a boolean"))),
    }
}

fn string_set(value: Option<&Json>, name: &str) -> Result<BTreeSet<String>> {
    match value {
        None | Some(Json::Null) => Ok(BTreeSet::new()),
        Some(Json::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Error::request(format!("{name} must hold strings")))
            })
            .collect(),
        Some(_) => Err(Error::request(format!(
            "{name} must be an array of strings"
        ))),
    }
}

fn transition_facts(f: &Json) -> Result<TransitionFacts> {
    let fields = match f.get("added_fields_without_history") {
        None | Some(Json::Null) => BTreeSet::new(),
        Some(Json::Array(items)) => items
            .iter()
            .map(|v| {
                Ok((
                    input_str(v, "table_id")?.to_owned(),
                    input_str(v, "field_id")?.to_owned(),
                ))
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(Error::request(
                "facts.added_fields_without_history must be an array",
            ))
        }
    };
    Ok(TransitionFacts {
        added_fields_without_history: fields,
        empty_added_tables: string_set(f.get("empty_added_tables"), "facts.empty_added_tables")?,
        materialization_changed: string_set(
            f.get("materialization_changed"),
            "facts.materialization_changed",
        )?,
        reconfigured: string_set(f.get("reconfigured"), "facts.reconfigured")?,
    })
}

/// A positive JSON integer at most 2^53−1.
fn positive_counter(v: &Json, name: &str) -> Result<u64> {
    match v {
        Json::Number(t)
            if !t.starts_with('0') && t.len() <= 16 && t.bytes().all(|b| b.is_ascii_digit()) =>
        {
            t.parse::<u64>()
                .ok()
                .filter(|n| *n <= crate::manifest::MAX_JSON_COUNTER)
                .ok_or_else(|| Error::request(format!("{name} must be a positive integer")))
        }
        _ => Err(Error::request(format!("{name} must be a positive integer"))),
    }
}

fn connect_dispatch(input: &Json) -> Result<Members> {
    let request = input
        .get("request")
        .ok_or_else(|| Error::request("input.request is required"))?;
    let protocol_version = match request.get("protocol_version") {
        Some(Json::Number(t)) if t.bytes().all(|b| b.is_ascii_digit()) => t.parse().ok(),
        _ => None,
    };
    let client_generation = match request.get("client_generation") {
        None | Some(Json::Null) => None,
        Some(v) => Some(positive_counter(v, "request.client_generation")?),
    };
    let req = ConnectRequest {
        protocol_version,
        schema: request.get("schema").cloned().unwrap_or(Json::Null),
        client_generation,
        schema_reset: input_bool(request, "schema_reset")?,
    };
    let Some(Json::Array(texts)) = input.get("manifests") else {
        return Err(Error::request(
            "input.manifests must be an array of manifest JSON texts",
        ));
    };
    let manifests = texts
        .iter()
        .map(|t| {
            Manifest::parse(
                t.as_str()
                    .ok_or_else(|| Error::request("manifests must be strings"))?,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let lineage = Lineage::from_history(manifests)?;
    let mut transition_scopes = BTreeMap::new();
    if let Some(Json::Array(items)) = input.get("transition_scopes") {
        for item in items {
            let r = SchemaRef {
                version: positive_counter(
                    item.get("version").unwrap_or(&Json::Null),
                    "transition version",
                )?,
                hash: parse_hex32(input_str(item, "hash")?)?,
            };
            transition_scopes.insert(r, string_set(item.get("scopes"), "transition scopes")?);
        }
    }
    let assigned = string_set(input.get("assigned_scopes"), "input.assigned_scopes")?;
    let presented = string_set(
        input.get("presented_cursor_scopes"),
        "input.presented_cursor_scopes",
    )?;
    let stale = string_set(
        input.get("stale_cursor_scopes"),
        "input.stale_cursor_scopes",
    )?;
    let runtime_ok = match input.get("client_runtime_supported") {
        None | Some(Json::Null) => true,
        Some(Json::Bool(b)) => *b,
        Some(_) => {
            return Err(Error::request(
                "input.client_runtime_supported must be a boolean",
            ))
        }
    };
    let view = ServerView {
        identity_known: matches!(input.get("identity_known"), Some(Json::Bool(true))),
        client_runtime_supported: runtime_ok,
        lineage: &lineage,
        transition_scopes: &transition_scopes,
        assigned_scopes: &assigned,
        presented_cursor_scopes: &presented,
        stale_cursor_scopes: &stale,
    };
    let outcome = dispatch(&req, &view)?;
    let response = outcome.to_json(&req.schema);
    let mut out = vec![("status".into(), Json::Number(outcome.status().to_string()))];
    match &outcome {
        ConnectOutcome::Schema { action, .. } => {
            out.push(("action".into(), s(action.name())));
            if let SchemaAction::Unsupported { reason, .. } = action {
                out.push(("reason".into(), s(reason.as_str())));
            }
            for member in ["affected_scopes", "scope_cursor_updates"] {
                if let Some(v) = response.get(member) {
                    out.push((member.into(), v.clone()));
                }
            }
        }
        _ => {
            let code = response.get("error").and_then(|e| e.get("code")).cloned();
            out.push(("code".into(), code.unwrap_or(Json::Null)));
        }
    }
    out.push(("response".into(), response));
    Ok(out)
}
