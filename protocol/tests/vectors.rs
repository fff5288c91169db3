//! Every conformance vector, checked against its independently computed expectation.
//!
//! The same source runs natively (`cargo test`) and on wasm32 in node and headless Chromium
//! (wasm-bindgen-test); the native build also runs every case through the
//! `synchro-conformance` binary and requires its output to equal the library's.

use sha2::{Digest, Sha256};
use synchro_protocol::conformance::eval_document;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{check_lineage, TransitionClass};
use synchro_protocol::value::canonical_float;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const CONFORMANCE: &str = include_str!("../../vectors/conformance-v1.json");
const SYNCHRO: &str = include_str!("../../vectors/synchro-v1.json");
const UPSTREAM: &str = include_str!("../../vectors/upstream/canonical-v1.json");
const UPSTREAM_CATALOG: &str = include_str!("../../vectors/upstream/catalog.json");
const FLOAT_BOUNDARIES: &str = include_str!("../../vectors/upstream/float-wire-boundaries-v1.json");
const LINEAGE: &str = include_str!("../../vectors/upstream/manifest-lineage-v1.json");

fn arr(v: &Json) -> &[Json] {
    match v {
        Json::Array(a) => a,
        _ => panic!("expected an array"),
    }
}

fn text(v: &Json, name: &str) -> String {
    v.get(name)
        .and_then(Json::as_str)
        .unwrap_or_else(|| panic!("missing string {name}"))
        .to_owned()
}

/// A case to run and what its output must contain.
struct Case {
    id: String,
    command: String,
    input: Json,
    valid: bool,
    /// Members that a valid output must carry with exactly these values.
    expect: Vec<(String, Json)>,
}

fn document(cases: &[Case]) -> String {
    let items: Vec<Json> = cases
        .iter()
        .map(|c| {
            Json::Object(vec![
                ("id".into(), Json::String(c.id.clone())),
                ("command".into(), Json::String(c.command.clone())),
                ("input".into(), c.input.clone()),
            ])
        })
        .collect();
    synchro_protocol::jcs::to_output_string(&Json::Object(vec![(
        "cases".into(),
        Json::Array(items),
    )]))
}

