//! POST /sync/pull through the public HTTP API, against real PostgreSQL with the capture
//! worker: pages in commit order, terminal checksums equal to digests recomputed from the
//! source tables, cursor tampering and misbinding, and every wire error pull can produce.

mod common;

use std::sync::Arc;

use common::Env;
use serde_json::{json, Value};
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::token::Keyring;
use synchro_protocol::value::TypedValue;
use synchro_server::api::{router, AppState, Config};
use synchro_server::auth::{mint, Authenticator};
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::publish::{load_lineage, publish};
use synchro_server::registry::{register, RegisterRequest};

const SECRET: &[u8] = b"pull-test-secret-0123456789abcdef";

struct Stack {
    env: Env,
    worker: Worker,
    base: String,
    http: reqwest::Client,
    state: Arc<AppState>,
}

async fn stack() -> Stack {
    stack_with(Config::default()).await
}

async fn stack_with(config: Config) -> Stack {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, title text)",
    )
    .await;
    let mut op = env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    env.admin
        .batch_execute("CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator; GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;")
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
    publish(&mut op).await.unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    // Bootstrap the (empty) relation so every later write is captured as its own change.
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
    let state = Arc::new(AppState {
        db: env.login("synchro_dev_adapter").await.into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(vec![
            env.login("synchro_dev_adapter").await,
        ]),
        auth: Authenticator::hs256(SECRET).unwrap(),
        cursor_keys: Keyring::new("k1", &[3; 32]).unwrap(),
        config,
        events: synchro_server::api::Notifier::listen(
            env.cluster.url("synchro_dev_adapter", "app"),
        ),
        membership_db: None,
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = state.clone();
    tokio::spawn(async move { axum::serve(listener, router(served)).await.unwrap() });
    Stack {
        env,
        worker,
        base,
        http: reqwest::Client::new(),
        state,
    }
}

impl Stack {
    async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn capture(&mut self) {
        while self.worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
    }

    async fn schema(&self) -> Value {
        let db = self.env.login("synchro_dev_adapter").await;
        let m = load_lineage(&db).await.unwrap();
        let r = m.current().unwrap().schema_ref();
        json!({"version": r.version, "hash": hex::encode(r.hash)})
    }

    /// Opens an events stream of client `c1` at `generation` with `token`.
    async fn open_events(&self, token: &str, generation: u64) -> reqwest::Response {
        self.http
            .post(format!("{}/sync/events", self.base))
            .header("authorization", format!("Bearer {token}"))
            .body(
                json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation})
                    .to_string(),
            )
            .send()
            .await
            .unwrap()
    }

    /// Connects `client` for `user` and returns its generation.
    async fn connect(&self, token: &str, client: &str) -> u64 {
        let (st, v) = self
            .post("/sync/connect", token, json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}}))
            .await;
        assert_eq!(st, 200, "{v}");
        v["client_generation"].as_u64().unwrap()
    }
}

async fn digest_from_source(s: &Stack, owner: &str) -> String {
    common::docs_digest_from_source(&s.env, owner).await
}

#[tokio::test]
async fn pages_in_commit_order_with_verifiable_terminal_checksums() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    for sql in [
        "INSERT INTO app.docs VALUES (1, 'alice', 'one'), (2, 'alice', NULL), (3, 'bob', 'three')",
        "UPDATE app.docs SET title = 'uno' WHERE id = 1",
        "INSERT INTO app.docs VALUES (4, 'alice', 'four')",
    ] {
        s.env.admin.batch_execute(sql).await.unwrap();
        // Each on its own (transactions captured together are materialized from their
        // final state: row 1 would then be one change).
        s.capture().await;
    }
    let schema = s.schema().await;
    let pull = |cursor: Value, limit: u64| {
        json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema,
               "scope_cursors": {"user:alice": cursor}, "limit": limit})
    };
    // First page: two changes, more to come, no checksums.
    let (st, v) = s.post("/sync/pull", &token, pull(Value::Null, 2)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["has_more"], true);
    assert!(v.get("checksums").is_none());
    assert_eq!(v["changes"].as_array().unwrap().len(), 2);
    let cursor = v["scope_cursor_updates"]["user:alice"].clone();
    let mut pks: Vec<Value> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["pk"].clone())
        .collect();
    // Rest: terminal page with the checksum map of exactly the active scope set.
    let (st, v) = s.post("/sync/pull", &token, pull(cursor, 100)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["has_more"], false);
    pks.extend(
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["pk"].clone()),
    );
    // Commit order: 1 and 2 (first transaction), 1 again (its update), then 4.
    assert_eq!(pks, [json!("1"), json!("2"), json!("1"), json!("4")]);
    let checksums = v["checksums"].as_object().unwrap();
    assert_eq!(checksums.keys().collect::<Vec<_>>(), ["user:alice"]);
    let digest = checksums["user:alice"]["digest"].as_str().unwrap();
    assert_eq!(digest, digest_from_source(&s, "alice").await);
    for c in v["changes"].as_array().unwrap() {
        if c["op"] == "upsert" {
            assert_eq!(c["row_checksum"]["algorithm"], "sha256");
            // The client recomputes each row digest from the manifest, row and version;
            // a page with a tampered value (or version) no longer matches its checksum.
            let db = s.env.login("synchro_dev_operator").await;
            let manifest = load_lineage(&db).await.unwrap().current().unwrap().clone();
            let table_id = c["table_id"].as_str().unwrap();
            let pk = Json::parse(&c["pk"].to_string()).unwrap();
            let row = Json::parse(&c["row"].to_string()).unwrap();
            let version = c["server_version"].as_str().unwrap();
            let digest = |row: &Json, version: &str| {
                hex::encode(
                    row_digest(&manifest, table_id, &pk, row, version)
                        .unwrap()
                        .digest,
                )
            };
            assert_eq!(
                digest(&row, version),
                c["row_checksum"]["digest"].as_str().unwrap()
            );
            let mut tampered_row = c["row"].clone();
            let first_string = tampered_row
                .as_object_mut()
                .unwrap()
                .values_mut()
                .find(|v| v.is_string() && v.as_str() != Some("4") && v.as_str() != Some("1"))
                .unwrap();
            *first_string = json!("tampered");
            let tampered_row = Json::parse(&tampered_row.to_string()).unwrap();
            assert_ne!(
                digest(&tampered_row, version),
                c["row_checksum"]["digest"].as_str().unwrap()
            );
            assert_ne!(
                digest(&row, "tampered-version"),
                c["row_checksum"]["digest"].as_str().unwrap()
            );
        }
    }
    let cursor = v["scope_cursor_updates"]["user:alice"].clone();

    // A row leaving the scope arrives as a delete; the digest follows the source again.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET owner = 'bob' WHERE id = 1")
        .await
        .unwrap();
    s.capture().await;
    let (st, v) = s
        .post("/sync/pull", &token, pull(cursor.clone(), 100))
        .await;
    assert_eq!(st, 200, "{v}");
    let changes = v["changes"].as_array().unwrap();
    assert_eq!(
        (
            changes.len(),
            changes[0]["op"].clone(),
            changes[0]["pk"].clone()
        ),
        (1, json!("delete"), json!("1"))
    );
    assert!(changes[0].get("row").is_none() && changes[0]["server_version"].is_string());
    assert_eq!(
        v["checksums"]["user:alice"]["digest"].as_str().unwrap(),
        digest_from_source(&s, "alice").await
    );

    // Tampered, foreign and wrong-purpose cursors are 400 and advance nothing.
    let c = cursor.as_str().unwrap();
    let last = if c.ends_with('A') { 'B' } else { 'A' };
    let tampered = format!("{}{last}", &c[..c.len() - 1]);
    let bob = mint(SECRET, "bob", 3600);
    s.connect(&bob, "c1").await;
    for (tok, cur) in [
        (&token, json!(tampered)),
        (&token, json!("r1.e30.AAAA")),
        (&bob, cursor.clone()),
    ] {
        let mut body = pull(cur, 10);
        if tok == &bob {
            body["scope_cursors"] = json!({"user:bob": cursor});
        }
        let (st, v) = s.post("/sync/pull", tok, body).await;
        assert_eq!(
            (st, v["error"]["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
    }
}

/// An expired client that connects again gets a new generation and a null cursor for every
/// scope it keeps, so it rebuilds them (spec 003; the answer used to carry no cursor update
/// unless the client happened to present its old cursors).
#[tokio::test]
async fn an_expired_client_reconnects_with_a_new_generation_and_null_cursors() {
    let s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let schema = s.schema().await;
    s.env
        .admin
        .batch_execute("UPDATE synchro.clients SET expired_at = now() WHERE client_id = 'c1'")
        .await
        .unwrap();
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["client_generation"], json!(generation + 1), "{v}");
    assert_eq!(
        v["scope_cursor_updates"],
        json!({"user:alice": null}),
        "{v}"
    );
    // A client that keeps its generation gets no such update.
    let (_, again) = s
        .post(
            "/sync/connect",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation + 1,
                   "schema": schema}),
        )
        .await;
    assert_eq!(again["scope_cursor_updates"], json!({}), "{again}");
}

