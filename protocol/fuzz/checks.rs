//! What each fuzz target asserts about one input. Shared by the cargo-fuzz targets
//! (`protocol/fuzz/fuzz_targets/*.rs`) and by the regression test that replays every kept
//! input (`protocol/tests/fuzz_regressions.rs`), so a crasher stays a test forever.
//!
//! Beyond "no panic", each check asserts the parser's own invariant: canonical output is a
//! fixed point and re-validates, and round trips give back the same octets.
#![allow(dead_code)]

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::RowIdentity;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_protocol::value::TypedValue;
use synchro_protocol::{conformance, decimal, jcs, semver};

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A check of one fuzz input; panics when an invariant breaks.
pub type Check = fn(&[u8]);

/// The names of the targets, each with its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("json", json),
    ("typed_value", typed_value),
    ("decimal", decimal_source),
    ("manifest", manifest),
    ("row_identity", row_identity),
    ("semver", semver_text),
    ("checksum", checksum),
    ("conformance", conformance_doc),
    ("token", token),
];

pub fn json(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(c) = jcs::canonicalize(s) {
        assert_eq!(
            jcs::canonicalize(&c).as_deref(),
            Ok(c.as_str()),
            "canonical JSON is a fixed point"
        );
    }
}

pub fn typed_value(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Some(raw) = text(rest) else { return };
    let ty = PortableType::ALL[usize::from(selector >> 1) % PortableType::ALL.len()];
    let nullable = selector & 1 == 1;
    let spec = match ty {
        PortableType::Decimal => FieldSpec::decimal(nullable, 40, 10).unwrap(),
        _ => FieldSpec::new(ty, nullable).unwrap(),
    };
    if let Ok(v) = TypedValue::from_wire_text(&spec, raw) {
        let again = TypedValue::from_wire_text(&spec, &v.to_wire_text())
            .expect("canonical wire text re-validates");
        assert_eq!(
            again.to_bytes(),
            v.to_bytes(),
            "wire round trip keeps the octets"
        );
    }
}

pub fn decimal_source(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(c) = decimal::canonicalize(s) {
        assert_eq!(
            decimal::validate_wire(&c, None).ok(),
            Some(c.as_str()),
            "canonical decimal re-validates"
        );
    }
}

pub fn manifest(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(m) = Manifest::parse(s) {
        // The canonical body, with its hash declared, parses to the same manifest.
        let body = m.canonical_body();
        let with_hash = format!(
            "{{\"schema_hash\":\"{}\",{}",
            m.schema_hash_hex(),
            &body[1..]
        );
        assert_eq!(
            Manifest::parse(&with_hash).expect("canonical body re-validates"),
            m
        );
    }
}

pub fn row_identity(data: &[u8]) {
    if let Ok(id) = RowIdentity::from_bytes(data) {
        assert_eq!(id.as_bytes(), data);
    }
}

pub fn semver_text(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(v) = semver::Version::parse(s) {
        assert_eq!(v.precedence(&v), std::cmp::Ordering::Equal);
    }
}

pub fn checksum(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(c) = Checksum::parse(s) {
        assert_eq!(Checksum::parse(&c.to_json_string()), Ok(c));
    }
}

pub fn conformance_doc(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(out) = conformance::eval_document(s) {
        assert!(Json::parse(&out).is_ok(), "output is JSON");
    }
}

pub fn token(data: &[u8]) {
    use synchro_protocol::token::{Keyring, ScopeCursor};
    let Some(s) = text(data) else { return };
    let ring = Keyring::new("k", &[7; 32]).unwrap();
    if let Ok(c) = ScopeCursor::open(&ring, s) {
        // Only tokens this ring signed open; re-signing gives the same cursor.
        assert_eq!(ScopeCursor::open(&ring, &c.sign(&ring)).unwrap(), c);
    }
}
