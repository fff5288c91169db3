//! The negative controls of spec 001 "Required negative controls" that belong to the core:
//! each input the digests bind changes the digest, and weaker scope-digest constructions
//! (CRC32, XOR, additive, constant, unsorted) fail the same checks the real one passes.

use std::collections::HashSet;

use sha2::{Digest, Sha256};
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A manifest with one table whose fields are given as (id, type, nullable) triples.
fn manifest(
    table_id: &str,
    pk: (&str, &str),
    fields: &[(&str, &str, bool)],
    table_name: &str,
) -> Manifest {
    let mut fs = vec![format!(
        r#"{{"field_id":"{}","name":"pk","type":"{}","nullable":false,"writable":false}}"#,
        pk.0, pk.1
    )];
    for (id, ty, nullable) in fields {
        let extra = if *ty == "decimal" {
            r#","precision":20,"scale":4"#
        } else {
            ""
        };
        fs.push(format!(
            r#"{{"field_id":"{id}","name":"n_{id}","type":"{ty}","nullable":{nullable},"writable":true{extra}}}"#
        ));
    }
    Manifest::parse(&format!(
        r#"{{"schema_version":1,"parent_schema":null,"transition_class":"initial","compatibility_floor":1,
        "tables":[{{"table_id":"{table_id}","relation_id":"rel","name":"{table_name}","composition":"multi_scope",
        "primary_key_field_id":"{}","lifecycle":{{"created_at_field_id":null,"updated_at_field_id":null,
        "deleted_at_field_id":null}},"fields":[{}],"indexes":[]}}]}}"#,
        pk.0,
        fs.join(",")
    ))
    .unwrap()
}

const FIELDS: &[(&str, &str, bool)] = &[("f_a", "string", true), ("f_b", "int", true)];

fn digest(m: &Manifest, table: &str, pk: &str, row: &str, version: &str) -> [u8; 32] {
    row_digest(
        m,
        table,
        &Json::parse(pk).unwrap(),
        &Json::parse(row).unwrap(),
        version,
    )
    .unwrap()
    .digest
}