#[tokio::test]
async fn pull_refuses_with_the_spec_errors() {
    let s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let schema = s.schema().await;
    let base = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema, "limit": 10});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    for limit in [json!(0), json!(1001), json!("10"), Value::Null] {
        let (st, v) = s.post("/sync/pull", &token, with("limit", limit)).await;
        assert_eq!(
            (st, v["error"]["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
    }
    let old = json!({"version": 1, "hash": "ab".repeat(32)});
    let (st, v) = s
        .post("/sync/pull", &token, with("schema", old.clone()))
        .await;
    assert_eq!(
        (
            st,
            v["error"]["code"].clone(),
            v["error"]["retryable"].clone()
        ),
        (422, json!("schema_mismatch"), json!(false)),
        "{v}"
    );
    assert_eq!(
        (
            v["error"]["current_schema"].clone(),
            v["error"]["received_schema"].clone()
        ),
        (schema.clone(), old)
    );
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            with("client_generation", json!(generation + 1)),
        )
        .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (409, json!("client_generation_expired")),
        "{v}"
    );
    assert_eq!(v["error"]["current_client_generation"], json!(generation));
    // A missing generation (absent or null) is one that does not match, for pull and
    // rebuild alike (spec 000: "missing, stale, or expired"; it used to be 400).
    let mut absent = base.clone();
    absent.as_object_mut().unwrap().remove("client_generation");
    let mut rebuild_absent = with("scope_id", json!("user:alice"));
    rebuild_absent
        .as_object_mut()
        .unwrap()
        .remove("client_generation");
    for (path, body) in [
        ("/sync/pull", absent),
        ("/sync/pull", with("client_generation", Value::Null)),
        ("/sync/rebuild", rebuild_absent),
    ] {
        let (st, v) = s.post(path, &token, body).await;
        assert_eq!(
            (st, v["error"]["code"].clone()),
            (409, json!("client_generation_expired")),
            "{path}: {v}"
        );
        assert_eq!(v["error"]["current_client_generation"], json!(generation));
    }
    // A generation that is not a positive integer is still malformed.
    for bad in [json!(0), json!(-1), json!("1")] {
        let (st, v) = s
            .post("/sync/pull", &token, with("client_generation", bad))
            .await;
        assert_eq!(
            (st, v["error"]["code"].clone()),
            (400, json!("invalid_request")),
            "{v}"
        );
    }
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            with("client_id", json!("never-connected")),
        )
        .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (409, json!("client_generation_expired")),
        "{v}"
    );
    let (st, v) = s
        .post("/sync/pull", &token, with("protocol_version", json!(2)))
        .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (426, json!("upgrade_required")),
        "{v}"
    );
}

/// Long on purpose: one rebuild session followed page by page while writes land, then its
/// hand-over to pull.
#[tokio::test]
async fn rebuild_pages_one_snapshot_and_hands_over_to_pull() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs SELECT g, 'alice', 'v1' FROM generate_series(1, 5) g")
        .await
        .unwrap();
    s.capture().await;
    let schema = s.schema().await;
    let req = |continuation: Option<&Value>| {
        let mut b = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema,
                           "scope_id": "user:alice", "limit": 2});
        if let Some(c) = continuation {
            b["continuation"] = c.clone();
        }
        b
    };
    let (st, first) = s.post("/sync/rebuild", &token, req(None)).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["has_more"], true);
    assert!(first.get("checksum").is_none() && first.get("final_scope_cursor").is_none());
    // A write after the snapshot does not leak into later pages of this rebuild.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET title = 'v2' WHERE id = 5")
        .await
        .unwrap();
    s.capture().await;
    let mut records: Vec<Value> = first["records"].as_array().unwrap().clone();
    let mut cont = first["continuation"].clone();
    let last = loop {
        let (st, page) = s.post("/sync/rebuild", &token, req(Some(&cont))).await;
        assert_eq!(st, 200, "{page}");
        records.extend(page["records"].as_array().unwrap().iter().cloned());
        if page["has_more"] == false {
            break page;
        }
        cont = page["continuation"].clone();
    };
    let pks: Vec<Value> = records.iter().map(|r| r["pk"].clone()).collect();
    assert_eq!(
        pks,
        [json!("1"), json!("2"), json!("3"), json!("4"), json!("5")],
        "identity order"
    );
    let titles: Vec<&str> = records
        .iter()
        .map(|r| {
            r["row"]
                .as_object()
                .unwrap()
                .values()
                .find(|v| v.as_str().is_some_and(|t| t.starts_with('v')))
                .unwrap()
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(titles, ["v1"; 5], "one snapshot");
    // The final checksum is the digest of exactly the records received.
    let db = s.env.login("synchro_dev_operator").await;
    let manifest = load_lineage(&db).await.unwrap().current().unwrap().clone();
    let table = &manifest.tables[0];
    let mut entries = Vec::new();
    for r in &records {
        let pk = Json::parse(&r["pk"].to_string()).unwrap();
        let row = Json::parse(&r["row"].to_string()).unwrap();
        let d = row_digest(
            &manifest,
            &table.table_id,
            &pk,
            &row,
            r["server_version"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(
            r["row_checksum"]["digest"].as_str().unwrap(),
            hex::encode(d.digest)
        );
        let key = TypedValue::from_wire(&table.primary_key().spec, &pk).unwrap();
        entries.push((RowIdentity::new(table, &key).unwrap(), d.digest));
    }
    let want = hex::encode(
        scope_digest(&manifest.schema_hash(), "user:alice", &mut entries, false)
            .unwrap()
            .digest,
    );
    assert_eq!(last["checksum"]["digest"].as_str().unwrap(), want);
    // Pull from the final cursor delivers exactly what changed after the snapshot.
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema,
                   "scope_cursors": {"user:alice": last["final_scope_cursor"]}, "limit": 100}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let changes = v["changes"].as_array().unwrap();
    assert_eq!((changes.len(), changes[0]["pk"].clone()), (1, json!("5")));
    assert_eq!(
        v["checksums"]["user:alice"]["digest"].as_str().unwrap(),
        digest_from_source(&s, "alice").await
    );

    // Re-registering the same rule changes no edge of the scope: its session stays valid.
    let (_, again) = s.post("/sync/rebuild", &token, req(None)).await;
    let op = s.env.login("synchro_dev_operator").await;
    op.batch_execute("SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')")
        .await
        .unwrap();
    s.capture().await;
    let (st, v) = s
        .post("/sync/rebuild", &token, req(Some(&again["continuation"])))
        .await;
    assert_eq!(st, 200, "{v}");
    // A rule that takes a row out of the scope advances its membership generation. A session
    // that started before the activation completes against the generation it was built
    // under (spec 003 staged backfill, step 5: the prior generation is retained for rebuild
    // sessions in flight) instead of restarting; its final cursor binds that generation, so
    // the next pull rebuilds the scope under the new rule. An unassigned scope is refused.
    op.batch_execute(
        "CREATE FUNCTION rules.doc_scopes_v2(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id AND id <> 1; END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes_v2(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes_v2(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes_v2(bigint)');",
    )
    .await
    .unwrap();
    s.capture().await;
    let mut page = again;
    let mut records = page["records"].as_array().unwrap().len();
    while page["has_more"] == true {
        let (st, v) = s
            .post("/sync/rebuild", &token, req(Some(&page["continuation"])))
            .await;
        assert_eq!(st, 200, "the session completes: {v}");
        records += v["records"].as_array().unwrap().len();
        page = v;
    }
    assert_eq!(records, 5, "the session's own snapshot, row 1 included");
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema,
                   "scope_cursors": {"user:alice": page["final_scope_cursor"]}, "limit": 100}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["rebuild_scopes"], json!(["user:alice"]), "{v}");
    let mut other = req(None);
    other["scope_id"] = json!("user:bob");
    let (st, v) = s.post("/sync/rebuild", &token, other).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (400, json!("invalid_request")),
        "{v}"
    );
}

