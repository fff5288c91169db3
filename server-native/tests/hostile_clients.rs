//! What a hostile client sends, against the real server binary on real PostgreSQL: forged
//! and abusive bearer tokens, NUL characters in identities and values, deeply nested and
//! huge bodies, and cursors or tokens swapped across users, clients, scopes and purposes.
//! Every refusal is a non-retryable 4xx with the spec's code (never a retryable 5xx that a
//! client would resend forever), and the server keeps serving well-formed requests.

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::{Env, Server};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use synchro_server::auth::{mint, mint_claims};

const SECRET: &str = "hostile-secret-0123456789abcdefgh";

struct Stack {
    _env: Env,
    base: String,
    http: reqwest::Client,
    _server: Server,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token with this header and these claims, signed with HMAC-SHA-256 under the server's
/// secret whatever the header says (`alg: none` gets an empty signature).
fn raw_token(header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    if header["alg"] == "none" {
        return format!("{input}.");
    }
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    format!(
        "{input}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

impl Stack {
    async fn start() -> Stack {
        let d = common::docs_server(
            "INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one'), (2, 'bob', 'blue', 'two'), (3, 'alice', 'red', 'three')",
            SECRET,
        )
        .await;
        Stack {
            _env: d.env,
            base: d.base,
            http: d.http,
            _server: d.server,
        }
    }

    async fn send(&self, path: &str, authorization: &[String], body: String) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).body(body);
        for a in authorization {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        self.send(path, &[format!("Bearer {token}")], body.to_string())
            .await
    }

    /// Connects and returns (generation, schema reference).
    async fn connect(&self, token: &str, client: &str) -> (u64, Value) {
        let (st, v) = self
            .post(
                "/sync/connect",
                token,
                &json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        (
            v["client_generation"].as_u64().unwrap(),
            json!({"version": v["schema"]["version"], "hash": v["schema"]["hash"]}),
        )
    }
}

/// A refusal: this status and code, not retryable.
fn refused(st: u16, v: &Value, status: u16, code: &str) {
    assert_eq!(
        (
            st,
            v["error"]["code"].as_str(),
            v["error"]["retryable"].as_bool()
        ),
        (status, Some(code), Some(false)),
        "{v}"
    );
}

#[tokio::test]
async fn forged_abusive_and_duplicate_tokens_are_401() {
    let s = Stack::start().await;
    let connect =
        json!({"protocol_version": 3, "client_id": "c1", "schema": {"version": 0, "hash": ""}})
            .to_string();
    let hs = json!({"alg": "HS256", "typ": "JWT"});
    let exp = now() + 3600;
    let valid = mint(SECRET.as_bytes(), "alice", 3600);
    let bad_tokens = [
        // alg none, and an RS256 header over an HMAC signature with the right secret.
        raw_token(
            &json!({"alg": "none", "typ": "JWT"}),
            &json!({"sub": "alice", "exp": exp}),
        ),
        raw_token(
            &json!({"alg": "RS256", "typ": "JWT"}),
            &json!({"sub": "alice", "exp": exp}),
        ),
        // Lifetimes: unbounded, far beyond the maximum, expired, not yet valid, absent.
        mint_claims(SECRET.as_bytes(), &json!({"sub": "alice", "exp": u64::MAX})),
        mint_claims(
            SECRET.as_bytes(),
            &json!({"sub": "alice", "exp": now() + 10 * 365 * 86_400}),
        ),
        mint_claims(
            SECRET.as_bytes(),
            &json!({"sub": "alice", "exp": now() - 3600}),
        ),
        mint_claims(
            SECRET.as_bytes(),
            &json!({"sub": "alice", "exp": exp, "nbf": now() + 600}),
        ),
        mint_claims(SECRET.as_bytes(), &json!({"sub": "alice"})),
        // Unusable user ids: blank, whitespace, 60 KB, control characters, NUL, absent.
        mint(SECRET.as_bytes(), "", 3600),
        mint(SECRET.as_bytes(), " \t ", 3600),
        mint(SECRET.as_bytes(), &"u".repeat(60_000), 3600),
        mint(SECRET.as_bytes(), "ali\nce", 3600),
        mint(SECRET.as_bytes(), "ali\u{0}ce", 3600),
        mint_claims(SECRET.as_bytes(), &json!({"exp": exp})),
        mint_claims(SECRET.as_bytes(), &json!({"sub": 42, "exp": exp})),
        // Right claims, wrong key; a damaged signature.
        mint(b"some-other-secret-0123456789", "alice", 3600),
        format!("{}x", &valid[..valid.len() - 1]),
        raw_token(&hs, &json!({"sub": "alice", "exp": exp})).replace('.', ""),
    ];
    for (i, token) in bad_tokens.iter().enumerate() {
        let (st, v) = s
            .send(
                "/sync/connect",
                &[format!("Bearer {token}")],
                connect.clone(),
            )
            .await;
        assert_eq!(st, 401, "token {i}: {v}");
        refused(st, &v, 401, "unauthorized");
    }
    // Two Authorization headers are refused, even when both carry the same valid token.
    let other = mint(SECRET.as_bytes(), "bob", 3600);
    for pair in [[&valid, &other], [&valid, &valid]] {
        let (st, v) = s
            .send(
                "/sync/connect",
                &[format!("Bearer {}", pair[0]), format!("Bearer {}", pair[1])],
                connect.clone(),
            )
            .await;
        refused(st, &v, 401, "unauthorized");
    }
    // A valid token with an nbf in the past, within the lifetime bound, is accepted.
    let ok = mint_claims(
        SECRET.as_bytes(),
        &json!({"sub": "alice", "exp": exp, "nbf": now() - 60}),
    );
    let (st, v) = s
        .send("/sync/connect", &[format!("Bearer {ok}")], connect.clone())
        .await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn nul_characters_are_client_errors_never_retryable_outages() {
    let s = Stack::start().await;
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let (generation, schema) = s.connect(&token, "c1").await;
    let nul = "c\u{0}1";
    let requests = [
        (
            "/sync/connect",
            json!({"protocol_version": 3, "client_id": nul, "schema": {"version": 0, "hash": ""}}),
        ),
        (
            "/sync/pull",
            json!({"protocol_version": 3, "client_id": nul, "client_generation": generation,
                   "schema": schema, "scope_cursors": {}, "limit": 10}),
        ),
        (
            "/sync/pull",
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema, "scope_cursors": {"user:\u{0}alice": null}, "limit": 10}),
        ),
        (
            "/sync/rebuild",
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema, "scope_id": "user:alice\u{0}", "limit": 10}),
        ),
        (
            "/sync/events",
            json!({"protocol_version": 3, "client_id": nul, "client_generation": generation}),
        ),
        (
            "/sync/push",
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema, "batch_id": "b\u{0}", "mutations": []}),
        ),
    ];
    for (path, body) in &requests {
        let (st, v) = s.post(path, &token, body).await;
        refused(st, &v, 400, "invalid_request");
    }

    // A NUL in a pushed value is that mutation's terminal invalid_value; the rest applies.
    let manifest = {
        let (st, v) = s
            .post(
                "/sync/connect",
                &token,
                &json!({"protocol_version": 3, "client_id": "manifest-reader",
                        "schema": {"version": 0, "hash": ""}}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        v["schema_definition"].clone()
    };
    let table = &manifest["tables"][0];
    let field = |name: &str| common::field_id(table, name);
    let mutation = |id: &str, pk: &str, title: &str| {
        json!({"mutation_id": id, "table_id": table["table_id"], "pk": pk, "operation": "insert",
               "base_version": null, "client_version": 1, "local_order": 1,
               "columns": [{"field_id": field("owner"), "value": "alice"},
                           {"field_id": field("team"), "value": "red"},
                           {"field_id": field("title"), "value": title}],
               "authored_schema": schema})
    };
    let (st, v) = s
        .post(
            "/sync/push",
            &token,
            &json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                    "schema": schema, "batch_id": "b1",
                    "mutations": [mutation("m1", "10", "a\u{0}b"), mutation("m2", "1\u{0}1", "x"),
                                  mutation("m3", "12", "fine")]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let outcomes: Vec<(&str, Option<&str>)> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["status"].as_str().unwrap(), o["code"].as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("rejected_terminal", Some("invalid_value")),
            ("rejected_terminal", Some("invalid_value")),
            ("applied", None)
        ],
        "{v}"
    );
}

