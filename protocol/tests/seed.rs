//! Portable seed bindings against vectors/seed-v1.json (computed independently by
//! vectors/tools/make_seed_v1.py), and every kind of token the server must refuse.

use synchro_protocol::json::Json;
use synchro_protocol::seed::{export_manifest_hash, ExportManifest, SeedPage, SeedReceipt};
use synchro_protocol::token::{self, Keyring, Purpose};

const VECTORS: &str = include_str!("../../vectors/seed-v1.json");

fn cases(kind: &str) -> Vec<Json> {
    let doc = Json::parse(VECTORS).unwrap();
    let Some(Json::Array(all)) = doc.get("cases") else {
        panic!("no cases")
    };
    let out: Vec<Json> = all
        .iter()
        .filter(|c| c.get("kind").and_then(Json::as_str) == Some(kind))
        .cloned()
        .collect();
    assert!(!out.is_empty(), "no {kind} case");
    out
}

fn text<'a>(c: &'a Json, name: &str) -> &'a str {
    c.get(name).and_then(Json::as_str).unwrap()
}

fn canonical(v: &Json) -> String {
    synchro_protocol::jcs::to_output_string(v)
}

fn ring(c: &Json) -> Keyring {
    Keyring::new(text(c, "key_id"), &hex::decode(text(c, "key")).unwrap()).unwrap()
}

#[test]
fn export_manifest_hashes_match_the_vectors() {
    for c in cases("export_manifest_hash") {
        let body = c.get("body").unwrap();
        let expect = text(&c, "expect");
        assert_eq!(hex::encode(export_manifest_hash(body)), expect, "{c:?}");
        let m = ExportManifest::from_json(body)
            .map_err(|e| format!("{e}"))
            .unwrap();
        assert_eq!(hex::encode(m.hash()), expect, "typed: {c:?}");
        assert_eq!(canonical(&m.to_json()), canonical(body), "round trip");
    }
}

#[test]
fn page_tokens_match_the_vectors_and_open_to_their_bindings() {
    for c in cases("seed_page_token") {
        let ring = ring(&c);
        let expect = text(&c, "expect");
        let page = SeedPage::open(&ring, expect).unwrap();
        assert_eq!(page.sign(&ring), expect, "{c:?}");
        assert_eq!(SeedPage::read_unverified(expect).unwrap(), page);
        let payload = c.get("payload").unwrap();
        assert_eq!(page.binding.scope_id, text(payload, "scope_id"));
        assert_eq!(
            page.next_row_ordinal.to_string(),
            text(payload, "next_row_ordinal")
        );
        assert_eq!(
            page.binding.membership_generation.to_string(),
            text(payload, "membership_generation")
        );
        assert_eq!(
            canonical(&page.binding.snapshot_boundary.to_json()),
            canonical(payload.get("snapshot_boundary").unwrap())
        );
    }
}

#[test]
fn receipts_match_the_vectors_and_read_the_same_without_the_key() {
    for c in cases("seed_receipt") {
        let ring = ring(&c);
        let expect = text(&c, "expect");
        let receipt = SeedReceipt::open(&ring, expect).unwrap();
        assert_eq!(receipt.sign(&ring), expect, "{c:?}");
        assert_eq!(SeedReceipt::read_unverified(expect).unwrap(), receipt);
        let payload = c.get("payload").unwrap();
        assert_eq!(
            receipt.cardinality.to_string(),
            text(payload, "cardinality")
        );
        assert_eq!(receipt.binding.scope_id, text(payload, "scope_id"));
    }
}

/// Replaces one member of a vector's payload and signs it again with the vector's key: the
/// MAC verifies, so only the member checks can refuse it.
fn resigned(c: &Json, purpose: Purpose, name: &str, value: Option<Json>) -> String {
    let Json::Object(mut members) = c.get("payload").unwrap().clone() else {
        panic!("payload")
    };
    members.retain(|(k, _)| k != name);
    if let Some(v) = value {
        members.push((name.to_owned(), v));
    }
    token::sign(purpose, &ring(c), members)
}

