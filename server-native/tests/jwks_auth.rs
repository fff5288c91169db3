//! Bearer tokens of an identity provider (`serve --jwks-url`): RS256, ES256 and EdDSA tokens
//! signed by an independent implementation (`jsonwebtoken`, with the test keys `openssl
//! genpkey` made in `protocol/tests/keys/`) are checked by the real server binary against a
//! key set it fetches from a real HTTP endpoint; a rotated-in key is picked up within the
//! refetch bound and made-up key ids cost the provider at most one fetch per interval.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{free_port, Env, Server};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use synchro_testkit::idp::{document, Provider, TestKey, AUDIENCE, ISSUER};

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
    let (rsa_a, ec, ed, rsa_b) = (
        TestKey::rsa_a(),
        TestKey::ec(),
        TestKey::ed(),
        TestKey::rsa_b(),
    );
    let idp = Provider::start(document(&[&rsa_a, &ec, &ed])).await;
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
            connect(&http, addr, &k.token("alice", json!({}))).await,
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
            connect(&http, addr, &rsa_a.token("alice", claims.clone())).await,
            401,
            "{claims}"
        );
    }
    // An HS256 token is refused: no secret is configured (no algorithm confusion, even
    // with the public key set as the secret).
    let hs = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "alice", "exp": 4_000_000_000u64, "iss": ISSUER, "aud": AUDIENCE}),
        &EncodingKey::from_secret(&document(&[&rsa_a])).unwrap(),
    )
    .unwrap();
    assert_eq!(connect(&http, addr, &hs).await, 401);

    // The provider rotates: rsa-b in, rsa-a out. Let the refetch interval pass since the
    // start's fetch, then a token naming rsa-b makes the server fetch again and is accepted.
    idp.serve(document(&[&rsa_b, &ec]));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let before = idp.fetched();
    assert_eq!(
        connect(&http, addr, &rsa_b.token("bob", json!({}))).await,
        200
    );
    assert_eq!(idp.fetched(), before + 1);
    // The retired key is refused now that the set no longer holds it.
    assert_eq!(
        connect(&http, addr, &rsa_a.token("alice", json!({}))).await,
        401
    );
    // Made-up key ids: within one interval, at most one more fetch however many arrive.
    let before = idp.fetched();
    for i in 0..20 {
        let made_up = rsa_b.with_kid(&format!("made-up-{i}"));
        assert_eq!(
            connect(&http, addr, &made_up.token("bob", json!({}))).await,
            401
        );
    }
    assert!(idp.fetched() <= before + 1);
    // Still serving with the keys it holds.
    assert_eq!(
        connect(&http, addr, &ec.token("carol", json!({}))).await,
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