/// Follows a scope to its terminal page from `cursor`; returns (final cursor, rebuild
/// listed, terminal digest).
async fn follow(
    s: &Stack,
    token: &str,
    client: &str,
    generation: u64,
    mut cursor: Value,
) -> (Value, bool, String) {
    let schema = s.schema().await;
    loop {
        let (st, v) = s
            .post(
                "/sync/pull",
                token,
                json!({"protocol_version": 3, "client_id": client, "client_generation": generation,
                       "schema": schema, "scope_cursors": {"user:alice": cursor}, "limit": 1000}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let rebuild = v["rebuild_scopes"]
            .as_array()
            .unwrap()
            .contains(&json!("user:alice"));
        if rebuild {
            return (Value::Null, true, String::new());
        }
        cursor = v["scope_cursor_updates"]["user:alice"].clone();
        if v["has_more"] == false {
            let digest = v["checksums"]["user:alice"]["digest"]
                .as_str()
                .unwrap()
                .to_owned();
            return (cursor, false, digest);
        }
    }
}

/// Spec 001's ordered index: after the first terminal digest, each later one brings the
/// scope's index forward with just the rows its effects name — rows entering, changing,
/// leaving the scope and deleted — and always equals the digest of the source's rows.
#[tokio::test]
async fn terminal_digests_follow_changes_through_the_scope_index() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute(
            "INSERT INTO app.docs SELECT g, 'alice', 'seed ' || g FROM generate_series(1, 300) g",
        )
        .await
        .unwrap();
    s.capture().await;
    let (mut cursor, rebuild, digest) = follow(&s, &token, "c1", generation, Value::Null).await;
    assert!(!rebuild);
    assert_eq!(digest, digest_from_source(&s, "alice").await);
    let advances = s.state.caches.digests.index_counts().1;
    for (i, sql) in [
        "UPDATE app.docs SET title = 'changed' WHERE id = 7",
        "INSERT INTO app.docs VALUES (1000, 'alice', 'new'), (1001, 'bob', 'not hers')",
        "UPDATE app.docs SET owner = 'bob' WHERE id IN (3, 150, 299)",
        "DELETE FROM app.docs WHERE id IN (1, 200)",
        "UPDATE app.docs SET owner = 'alice' WHERE id IN (150, 1001)",
        "BEGIN; DELETE FROM app.docs WHERE id = 5; INSERT INTO app.docs VALUES (5, 'alice', 'again'); COMMIT",
        "UPDATE app.docs SET title = NULL WHERE id BETWEEN 10 AND 20",
    ]
    .into_iter()
    .enumerate()
    {
        s.env.admin.batch_execute(sql).await.unwrap();
        s.capture().await;
        let (next, rebuild, digest) = follow(&s, &token, "c1", generation, cursor).await;
        assert!(!rebuild, "step {i}");
        assert_eq!(digest, digest_from_source(&s, "alice").await, "step {i}: {sql}");
        cursor = next;
    }
    assert!(
        s.state.caches.digests.index_counts().1 >= advances + 7,
        "the later digests came from the index"
    );
}

/// When most of a scope changed, its terminal digest builds the index again from the
/// scope's keys and versions (row digests the pages just computed, from the cache) instead
/// of reading each changed row by key; it still equals the digest of the source's rows.
#[tokio::test]
async fn a_scope_mostly_changed_is_digested_again_in_full() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute(
            "INSERT INTO app.docs SELECT g, 'alice', 'seed ' || g FROM generate_series(1, 3000) g",
        )
        .await
        .unwrap();
    s.capture().await;
    let (cursor, rebuild, digest) = follow(&s, &token, "c1", generation, Value::Null).await;
    assert!(!rebuild);
    assert_eq!(digest, digest_from_source(&s, "alice").await);
    s.env
        .admin
        .batch_execute(
            "UPDATE app.docs SET title = 'changed ' || id WHERE id <= 2500;
             UPDATE app.docs SET owner = 'bob' WHERE id > 2900",
        )
        .await
        .unwrap();
    s.capture().await;
    let builds = s.state.caches.digests.index_counts().0;
    let (_, rebuild, digest) = follow(&s, &token, "c1", generation, cursor).await;
    assert!(!rebuild);
    assert_eq!(digest, digest_from_source(&s, "alice").await);
    assert!(
        s.state.caches.digests.index_counts().0 > builds,
        "the index was built again"
    );
}

async fn floor(s: &Stack) -> i64 {
    s.env
        .admin
        .query_one(
            "SELECT coalesce((SELECT resume_floor FROM synchro.scope_retention WHERE scope_id = 'user:alice'), 0)",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn compaction_keeps_acknowledged_history_and_stales_cursors_below_the_floor() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let g1 = s.connect(&token, "c1").await;
    let g2 = s.connect(&token, "c2").await;
    // Compaction is the operator's (spec 001; the worker may not run it).
    let operator_db = s.env.login("synchro_dev_operator").await;
    s.env
        .admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (1, 'alice', 'a'), (2, 'alice', 'b'), (3, 'bob', 'c')",
        )
        .await
        .unwrap();
    s.capture().await;
    // Both clients replay from the start (floor 0) and acknowledge their cursors.
    let (q1, _, _) = follow(&s, &token, "c1", g1, Value::Null).await;
    let (q2, _, _) = follow(&s, &token, "c2", g2, Value::Null).await;
    let (q1, _, _) = follow(&s, &token, "c1", g1, q1).await;
    let (q2, _, _) = follow(&s, &token, "c2", g2, q2).await;
    let old_c1 = q1.clone();

    s.env
        .admin
        .batch_execute("UPDATE app.docs SET title = 'a2' WHERE id = 1; INSERT INTO app.docs VALUES (4, 'alice', 'd')")
        .await
        .unwrap();
    s.capture().await;
    // c1 moves on and acknowledges the newer position; c2 stays behind.
    let (q1, _, _) = follow(&s, &token, "c1", g1, q1).await;
    let (q1, _, _) = follow(&s, &token, "c1", g1, q1).await;

    // Bad batch sizes are refused before any work.
    assert_eq!(
        common::sqlstate(
            &operator_db,
            "SELECT synchro.synchro_compact_scope('user:alice', 0)"
        )
        .await,
        "22023"
    );
    let before: i64 = s
        .env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.scope_effects WHERE scope_id = 'user:alice'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let c = synchro_server::retention::compact(&operator_db, 1)
        .await
        .unwrap();
    assert!(c.effects_deleted > 0, "{c:?}");
    let f1 = floor(&s).await;
    assert!(f1 > 0);
    let after: i64 = s
        .env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.scope_effects WHERE scope_id = 'user:alice'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Only history both clients acknowledged went; c2's pending changes are retained.
    assert!(after > 0 && after < before, "{before} -> {after}");
    let below: i64 = s
        .env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.scope_effects WHERE scope_id = 'user:alice' AND position <= $1",
            &[&f1],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(below, 0);

    // c2 resumes from its acknowledged cursor and ends at the source's digest.
    let (_, rebuild, digest) = follow(&s, &token, "c2", g2, q2).await;
    assert!(!rebuild);
    assert_eq!(digest, digest_from_source(&s, "alice").await);
    // A new client cannot replay a compacted log: it must rebuild.
    let g3 = s.connect(&token, "c3").await;
    assert!(follow(&s, &token, "c3", g3, Value::Null).await.1);

    // c2 expires (no acknowledgement for 40 days): compaction makes that durable and no
    // longer keeps its history; everything c1 acknowledged goes, even the whole log.
    s.env
        .admin
        .batch_execute(
            "UPDATE synchro.clients SET generation_started_at = now() - interval '40 days',
                    last_acknowledged_at = now() - interval '40 days' WHERE client_id IN ('c2', 'c3')",
        )
        .await
        .unwrap();
    let c = synchro_server::retention::compact(&operator_db, 1000)
        .await
        .unwrap();
    assert_eq!(c.clients_expired, 2);
    let f2 = floor(&s).await;
    assert!(f2 > f1, "the floor only moves forward: {f1} -> {f2}");
    let expired: bool = s
        .env
        .admin
        .query_one(
            "SELECT expired_at IS NOT NULL FROM synchro.clients WHERE client_id = 'c2'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(expired);
    // Raising the TTL does not revive the expired generation.
    s.env
        .admin
        .batch_execute("UPDATE synchro.settings SET value = '3650' WHERE key = 'client_ttl_days'")
        .await
        .unwrap();
    let schema = s.schema().await;
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c2", "client_generation": g2,
                   "schema": schema, "scope_cursors": {}, "limit": 10}),
        )
        .await;
    assert_eq!(st, 409, "{v}");
    // The empty log is no proof for an old cursor: c1's first cursor is below the floor.
    assert!(follow(&s, &token, "c1", g1, old_c1).await.1);
    // c1's current cursor still resumes, with the source digest.
    let (_, rebuild, digest) = follow(&s, &token, "c1", g1, q1).await;
    assert!(!rebuild);
    assert_eq!(digest, digest_from_source(&s, "alice").await);
}

