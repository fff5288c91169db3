//! Bearer tokens of an identity provider (`serve --jwks-url`): RS256, ES256 and EdDSA tokens
//! signed by an independent implementation (`jsonwebtoken`, with the test keys `openssl
//! genpkey` made in `protocol/tests/keys/`) are checked by the real server binary against a
//! key set it fetches from a real HTTP endpoint; a rotated-in key is picked up within the
//! refetch bound and made-up key ids cost the provider at most one fetch per interval.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{free_port, Env, Server};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

const ISSUER: &str = "https://idp.example.com/";
const AUDIENCE: &str = "https://sync.example.com";

struct TestKey {
    alg: Algorithm,
    kid: &'static str,
    key: EncodingKey,
}

fn key(alg: Algorithm, kid: &'static str, pem: &str) -> TestKey {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
        _ => EncodingKey::from_ed_pem(pem.as_bytes()),
    }
    .unwrap();
    TestKey { alg, kid, key }
}

fn keys() -> [TestKey; 4] {
    [
        key(
            Algorithm::RS256,
            "rsa-a",
            include_str!("../../protocol/tests/keys/rsa-a.pem"),
        ),
        key(
            Algorithm::ES256,
            "ec",
            include_str!("../../protocol/tests/keys/ec.pem"),
        ),
        key(
            Algorithm::EdDSA,
            "ed",
            include_str!("../../protocol/tests/keys/ed.pem"),
        ),
        key(
            Algorithm::RS256,
            "rsa-b",
            include_str!("../../protocol/tests/keys/rsa-b.pem"),
        ),
    ]
}

fn document(keys: &[&TestKey]) -> Vec<u8> {
    let keys: Vec<_> = keys
        .iter()
        .map(|k| {
            let mut jwk = Jwk::from_encoding_key(&k.key, k.alg).unwrap();
            jwk.common.key_id = Some(k.kid.to_owned());
            jwk
        })
        .collect();
    serde_json::to_vec(&json!({ "keys": keys })).unwrap()
}

