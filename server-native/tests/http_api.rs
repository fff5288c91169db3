//! The HTTP API against a real PostgreSQL: every wire error this issue can produce, the
//! connect dispatch rows, client generations and assignment, readiness, and a canary
//! check that no log line, health output or error body carries identities or tokens.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use common::Env;
use serde_json::{json, Value};
use synchro_server::api::{router, AppState, Config};
use synchro_server::auth::{mint, Authenticator};
use synchro_server::{dev, publish};

const SECRET: &[u8] = b"test-secret-0123456789abcdef";
const USER: &str = "canary-user-5f1e";
const CLIENT: &str = "canary-client-77aa";
const SHARED: &str = "canary-scope-31c9";
const GRANTED: &str = "canary-granted-8d2b";

/// Everything the server logs in this test binary.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        // The production filter at its most verbose setting.
        synchro_server::logging::init("trace", move || Sink(sink.clone()), false);
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);
impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Server {
    env: Env,
    base: String,
    http: reqwest::Client,
}

async fn start(config: Config) -> Server {
    logs();
    let env = Env::installed().await;
    dev::create_demo_schema(&env.admin).await.unwrap();
    let mut operator = env.login("synchro_dev_operator").await;
    dev::register_demo(&operator).await.unwrap();
    publish::publish(&mut operator).await.unwrap();
    operator
        .execute("SELECT synchro.synchro_add_shared_scope($1)", &[&SHARED])
        .await
        .unwrap();
    let state = Arc::new(AppState {
        db: env.login("synchro_dev_adapter").await.into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(vec![
            env.login("synchro_dev_adapter").await,
        ]),
        cursor_keys: synchro_protocol::token::Keyring::new("k1", &[9; 32]).unwrap(),
        auth: Authenticator::hs256(SECRET).unwrap(),
        config,
        events: Default::default(),
        membership_db: None,
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    Server {
        env,
        base,
        http: reqwest::Client::new(),
    }
}

impl Server {
    async fn connect(&self, token: Option<&str>, body: String) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/sync/connect", self.base))
            .body(body);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }

    async fn current(&self) -> Value {
        let db = self.env.login("synchro_dev_adapter").await;
        let row = db
            .query_one("SELECT schema_version, schema_hash FROM synchro.synchro_manifest_history() ORDER BY 1 DESC LIMIT 1", &[])
            .await
            .unwrap();
        json!({"version": row.get::<_, i64>(0), "hash": row.get::<_, String>(1)})
    }
}

fn body(v: Value) -> String {
    v.to_string()
}

/// Asserts the spec's error shape and returns the error object.
fn error<'a>(
    status: u16,
    v: &'a Value,
    want_status: u16,
    code: &str,
    retryable: bool,
) -> &'a Value {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    assert_eq!(e["code"], code, "{v}");
    assert_eq!(e["retryable"], retryable, "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    e
}

/// Like [`error`], also keeping the body for the canary check.
fn expect_error(
    bodies: &mut Vec<String>,
    status: u16,
    v: &Value,
    want: u16,
    code: &str,
    retryable: bool,
) {
    error(status, v, want, code, retryable);
    bodies.push(v.to_string());
}