/// Compaction is the operator's alone (spec 001's role table): the worker login cannot run
/// it and the capture worker does not; `synchro-server compact` refuses bad arguments
/// before connecting, refuses a login that is not the operator's, and with `--every` runs a
/// pass per interval, each recorded for the health report (`last_compaction_at`).
#[tokio::test]
async fn compaction_runs_as_the_operator_on_its_schedule() {
    let mut s = stack().await;
    let worker = s.env.login("synchro_dev_worker").await;
    worker
        .batch_execute("SET ROLE synchro_worker")
        .await
        .unwrap();
    for call in [
        "SELECT synchro.synchro_expire()",
        "SELECT synchro.synchro_compaction_scopes()",
        "SELECT synchro.synchro_compact_scope('user:alice', 10)",
    ] {
        assert_eq!(common::sqlstate(&worker, call).await, "42501", "{call}");
    }
    // Capture alone never compacts.
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'a')")
        .await
        .unwrap();
    s.capture().await;
    let last = || async {
        s.env
            .admin
            .query_one(
                "SELECT synchro.synchro_capture_report()->>'last_compaction_at'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
    };
    assert_eq!(last().await, None);

    let bin = env!("CARGO_BIN_EXE_synchro-server");
    let operator_url = s.env.cluster.url("synchro_dev_operator", "app");
    for (args, flag) in [
        (&["--batch-size", "0"][..], "--batch-size"),
        (&["--batch-size=-3"][..], "--batch-size"),
        (&["--every", "0"][..], "--every"),
        (&["--every", "1.5"][..], "--every"),
    ] {
        let out = std::process::Command::new(bin)
            .arg("compact")
            .args(args)
            .env("DATABASE_URL", &operator_url)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(flag),
            "{args:?}: {err}"
        );
    }
    assert_eq!(last().await, None, "a refused command ran no pass");
    let as_worker = std::process::Command::new(bin)
        .arg("compact")
        .env(
            "DATABASE_URL",
            s.env.cluster.url("synchro_dev_worker", "app"),
        )
        .output()
        .unwrap();
    assert!(
        !as_worker.status.success()
            && String::from_utf8_lossy(&as_worker.stderr).contains("operator login"),
        "{as_worker:?}"
    );
    assert_eq!(last().await, None);

    let mut every = std::process::Command::new(bin)
        .args(["compact", "--every", "1"])
        .env("DATABASE_URL", &operator_url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.len() < 3 && std::time::Instant::now() < deadline {
        if let Some(at) = last().await {
            if seen.last() != Some(&at) {
                seen.push(at);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    every.kill().unwrap();
    let out = every.wait_with_output().unwrap();
    assert_eq!(seen.len(), 3, "three passes recorded: {seen:?}");
    let passes: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(passes.len() >= 3, "{passes:?}");
    assert!(
        passes.iter().all(|p| p["effects_deleted"].is_i64()),
        "{passes:?}"
    );
}

/// Reads the next server-sent event (skipping comments) as (name, data).
async fn next_event(resp: &mut reqwest::Response, buffer: &mut String) -> (String, Value) {
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if block.starts_with(':') {
                continue;
            }
            let mut name = String::new();
            let mut data = Value::Null;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap();
                }
            }
            return (name, data);
        }
        let chunk = resp.chunk().await.unwrap().expect("stream ended");
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn events_stream_names_changed_scopes_right_after_the_commit_without_data() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    // A stale generation is refused like pull refuses it.
    let stale = s.open_events(&token, generation + 1).await;
    assert_eq!(stale.status(), 409);
    let mut resp = s.open_events(&token, generation).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut buffer = String::new();
    assert_eq!(next_event(&mut resp, &mut buffer).await.0, "ready");

    // Bob's change wakes the stream but concerns none of alice's scopes: no event. Then
    // alice's change is named (scope only) well before the 5 s fallback tick.
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (10, 'bob', 'secret-bob-title')")
        .await
        .unwrap();
    s.capture().await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (11, 'alice', 'secret-alice-title')")
        .await
        .unwrap();
    let committed = std::time::Instant::now();
    s.capture().await;
    let (name, data) = tokio::time::timeout(
        std::time::Duration::from_secs(4),
        next_event(&mut resp, &mut buffer),
    )
    .await
    .expect("the notification arrives before the fallback tick");
    let latency = committed.elapsed();
    assert_eq!(name, "changed");
    assert_eq!(data, json!({"scopes": ["user:alice"]}));
    assert!(!buffer.contains("secret"));
    eprintln!("commit to event: {latency:?}");

    // A new generation (reconnect with an unknown one) ends the old stream.
    s.env
        .admin
        .batch_execute("UPDATE synchro.clients SET client_generation = client_generation + 1 WHERE client_id = 'c1'")
        .await
        .unwrap();
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (12, 'alice', 'x')")
        .await
        .unwrap();
    s.capture().await;
    let (name, data) = tokio::time::timeout(
        std::time::Duration::from_secs(8),
        next_event(&mut resp, &mut buffer),
    )
    .await
    .unwrap();
    assert_eq!(name, "end");
    assert_eq!(data, json!({"reason": "client_generation_expired"}));
}