fn token(k: &TestKey, sub: &str, claims: serde_json::Value) -> String {
    let mut header = Header::new(k.alg);
    header.kid = Some(k.kid.to_owned());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut all = json!({"sub": sub, "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE});
    for (k, v) in claims.as_object().unwrap() {
        all[k] = v.clone();
    }
    encode(&header, &all, &k.key).unwrap()
}

/// A provider's JWKS endpoint: serves the current document and counts the fetches.
struct Provider {
    document: Arc<Mutex<Vec<u8>>>,
    fetches: Arc<AtomicUsize>,
    url: String,
}

async fn provider(initial: Vec<u8>) -> Provider {
    let document = Arc::new(Mutex::new(initial));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (d, f) = (document.clone(), fetches.clone());
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let (d, f) = (d.clone(), f.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                (
                    [("content-type", "application/json")],
                    d.lock().unwrap().clone(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Provider {
        document,
        fetches,
        url: format!("http://{addr}/.well-known/jwks.json"),
    }
}

fn start(env: &Env, flags: &[&str]) -> (Server, SocketAddr) {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut args = common::serve_args(env, port, "unused-secret-0123456789");
    // Key-set tokens only: no HS256 secret (the cursor secret is then required).
    let at = args.iter().position(|a| a == "--jwt-secret").unwrap();
    args.drain(at..at + 2);
    let server = Server::from(
        std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args(args)
            .args(["--cursor-secret", "jwks-cursor-secret-0123456789"])
            .args(flags)
            .env("SYNCHRO_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    (server, addr)
}

/// Each connect is a new client (a known one must present its installed schema).
static CLIENTS: AtomicUsize = AtomicUsize::new(0);

async fn connect(http: &reqwest::Client, addr: SocketAddr, token: &str) -> u16 {
    let response = http
        .post(format!("http://{addr}/sync/connect"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"protocol_version":3,"client_id":"c{}","schema":{{"version":0,"hash":""}}}}"#,
            CLIENTS.fetch_add(1, Ordering::SeqCst)
        ))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    if status != 200 && status != 401 {
        panic!(
            "connect answered {status}: {}",
            response.text().await.unwrap()
        );
    }
    status
}

#[tokio::test]
async fn an_identity_providers_tokens_are_verified_with_its_fetched_and_rotated_keys() {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(&env, "").await;
    let [rsa_a, ec, ed, rsa_b] = keys();
    let idp = provider(document(&[&rsa_a, &ec, &ed])).await;
    let (_server, addr) = start(
        &env,
        &[
            "--jwks-url",
            &idp.url,
            "--jwt-issuer",
            ISSUER,
            "--jwt-audience",
            AUDIENCE,
            "--jwks-refetch-secs",
            "2",
        ],
    );
    let http = reqwest::Client::new();
    common::wait_ready(&http, &format!("http://{addr}")).await;

    for k in [&rsa_a, &ec, &ed] {
        assert_eq!(
            connect(&http, addr, &token(k, "alice", json!({}))).await,
            200,
            "{:?}",
            k.alg
        );
    }
    // The claim rules: another issuer, another audience, none.
    for claims in [
        json!({"iss": "https://evil.example.com/"}),
        json!({"aud": "https://other.example.com"}),
        json!({"aud": null}),
    ] {
        assert_eq!(
            connect(&http, addr, &token(&rsa_a, "alice", claims.clone())).await,
            401,
            "{claims}"
        );
    }
    // An HS256 token is refused: no secret is configured (no algorithm confusion).
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "exp": 4_000_000_000u64, "iss": ISSUER, "aud": AUDIENCE}),
        &EncodingKey::from_secret(&document(&[&rsa_a])).unwrap(),
    )
    .unwrap();
    assert_eq!(connect(&http, addr, &hs).await, 401);

    // The provider rotates: rsa-b in, rsa-a out. Let the refetch interval pass since the
    // start's fetch, then a token naming rsa-b makes the server fetch again and is accepted.
    *idp.document.lock().unwrap() = document(&[&rsa_b, &ec]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let before = idp.fetches.load(Ordering::SeqCst);
    assert_eq!(
        connect(&http, addr, &token(&rsa_b, "bob", json!({}))).await,
        200
    );
    assert_eq!(idp.fetches.load(Ordering::SeqCst), before + 1);
    // The retired key is refused now that the set no longer holds it.
    assert_eq!(
        connect(&http, addr, &token(&rsa_a, "alice", json!({}))).await,
        401
    );
    // Made-up key ids: within one interval, at most one more fetch however many arrive.
    let before = idp.fetches.load(Ordering::SeqCst);
    for i in 0..20 {
        let mut t = TestKey {
            alg: Algorithm::RS256,
            kid: "rsa-b",
            key: rsa_b.key.clone(),
        };
        let kid = format!("made-up-{i}");
        t.kid = Box::leak(kid.into_boxed_str());
        assert_eq!(
            connect(&http, addr, &token(&t, "bob", json!({}))).await,
            401
        );
    }
    assert!(idp.fetches.load(Ordering::SeqCst) <= before + 1);
    // Still serving the keys it holds.
    assert_eq!(
        connect(&http, addr, &token(&ec, "carol", json!({}))).await,
        200
    );
}

#[test]
fn a_key_set_without_an_issuer_or_over_plain_http_is_refused_at_start() {
    let binary = env!("CARGO_BIN_EXE_synchro-server");
    let cursor = ["--cursor-secret", "jwks-cursor-secret-0123456789"];
    let jwks = ["--jwks-url", "https://idp.example.com/jwks"];
    let issuer = ["--jwt-issuer", ISSUER];
    for (flags, says) in [
        (
            [&cursor[..], &jwks].concat(),
            "--jwks-url needs --jwt-issuer",
        ),
        (
            [
                &cursor[..],
                &["--jwks-url", "http://idp.example.com/jwks"],
                &issuer,
            ]
            .concat(),
            "must be an https:// URL",
        ),
        ([&cursor[..], &issuer].concat(), "bearer tokens need a key"),
        (
            [&jwks[..], &issuer].concat(),
            "--cursor-secret (SYNCHRO_CURSOR_SECRET) is required without --jwt-secret",
        ),
    ] {
        let out = std::process::Command::new(binary)
            .args(["serve", "--database-url", "postgres://127.0.0.1:1/none"])
            .args(&flags)
            .env_remove("SYNCHRO_JWT_SECRET")
            .env_remove("SYNCHRO_CURSOR_SECRET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
