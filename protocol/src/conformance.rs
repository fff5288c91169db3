//! The conformance protocol shared by the `synchro-conformance` binary and the wasm build.
//!
//! Input: `{"cases":[{"id","command","input"}]}`. Output: `{"results":[{"id","output"}]}`,
//! one result per case in order, serialized by RFC 8785 so that two implementations can be
//! compared octet for octet. `output` is `{"valid":true, ...}` or
//! `{"valid":false,"error":{"code","message"}}`. See README.md for every command.

use crate::digest::{row_digest, scope_digest, RowIdentity};
use crate::error::{Error, Result};
use crate::jcs;
use crate::json::Json;
use crate::manifest::{parse_hex32, Manifest};
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
    jcs::to_canonical_string(&out)
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
                let got = got.map_or("absent".to_owned(), |g| {
                    jcs::to_canonical_string(g).unwrap_or_else(|_| "?".into())
                });
                let want = jcs::to_canonical_string(want).unwrap_or_else(|_| "?".into());
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

fn run(command: &str, input: &Json) -> Result<Members> {
    match command {
        "typed-value" => {
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
        "manifest" => {
            let m = Manifest::parse(input_str(input, "manifest_json")?)?;
            Ok(vec![
                ("canonical_bytes_hex".into(), s(hex::encode(m.hash_input()))),
                ("schema_hash".into(), s(m.schema_hash_hex())),
            ])
        }
        "row-identity" => {
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
        "row-digest" => {
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
        "scope-digest" => {
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
        "canonical-json" => Ok(vec![(
            "canonical".into(),
            s(jcs::canonicalize(input_str(input, "text")?)?),
        )]),
        "canonical-decimal" => {
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
        "canonical-float" => Ok(vec![(
            "canonical".into(),
            s(canonical_float(input_str(input, "source")?)?),
        )]),
        "checksum" => {
            let c = Checksum::parse(input_str(input, "text")?)?;
            Ok(vec![("digest".into(), s(hex::encode(c.0)))])
        }
        "semver-compare" => {
            let order = semver::compare(input_str(input, "a")?, input_str(input, "b")?)?;
            Ok(vec![(
                "order".into(),
                Json::Number((order as i8).to_string()),
            )])
        }
        _ => Err(Error::request("unknown command")),
    }
}