/// Access ends when it ends, for events streams too: once a scope is revoked no `changed`
/// names it (a commit in it wakes the stream and is not named; it used to be, from the
/// client's stored assignment), the stream has the client pull (`changed` naming no scope)
/// so the pull takes the scope away, and a stream whose generation was replaced ends within
/// the recheck bound with no change at all (it used to run on until the next change of one
/// of its scopes). The bound is 1 s (plus up to as much again) here, 30 s by default.
#[tokio::test]
async fn an_events_stream_stops_naming_a_revoked_scope_and_ends_when_its_generation_is_replaced() {
    let mut s = stack_with(Config {
        events_recheck: std::time::Duration::from_secs(1),
        ..Config::default()
    })
    .await;
    s.env
        .admin
        .batch_execute("SELECT synchro.synchro_grant_user_scope('alice', 'user:bob')")
        .await
        .unwrap();
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let mut resp = s.open_events(&token, generation).await;
    assert_eq!(resp.status(), 200);
    let mut buffer = String::new();
    assert_eq!(next_event(&mut resp, &mut buffer).await.0, "ready");
    let within = |secs| std::time::Duration::from_secs(secs);
    let insert = |id: i64| format!("INSERT INTO app.docs VALUES ({id}, 'bob', 'b')");

    s.env.admin.batch_execute(&insert(20)).await.unwrap();
    s.capture().await;
    let heard = tokio::time::timeout(within(4), next_event(&mut resp, &mut buffer)).await;
    assert_eq!(
        heard.unwrap(),
        ("changed".into(), json!({"scopes": ["user:bob"]}))
    );

    // Revoked: the next commit in the scope is not named; the client is told to pull.
    s.env
        .admin
        .batch_execute("SELECT synchro.synchro_revoke_user_scope('alice', 'user:bob')")
        .await
        .unwrap();
    s.env.admin.batch_execute(&insert(21)).await.unwrap();
    s.capture().await;
    let heard = tokio::time::timeout(within(4), next_event(&mut resp, &mut buffer)).await;
    assert_eq!(heard.unwrap(), ("changed".into(), json!({"scopes": []})));
    s.env.admin.batch_execute(&insert(22)).await.unwrap();
    s.capture().await;
    let heard = tokio::time::timeout(within(3), next_event(&mut resp, &mut buffer)).await;
    assert!(heard.is_err(), "{heard:?}");

    // A replaced generation ends the stream with no change of its scopes.
    s.env
        .admin
        .batch_execute("UPDATE synchro.clients SET client_generation = client_generation + 1 WHERE client_id = 'c1'")
        .await
        .unwrap();
    let heard = tokio::time::timeout(within(4), next_event(&mut resp, &mut buffer)).await;
    assert_eq!(
        heard.unwrap(),
        ("end".into(), json!({"reason": "client_generation_expired"}))
    );
}

#[tokio::test]
async fn events_streams_end_with_schema_changed_when_the_served_manifest_changes() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let (http, base) = (s.http.clone(), s.base.clone());
    let open = || async {
        let mut resp = http
            .post(format!("{base}/sync/events"))
            .header("authorization", format!("Bearer {token}"))
            .body(
                json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        let mut buffer = String::new();
        assert_eq!(next_event(&mut resp, &mut buffer).await.0, "ready");
        (resp, buffer)
    };
    // The next event within `secs`, if any.
    let next_within = |secs: u64, (mut resp, mut buffer): (reqwest::Response, String)| async move {
        let e = tokio::time::timeout(
            std::time::Duration::from_secs(secs),
            next_event(&mut resp, &mut buffer),
        )
        .await
        .ok();
        (e, (resp, buffer))
    };
    let schema_changed = Some(("end".to_owned(), json!({"reason": "schema_changed"})));

    // A reconfiguration: its publish serves nothing new yet (capture activates it), so no
    // stream ends (each would end within 2 s)...
    let stream = open().await;
    let mut op = add_note_column(&s).await;
    let v1 = served_version(&s).await;
    let (e, stream) = next_within(3, stream).await;
    assert_eq!(e, None, "nothing is served anew at the publish");
    // ...the capture commit that activates it does.
    s.capture().await;
    assert_eq!(served_version(&s).await, v1 + 1);
    assert_eq!(
        next_within(10, stream).await.0,
        schema_changed,
        "the activation"
    );

    // A new (empty) table with its membership rule: served from its publish.
    let stream = open().await;
    s.env
        .as_app_owner("CREATE TABLE app.tags (id bigint PRIMARY KEY, owner text NOT NULL)")
        .await;
    register(&op, &RegisterRequest::synced("app", "tags", "multi_scope"))
        .await
        .unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.tag_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.tags\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.tag_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.tag_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'tags', 'rules.tag_scopes(bigint)');",
    )
    .await
    .unwrap();
    publish(&mut op).await.unwrap();
    assert_eq!(served_version(&s).await, v1 + 2);
    let (e, stream) = next_within(10, stream).await;
    assert_eq!(e, schema_changed, "the publish of a new table");
    // Its bootstrap and its rule going live serve nothing new: the next stream stays open.
    let stream2 = open().await;
    drop(stream);
    s.capture().await;
    let (e, _) = next_within(3, stream2).await;
    assert_eq!(e, None, "nothing changed for clients");

    // A commit with no schema change ends nothing.
    let stream = open().await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs (id, owner, title) VALUES (20, 'alice', 'x')")
        .await
        .unwrap();
    s.capture().await;
    let (e, _) = next_within(10, stream).await;
    assert_eq!(e.map(|(name, _)| name).as_deref(), Some("changed"));
}

#[tokio::test]
async fn a_pull_whose_snapshot_comes_after_a_schema_activation_is_a_schema_mismatch() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let old = s.schema().await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs (id, owner, title) VALUES (1, 'alice', 'before')")
        .await
        .unwrap();
    s.capture().await;
    // A reconfiguration (a new column), published; capture activates it below.
    add_note_column(&s).await;
    // The pull passes its gates under the old manifest, then waits for a snapshot
    // connection (the test holds the only one)...
    let state = s.state.clone();
    let held = state.snapshot_db.lock().await.unwrap();
    let pull = {
        let (http, base) = (s.http.clone(), s.base.clone());
        let body = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                          "schema": old, "scope_cursors": {"user:alice": null}, "limit": 100});
        tokio::spawn(async move {
            let r = http
                .post(format!("{base}/sync/pull"))
                .header("authorization", format!("Bearer {token}"))
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // ...while the reconfiguration activates and a row is written in the new shape.
    s.capture().await;
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET note = 'new shape' WHERE id = 1")
        .await
        .unwrap();
    s.capture().await;
    drop(held);
    // Its snapshot has rows the old manifest cannot describe: a 422 the client reconnects
    // on, not a digest failure (500) that blocks it.
    let (st, v) = pull.await.unwrap();
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "schema_mismatch", "{v}");
}

/// Adds the nullable column `note` to app.docs and reconfigures it (published; the next
/// capture commit activates it); returns the operator's connection.
async fn add_note_column(s: &Stack) -> tokio_postgres::Client {
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    let mut op = s.env.login("synchro_dev_operator").await;
    let request = synchro_server::registry::ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        ..Default::default()
    };
    synchro_server::registry::reconfigure(&mut op, &request, true)
        .await
        .unwrap();
    op
}

async fn served_version(s: &Stack) -> u64 {
    let db = s.env.login("synchro_dev_adapter").await;
    let lineage = synchro_server::publish::load_serving_lineage(&db)
        .await
        .unwrap();
    lineage.current().unwrap().schema_version
}