#[test]
fn every_bound_input_changes_the_row_digest() {
    let base = manifest("tbl", ("pk", "string"), FIELDS, "t");
    let row = r#"{"pk":"1","f_a":"x","f_b":7}"#;
    let variants: Vec<(&str, [u8; 32])> = vec![
        ("base", digest(&base, "tbl", r#""1""#, row, "v1")),
        (
            "schema (same table, different manifest hash)",
            digest(
                &manifest("tbl", ("pk", "string"), FIELDS, "renamed"),
                "tbl",
                r#""1""#,
                row,
                "v1",
            ),
        ),
        (
            "table id",
            digest(
                &manifest("tbl2", ("pk", "string"), FIELDS, "t"),
                "tbl2",
                r#""1""#,
                row,
                "v1",
            ),
        ),
        (
            "key field id",
            digest(
                &manifest("tbl", ("pk2", "string"), FIELDS, "t"),
                "tbl",
                r#""1""#,
                r#"{"pk2":"1","f_a":"x","f_b":7}"#,
                "v1",
            ),
        ),
        (
            "key type (int64 with the same digits)",
            digest(
                &manifest("tbl", ("pk", "int64"), FIELDS, "t"),
                "tbl",
                r#""1""#,
                row,
                "v1",
            ),
        ),
        (
            "key type (int with the same digits)",
            digest(
                &manifest("tbl", ("pk", "int"), FIELDS, "t"),
                "tbl",
                "1",
                r#"{"pk":1,"f_a":"x","f_b":7}"#,
                "v1",
            ),
        ),
        (
            "key value",
            digest(
                &base,
                "tbl",
                r#""2""#,
                r#"{"pk":"2","f_a":"x","f_b":7}"#,
                "v1",
            ),
        ),
        (
            "field type (int64 with the same digits)",
            digest(
                &manifest(
                    "tbl",
                    ("pk", "string"),
                    &[("f_a", "string", true), ("f_b", "int64", true)],
                    "t",
                ),
                "tbl",
                r#""1""#,
                r#"{"pk":"1","f_a":"x","f_b":"7"}"#,
                "v1",
            ),
        ),
        (
            "null state (null instead of empty string)",
            digest(
                &base,
                "tbl",
                r#""1""#,
                r#"{"pk":"1","f_a":null,"f_b":7}"#,
                "v1",
            ),
        ),
        (
            "null state (empty string)",
            digest(
                &base,
                "tbl",
                r#""1""#,
                r#"{"pk":"1","f_a":"","f_b":7}"#,
                "v1",
            ),
        ),
        (
            "row value",
            digest(
                &base,
                "tbl",
                r#""1""#,
                r#"{"pk":"1","f_a":"x","f_b":8}"#,
                "v1",
            ),
        ),
        ("server version", digest(&base, "tbl", r#""1""#, row, "v2")),
    ];
    let mut seen = HashSet::new();
    for (what, d) in &variants {
        assert!(
            seen.insert(*d),
            "changing the {what} did not change the digest"
        );
    }
    // Member order in the row object is not bound: the same row reordered digests the same.
    assert_eq!(
        digest(
            &base,
            "tbl",
            r#""1""#,
            r#"{"f_b":7,"pk":"1","f_a":"x"}"#,
            "v1"
        ),
        variants[0].1
    );
}

#[test]
fn invalid_rows_are_rejected_before_hashing() {
    let m = manifest("tbl", ("pk", "string"), FIELDS, "t");
    let pk = Json::parse(r#""1""#).unwrap();
    for (row, code) in [
        (r#"{"pk":"1","f_a":"x"}"#, "invalid_row"),
        (r#"{"pk":"1","f_a":"x","f_b":7,"f_c":1}"#, "invalid_row"),
        (r#"{"pk":"2","f_a":"x","f_b":7}"#, "primary_key_mismatch"),
        (r#"{"pk":"1","f_a":"x","f_b":7.5}"#, "non_canonical"),
        (r#"{"pk":null,"f_a":"x","f_b":7}"#, "null_not_allowed"),
        (r#"["pk"]"#, "invalid_row"),
    ] {
        let err = row_digest(&m, "tbl", &pk, &Json::parse(row).unwrap(), "v1").unwrap_err();
        assert_eq!(err.code(), code, "{row}");
    }
    assert!(Json::parse(r#"{"pk":"1","f_a":"x","f_a":"y","f_b":7}"#).is_err());
    let row = Json::parse(r#"{"pk":"1","f_a":"x","f_b":7}"#).unwrap();
    assert_eq!(
        row_digest(&m, "tbl", &pk, &row, "").unwrap_err().code(),
        "invalid_server_version"
    );
    assert_eq!(
        row_digest(&m, "nope", &pk, &row, "v").unwrap_err().code(),
        "unknown_table"
    );
    assert_eq!(
        row_digest(&m, "tbl", &Json::Null, &row, "v")
            .unwrap_err()
            .code(),
        "null_not_allowed"
    );
}

#[test]
fn reordered_json_members_converge_and_duplicates_are_rejected() {
    assert_eq!(
        jcs::canonicalize(r#"{"b":[1,{"y":2,"x":1}],"a":null}"#).unwrap(),
        jcs::canonicalize(r#"{ "a" : null , "b" : [ 1.0 , { "x" : 1e0 , "y" : 20e-1 } ] }"#)
            .unwrap()
    );
    assert!(jcs::canonicalize(r#"{"a":{"b":1,"b":1}}"#).is_err());
    // Implementation-native serialization (here: unsorted members) is not accepted as json.
    let spec =
        synchro_protocol::types::FieldSpec::new(synchro_protocol::types::PortableType::Json, false)
            .unwrap();
    assert!(
        synchro_protocol::value::TypedValue::from_wire_text(&spec, r#""{\"b\":1,\"a\":2}""#)
            .is_err()
    );
    assert!(
        synchro_protocol::value::TypedValue::from_wire_text(&spec, r#""{\"a\":2, \"b\":1}""#)
            .is_err()
    );
    assert!(synchro_protocol::value::TypedValue::from_wire_text(&spec, r#""[1.50]""#).is_err());
}

// ---- scope digest: the real construction against mutants ----

type Entries = Vec<(RowIdentity, [u8; 32])>;
type ScopeFn = fn(&[u8; 32], &str, &Entries) -> [u8; 32];

fn real(schema: &[u8; 32], scope: &str, entries: &Entries) -> [u8; 32] {
    scope_digest(schema, scope, &mut entries.clone(), false)
        .unwrap()
        .digest
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn mutant_crc32(schema: &[u8; 32], scope: &str, entries: &Entries) -> [u8; 32] {
    let mut all = schema.to_vec();
    all.extend_from_slice(scope.as_bytes());
    let mut sorted = entries.clone();
    sorted.sort();
    for (i, d) in &sorted {
        all.extend_from_slice(i.as_bytes());
        all.extend_from_slice(d);
    }
    let mut out = [0u8; 32];
    out[..4].copy_from_slice(&crc32(&all).to_be_bytes());
    out
}

fn mutant_xor(_: &[u8; 32], _: &str, entries: &Entries) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (_, d) in entries {
        for (o, x) in out.iter_mut().zip(d) {
            *o ^= x;
        }
    }
    out
}

fn mutant_additive(_: &[u8; 32], _: &str, entries: &Entries) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (_, d) in entries {
        let mut carry = 0u16;
        for k in (0..32).rev() {
            let s = u16::from(out[k]) + u16::from(d[k]) + carry;
            out[k] = s as u8;
            carry = s >> 8;
        }
    }
    out
}

fn mutant_constant(_: &[u8; 32], _: &str, _: &Entries) -> [u8; 32] {
    Sha256::digest(b"healthy").into()
}

/// Hashes entries in the order given instead of identity order.
fn mutant_unsorted(schema: &[u8; 32], scope: &str, entries: &Entries) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"synchro:v3:scope-digest:v1\0");
    h.update(schema);
    h.update((scope.len() as u64).to_be_bytes());
    h.update(scope.as_bytes());
    h.update((entries.len() as u64).to_be_bytes());
    for (i, d) in entries {
        h.update((i.as_bytes().len() as u64).to_be_bytes());
        h.update(i.as_bytes());
        h.update(d);
    }
    h.finalize().into()
}

/// Every check a scope-digest implementation must pass; returns the ones it fails.
fn scope_suite(f: ScopeFn) -> Vec<&'static str> {
    let mut failed = Vec::new();
    // Independent expectations from vectors/conformance-v1.json SD-01/SD-02 (same state,
    // entries given in two orders).
    let doc = Json::parse(include_str!("../../vectors/conformance-v1.json")).unwrap();
    let Some(Json::Array(cases)) = doc.get("cases") else {
        panic!()
    };
    for id in ["SD-01", "SD-02", "SD-03"] {
        let case = cases
            .iter()
            .find(|c| c.get("id").and_then(Json::as_str) == Some(id))
            .unwrap();
        let input = case.get("input").unwrap();
        let schema: [u8; 32] = hex::decode(input.get("schema_hash").unwrap().as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let Some(Json::Array(es)) = input.get("entries") else {
            panic!()
        };
        let entries: Entries = es
            .iter()
            .map(|e| {
                let id = hex::decode(e.get("row_identity_hex").unwrap().as_str().unwrap()).unwrap();
                let d = hex::decode(e.get("row_digest_hex").unwrap().as_str().unwrap()).unwrap();
                (RowIdentity::from_bytes(&id).unwrap(), d.try_into().unwrap())
            })
            .collect();
        let want = case
            .get("expect")
            .unwrap()
            .get("sha256")
            .unwrap()
            .as_str()
            .unwrap();
        if hex::encode(f(
            &schema,
            input.get("scope_id").unwrap().as_str().unwrap(),
            &entries,
        )) != want
        {
            failed.push("independent vector");
        }
    }
    // Controls on a scope of three rows.
    let m = manifest("tbl", ("pk", "string"), FIELDS, "t");
    let t = m.table("tbl").unwrap();
    let ident = |k: &str| {
        let pk = synchro_protocol::value::TypedValue::from_wire_text(
            &t.primary_key().spec,
            &format!("\"{k}\""),
        )
        .unwrap();
        RowIdentity::new(t, &pk).unwrap()
    };
    let d = |n: u8| -> [u8; 32] { Sha256::digest([n]).into() };
    let schema = m.schema_hash();
    let base: Entries = vec![(ident("a"), d(1)), (ident("b"), d(2)), (ident("c"), d(3))];
    let b = f(&schema, "s", &base);
    let mut checks: Vec<(&'static str, [u8; 32])> = vec![
        ("scope id", f(&schema, "s2", &base)),
        ("schema hash", f(&[7; 32], "s", &base)),
        (
            "row pairing",
            f(
                &schema,
                "s",
                &vec![(ident("a"), d(2)), (ident("b"), d(1)), (ident("c"), d(3))],
            ),
        ),
        ("missing row", f(&schema, "s", &base[..2].to_vec())),
        (
            "extra row",
            f(
                &schema,
                "s",
                &[base.clone(), vec![(ident("d"), d(4))]].concat(),
            ),
        ),
        (
            "row digest",
            f(
                &schema,
                "s",
                &vec![(ident("a"), d(9)), (ident("b"), d(2)), (ident("c"), d(3))],
            ),
        ),
        (
            "identity",
            f(
                &schema,
                "s",
                &vec![(ident("z"), d(1)), (ident("b"), d(2)), (ident("c"), d(3))],
            ),
        ),
    ];
    // A pair of entries that cancel under XOR/addition must still change the digest.
    let cancel = vec![(ident("x"), d(5)), (ident("y"), d(5))];
    checks.push((
        "cancelling pair",
        f(&schema, "s", &[base.clone(), cancel].concat()),
    ));
    for (what, other) in checks {
        if other == b {
            failed.push(what);
        }
    }
    // Entry order given by the caller must not matter.
    let reversed: Entries = base.iter().rev().cloned().collect();
    if f(&schema, "s", &reversed) != b {
        failed.push("order independence");
    }
    failed
}

#[test]
fn the_real_scope_digest_passes_the_suite() {
    assert_eq!(scope_suite(real), Vec::<&str>::new());
}

#[test]
fn weaker_scope_digests_fail_the_suite() {
    for (name, f) in [
        ("crc32", mutant_crc32 as ScopeFn),
        ("xor", mutant_xor),
        ("additive", mutant_additive),
        ("constant", mutant_constant),
        ("unsorted", mutant_unsorted),
    ] {
        let failed = scope_suite(f);
        assert!(
            !failed.is_empty(),
            "the {name} mutant passed the scope-digest suite"
        );
    }
    // The cancellation and control checks on their own (without the vectors) also catch
    // the aggregates that ignore identities.
    assert!(
        scope_suite(mutant_xor).contains(&"cancelling pair")
            || scope_suite(mutant_xor).contains(&"identity")
    );
    assert!(scope_suite(mutant_additive).contains(&"identity"));
    assert!(scope_suite(mutant_constant).contains(&"scope id"));
    assert!(scope_suite(mutant_unsorted).contains(&"order independence"));
}

#[test]
fn duplicate_and_malformed_scope_entries_are_rejected() {
    let m = manifest("tbl", ("pk", "int"), FIELDS, "t");
    let t = m.table("tbl").unwrap();
    let pk =
        synchro_protocol::value::TypedValue::from_wire_text(&t.primary_key().spec, "5").unwrap();
    let id = RowIdentity::new(t, &pk).unwrap();
    let mut dup = vec![(id.clone(), [1; 32]), (id.clone(), [2; 32])];
    assert_eq!(
        scope_digest(&m.schema_hash(), "s", &mut dup, false)
            .unwrap_err()
            .code(),
        "invalid_scope"
    );
    assert_eq!(
        scope_digest(&m.schema_hash(), "", &mut [], false)
            .unwrap_err()
            .code(),
        "invalid_scope"
    );
    // Every strict prefix and every extension of a valid identity is rejected.
    let bytes = id.as_bytes();
    for n in 0..bytes.len() {
        assert!(RowIdentity::from_bytes(&bytes[..n]).is_err(), "prefix {n}");
    }
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert!(RowIdentity::from_bytes(&longer).is_err());
    // A streaming digester refuses out-of-order, duplicate and miscounted input.
    use synchro_protocol::digest::ScopeDigester;
    let mut s = ScopeDigester::new(&m.schema_hash(), "s", 2).unwrap();
    s.add(&id, &[0; 32]).unwrap();
    assert!(s.add(&id, &[0; 32]).is_err());
    assert!(s.finish().is_err());
}

#[test]
fn digest_from_values_equals_digest_from_wire_json() {
    use synchro_protocol::digest::row_digest_of_values;
    use synchro_protocol::value::TypedValue;
    let m = manifest(
        "tbl",
        ("pk", "string"),
        &[
            ("f_a", "string", true),
            ("f_b", "int", false),
            ("f_c", "decimal", true),
        ],
        "t",
    );
    let t = m.table("tbl").unwrap();
    let row = Json::parse(r#"{"pk":"k","f_a":null,"f_b":-3,"f_c":"12.5"}"#).unwrap();
    let from_wire = row_digest(&m, "tbl", &Json::parse(r#""k""#).unwrap(), &row, "v9").unwrap();
    // Values in field order: f_a, f_b, f_c, pk.
    let values: Vec<TypedValue> = t
        .fields
        .iter()
        .map(|f| TypedValue::from_wire(&f.spec, row.get(&f.field_id).unwrap()).unwrap())
        .collect();
    let from_values = row_digest_of_values(&m.schema_hash(), t, &values, "v9").unwrap();
    assert_eq!(from_values.input, from_wire.input);
    assert_eq!(from_values.digest, from_wire.digest);
    // A value of the wrong type, a null for a required field, or a decimal beyond its
    // scale is refused.
    let mut wrong = values.clone();
    wrong[1] = TypedValue::from_wire_text(
        &synchro_protocol::types::FieldSpec::new(
            synchro_protocol::types::PortableType::Int64,
            false,
        )
        .unwrap(),
        "\"-3\"",
    )
    .unwrap();
    assert_eq!(
        row_digest_of_values(&m.schema_hash(), t, &wrong, "v9")
            .unwrap_err()
            .code(),
        "type_mismatch"
    );
    let mut null = values.clone();
    null[1] = TypedValue::null(synchro_protocol::types::PortableType::Int);
    assert_eq!(
        row_digest_of_values(&m.schema_hash(), t, &null, "v9")
            .unwrap_err()
            .code(),
        "null_not_allowed"
    );
    let mut wide = values.clone();
    wide[2] = TypedValue::from_scalar(synchro_protocol::value::Scalar::Decimal("1.23456".into()))
        .unwrap();
    assert_eq!(
        row_digest_of_values(&m.schema_hash(), t, &wide, "v9")
            .unwrap_err()
            .code(),
        "scale_exceeded"
    );
    assert!(
        TypedValue::from_scalar(synchro_protocol::value::Scalar::Decimal("1.50".into())).is_err()
    );
    assert_eq!(
        row_digest_of_values(&m.schema_hash(), t, &values[..3], "v9")
            .unwrap_err()
            .code(),
        "invalid_row"
    );
}
