//! The whole server (`synchro-server serve --worker-url`, HTTP and capture in one process)
//! killed with SIGKILL twice during a write load and restarted: through the public HTTP API,
//! every user's pulled state equals the source tables, every source transaction was applied
//! exactly once, and every terminal scope digest equals the digest computed from a direct
//! query of the source.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{start_server, wait_ready, Env};
use serde_json::{json, Value};
use synchro_server::auth::mint;
use synchro_server::registry::{register, RegisterRequest};

const SECRET: &str = "server-crash-secret-0123456789abc";
const OWNERS: [&str; 3] = ["alice", "bob", "carol"];

async fn post(http: &reqwest::Client, base: &str, token: &str, path: &str, body: Value) -> Value {
    let r = http
        .post(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

/// Long on purpose: one write load, the kill, the restart, then every check of what
/// survived.
#[tokio::test]
async fn kill_9_of_the_server_during_writes_loses_and_duplicates_nothing() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, title text);
         INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob', 'carol'])[1 + g % 3], 'seed ' || g
           FROM generate_series(1, 300) g",
    )
    .await;
    let mut op = env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');",
    )
    .await
    .unwrap();
    synchro_server::publish::publish(&mut op).await.unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut server = start_server(&env, port, SECRET);
    // Ready means bootstrapped (the 300 seeded rows) with a live capture leader.
    wait_ready(&http, &base).await;

    // Writers: 3 connections x 50 transactions of inserts, updates (including an owner
    // change, which moves a row between scopes) and deletes.
    let mut writers = Vec::new();
    for w in 0..3i64 {
        let url = env.cluster.url("postgres", "app");
        writers.push(tokio::spawn(async move {
            let db = synchro_server::connect_db(&url).await.unwrap();
            for i in 0..50i64 {
                let id = 1000 + w * 1000 + i;
                db.batch_execute(&format!(
                    "BEGIN;
                     INSERT INTO app.docs VALUES ({id}, (ARRAY['alice', 'bob', 'carol'])[1 + {i} % 3], 'w{w}');
                     UPDATE app.docs SET title = 'edited {i}', owner = (ARRAY['alice', 'bob', 'carol'])[1 + ({i} + {w}) % 3]
                      WHERE id = {seed};
                     DELETE FROM app.docs WHERE id = {gone};
                     COMMIT;",
                    seed = 1 + (w * 100 + i) % 300,
                    gone = 1000 + w * 1000 + i - 3,
                ))
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }));
    }
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(120)).await;
        server.0.kill().unwrap(); // SIGKILL
        server.0.wait().unwrap();
        server = start_server(&env, port, SECRET);
    }
    for w in writers {
        w.await.unwrap();
    }
    wait_ready(&http, &base).await;
    // Caught up: every writer transaction applied once, plus the bootstrap.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let applied: i64 = env
            .admin
            .query_one(
                "SELECT applied_transactions FROM synchro.capture_state",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(applied <= 151, "a transaction was applied twice: {applied}");
        if applied == 151 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "capture did not catch up: {applied}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Each user pulls their scope from scratch: the replayed state equals the source and
    // the terminal digest equals the one computed from the source tables.
    let manifest = post(
        &http,
        &base,
        &mint(SECRET.as_bytes(), "alice", 600),
        "/sync/connect",
        json!({"protocol_version": 3, "client_id": "probe", "schema": {"version": 0, "hash": ""}}),
    )
    .await;
    let schema =
        json!({"version": manifest["schema"]["version"], "hash": manifest["schema"]["hash"]});
    for owner in OWNERS {
        let token = mint(SECRET.as_bytes(), owner, 600);
        let connect = post(
            &http,
            &base,
            &token,
            "/sync/connect",
            json!({"protocol_version": 3, "client_id": "c1", "schema": schema}),
        )
        .await;
        let generation = connect["client_generation"].clone();
        let scope = format!("user:{owner}");
        let mut cursor = Value::Null;
        let mut state: BTreeMap<String, Value> = BTreeMap::new();
        let digest = loop {
            let v = post(
                &http,
                &base,
                &token,
                "/sync/pull",
                json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                       "schema": schema, "scope_cursors": {scope.clone(): cursor}, "limit": 100}),
            )
            .await;
            for c in v["changes"].as_array().unwrap() {
                let pk = c["pk"].as_str().unwrap().to_owned();
                match c["op"].as_str().unwrap() {
                    "upsert" => {
                        state.insert(pk, c["row"].clone());
                    }
                    _ => {
                        state.remove(&pk);
                    }
                }
            }
            cursor = v["scope_cursor_updates"][&scope].clone();
            if v["has_more"] == false {
                break v["checksums"][&scope]["digest"]
                    .as_str()
                    .unwrap()
                    .to_owned();
            }
        };
        let source: Vec<i64> = env
            .admin
            .query(
                "SELECT id FROM app.docs WHERE owner = $1 ORDER BY id",
                &[&owner],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut pulled: Vec<i64> = state.keys().map(|k| k.parse().unwrap()).collect();
        pulled.sort();
        assert_eq!(pulled, source, "{owner}'s pulled rows equal the source");
        assert_eq!(
            digest,
            common::docs_digest_from_source(&env, owner).await,
            "{owner}'s terminal digest equals the source digest"
        );
    }
}