#[tokio::test]
async fn connect_bridges_valid_cursors_across_a_compatible_schema_change() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'a'), (2, 'alice', 'b')")
        .await
        .unwrap();
    s.capture().await;
    let (cursor, _, _) = follow(&s, &token, "c1", generation, Value::Null).await;
    let old_schema = s.schema().await;
    let connect = |schema: Value, cursors: Value| {
        json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
               "schema": schema, "scope_cursors": cursors})
    };

    // Exact schema: nothing to bridge, the cursor stays as it is.
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            connect(old_schema.clone(), json!({"user:alice": cursor})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["schema"]["action"], "none");
    assert_eq!(v["scope_cursor_updates"], json!({}));
    // A forged cursor is refused.
    let mut forged = cursor.as_str().unwrap().to_owned();
    let tail = if forged.ends_with("AA") { "BB" } else { "AA" };
    forged.replace_range(forged.len() - 2.., tail);
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            connect(old_schema.clone(), json!({"user:alice": forged})),
        )
        .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (400, json!("invalid_request"))
    );

    // A Class 2 change (a new, empty table) and a write after the cursor.
    s.env
        .as_app_owner("CREATE TABLE app.tags (id text PRIMARY KEY, label text)")
        .await;
    let mut op = s.env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "tags", "multi_scope"))
        .await
        .unwrap();
    publish(&mut op).await.unwrap();
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (3, 'alice', 'c')")
        .await
        .unwrap();
    s.capture().await;
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            connect(old_schema.clone(), json!({"user:alice": cursor})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["schema"]["action"], "replace", "{v}");
    let bridged = v["scope_cursor_updates"]["user:alice"].clone();
    assert!(
        bridged.is_string() && bridged != json!("reissue") && bridged != cursor,
        "{v}"
    );
    // The bridged cursor resumes under the new schema at the same position: only the
    // later write arrives, and the terminal digest matches the source.
    let new_schema = s.schema().await;
    assert_ne!(new_schema, old_schema);
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": new_schema, "scope_cursors": {"user:alice": bridged}, "limit": 100}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["rebuild_scopes"], json!([]));
    let pks: Vec<Value> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["pk"].clone())
        .collect();
    assert_eq!(pks, [json!("3")]);
    assert_eq!(
        v["checksums"]["user:alice"]["digest"].as_str().unwrap(),
        digest_from_source(&s, "alice").await
    );
    // The old-schema cursor itself is not accepted by pull under the new schema: rebuild.
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": new_schema, "scope_cursors": {"user:alice": cursor}, "limit": 100}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["rebuild_scopes"], json!(["user:alice"]));
}

#[tokio::test]
async fn snapshot_pool_hands_out_free_connections_and_queues_when_all_are_busy() {
    let env = Env::installed().await;
    let pool = synchro_server::api::SnapshotPool::new(vec![
        env.login("synchro_dev_adapter").await,
        env.login("synchro_dev_adapter").await,
    ]);
    let a = pool.lock().await.unwrap();
    let b = tokio::time::timeout(std::time::Duration::from_secs(5), pool.lock())
        .await
        .expect("the second connection is free")
        .unwrap();
    // Two snapshots at once on distinct sessions.
    let a_pid = pid(&a).await;
    assert_ne!(a_pid, pid(&b).await);
    // Both busy: a third waits until one is released.
    let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), pool.lock()).await;
    assert!(waiting.is_err(), "no third connection exists");
    drop(a);
    let again = tokio::time::timeout(std::time::Duration::from_secs(5), pool.lock())
        .await
        .expect("a released connection is handed out again")
        .unwrap();
    assert_eq!(
        pid(&again).await,
        a_pid,
        "the released connection, not the busy one"
    );
}

async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_terminated_session_is_replaced_when_its_connection_is_next_used() {
    let env = Env::installed().await;
    let url = env.cluster.url("synchro_dev_adapter", "app");
    let connect = || async { synchro_server::connect_db(&url).await.unwrap() };
    let pool = synchro_server::api::ConnectionPool::reconnecting(&url, vec![connect().await]);
    let shared = synchro_server::api::SharedConnection::new(&url, connect().await);
    let before = [
        pid(&pool.lock().await.unwrap()).await,
        pid(&shared.get().await.unwrap()).await,
    ];
    // Both sessions end under the server, as in a database restart.
    env.admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid",
            &[&before.to_vec()],
        )
        .await
        .unwrap();
    // A request that meets the connection before its end is seen gets an error (503); the
    // next use connects again: a new session that works.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut failed = 0;
    let after = loop {
        let from_pool = match pool.lock().await {
            Ok(c) => c.query_one("SELECT pg_backend_pid()", &[]).await.ok(),
            Err(_) => None,
        };
        let from_shared = match shared.get().await {
            Ok(c) => c.query_one("SELECT pg_backend_pid()", &[]).await.ok(),
            Err(_) => None,
        };
        if let (Some(a), Some(b)) = (from_pool, from_shared) {
            break [a.get::<_, i32>(0), b.get::<_, i32>(0)];
        }
        failed += 1;
        assert!(std::time::Instant::now() < deadline, "never replaced");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        failed <= 1,
        "one use at most met the closed connection ({failed})"
    );
    assert_ne!(after[0], before[0]);
    assert_ne!(after[1], before[1]);
    // A pool built without a URL keeps what it has (tests that build the state by hand).
    let fixed = synchro_server::api::ConnectionPool::new(vec![connect().await]);
    let p = pid(&fixed.lock().await.unwrap()).await;
    env.admin
        .execute("SELECT pg_terminate_backend($1)", &[&p])
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let kept = fixed.lock().await.unwrap();
    assert!(kept.is_closed(), "not replaced");
}

#[tokio::test]
async fn while_the_database_cannot_be_reached_requests_are_refused_without_queueing() {
    let env = Env::installed().await;
    // A "database" that takes connections and never answers (as a host that went away
    // mid-handshake): each connect attempt lasts until its timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "host=127.0.0.1 port={} user=nobody dbname=app",
        silent.local_addr().unwrap().port()
    );
    let first = env.login("synchro_dev_adapter").await;
    let p = pid(&first).await;
    let shared = std::sync::Arc::new(synchro_server::api::SharedConnection::new(&url, first));
    env.admin
        .execute("SELECT pg_terminate_backend($1)", &[&p])
        .await
        .unwrap();
    // The closed connection is seen, one connect is tried and fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let got = shared.get().await;
        if let Err(e) = got {
            assert_eq!(axum::response::IntoResponse::into_response(e).status(), 503);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the end is never seen"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Right after, ten requests at once are refused without trying again each (one
    // attempt lasts 5 s): none waits behind another's connect.
    let started = std::time::Instant::now();
    let all = futures_util::future::join_all((0..10).map(|_| {
        let shared = shared.clone();
        async move {
            match shared.get().await {
                Ok(_) => 200,
                Err(e) => axum::response::IntoResponse::into_response(e)
                    .status()
                    .as_u16(),
            }
        }
    }))
    .await;
    assert_eq!(all, [503; 10]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "refused at once, not after a connect timeout each ({:?})",
        started.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_class_3_manifest_is_served_only_once_its_table_is_materialized() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    let old_schema = s.schema().await;
    // A new table that already has rows: a Class 3 change needing its bootstrap copy.
    s.env
        .as_app_owner(
            "CREATE TABLE app.notes (id bigint PRIMARY KEY, body text);
             INSERT INTO app.notes VALUES (1, 'existing')",
        )
        .await;
    let mut op = s.env.login("synchro_dev_operator").await;
    register(
        &op,
        &RegisterRequest::synced("app", "notes", "single_scope"),
    )
    .await
    .unwrap();
    publish(&mut op).await.unwrap();
    let connect = |schema: Value| json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema});
    // Before the worker has copied it, clients stay on the previous manifest.
    let (st, v) = s
        .post("/sync/connect", &token, connect(old_schema.clone()))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["schema"]["action"], "none", "{v}");
    // Once it is copied, the Class 3 manifest is current and the client rebuilds.
    s.capture().await;
    let (st, v) = s
        .post("/sync/connect", &token, connect(old_schema.clone()))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["schema"]["action"], "rebuild_local", "{v}");
    assert_eq!(v["affected_scopes"], json!(["user:alice"]));
}

/// Rebuilds `user:alice` for `client` to its last page; returns (final cursor, checksum).
async fn rebuild_scope(s: &Stack, token: &str, client: &str, generation: u64) -> (Value, String) {
    let schema = s.schema().await;
    let mut continuation = Value::Null;
    loop {
        let (st, page) = s
            .post(
                "/sync/rebuild",
                token,
                json!({"protocol_version": 3, "client_id": client, "client_generation": generation,
                       "schema": schema, "scope_id": "user:alice", "limit": 2, "continuation": continuation}),
            )
            .await;
        assert_eq!(st, 200, "{page}");
        if page["has_more"] == false {
            return (
                page["final_scope_cursor"].clone(),
                page["checksum"]["digest"].as_str().unwrap().to_owned(),
            );
        }
        continuation = page["continuation"].clone();
    }
}