/// Long on purpose: one server starts once, and each connect case builds on the generations
/// and holds the cases before it left.
#[tokio::test]
async fn connect_dispatch_errors_generations_and_canaries() {
    let s = start(Config {
        max_body_bytes: 4096,
        min_client_version: None,
        ..Config::default()
    })
    .await;
    let token = mint(SECRET, USER, 3600);
    let fresh = json!({"version": 0, "hash": ""});
    let mut error_bodies: Vec<String> = Vec::new();

    // 426 before anything else, authenticated or not.
    let (st, v) = s
        .connect(
            None,
            body(json!({"protocol_version": 2, "client_id": CLIENT})),
        )
        .await;
    expect_error(&mut error_bodies, st, &v, 426, "upgrade_required", false);
    assert_eq!(
        (
            v["error"]["required_protocol_version"].clone(),
            v["error"]["received_protocol_version"].clone()
        ),
        (json!(3), json!(2))
    );
    let (st, v) = s
        .connect(Some(&token), body(json!({"client_id": CLIENT})))
        .await;
    expect_error(&mut error_bodies, st, &v, 426, "upgrade_required", false);
    assert_eq!(v["error"]["received_protocol_version"], Value::Null);

    // 401 without a valid bearer token.
    let req = body(json!({"protocol_version": 3, "client_id": CLIENT, "schema": fresh}));
    let (st, v) = s.connect(None, req.clone()).await;
    expect_error(&mut error_bodies, st, &v, 401, "unauthorized", false);
    let forged = mint(b"another-secret-0123456789", USER, 3600);
    let (st, v) = s.connect(Some(&forged), req.clone()).await;
    expect_error(&mut error_bodies, st, &v, 401, "unauthorized", false);

    // 400 invalid_request: malformed JSON, oversized body, bad members.
    for bad in [
        "{".to_owned(),
        "[]".to_owned(),
        format!(
            r#"{{"protocol_version":3,"client_id":"{CLIENT}","pad":"{}"}}"#,
            "x".repeat(5000)
        ),
        body(json!({"protocol_version": 3, "schema": fresh})),
        body(json!({"protocol_version": 3, "client_id": "", "schema": fresh})),
        body(
            json!({"protocol_version": 3, "client_id": CLIENT, "client_generation": 0, "schema": fresh}),
        ),
        body(
            json!({"protocol_version": 3, "client_id": CLIENT, "schema": fresh, "schema_reset": "yes"}),
        ),
        format!(
            r#"{{"protocol_version":3,"client_id":"{CLIENT}","client_id":"x","schema":{{"version":0,"hash":""}}}}"#
        ),
    ] {
        let (st, v) = s.connect(Some(&token), bad.clone()).await;
        if st == 426 {
            panic!("{bad}");
        }
        expect_error(&mut error_bodies, st, &v, 400, "invalid_request", false);
    }

    // Fresh identity + fresh sentinel: replace with the inline manifest, generation 1.
    let (st, v) = s.connect(Some(&token), req.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["schema"]["action"], "replace");
    assert!(v["schema_definition"]["tables"]
        .as_array()
        .is_some_and(|t| t.len() == 2));
    assert!(v.get("affected_scopes").is_none());
    assert_eq!(
        (
            v["client_generation"].clone(),
            v["scope_set_version"].clone()
        ),
        (json!(1), json!(1))
    );
    let user_scope = format!("user:{USER}");
    assert_eq!(v["scope_updates"]["added"], json!([SHARED, user_scope]));
    let current = s.current().await;
    assert_eq!(
        (v["schema"]["version"].clone(), v["schema"]["hash"].clone()),
        (current["version"].clone(), current["hash"].clone())
    );

    // The same identity cannot present the fresh sentinel again.
    let (st, v) = s.connect(Some(&token), req.clone()).await;
    let e = error(st, &v, 400, "invalid_schema_reference", false);
    assert_eq!(e["received_schema"], fresh);
    error_bodies.push(v.to_string());

    // Exact current schema: none, same generation, no manifest body.
    let at_current = |gen: Option<u64>, schema: &Value, reset: bool| {
        let mut b = json!({"protocol_version": 3, "client_id": CLIENT, "schema": schema});
        if let Some(g) = gen {
            b["client_generation"] = json!(g);
        }
        if reset {
            b["schema_reset"] = json!(true);
        }
        body(b)
    };
    let (st, v) = s
        .connect(Some(&token), at_current(Some(1), &current, false))
        .await;
    assert_eq!(
        (st, v["schema"]["action"].clone()),
        (200, json!("none")),
        "{v}"
    );
    assert!(v.get("schema_definition").is_none() && v.get("affected_scopes").is_none());
    assert_eq!(v["client_generation"], 1);
    assert_eq!(v["scope_updates"], json!({"added": [], "removed": []}));

    // A known identity must present its generation; malformed references are 400.
    let (st, v) = s
        .connect(Some(&token), at_current(None, &current, false))
        .await;
    expect_error(
        &mut error_bodies,
        st,
        &v,
        400,
        "invalid_schema_reference",
        false,
    );
    let upper = json!({"version": current["version"], "hash": current["hash"].as_str().unwrap().to_uppercase()});
    let (st, v) = s
        .connect(Some(&token), at_current(Some(1), &upper, false))
        .await;
    expect_error(
        &mut error_bodies,
        st,
        &v,
        400,
        "invalid_schema_reference",
        false,
    );

    // Unknown lineage: unsupported, HTTP 200, no body of the manifest.
    let unknown = json!({"version": 77, "hash": "ab".repeat(32)});
    let (st, v) = s
        .connect(Some(&token), at_current(Some(1), &unknown, false))
        .await;
    assert_eq!(
        (
            st,
            v["schema"]["action"].clone(),
            v["schema"]["reason"].clone()
        ),
        (200, json!("unsupported"), json!("unknown_schema_lineage"))
    );
    assert!(v.get("schema_definition").is_none());

    // A new grant advances scope_set_version and appears in the delta; reset rebuilds all.
    let operator = s.env.login("synchro_dev_operator").await;
    operator
        .execute(
            "SELECT synchro.synchro_grant_user_scope($1, $2)",
            &[&USER, &GRANTED],
        )
        .await
        .unwrap();
    let (st, v) = s
        .connect(Some(&token), at_current(Some(1), &unknown, true))
        .await;
    assert_eq!(
        (st, v["schema"]["action"].clone()),
        (200, json!("rebuild_local")),
        "{v}"
    );
    assert_eq!(v["affected_scopes"], json!([GRANTED, SHARED, user_scope]));
    assert_eq!(v["scope_set_version"], 2);
    assert_eq!(v["scope_updates"]["added"], json!([GRANTED]));

    // A stale generation gets a new one (its cursors are gone).
    let (st, v) = s
        .connect(Some(&token), at_current(Some(9), &current, false))
        .await;
    assert_eq!((st, v["client_generation"].clone()), (200, json!(2)), "{v}");

    // An expired generation (30 days without acknowledgement) is replaced on connect;
    // connecting does not itself refresh the expiry clock.
    s.env
        .admin
        .execute(
            "UPDATE synchro.clients SET generation_started_at = now() - interval '31 days'",
            &[],
        )
        .await
        .unwrap();
    let (st, v) = s
        .connect(Some(&token), at_current(Some(2), &current, false))
        .await;
    assert_eq!((st, v["client_generation"].clone()), (200, json!(3)), "{v}");
    let (st, v) = s
        .connect(Some(&token), at_current(Some(3), &current, false))
        .await;
    assert_eq!((st, v["client_generation"].clone()), (200, json!(3)), "{v}");

    // Readiness fails closed until a capture worker has run; then it is ready, with a
    // generic body only.
    let ready = s
        .http
        .get(format!("{}/ready", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let worker_url = s.env.cluster.url("synchro_dev_worker", "app");
    let mut worker = synchro_server::capture::worker::Worker::connect(&worker_url)
        .await
        .unwrap();
    worker
        .step(synchro_server::capture::worker::Failpoint::None)
        .await
        .unwrap();
    let ready = s
        .http
        .get(format!("{}/ready", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let ready_body = ready.text().await.unwrap();
    assert_eq!(ready_body, r#"{"status":"ready"}"#);
    let monitor = s.env.login("synchro_dev_monitor").await;
    let detail: String = monitor
        .query_one("SELECT synchro.synchro_health_detail()::text", &[])
        .await
        .unwrap()
        .get(0);

    // Canaries: no identity or token in logs, health output or any error body.
    let log_text = String::from_utf8(logs().lock().unwrap().clone()).unwrap();
    assert!(
        log_text.contains("connect"),
        "the server logged nothing: {log_text}"
    );
    for canary in [
        USER,
        CLIENT,
        SHARED,
        GRANTED,
        token.as_str(),
        forged.as_str(),
    ] {
        assert!(!log_text.contains(canary), "log leaks {canary}");
        assert!(
            !ready_body.contains(canary) && !detail.contains(canary),
            "health leaks {canary}"
        );
        for b in &error_bodies {
            assert!(!b.contains(canary), "error body leaks {canary}: {b}");
        }
    }
}

#[tokio::test]
async fn a_client_below_the_minimum_runtime_must_upgrade() {
    let s = start(Config {
        max_body_bytes: 4096,
        min_client_version: Some("2.0.0".into()),
        ..Config::default()
    })
    .await;
    let token = mint(SECRET, "runtime-user", 3600);
    let req = |v: Option<&str>| {
        let mut b =
            json!({"protocol_version": 3, "client_id": "c", "schema": {"version": 0, "hash": ""}});
        if let Some(v) = v {
            b["client_version"] = json!(v);
        }
        body(b)
    };
    for old in [None, Some("1.9.9"), Some("2.0.0-rc.1")] {
        let (st, v) = s.connect(Some(&token), req(old)).await;
        error(st, &v, 426, "upgrade_required", false);
    }
    let (st, v) = s.connect(Some(&token), req(Some("v2.0.0"))).await;
    error(st, &v, 400, "invalid_request", false);
    let (st, v) = s.connect(Some(&token), req(Some("2.0.0+build.5"))).await;
    assert_eq!(
        (st, v["schema"]["action"].clone()),
        (200, json!("replace")),
        "{v}"
    );
}

#[tokio::test]
async fn the_assignment_function_runs_as_its_owner_and_its_results_are_validated() {
    let s = start(Config::default()).await;
    s.env
        .admin
        .batch_execute("CREATE SCHEMA assign AUTHORIZATION synchro_dev_operator; GRANT USAGE ON SCHEMA assign TO synchro_owner;")
        .await
        .unwrap();
    let op = s.env.login("synchro_dev_operator").await;
    // The table belongs to the operator and is NOT readable by synchro_owner: the function
    // can only work when it runs with its owner's privileges.
    op.batch_execute(
        "CREATE TABLE assign.memberships (user_id text, scope text);
         INSERT INTO assign.memberships VALUES ('team-user', 'team:red'), ('team-user', 'team:blue');
         CREATE FUNCTION assign.scopes(p_user text) RETURNS SETOF text LANGUAGE sql STABLE
           SET search_path = pg_catalog, synchro
           BEGIN ATOMIC SELECT scope FROM assign.memberships WHERE user_id = p_user; END;
         REVOKE EXECUTE ON FUNCTION assign.scopes(text) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION assign.scopes(text) TO synchro_owner;
         SELECT synchro.synchro_register_assignment_function('assign.scopes', 3);",
    )
    .await
    .unwrap();
    let readable: bool = s
        .env
        .admin
        .query_one(
            "SELECT has_table_privilege('synchro_owner', 'assign.memberships', 'SELECT')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!readable);
    let token = mint(SECRET, "team-user", 3600);
    let req = |client: &str| {
        body(
            json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}}),
        )
    };
    let (st, v) = s.connect(Some(&token), req("a")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["scope_updates"]["added"],
        json!([SHARED, "team:blue", "team:red", "user:team-user"])
    );

    // Invalid results fail closed with 500 sync_integrity_failure.
    for (sql, client) in [
        ("INSERT INTO assign.memberships VALUES ('team-user', 'user:someone')", "b"),
        ("DELETE FROM assign.memberships WHERE scope LIKE 'user:%'; INSERT INTO assign.memberships VALUES ('team-user', '  ')", "c"),
        ("DELETE FROM assign.memberships WHERE scope = '  '; INSERT INTO assign.memberships VALUES ('team-user', 'team:x'), ('team-user', 'team:y')", "d"),
    ] {
        op.batch_execute(sql).await.unwrap();
        let (st, v) = s.connect(Some(&token), req(client)).await;
        error(st, &v, 500, "sync_integrity_failure", false);
    }
    op.batch_execute("DELETE FROM assign.memberships WHERE scope IN ('team:x', 'team:y')")
        .await
        .unwrap();
    let (st, _) = s.connect(Some(&token), req("e")).await;
    assert_eq!(st, 200);
    // A definition changed after registration is refused until registered again.
    op.batch_execute(
        "CREATE OR REPLACE FUNCTION assign.scopes(p_user text) RETURNS SETOF text LANGUAGE sql STABLE
           SET search_path = pg_catalog, synchro
           BEGIN ATOMIC SELECT scope FROM assign.memberships WHERE user_id = p_user AND scope <> ''; END",
    )
    .await
    .unwrap();
    let (st, v) = s.connect(Some(&token), req("f")).await;
    error(st, &v, 500, "sync_integrity_failure", false);
    op.batch_execute(
        "SELECT synchro.synchro_register_assignment_function('assign.scopes(text)', 3)",
    )
    .await
    .unwrap();
    let (st, _) = s.connect(Some(&token), req("g")).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn a_database_failure_is_503_and_readiness_fails_closed() {
    logs();
    let env = Env::installed().await;
    // A database without synchro: every call fails.
    let boot = synchro_server::connect_db(&env.cluster.admin_url())
        .await
        .unwrap();
    boot.batch_execute("CREATE DATABASE bare").await.unwrap();
    let state = Arc::new(AppState {
        db: synchro_server::connect_db(&env.cluster.url("synchro_dev_adapter", "bare"))
            .await
            .unwrap()
            .into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(vec![synchro_server::connect_db(
            &env.cluster.url("synchro_dev_adapter", "bare"),
        )
        .await
        .unwrap()]),
        cursor_keys: synchro_protocol::token::Keyring::new("k1", &[9; 32]).unwrap(),
        auth: Authenticator::hs256(SECRET).unwrap(),
        config: Config::default(),
        events: Default::default(),
        membership_db: None,
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{base}/sync/connect"))
        .header("authorization", format!("Bearer {}", mint(SECRET, "u", 60)))
        .body(body(
            json!({"protocol_version": 3, "client_id": "c", "schema": {"version": 0, "hash": ""}}),
        ))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap();
    error(status, &v, 503, "temporary_unavailable", true);
    let ready = http.get(format!("{base}/ready")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    assert_eq!(ready.text().await.unwrap(), r#"{"status":"unready"}"#);
}