#[tokio::test]
async fn deep_huge_and_swapped_requests_are_refused_and_the_server_keeps_serving() {
    let s = Stack::start().await;
    let alice = mint(SECRET.as_bytes(), "alice", 3600);
    let bob = mint(SECRET.as_bytes(), "bob", 3600);
    let (g1, schema) = s.connect(&alice, "c1").await;
    let (g2, _) = s.connect(&alice, "c2").await;
    let (gb, _) = s.connect(&bob, "c1").await;

    // Deeply nested JSON and a 10 MB body: 400, and quickly.
    let deep = format!(
        "{{\"protocol_version\":3,\"x\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let (st, v) = s
        .send("/sync/pull", &[format!("Bearer {alice}")], deep)
        .await;
    refused(st, &v, 400, "invalid_request");
    // A declared 10 MB body is refused before any of it is read.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
            .await
            .unwrap();
        let head = format!(
            "POST /sync/pull HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\ncontent-length: {}\r\n\r\n",
            10 << 20
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut answer))
            .await
            .expect("an answer without the body")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("invalid_request"), "{answer}");
    }

    // A cursor of alice's c1, for user:alice.
    let pull = |client: &str, generation: u64, cursors: Value| {
        json!({"protocol_version": 3, "client_id": client, "client_generation": generation,
               "schema": schema, "scope_cursors": cursors, "limit": 1000})
    };
    let (st, v) = s
        .post(
            "/sync/pull",
            &alice,
            &pull("c1", g1, json!({"user:alice": null})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let cursor = v["scope_cursor_updates"]["user:alice"].clone();
    assert!(cursor.is_string(), "{v}");
    // The same cursor presented by another client of alice's, by bob's client of the same
    // name, and for another scope of alice's: each is misbound.
    for (token, client, generation, cursors) in [
        (&alice, "c2", g2, json!({"user:alice": cursor})),
        (&bob, "c1", gb, json!({"user:bob": cursor})),
        (&alice, "c1", g1, json!({"team:red": cursor})),
    ] {
        let (st, v) = s
            .post("/sync/pull", token, &pull(client, generation, cursors))
            .await;
        refused(st, &v, 400, "invalid_request");
    }
    // Purposes: a rebuild continuation is no scope cursor, and a cursor no continuation.
    let rebuild = |continuation: Value| {
        json!({"protocol_version": 3, "client_id": "c1", "client_generation": g1, "schema": schema,
               "scope_id": "team:red", "limit": 1, "continuation": continuation})
    };
    let (st, first) = s.post("/sync/rebuild", &alice, &rebuild(Value::Null)).await;
    assert_eq!(st, 200, "{first}");
    let continuation = first["continuation"].clone();
    assert!(continuation.is_string(), "{first}");
    let (st, v) = s
        .post(
            "/sync/pull",
            &alice,
            &pull("c1", g1, json!({"team:red": continuation})),
        )
        .await;
    refused(st, &v, 400, "invalid_request");
    let (st, v) = s
        .post("/sync/rebuild", &alice, &rebuild(cursor.clone()))
        .await;
    refused(st, &v, 400, "invalid_request");
    // A continuation replayed by another user is refused too.
    let mut stolen = rebuild(continuation.clone());
    stolen["client_generation"] = json!(gb);
    let (st, v) = s.post("/sync/rebuild", &bob, &stolen).await;
    refused(st, &v, 400, "invalid_request");

    // After all of that, the server still serves alice's own cursor.
    let (st, v) = s
        .post(
            "/sync/pull",
            &alice,
            &pull("c1", g1, json!({"user:alice": cursor})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}