/// Issue 12.1: once compaction has emptied the effect log, a rebuild's final cursor used
/// to stand at position 0, below the scope's floor, so every pull asked for the rebuild
/// again. It must stand at the snapshot's stream boundary, for a client that had a cursor
/// and for a fresh one.
#[tokio::test]
async fn a_rebuild_after_compaction_hands_over_to_incremental_pulls() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let g1 = s.connect(&token, "c1").await;
    let operator_db = s.env.login("synchro_dev_operator").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs SELECT g, 'alice', 'v1' FROM generate_series(1, 5) g; INSERT INTO app.docs VALUES (9, 'bob', 'b')")
        .await
        .unwrap();
    s.capture().await;
    // c1 follows to the end and acknowledges it: every effect can go.
    let (q1, _, _) = follow(&s, &token, "c1", g1, Value::Null).await;
    let (q1, rebuild, _) = follow(&s, &token, "c1", g1, q1).await;
    assert!(!rebuild);
    let c = synchro_server::retention::compact(&operator_db, 1000)
        .await
        .unwrap();
    assert!(c.effects_deleted > 0, "{c:?}");
    let left: i64 = s
        .env
        .admin
        .query_one("SELECT count(*) FROM synchro.scope_effects", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the whole log was compacted");
    assert!(floor(&s).await > 0);

    // A fresh client must rebuild, and after the rebuild it resumes incrementally.
    let g2 = s.connect(&token, "c2").await;
    assert!(follow(&s, &token, "c2", g2, Value::Null).await.1);
    let (q2, checksum) = rebuild_scope(&s, &token, "c2", g2).await;
    assert_eq!(checksum, digest_from_source(&s, "alice").await);
    let (q2, rebuild, digest) = follow(&s, &token, "c2", g2, q2).await;
    assert!(!rebuild, "the rebuild's final cursor is below the floor");
    assert_eq!(digest, digest_from_source(&s, "alice").await);

    // The client that had a cursor rebuilds (as after a mismatch) and resumes too.
    let (r1, _) = rebuild_scope(&s, &token, "c1", g1).await;
    assert!(!follow(&s, &token, "c1", g1, r1.clone()).await.1);
    assert!(!follow(&s, &token, "c1", g1, q1).await.1);

    // New writes arrive incrementally from those cursors.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET title = 'v2' WHERE id = 3; INSERT INTO app.docs VALUES (6, 'alice', 'v1')")
        .await
        .unwrap();
    s.capture().await;
    for (client, generation, cursor) in [("c1", g1, r1), ("c2", g2, q2)] {
        let schema = s.schema().await;
        let (st, v) = s
            .post(
                "/sync/pull",
                &token,
                json!({"protocol_version": 3, "client_id": client, "client_generation": generation,
                       "schema": schema, "scope_cursors": {"user:alice": cursor}, "limit": 1000}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["rebuild_scopes"], json!([]), "{v}");
        assert_eq!(v["changes"].as_array().unwrap().len(), 2, "{v}");
        assert_eq!(
            v["checksums"]["user:alice"]["digest"].as_str().unwrap(),
            digest_from_source(&s, "alice").await
        );
    }
}

/// Spec 000's error table: while capture is blocked, pull and rebuild answer 503
/// `temporary_unavailable` with `reason: "capture_blocked"` (retryable) instead of serving
/// a projection that no longer follows the source, with valid checksums, as current.
#[tokio::test]
async fn while_capture_is_blocked_pull_and_rebuild_answer_capture_blocked() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'one')")
        .await
        .unwrap();
    s.capture().await;
    let schema = s.schema().await;
    let pull = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                      "schema": schema, "scope_cursors": {"user:alice": null}, "limit": 10});
    let rebuild = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                         "schema": schema, "scope_id": "user:alice", "limit": 10});
    assert_eq!(s.post("/sync/pull", &token, pull.clone()).await.0, 200);
    s.env
        .admin
        .batch_execute(
            "UPDATE synchro.capture_state SET blocked_reason = 'decode_error', blocked_at = now()",
        )
        .await
        .unwrap();
    for (path, body) in [("/sync/pull", &pull), ("/sync/rebuild", &rebuild)] {
        let (st, v) = s.post(path, &token, body.clone()).await;
        assert_eq!(
            (
                st,
                v["error"]["code"].as_str(),
                v["error"]["reason"].as_str(),
                v["error"]["retryable"].as_bool()
            ),
            (
                503,
                Some("temporary_unavailable"),
                Some("capture_blocked"),
                Some(true)
            ),
            "{path}: {v}"
        );
    }
    // A wrong schema or generation is still the client's own error first.
    let mut stale = pull.clone();
    stale["client_generation"] = json!(generation + 1);
    assert_eq!(s.post("/sync/pull", &token, stale).await.0, 409);
    s.env
        .admin
        .batch_execute("UPDATE synchro.capture_state SET blocked_reason = NULL, blocked_at = NULL")
        .await
        .unwrap();
    assert_eq!(s.post("/sync/pull", &token, pull).await.0, 200);
}

/// A scope revoked while its rebuild is under way gets no page after the revocation: the
/// continuation and a new rebuild are both 409 `rebuild_restart_required` (they used to
/// serve rows written after it until the client's next connect), and the next connect
/// takes the scope away.
#[tokio::test]
async fn a_revoked_scope_gets_no_rebuild_page_after_the_revocation() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let generation = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs SELECT g, 'alice', 'v1' FROM generate_series(1, 5) g")
        .await
        .unwrap();
    s.capture().await;
    let schema = s.schema().await;
    let req = |continuation: Option<&Value>| {
        let mut b = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation, "schema": schema,
                           "scope_id": "user:alice", "limit": 2});
        if let Some(c) = continuation {
            b["continuation"] = c.clone();
        }
        b
    };
    let (st, first) = s.post("/sync/rebuild", &token, req(None)).await;
    assert_eq!((st, &first["has_more"]), (200, &json!(true)), "{first}");

    // The operator revokes alice's default scope; a row is written after it.
    s.env
        .admin
        .batch_execute(
            "SELECT synchro.synchro_revoke_user_scope('alice', 'user:alice');
             INSERT INTO app.docs VALUES (6, 'alice', 'after the revocation');",
        )
        .await
        .unwrap();
    s.capture().await;
    for (what, body) in [
        ("the continuation", req(Some(&first["continuation"]))),
        ("a new rebuild", req(None)),
    ] {
        let (st, v) = s.post("/sync/rebuild", &token, body).await;
        assert_eq!(st, 409, "{what}: {v}");
        assert_eq!(
            v["error"]["code"],
            json!("rebuild_restart_required"),
            "{what}"
        );
        assert_eq!(v["error"]["scope_id"], json!("user:alice"), "{what}");
    }
    // The next connect takes it away.
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["scope_updates"]["removed"], json!(["user:alice"]), "{v}");
}

/// No events stream outlives its bearer token: it ends with `token_expired` once the token
/// is no longer accepted (its `exp` plus the 30 s clock-skew leeway every request gets; it
/// used to run on for its whole 5-minute lifetime). Here the token's `exp` is 27 s ago, so
/// it is accepted for about 3 s more.
#[tokio::test]
async fn an_events_stream_ends_when_its_token_expires() {
    let s = stack().await;
    let long = mint(SECRET, "alice", 3600);
    let generation = s.connect(&long, "c1").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let short =
        synchro_server::auth::mint_claims(SECRET, &json!({"sub": "alice", "exp": now - 27}));
    let opened = std::time::Instant::now();
    let mut resp = s.open_events(&short, generation).await;
    assert_eq!(resp.status(), 200);
    let mut buffer = String::new();
    assert_eq!(next_event(&mut resp, &mut buffer).await.0, "ready");
    let (name, data) = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        next_event(&mut resp, &mut buffer),
    )
    .await
    .expect("the stream outlived its token");
    assert_eq!(
        (name.as_str(), &data),
        ("end", &json!({"reason": "token_expired"}))
    );
    let after = opened.elapsed();
    assert!(
        after >= std::time::Duration::from_secs(1) && after <= std::time::Duration::from_secs(5),
        "{after:?}"
    );
}

