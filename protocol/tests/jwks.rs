//! RS256, ES256 and EdDSA tokens signed by an independent implementation (the
//! `jsonwebtoken` crate, from private keys `openssl genpkey` made: `tests/keys/`, test keys
//! only) and checked by `jwt::Verifier` against a key set built from the same keys.

use std::sync::Arc;

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use synchro_protocol::jwt::jwks::{acceptable_url, JwksError, KeySet};
use synchro_protocol::jwt::{Refusal, Verifier, DEFAULT_MAX_TOKEN_LIFETIME_SECS};

const NOW: u64 = 1_800_000_000;
const ISSUER: &str = "https://idp.example.com/";

struct TestKey {
    alg: Algorithm,
    kid: &'static str,
    key: EncodingKey,
}

fn key(alg: Algorithm, kid: &'static str, pem: &str) -> TestKey {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(pem.as_bytes()),
        _ => unreachable!(),
    }
    .unwrap();
    TestKey { alg, kid, key }
}

fn rsa_a() -> TestKey {
    key(Algorithm::RS256, "rsa-a", include_str!("keys/rsa-a.pem"))
}
fn rsa_b() -> TestKey {
    key(Algorithm::RS256, "rsa-b", include_str!("keys/rsa-b.pem"))
}
fn ec() -> TestKey {
    key(Algorithm::ES256, "ec", include_str!("keys/ec.pem"))
}
fn ed() -> TestKey {
    key(Algorithm::EdDSA, "ed", include_str!("keys/ed.pem"))
}

fn jwk(k: &TestKey) -> serde_json::Value {
    let mut jwk = Jwk::from_encoding_key(&k.key, k.alg).unwrap();
    jwk.common.key_id = Some(k.kid.to_owned());
    serde_json::to_value(jwk).unwrap()
}

fn set(keys: &[&TestKey]) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"keys": keys.iter().map(|k| jwk(k)).collect::<Vec<_>>()}),
    )
    .unwrap()
}

fn token(k: &TestKey, kid: Option<&str>, claims: serde_json::Value) -> String {
    let mut header = Header::new(k.alg);
    header.kid = kid.map(str::to_owned);
    format!("Bearer {}", encode(&header, &claims, &k.key).unwrap())
}

fn claims(sub: &str) -> serde_json::Value {
    serde_json::json!({"sub": sub, "exp": NOW + 60, "iss": ISSUER})
}

fn verifier(keys: &[u8]) -> Verifier {
    Verifier::new(DEFAULT_MAX_TOKEN_LIFETIME_SECS)
        .unwrap()
        .with_issuer(ISSUER)
        .unwrap()
        .with_keys(Arc::new(KeySet::parse(keys).unwrap()))
}

#[test]
fn each_algorithm_verifies_with_its_key_and_kid() {
    let (a, e, d) = (rsa_a(), ec(), ed());
    let v = verifier(&set(&[&a, &e, &d]));
    for k in [&a, &e, &d] {
        let t = token(k, Some(k.kid), claims("alice"));
        assert_eq!(
            v.check(Some(&t), NOW),
            Ok(("alice".to_owned(), NOW + 60)),
            "{:?}",
            k.alg
        );
        // Without a kid every key fitting the algorithm is tried.
        let t = token(k, None, claims("bob"));
        assert_eq!(
            v.user_id(Some(&t), NOW).as_deref(),
            Some("bob"),
            "{:?}",
            k.alg
        );
    }
}