/// Checks an output document against the cases; returns the number checked.
fn check_results(cases: &[Case], output: &str) -> usize {
    let out = Json::parse(output).expect("output is JSON");
    let results = arr(out.get("results").expect("results"));
    assert_eq!(results.len(), cases.len(), "one result per case");
    let mut failures = Vec::new();
    for (case, result) in cases.iter().zip(results) {
        assert_eq!(text(result, "id"), case.id, "results are in case order");
        let output = result.get("output").expect("output");
        let valid = output.get("valid") == Some(&Json::Bool(true));
        if valid != case.valid {
            failures.push(format!(
                "{}: valid={valid}, expected {} ({output:?})",
                case.id, case.valid
            ));
            continue;
        }
        if !valid {
            let err = output.get("error").expect("invalid output has error");
            assert!(!text(err, "code").is_empty() && !text(err, "message").is_empty());
            continue;
        }
        for (name, want) in &case.expect {
            if output.get(name) != Some(want) {
                failures.push(format!(
                    "{}: {name} = {:?}, expected {want:?}",
                    case.id,
                    output.get(name)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    cases.len()
}

fn conformance_cases() -> Vec<Case> {
    cases_with_expectations(CONFORMANCE)
}

fn cases_with_expectations(file: &str) -> Vec<Case> {
    let doc = Json::parse(file).unwrap();
    arr(doc.get("cases").unwrap())
        .iter()
        .map(|c| {
            let expect = c.get("expect").unwrap();
            let Json::Object(members) = expect else {
                panic!()
            };
            Case {
                id: text(c, "id"),
                command: text(c, "command"),
                input: c.get("input").unwrap().clone(),
                valid: expect.get("valid") == Some(&Json::Bool(true)),
                expect: members
                    .iter()
                    .filter(|(k, _)| k != "valid")
                    .cloned()
                    .collect(),
            }
        })
        .collect()
}

/// The upstream vectors of the kinds our spec defines, as conformance cases. Expected
/// values come from the file; `expected_bytes_sha256` is checked separately.
fn upstream_cases() -> Vec<Case> {
    let doc = Json::parse(UPSTREAM).unwrap();
    let mut cases = Vec::new();
    for v in arr(doc.get("vectors").unwrap()) {
        let kind = text(v, "kind");
        let command = match kind.as_str() {
            "typed_value" => "typed-value",
            "schema_manifest" => "manifest",
            "row_identity" => "row-identity",
            "row_digest" => "row-digest",
            "scope_digest" => "scope-digest",
            "mutation_fingerprint" | "batch_fingerprint" => continue,
            other => panic!("unknown upstream kind {other}"),
        };
        let valid = v.get("valid") == Some(&Json::Bool(true));
        let expected = v.get("expected").unwrap();
        let mut expect = Vec::new();
        if valid {
            let bytes = expected.get("canonical_bytes_hex").unwrap().clone();
            let bytes_name = if command == "row-identity" {
                "row_identity_hex"
            } else {
                "canonical_bytes_hex"
            };
            expect.push((bytes_name.to_owned(), bytes));
            if let Some(sha @ Json::String(_)) = expected.get("expected_sha256") {
                let name = if command == "manifest" {
                    "schema_hash"
                } else {
                    "sha256"
                };
                expect.push((name.to_owned(), sha.clone()));
            }
        }
        cases.push(Case {
            id: text(v, "vector_id"),
            command: command.to_owned(),
            input: v.get("input").unwrap().clone(),
            valid,
            expect,
        });
    }
    cases
}

#[test]
fn conformance_v1_all_cases_pass() {
    let cases = conformance_cases();
    assert_eq!(cases.len(), 123);
    let out = eval_document(&document(&cases)).unwrap();
    assert_eq!(check_results(&cases, &out), 123);
}

#[test]
fn synchro_v1_schema_evolution_cases_pass() {
    let cases = cases_with_expectations(SYNCHRO);
    assert_eq!(cases.len(), 39);
    let out = eval_document(&document(&cases)).unwrap();
    assert_eq!(check_results(&cases, &out), 39);
}

#[test]
fn upstream_canonical_v1_all_defined_kinds_pass() {
    let cases = upstream_cases();
    assert_eq!(cases.len(), 95);
    let out = eval_document(&document(&cases)).unwrap();
    assert_eq!(check_results(&cases, &out), 95);
}

/// The client's verification path ([`row_values`] then [`RowHasher`], what a pull page is
/// checked with) gives every row-digest vector's expected digest, and refuses what the
/// reference path refuses.
#[test]
fn the_client_row_hasher_agrees_with_every_row_digest_vector() {
    use synchro_protocol::digest::{row_digest, row_values, RowHasher, RowIdentity};
    use synchro_protocol::manifest::Manifest;
    use synchro_protocol::value::TypedValue;
    let mut hasher = RowHasher::new();
    let mut checked = 0;
    for case in conformance_cases().into_iter().chain(upstream_cases()) {
        if case.command != "row-digest" {
            continue;
        }
        let field = |name| case.input.get(name).and_then(Json::as_str);
        let (Some(m), Some(table_id), Some(pk), Some(row), Some(version)) = (
            field("manifest_json"),
            field("table_id"),
            field("pk_json"),
            field("row_json"),
            field("server_version"),
        ) else {
            continue;
        };
        let (Ok(m), Ok(pk), Ok(row)) = (Manifest::parse(m), Json::parse(pk), Json::parse(row))
        else {
            continue;
        };
        let reference = row_digest(&m, table_id, &pk, &row, version).map(|d| d.digest);
        let client = (|| {
            let table = m
                .table(table_id)
                .ok_or(synchro_protocol::Error::UnknownTable)?;
            let key = TypedValue::from_wire(&table.primary_key().spec, &pk)?;
            let identity = RowIdentity::new(table, &key)?;
            let values = row_values(table, row.clone(), &key)?;
            hasher.digest(&m.schema_hash(), table, &identity, &values, version)
        })();
        match (&reference, &client) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{}", case.id),
            (Err(_), Err(_)) => {}
            _ => panic!("{}: reference {reference:?}, client {client:?}", case.id),
        }
        if case.valid {
            let expected = case
                .expect
                .iter()
                .find(|(k, _)| k == "sha256")
                .and_then(|(_, v)| v.as_str());
            if let (Some(expected), Ok(d)) = (expected, &client) {
                assert_eq!(hex(d), expected, "{}", case.id);
            }
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} row-digest vectors");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn upstream_files_are_the_published_ones() {
    // The catalog pins the vector file's SHA-256; a corrupted copy would fail here.
    let catalog = Json::parse(UPSTREAM_CATALOG).unwrap();
    let set = &arr(catalog.get("vector_sets").unwrap())[0];
    assert_eq!(
        hex::encode(Sha256::digest(UPSTREAM.as_bytes())),
        text(set, "source_sha256")
    );
    // And each valid vector's expected_bytes_sha256 is the hash of its expected bytes, so
    // comparing canonical_bytes_hex also pins the independently computed hash.
    let doc = Json::parse(UPSTREAM).unwrap();
    for v in arr(doc.get("vectors").unwrap()) {
        let e = v.get("expected").unwrap();
        if let (Some(Json::String(b)), Some(Json::String(h))) =
            (e.get("canonical_bytes_hex"), e.get("expected_bytes_sha256"))
        {
            assert_eq!(&hex::encode(Sha256::digest(hex::decode(b).unwrap())), h);
        }
    }
}

#[test]
fn upstream_float_wire_boundaries() {
    let doc = Json::parse(FLOAT_BOUNDARIES).unwrap();
    let cases = arr(doc.get("cases").unwrap());
    assert!(!cases.is_empty());
    for c in cases {
        assert_eq!(
            canonical_float(&text(c, "source")).unwrap(),
            text(c, "canonical")
        );
    }
}

#[test]
fn upstream_manifest_lineage() {
    let doc = Json::parse(LINEAGE).unwrap();
    let num = |v: &Json| match v {
        Json::Number(t) => t.parse::<u64>().unwrap(),
        _ => panic!(),
    };
    let cases = arr(doc.get("cases").unwrap());
    assert_eq!(cases.len(), 12);
    for c in cases {
        let parent = match c.get("parent_version").unwrap() {
            Json::Null => None,
            v => Some(num(v)),
        };
        let got = check_lineage(
            num(c.get("schema_version").unwrap()),
            parent,
            TransitionClass::parse(&text(c, "transition_class")).unwrap(),
            num(c.get("compatibility_floor").unwrap()),
        );
        assert_eq!(
            got.is_ok(),
            c.get("valid") == Some(&Json::Bool(true)),
            "{}",
            text(c, "case")
        );
    }
}

/// Runs `synchro-conformance eval` with `doc` on stdin.
#[cfg(not(target_arch = "wasm32"))]
fn eval_with_binary(doc: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_synchro-conformance"))
        .arg("eval")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(doc.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn binary_gives_the_library_output_for_every_vector() {
    for (cases, n) in [
        (conformance_cases(), 123),
        (upstream_cases(), 95),
        (cases_with_expectations(SYNCHRO), 39),
    ] {
        let doc = document(&cases);
        let out = eval_with_binary(&doc);
        assert!(out.status.success());
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(check_results(&cases, &stdout), n);
        assert_eq!(stdout.trim_end(), eval_document(&doc).unwrap());
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn binary_rejects_a_malformed_document_with_status_2() {
    for doc in ["{", "{\"cases\":{}}", "[]"] {
        let out = eval_with_binary(doc);
        assert_eq!(out.status.code(), Some(2), "{doc}");
        assert!(out.stdout.is_empty());
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn check_subcommand_reports_mismatches() {
    use std::process::Command;
    let dir = std::env::temp_dir().join(format!("synchro-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.json");
    std::fs::write(&good, CONFORMANCE).unwrap();
    // Break one expectation: the tool must notice it.
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        CONFORMANCE.replacen("0101000000000000000568656c6c6f", "00", 1),
    )
    .unwrap();
    let run = |p: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_synchro-conformance"))
            .arg("check")
            .arg(p)
            .output()
            .unwrap()
    };
    let ok = run(&good);
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("123/123 cases match"));
    let ko = run(&bad);
    assert_eq!(ko.status.code(), Some(1));
    let out = String::from_utf8_lossy(&ko.stdout);
    assert!(out.contains("MISMATCH TV-STRING-01") && out.contains("122/123 cases match"));
    std::fs::remove_dir_all(&dir).unwrap();
}