/// Spec 003: "The server records last_acknowledged_at whenever a successful request presents
/// a newer valid scope cursor" — a connect as well as a pull (issue 38.4). A client that
/// only reconnects with its cursor is not expired as if it had been away.
#[tokio::test]
async fn a_connect_presenting_a_newer_valid_cursor_refreshes_the_acknowledgement() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let g = s.connect(&token, "c1").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'a')")
        .await
        .unwrap();
    s.capture().await;
    // One pull from a null cursor: nothing acknowledged yet.
    let (q, rebuild, _) = follow(&s, &token, "c1", g, Value::Null).await;
    assert!(!rebuild);
    s.env
        .admin
        .batch_execute(
            "UPDATE synchro.clients SET generation_started_at = now() - interval '20 days',
                    last_acknowledged_at = now() - interval '20 days' WHERE client_id = 'c1'",
        )
        .await
        .unwrap();
    let acks = || async {
        s.env
            .admin
            .query_one(
                "SELECT count(*) FROM synchro.client_scope_acks WHERE client_id = 'c1'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(acks().await, 0);
    let schema = s.schema().await;
    let (st, v) = s
        .post(
            "/sync/connect",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": g,
                   "schema": schema, "scope_cursors": {"user:alice": q}}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["client_generation"], g);
    assert_eq!(acks().await, 1, "the presented position is acknowledged");
    let age: f64 = s
        .env
        .admin
        .query_one(
            "SELECT extract(epoch FROM now() - last_acknowledged_at)::float8 FROM synchro.clients
              WHERE client_id = 'c1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(age < 60.0, "last_acknowledged_at refreshed: {age} s ago");
}

/// Spec 003 "Scope-local compaction": an active rebuild session pins the history its final
/// cursor needs (issue 38.4). Compaction runs between a session's pages, after writes that
/// came after its snapshot: the session completes, and from its final cursor the client pulls
/// exactly those writes (no rebuild loop, no change lost) and ends at the source's digest.
#[tokio::test]
async fn compaction_during_a_rebuild_session_keeps_what_its_final_cursor_needs() {
    let mut s = stack().await;
    let token = mint(SECRET, "alice", 3600);
    let g = s.connect(&token, "c1").await;
    let operator_db = s.env.login("synchro_dev_operator").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs SELECT g, 'alice', 'v1' FROM generate_series(1, 5) g")
        .await
        .unwrap();
    s.capture().await;
    let schema = s.schema().await;
    let page = |continuation: Value| {
        json!({"protocol_version": 3, "client_id": "c1", "client_generation": g, "schema": schema,
               "scope_id": "user:alice", "limit": 2, "continuation": continuation})
    };
    let (st, first) = s.post("/sync/rebuild", &token, page(Value::Null)).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["has_more"], true);
    // Writes after the session's snapshot, then a compaction pass mid-session.
    s.env
        .admin
        .batch_execute(
            "UPDATE app.docs SET title = 'v2' WHERE id = 5; INSERT INTO app.docs VALUES (6, 'alice', 'v1')",
        )
        .await
        .unwrap();
    s.capture().await;
    let c = synchro_server::retention::compact(&operator_db, 1000)
        .await
        .unwrap();
    assert!(
        c.effects_deleted > 0,
        "compaction ran, up to the session: {c:?}"
    );
    let mut continuation = first["continuation"].clone();
    let cursor = loop {
        let (st, p) = s.post("/sync/rebuild", &token, page(continuation)).await;
        assert_eq!(st, 200, "{p}");
        if p["has_more"] == false {
            break p["final_scope_cursor"].clone();
        }
        continuation = p["continuation"].clone();
    };
    let (st, v) = s
        .post(
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": g,
                   "schema": schema, "scope_cursors": {"user:alice": cursor}, "limit": 1000}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["rebuild_scopes"],
        json!([]),
        "the final cursor resumes: {v}"
    );
    assert_eq!(v["changes"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(
        v["checksums"]["user:alice"]["digest"].as_str().unwrap(),
        digest_from_source(&s, "alice").await
    );
}

/// Issue 38.3: `lineage reset --scope` (spec 003: the retention generation changes only when
/// the retention lineage itself is invalidated) stales that scope's cursors only: its client
/// rebuilds it and ends at the source's digest; another user's scope resumes untouched. A
/// dry run changes nothing; a blank or unknown scope is refused.
#[tokio::test]
async fn a_scope_lineage_reset_stales_only_that_scopes_cursors() {
    let mut s = stack().await;
    let alice = mint(SECRET, "alice", 3600);
    let bob = mint(SECRET, "bob", 3600);
    let ga = s.connect(&alice, "c1").await;
    let gb = s.connect(&bob, "c2").await;
    s.env
        .admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'a'), (2, 'bob', 'b')")
        .await
        .unwrap();
    s.capture().await;
    let schema = s.schema().await;
    let pull = |token: &str, client: &str, generation: u64, scope: &str, cursor: Value| {
        let body = json!({"protocol_version": 3, "client_id": client, "client_generation": generation,
                          "schema": schema, "scope_cursors": {scope: cursor}, "limit": 1000});
        let token = token.to_owned();
        let s = &s;
        async move { s.post("/sync/pull", &token, body).await }
    };
    let (_, a) = pull(&alice, "c1", ga, "user:alice", Value::Null).await;
    let (_, b) = pull(&bob, "c2", gb, "user:bob", Value::Null).await;
    let qa = a["scope_cursor_updates"]["user:alice"].clone();
    let qb = b["scope_cursor_updates"]["user:bob"].clone();
    let op = s.env.login("synchro_dev_operator").await;
    let reset = |scope: &'static str, dry: bool| {
        let op = &op;
        async move {
            op.query_one(
                "SELECT synchro.synchro_lineage_reset_scope($1, $2)::text",
                &[&scope, &dry],
            )
            .await
            .map(|r| serde_json::from_str::<Value>(r.get(0)).unwrap())
        }
    };
    for bad in ["", "  ", "user:nobody"] {
        let e = reset(bad, true).await.unwrap_err();
        assert_eq!(e.code().unwrap().code(), "22023", "{bad:?}");
    }
    let dry = reset("user:alice", true).await.unwrap();
    assert_eq!(dry["retention_generation"], json!({"from": 1, "to": 1}));
    assert_eq!(dry["clients_assigned"], 1);
    let (_, still) = pull(&alice, "c1", ga, "user:alice", qa.clone()).await;
    assert_eq!(
        still["rebuild_scopes"],
        json!([]),
        "a dry run changes nothing"
    );
    let done = reset("user:alice", false).await.unwrap();
    assert_eq!(done["retention_generation"], json!({"from": 1, "to": 2}));
    let (_, a) = pull(&alice, "c1", ga, "user:alice", qa).await;
    assert_eq!(a["rebuild_scopes"], json!(["user:alice"]), "{a}");
    let (_, b) = pull(&bob, "c2", gb, "user:bob", qb).await;
    assert_eq!(b["rebuild_scopes"], json!([]), "another scope resumes: {b}");
    let (cursor, checksum) = rebuild_scope(&s, &alice, "c1", ga).await;
    assert_eq!(checksum, digest_from_source(&s, "alice").await);
    let (_, a) = pull(&alice, "c1", ga, "user:alice", cursor).await;
    assert_eq!(
        a["rebuild_scopes"],
        json!([]),
        "the rebuilt cursor resumes: {a}"
    );
}