#[test]
fn a_token_is_refused_naming_the_rule_it_broke() {
    let (a, b, e) = (rsa_a(), rsa_b(), ec());
    let v = verifier(&set(&[&a, &e]));
    let check = |t: &str| v.check(Some(t), NOW).unwrap_err();
    // Signed by a key the set does not hold, under a kid it does not know.
    assert_eq!(
        check(&token(&b, Some("rsa-b"), claims("a"))),
        Refusal::UnknownKey
    );
    // Signed by another key under a known kid.
    assert_eq!(
        check(&token(&b, Some("rsa-a"), claims("a"))),
        Refusal::Signature
    );
    assert_eq!(check(&token(&b, None, claims("a"))), Refusal::Signature);
    // An ES256 token naming the RSA key's kid: no algorithm confusion.
    assert_eq!(
        check(&token(&e, Some("rsa-a"), claims("a"))),
        Refusal::Algorithm
    );
    // HS256 with no secret configured (the classic confusion: the public key as secret).
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &claims("a"),
        &EncodingKey::from_secret(&serde_json::to_vec(&jwk(&a)).unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(check(&format!("Bearer {hs}")), Refusal::Algorithm);
    // Claim rules apply to key-set tokens as to HS256 ones.
    let mut c = claims("a");
    c["iss"] = "https://other.example.com/".into();
    assert_eq!(check(&token(&a, Some("rsa-a"), c)), Refusal::Issuer);
    let mut c = claims("a");
    c.as_object_mut().unwrap().remove("iss");
    assert_eq!(check(&token(&a, Some("rsa-a"), c)), Refusal::Issuer);
    let mut c = claims("a");
    c["aud"] = "some-api".into();
    assert_eq!(check(&token(&a, Some("rsa-a"), c)), Refusal::Audience);
    let mut c = claims("a");
    c["exp"] = (NOW - 31).into();
    assert_eq!(check(&token(&a, Some("rsa-a"), c)), Refusal::Expired);
    assert_eq!(
        check(&token(&a, Some("rsa-a"), claims(" "))),
        Refusal::Subject
    );
    // A tampered payload.
    let t = token(&a, Some("rsa-a"), claims("alice"));
    let forged = {
        let mut parts: Vec<&str> = t.split('.').collect();
        let other = token(&a, Some("rsa-a"), claims("mallory"));
        let payload = other.split('.').nth(1).unwrap().to_owned();
        parts[1] = Box::leak(payload.into_boxed_str());
        parts.join(".")
    };
    assert_eq!(check(&forged), Refusal::Signature);
}

#[test]
fn the_configured_audience_must_be_named() {
    let a = rsa_a();
    let v = verifier(&set(&[&a]))
        .with_audience("https://api.example.com")
        .unwrap();
    let with = |aud: serde_json::Value| {
        let mut c = claims("a");
        c["aud"] = aud;
        v.check(Some(&token(&a, Some("rsa-a"), c)), NOW)
            .map(|(s, _)| s)
    };
    assert_eq!(with("https://api.example.com".into()).as_deref(), Ok("a"));
    assert_eq!(
        with(serde_json::json!(["other", "https://api.example.com"])).as_deref(),
        Ok("a")
    );
    assert_eq!(with("other".into()), Err(Refusal::Audience));
    assert_eq!(with(serde_json::json!(["other"])), Err(Refusal::Audience));
    assert_eq!(with(serde_json::json!(7)), Err(Refusal::Audience));
    assert_eq!(
        v.check(Some(&token(&a, Some("rsa-a"), claims("a"))), NOW),
        Err(Refusal::Audience),
        "no aud at all"
    );
}

#[test]
fn a_secret_and_a_key_set_work_side_by_side() {
    let a = rsa_a();
    let secret = b"a-shared-secret-of-16+-bytes";
    let v = verifier(&set(&[&a])).with_secret(secret).unwrap();
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &claims("h"),
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap();
    assert_eq!(
        v.user_id(Some(&format!("Bearer {hs}")), NOW).as_deref(),
        Some("h")
    );
    let t = token(&a, Some("rsa-a"), claims("r"));
    assert_eq!(v.user_id(Some(&t), NOW).as_deref(), Some("r"));
    // A key-set token is refused by a verifier that has only the secret.
    let hs_only = Verifier::hs256(secret, 3600).unwrap();
    assert_eq!(hs_only.check(Some(&t), NOW), Err(Refusal::Algorithm));
}

#[test]
fn unusable_keys_are_skipped_and_a_set_without_one_is_refused() {
    let a = rsa_a();
    let weak = key(Algorithm::RS256, "weak", include_str!("keys/rsa-1024.pem"));
    let mut enc = jwk(&rsa_b());
    enc["use"] = "enc".into();
    let mut wrong_alg = jwk(&ec());
    wrong_alg["alg"] = "RS256".into();
    let mut p384 = jwk(&ec());
    p384["crv"] = "P-384".into();
    let mut off_curve = jwk(&ec());
    off_curve["y"] = off_curve["x"].clone();
    let unusable = vec![
        jwk(&weak),
        enc,
        wrong_alg,
        p384,
        off_curve,
        serde_json::json!({"kty": "oct", "k": "c2VjcmV0"}),
        serde_json::json!({"kty": "RSA", "n": 7}),
        serde_json::json!("not a key"),
    ];
    let doc = |keys: Vec<serde_json::Value>| {
        serde_json::to_vec(&serde_json::json!({ "keys": keys })).unwrap()
    };
    assert_eq!(
        KeySet::parse(&doc(unusable.clone())).unwrap_err(),
        JwksError::NoUsableKey
    );
    let mut with_one = unusable;
    with_one.push(jwk(&a));
    let keys = KeySet::parse(&doc(with_one)).unwrap();
    assert_eq!(keys.len(), 1);
    // The skipped weak key verifies nothing, even under its own kid.
    let v = verifier(&set(&[&a]));
    let t = token(&weak, Some("weak"), claims("a"));
    assert_eq!(v.check(Some(&t), NOW), Err(Refusal::UnknownKey));
    for bad in [&b"{}"[..], b"[]", b"{\"keys\":{}}", b"not json", b"\xff"] {
        assert_eq!(KeySet::parse(bad).unwrap_err(), JwksError::NotAKeySet);
    }
    let huge = vec![b' '; 256 * 1024 + 1];
    assert_eq!(KeySet::parse(&huge).unwrap_err(), JwksError::TooLarge);
}

#[test]
fn key_sets_come_over_https_or_from_this_machine() {
    for ok in [
        "https://idp.example.com/.well-known/jwks.json",
        "http://127.0.0.1:9000/jwks",
        "http://localhost/jwks",
        "http://[::1]:8080/jwks",
    ] {
        assert!(acceptable_url(ok), "{ok}");
    }
    for bad in [
        "http://idp.example.com/jwks",
        "http://localhost.example.com/jwks",
        "https://user@idp.example.com/jwks",
        "ftp://idp.example.com/jwks",
        "https://",
        "https://idp.example.com/a b",
        "",
    ] {
        assert!(!acceptable_url(bad), "{bad}");
    }
}