#[test]
fn every_altered_or_misdirected_token_is_refused() {
    let page = &cases("seed_page_token")[0];
    let receipt = &cases("seed_receipt")[0];
    let (page_ring, receipt_ring) = (ring(page), ring(receipt));
    let page_token = text(page, "expect");
    let receipt_token = text(receipt, "expect");

    // Any changed byte of the payload or MAC.
    for token in [page_token, receipt_token] {
        for i in [4, token.len() / 2, token.len() - 1] {
            let mut bytes = token.as_bytes().to_vec();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            assert!(SeedPage::open(&page_ring, &altered).is_err(), "{i}");
            assert!(SeedReceipt::open(&receipt_ring, &altered).is_err(), "{i}");
        }
    }
    // A token of one purpose is never the other, nor a cursor; nor under another key.
    assert!(SeedReceipt::open(&receipt_ring, page_token).is_err());
    assert!(SeedPage::open(&page_ring, receipt_token).is_err());
    assert!(SeedPage::open(&receipt_ring, page_token).is_err());
    assert!(SeedReceipt::read_unverified(page_token).is_err());
    assert!(SeedPage::read_unverified(receipt_token).is_err());
    let other = Keyring::new(text(page, "key_id"), &[7u8; 32]).unwrap();
    assert!(SeedPage::open(&other, page_token).is_err(), "another key");
    let same_bytes = page_token.replacen("sp1.", "c1.", 1);
    assert!(token::open(Purpose::ScopeCursor, &page_ring, &same_bytes).is_err());

    // Correctly signed, but not what the spec allows.
    let s = |v: &str| Some(Json::String(v.into()));
    for (name, value) in [
        ("next_row_ordinal", s("01")),
        ("next_row_ordinal", s("-1")),
        ("next_row_ordinal", Some(Json::Number("1".into()))),
        ("page_limit", s("18446744073709551616")),
        ("transaction_nonce", s("short")),
        ("export_id", s("0B3C5E2A-7F41-4C8E-9D2A-5B6C7D8E9F01")),
        ("export_manifest_hash", s("00")),
        ("kind", s("portable_seed_continuation")),
        ("version", Some(Json::Number("2".into()))),
        ("snapshot_boundary", s("0/16B3748")),
        ("extra", s("x")),
        ("scope_id", None),
    ] {
        let t = resigned(page, Purpose::SeedPage, name, value);
        assert!(SeedPage::open(&page_ring, &t).is_err(), "{name}");
    }
    for (name, value) in [
        ("cardinality", s("1.0")),
        ("issued_at", s("2026-12-06T07:00:00Z")),
        ("checksum", s("deadbeef")),
        ("user_id", s("alice")),
        ("kind", s("portable_seed_page")),
    ] {
        let t = resigned(receipt, Purpose::SeedContinuation, name, value);
        assert!(SeedReceipt::open(&receipt_ring, &t).is_err(), "{name}");
        assert!(SeedReceipt::read_unverified(&t).is_err(), "{name}");
    }
}

#[test]
fn an_export_manifest_with_scopes_out_of_order_or_twice_is_refused() {
    let c = &cases("export_manifest_hash")[0];
    let body = c.get("body").unwrap();
    let Json::Object(members) = body.clone() else {
        panic!()
    };
    let with_scopes = |scopes: Vec<Json>| {
        let mut m = members.clone();
        m.retain(|(k, _)| k != "scopes");
        m.push(("scopes".into(), Json::Array(scopes)));
        Json::Object(m)
    };
    let Some(Json::Array(scopes)) = body.get("scopes") else {
        panic!()
    };
    assert!(ExportManifest::from_json(&with_scopes(scopes.clone())).is_ok());
    let reversed: Vec<Json> = scopes.iter().rev().cloned().collect();
    assert!(ExportManifest::from_json(&with_scopes(reversed)).is_err());
    let twice = vec![scopes[0].clone(), scopes[0].clone()];
    assert!(ExportManifest::from_json(&with_scopes(twice)).is_err());
}
