//! POST /sync/push through the real server binary on real PostgreSQL: compare-and-swap
//! writes to the application table with row-bearing outcomes, conflicts instead of lost
//! updates (also between two concurrent clients), exact replay of a completed batch (also
//! after the client generation changed) without a second write, the schema and generation
//! gates, every strict limit's 400, authorization by the row's scopes before and after the
//! write, value and writability checks, and authored-schema compatibility after Class 2
//! and Class 4 changes.

mod common;

use common::{free_port, start_server, wait_ready, Env, Server};
use serde_json::{json, Value};
use synchro_protocol::digest::row_digest;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_server::auth::mint;
use synchro_server::publish::{load_lineage, publish};
use synchro_server::registry::{register, RegisterRequest};

const SECRET: &str = "push-api-secret-0123456789abcdefg";

struct Stack {
    env: Env,
    base: String,
    http: reqwest::Client,
    _server: Server,
}

struct Session {
    token: String,
    client: String,
    generation: u64,
    schema: Value,
}

impl Stack {
    async fn start() -> Stack {
        let d = common::docs_server(
            "INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one'), (2, 'bob', 'blue', 'two'), (3, 'bob', 'red', 'three')",
            SECRET,
        )
        .await;
        Stack {
            env: d.env,
            base: d.base,
            http: d.http,
            _server: d.server,
        }
    }

    async fn post(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(token, path, body.to_string()).await
    }

    async fn post_raw(&self, token: &str, path: &str, body: String) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    async fn session(&self, user: &str, client: &str) -> Session {
        let token = mint(SECRET.as_bytes(), user, 3600);
        let (st, v) = self
            .post(
                &token,
                "/sync/connect",
                &json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        Session {
            token,
            client: client.into(),
            generation: v["client_generation"].as_u64().unwrap(),
            schema: json!({"version": v["schema"]["version"], "hash": v["schema"]["hash"]}),
        }
    }

    async fn manifest(&self) -> Manifest {
        let db = self.env.login("synchro_dev_adapter").await;
        load_lineage(&db).await.unwrap().current().unwrap().clone()
    }

    async fn push(&self, s: &Session, batch: &str, mutations: Vec<Value>) -> (u16, Value) {
        self.post(
            &s.token,
            "/sync/push",
            &json!({"protocol_version": 3, "client_id": s.client, "client_generation": s.generation,
                    "schema": s.schema, "batch_id": batch, "mutations": mutations}),
        )
        .await
    }

    async fn source(&self, id: i64) -> Option<(String, String, Option<String>, i64)> {
        self.env
            .admin
            .query_opt(
                "SELECT d.owner, d.team, d.title, coalesce(v.version, 0)
                   FROM app.docs d LEFT JOIN synchro.source_versions v ON v.pk = d.id::text
                  WHERE d.id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    }

    /// The current server version of a row as pull would report it (the projection's when
    /// the row has not been written since bootstrap).
    async fn version(&self, id: i64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(r) = self
                .env
                .admin
                .query_opt(
                    "SELECT server_version FROM synchro.projection_rows WHERE pk = $1",
                    &[&format!("\"{id}\"")],
                )
                .await
                .unwrap()
            {
                return r.get(0);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "row {id} never captured"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

fn field(m: &Manifest, name: &str) -> String {
    m.tables[0]
        .fields
        .iter()
        .find(|f| f.name == name)
        .unwrap()
        .field_id
        .clone()
}

fn mutation(
    m: &Manifest,
    id: &str,
    op: &str,
    pk: i64,
    base: Option<&str>,
    columns: &[(&str, Value)],
) -> Value {
    json!({
        "mutation_id": id, "table_id": m.tables[0].table_id, "pk": pk.to_string(), "operation": op,
        "base_version": base, "client_version": 1, "local_order": 1,
        "columns": columns.iter().map(|(f, v)| json!({"field_id": field(m, f), "value": v})).collect::<Vec<_>>(),
        "authored_schema": {"version": m.schema_version, "hash": m.schema_hash_hex()},
    })
}

/// Checks a row-bearing outcome's checksum against its row, independently of the server.
fn verify_row(m: &Manifest, pk: i64, o: &Value) {
    let d = row_digest(
        m,
        &m.tables[0].table_id,
        &Json::String(pk.to_string()),
        &Json::parse(&o["row"].to_string()).unwrap(),
        o["server_version"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(
        o["row_checksum"]["digest"].as_str().unwrap(),
        hex::encode(d.digest),
        "{o}"
    );
}

/// Long on purpose: each outcome and gate in turn, on the rows and batches the steps before
/// wrote.
#[tokio::test]
async fn compare_and_swap_outcomes_replay_and_gates() {
    let s = Stack::start().await;
    let m = s.manifest().await;
    let alice = s.session("alice", "c1").await;

    // Insert, then update from its version: both applied, row-bearing, in the source.
    let (st, v) = s
        .push(
            &alice,
            "b1",
            vec![mutation(
                &m,
                "m1",
                "insert",
                100,
                None,
                &[
                    ("owner", json!("alice")),
                    ("team", json!("red")),
                    ("title", json!("new")),
                ],
            )],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let o = &v["outcomes"][0];
    assert_eq!(
        (o["mutation_id"].as_str(), o["status"].as_str()),
        (Some("m1"), Some("applied")),
        "{v}"
    );
    verify_row(&m, 100, o);
    let v1 = o["server_version"].as_str().unwrap().to_owned();
    let (owner, team, title, version) = s.source(100).await.unwrap();
    assert_eq!(
        (
            owner.as_str(),
            team.as_str(),
            title.as_deref(),
            version.to_string()
        ),
        ("alice", "red", Some("new"), v1.clone())
    );
    let (_, v) = s
        .push(
            &alice,
            "b2",
            vec![mutation(
                &m,
                "m2",
                "update",
                100,
                Some(&v1),
                &[("title", json!("edited"))],
            )],
        )
        .await;
    let o = &v["outcomes"][0];
    assert_eq!(o["status"], "applied", "{v}");
    verify_row(&m, 100, o);
    let v2 = o["server_version"].as_str().unwrap().to_owned();
    assert_ne!(v1, v2);

    // A stale base version: a conflict carrying the current row, nothing overwritten.
    let stale = vec![mutation(
        &m,
        "m3",
        "update",
        100,
        Some(&v1),
        &[("title", json!("lost?"))],
    )];
    let (_, v) = s.push(&alice, "b3", stale.clone()).await;
    let o = &v["outcomes"][0];
    assert_eq!(
        (o["status"].as_str(), o["code"].as_str()),
        (Some("conflict"), Some("version_conflict")),
        "{v}"
    );
    assert_eq!(o["server_version"].as_str(), Some(v2.as_str()));
    verify_row(&m, 100, o);
    assert_eq!(s.source(100).await.unwrap().2.as_deref(), Some("edited"));

    // Exact replay of a completed batch: the stored outcomes, no second write.
    let before = s.source(100).await;
    let (st, again) = s
        .push(
            &alice,
            "b2",
            vec![mutation(
                &m,
                "m2",
                "update",
                100,
                Some(&v1),
                &[("title", json!("edited"))],
            )],
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(
        again["outcomes"][0]["server_version"].as_str(),
        Some(v2.as_str())
    );
    assert_eq!(s.source(100).await, before, "no second write");
    // The same batch ID with different content is refused.
    let (st, e) = s.push(&alice, "b2", stale.clone()).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    // A mutation ID already executed returns its stored outcome in a new batch.
    let (_, v) = s.push(&alice, "b4", stale.clone()).await;
    assert_eq!(v["outcomes"][0]["status"], "conflict");

    // A new generation: the old batch still replays; new work with the old generation is 409.
    let (st, renewed) = s
        .post(
            &alice.token,
            "/sync/connect",
            &json!({"protocol_version": 3, "client_id": "c1", "client_generation": alice.generation + 100, "schema": alice.schema}),
        )
        .await;
    assert_eq!(st, 200, "{renewed}");
    assert_ne!(
        renewed["client_generation"].as_u64(),
        Some(alice.generation)
    );
    let (st, replay) = s
        .push(
            &alice,
            "b2",
            vec![mutation(
                &m,
                "m2",
                "update",
                100,
                Some(&v1),
                &[("title", json!("edited"))],
            )],
        )
        .await;
    assert_eq!((st, replay.clone()), (200, again.clone()));
    let (st, e) = s
        .push(
            &alice,
            "b5",
            vec![mutation(&m, "m5", "delete", 100, Some(&v2), &[])],
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("client_generation_expired")),
        "{e}"
    );
    // So is new work without a generation (it used to be 400).
    let (st, e) = s
        .post(
            &alice.token,
            "/sync/push",
            &json!({"protocol_version": 3, "client_id": alice.client, "schema": alice.schema,
                    "batch_id": "b6", "mutations": [mutation(&m, "m6", "delete", 100, Some(&v2), &[])]}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("client_generation_expired")),
        "{e}"
    );
    let alice = Session {
        generation: renewed["client_generation"].as_u64().unwrap(),
        ..alice
    };
    // Schema gate.
    let wrong = Session {
        token: alice.token.clone(),
        client: alice.client.clone(),
        generation: alice.generation,
        schema: json!({"version": 1, "hash": "00".repeat(32)}),
    };
    let (st, e) = s
        .push(
            &wrong,
            "b6",
            vec![mutation(&m, "m6", "delete", 100, Some(&v2), &[])],
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("schema_mismatch")),
        "{e}"
    );
    assert!(e["error"]["current_schema"].is_object());

    // Values and writability.
    let (_, v) = s
        .push(
            &alice,
            "b7",
            vec![
                mutation(&m, "m7", "update", 100, Some(&v2), &[("title", json!(5))]),
                mutation(&m, "m8", "update", 100, Some(&v2), &[("id", json!("7"))]),
                mutation(&m, "m9", "insert", 101, None, &[("team", json!("red"))]),
            ],
        )
        .await;
    let codes: Vec<&str> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["invalid_value", "not_writable", "constraint_violation"],
        "{v}"
    );
    assert!(
        v.to_string().find("\"7\"").is_none(),
        "no values in outcomes"
    );

    // Authorization by the row's scopes, before and after.
    let (_, v) = s
        .push(
            &alice,
            "b8",
            vec![
                // Bob's row in no scope of alice's.
                mutation(
                    &m,
                    "m10",
                    "update",
                    2,
                    Some(&s.version(2).await),
                    &[("title", json!("mine"))],
                ),
                // A new row that would land outside her scopes.
                mutation(
                    &m,
                    "m11",
                    "insert",
                    102,
                    None,
                    &[("owner", json!("bob")), ("team", json!("blue"))],
                ),
                // Moving her row out of her scopes.
                mutation(
                    &m,
                    "m12",
                    "update",
                    100,
                    Some(&v2),
                    &[("owner", json!("bob"))],
                ),
                // Bob's row in team:red, which alice has: allowed.
                mutation(
                    &m,
                    "m13",
                    "update",
                    3,
                    Some(&s.version(3).await),
                    &[("title", json!("by alice"))],
                ),
            ],
        )
        .await;
    let statuses: Vec<(&str, Option<&str>)> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["status"].as_str().unwrap(), o["code"].as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            // Bob's row is invisible to alice: answered like a missing row.
            ("conflict", Some("version_conflict")),
            ("rejected_terminal", Some("forbidden")),
            ("rejected_terminal", Some("forbidden")),
            ("applied", None)
        ],
        "{v}"
    );
    assert!(
        v["outcomes"][0].get("row").is_none(),
        "nothing of a forbidden row is revealed"
    );
    assert_eq!(s.source(2).await.unwrap().2.as_deref(), Some("two"));
    assert!(s.source(102).await.is_none());
    assert_eq!(s.source(100).await.unwrap().0, "alice");
    assert_eq!(s.source(3).await.unwrap().2.as_deref(), Some("by alice"));
}

#[tokio::test]
async fn every_limit_is_a_400_before_any_work() {
    let s = Stack::start().await;
    let m = s.manifest().await;
    let alice = s.session("alice", "c1").await;
    let one = |id: &str| {
        mutation(
            &m,
            id,
            "insert",
            500,
            None,
            &[("owner", json!("alice")), ("team", json!("red"))],
        )
    };
    let many: Vec<Value> = (0..1001).map(|i| one(&format!("m{i}"))).collect();
    let wide: Vec<(&str, Value)> = (0..257).map(|_| ("title", json!("x"))).collect();
    let mut wide_m = one("w");
    wide_m["columns"] = json!(wide
        .iter()
        .enumerate()
        .map(|(i, (_, v))| json!({"field_id": format!("f{i}"), "value": v}))
        .collect::<Vec<_>>());
    let mut big = one("big");
    big["columns"][0]["value"] = json!("x".repeat(70_000));
    for (what, mutations) in [
        ("no mutations", vec![]),
        ("1001 mutations", many),
        ("257 columns", vec![wide_m]),
        ("a 70 kB mutation", vec![big]),
    ] {
        let (st, e) = s.push(&alice, "limits", mutations).await;
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{what}"
        );
    }
    // A body over 1 MiB.
    let body = json!({"protocol_version": 3, "client_id": "c1", "client_generation": alice.generation,
                      "schema": alice.schema, "batch_id": "huge", "mutations": [one("h")], "pad": "x".repeat(1_100_000)});
    let (st, e) = s
        .post_raw(&alice.token, "/sync/push", body.to_string())
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert!(s.source(500).await.is_none(), "nothing written");
    let batches: i64 = s
        .env
        .admin
        .query_one("SELECT count(*) FROM synchro.push_batches", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(batches, 0);
}

#[tokio::test]
async fn two_clients_editing_one_row_concurrently_lose_no_update() {
    let s = Stack::start().await;
    let m = s.manifest().await;
    let a = s.session("alice", "phone").await;
    let b = s.session("alice", "laptop").await;
    let base = s.version(1).await;
    for round in 0..5 {
        let base = if round == 0 {
            base.clone()
        } else {
            s.source(1).await.unwrap().3.to_string()
        };
        let (batch_a, batch_b) = (format!("a{round}"), format!("b{round}"));
        let (ra, rb) = tokio::join!(
            s.push(
                &a,
                &batch_a,
                vec![mutation(
                    &m,
                    &format!("a{round}"),
                    "update",
                    1,
                    Some(&base),
                    &[("title", json!(format!("phone {round}")))]
                )]
            ),
            s.push(
                &b,
                &batch_b,
                vec![mutation(
                    &m,
                    &format!("b{round}"),
                    "update",
                    1,
                    Some(&base),
                    &[("title", json!(format!("laptop {round}")))]
                )]
            ),
        );
        let statuses = [
            ra.1["outcomes"][0]["status"].clone(),
            rb.1["outcomes"][0]["status"].clone(),
        ];
        let applied = statuses.iter().filter(|x| *x == "applied").count();
        let conflicts = statuses.iter().filter(|x| *x == "conflict").count();
        assert_eq!((applied, conflicts), (1, 1), "round {round}: {ra:?} {rb:?}");
        let winner = if statuses[0] == "applied" {
            format!("phone {round}")
        } else {
            format!("laptop {round}")
        };
        assert_eq!(
            s.source(1).await.unwrap().2,
            Some(winner),
            "the applied write is the row"
        );
    }
}

#[tokio::test]
async fn authored_schema_after_class_2_applies_and_after_class_4_is_incompatible() {
    let s = Stack::start().await;
    let v1 = s.manifest().await;
    let alice = s.session("alice", "c1").await;
    let base = s.version(1).await;
    // Intent authored under v1, pushed after a Class 2 change (a new empty table).
    s.env
        .as_app_owner("CREATE TABLE app.tags (id text PRIMARY KEY)")
        .await;
    let mut op = s.env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "tags", "multi_scope"))
        .await
        .unwrap();
    publish(&mut op).await.unwrap();
    let v2 = s.manifest().await;
    assert_eq!(v2.schema_version, 2);
    let current = Session {
        schema: json!({"version": 2, "hash": v2.schema_hash_hex()}),
        ..alice
    };
    let authored_v1 = mutation(
        &v1,
        "m1",
        "update",
        1,
        Some(&base),
        &[("title", json!("offline"))],
    );
    let (st, v) = s.push(&current, "b1", vec![authored_v1]).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcomes"][0]["status"], "applied", "{v}");
    assert_eq!(s.source(1).await.unwrap().2.as_deref(), Some("offline"));

    // A Class 4 manifest without `title`: intent authored under v1 that writes it is
    // schema_incompatible, naming only the field.
    let mut body: Value = serde_json::from_str(&v2.canonical_body()).unwrap();
    body["schema_version"] = json!(3);
    body["parent_schema"] = json!({"version": 2, "hash": v2.schema_hash_hex()});
    body["transition_class"] = json!("class_4");
    body["compatibility_floor"] = json!(3);
    for t in body["tables"].as_array_mut().unwrap() {
        if t["name"] == "docs" {
            t["fields"]
                .as_array_mut()
                .unwrap()
                .retain(|f| f["name"] != "title");
        }
    }
    let v3 = Manifest::parse(&body.to_string()).unwrap();
    op.execute(
        "SELECT synchro.synchro_insert_manifest(3, $1, $2, 2, $3, 'class_4', 3)",
        &[
            &v3.schema_hash_hex(),
            &v3.canonical_body(),
            &v2.schema_hash_hex(),
        ],
    )
    .await
    .unwrap();
    let current = Session {
        schema: json!({"version": 3, "hash": v3.schema_hash_hex()}),
        ..current
    };
    let new_base = s.source(1).await.unwrap().3.to_string();
    let m = mutation(
        &v1,
        "m2",
        "update",
        1,
        Some(&new_base),
        &[("title", json!("secret text")), ("owner", json!("alice"))],
    );
    let (st, v) = s.push(&current, "b2", vec![m]).await;
    assert_eq!(st, 200, "{v}");
    let o = &v["outcomes"][0];
    assert_eq!(
        (
            o["status"].as_str(),
            o["code"].as_str(),
            o["retryable"].as_bool()
        ),
        (
            Some("rejected_terminal"),
            Some("schema_incompatible"),
            Some(false)
        ),
        "{v}"
    );
    assert_eq!(o["incompatible_field_ids"], json!([field(&v1, "title")]));
    assert_eq!(o["authored_schema"]["version"], 1);
    assert_eq!(o["current_schema"]["version"], 3);
    assert!(
        !v.to_string().contains("secret text"),
        "no values in the outcome"
    );
    assert_eq!(
        s.source(1).await.unwrap().2.as_deref(),
        Some("offline"),
        "nothing written"
    );
}

/// A pushed row of every portable type: the applied outcome's row is exactly the row capture
/// later materializes (same canonical values, same version, same checksum), so a pushing
/// client and every other client verify the same state.
#[tokio::test]
async fn an_applied_row_equals_the_row_capture_materializes() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.kinds (id int PRIMARY KEY, n int, big bigint, s text, f float8, b bool,
                                 d numeric(12, 3), at timestamptz, day date, clock time, j jsonb, raw bytea)",
    )
    .await;
    common::register_with_rule(
        &env,
        "kinds",
        "CREATE FUNCTION rules.kind_scopes(p_id integer) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'shared' FROM synchro_projection.\"app.kinds\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.kind_scopes(integer) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.kind_scopes(integer) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'kinds', 'rules.kind_scopes(integer)');
         SELECT synchro.synchro_add_shared_scope('shared');",
    )
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = start_server(&env, port, SECRET);
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;
    let s = Stack {
        env,
        base,
        http,
        _server,
    };
    let session = s.session("carol", "c1").await;
    let m = s.manifest().await;
    let t = &m.tables[0];
    let id = |name: &str| {
        t.fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .field_id
            .clone()
    };
    let columns = json!([
        {"field_id": id("n"), "value": -7},
        {"field_id": id("big"), "value": "9007199254740993"},
        {"field_id": id("s"), "value": "ünï"},
        {"field_id": id("f"), "value": 0.1},
        {"field_id": id("b"), "value": true},
        {"field_id": id("d"), "value": "12.5"},
        {"field_id": id("at"), "value": "2026-11-30T12:34:56.123456Z"},
        {"field_id": id("day"), "value": "2026-11-30"},
        {"field_id": id("clock"), "value": "23:59:59.000001"},
        {"field_id": id("j"), "value": "{\"a\":[1,2]}"},
        {"field_id": id("raw"), "value": "AP8"},
    ]);
    let (st, v) = s
        .post(
            &session.token,
            "/sync/push",
            &json!({"protocol_version": 3, "client_id": "c1", "client_generation": session.generation,
                    "schema": session.schema, "batch_id": "b1", "mutations": [{
                        "mutation_id": "m1", "table_id": t.table_id, "pk": 1, "operation": "insert",
                        "base_version": null, "client_version": 1, "local_order": 1, "columns": columns,
                        "authored_schema": {"version": m.schema_version, "hash": m.schema_hash_hex()}}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let o = &v["outcomes"][0];
    assert_eq!(o["status"], "applied", "{v}");
    // Wait for capture, then compare with the projection's row and version.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (row, version): (String, String) = loop {
        if let Some(r) = s
            .env
            .admin
            .query_opt(
                "SELECT row_json, server_version FROM synchro.projection_rows WHERE pk = '1'",
                &[],
            )
            .await
            .unwrap()
        {
            break (r.get(0), r.get(1));
        }
        assert!(std::time::Instant::now() < deadline, "never captured");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(o["server_version"].as_str(), Some(version.as_str()));
    let captured: Value = serde_json::from_str(&row).unwrap();
    assert_eq!(o["row"], captured, "the outcome's row is the captured row");
    let d = row_digest(
        &m,
        &t.table_id,
        &Json::Number("1".into()),
        &Json::parse(&row).unwrap(),
        &version,
    )
    .unwrap();
    assert_eq!(
        o["row_checksum"]["digest"].as_str(),
        Some(hex::encode(d.digest).as_str())
    );
}

/// Issue 12.6: a write may not add the row to a scope the user does not hold, even when
/// another of the row's scopes is theirs; and an invisible row is answered exactly like a
/// missing one.
#[tokio::test]
async fn a_write_never_adds_a_foreign_scope_nor_reveals_an_invisible_row() {
    let s = Stack::start().await;
    let m = s.manifest().await;
    // Rows: 1 (alice, red), 2 (bob, blue), 3 (bob, red); alice holds user:alice, team:red.
    let alice = s.session("alice", "c1").await;
    let (v1, v2, v3) = (s.version(1).await, s.version(2).await, s.version(3).await);
    let (st, v) = s
        .push(
            &alice,
            "b1",
            vec![
                // A new row in team:red (hers) and user:bob (not hers).
                mutation(
                    &m,
                    "m1",
                    "insert",
                    200,
                    None,
                    &[("owner", json!("bob")), ("team", json!("red"))],
                ),
                // Bob's team:red row handed to carol: adds user:carol.
                mutation(
                    &m,
                    "m2",
                    "update",
                    3,
                    Some(&v3),
                    &[("owner", json!("carol"))],
                ),
                // Her own row moved into team:blue, which she does not hold.
                mutation(&m, "m3", "update", 1, Some(&v1), &[("team", json!("blue"))]),
                // Changing only the title of bob's team:red row adds no scope: allowed.
                mutation(
                    &m,
                    "m4",
                    "update",
                    3,
                    Some(&v3),
                    &[("title", json!("edited"))],
                ),
                // A new row entirely in her scopes: allowed.
                mutation(
                    &m,
                    "m5",
                    "insert",
                    201,
                    None,
                    &[("owner", json!("alice")), ("team", json!("red"))],
                ),
            ],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let codes: Vec<(&str, Option<&str>)> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["status"].as_str().unwrap(), o["code"].as_str()))
        .collect();
    assert_eq!(
        codes,
        [
            ("rejected_terminal", Some("forbidden")),
            ("rejected_terminal", Some("forbidden")),
            ("rejected_terminal", Some("forbidden")),
            ("applied", None),
            ("applied", None)
        ],
        "{v}"
    );
    assert!(s.source(200).await.is_none());
    assert_eq!(s.source(3).await.unwrap().0, "bob");
    assert_eq!(s.source(1).await.unwrap().1, "red");
    // Bob never sees a row alice tried to put into his scope.
    let bob = s.session("bob", "c2").await;
    let (st, pulled) = s
        .post(
            &bob.token,
            "/sync/pull",
            &json!({"protocol_version": 3, "client_id": "c2", "client_generation": bob.generation,
                    "schema": bob.schema, "scope_cursors": {"user:bob": null}, "limit": 1000}),
        )
        .await;
    assert_eq!(st, 200, "{pulled}");
    assert!(
        !pulled["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["pk"] == json!("200")),
        "{pulled}"
    );

    // Bob's user:bob/team:blue row 2 is invisible to alice; row 999 does not exist. Every
    // write to either is answered the same, whatever base version is presented.
    let (st, v) = s
        .push(
            &alice,
            "b2",
            vec![
                mutation(&m, "n1", "update", 2, Some(&v2), &[("title", json!("x"))]),
                mutation(&m, "n2", "update", 999, Some(&v2), &[("title", json!("x"))]),
                mutation(&m, "n3", "update", 2, Some("1"), &[("title", json!("x"))]),
                mutation(&m, "n4", "update", 999, Some("1"), &[("title", json!("x"))]),
                mutation(&m, "n5", "delete", 2, Some(&v2), &[]),
                mutation(&m, "n6", "delete", 999, Some(&v2), &[]),
            ],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let mut shapes: Vec<Value> = v["outcomes"].as_array().unwrap().clone();
    for o in &mut shapes {
        o.as_object_mut().unwrap().remove("mutation_id");
    }
    assert!(
        shapes.iter().all(|o| *o == shapes[0]),
        "invisible and missing rows must be indistinguishable: {v}"
    );
    assert_eq!(shapes[0]["status"], "conflict", "{v}");
    assert!(shapes[0].get("row").is_none() && shapes[0].get("server_version").is_none());
    assert_eq!(s.source(2).await.unwrap().2.as_deref(), Some("two"));
    // An insert over an invisible key cannot apply, and reveals nothing of the row.
    let (st, v) = s
        .push(
            &alice,
            "b3",
            vec![mutation(
                &m,
                "i1",
                "insert",
                2,
                None,
                &[("owner", json!("alice")), ("team", json!("red"))],
            )],
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let mut o = v["outcomes"][0].clone();
    o.as_object_mut().unwrap().remove("mutation_id");
    assert_eq!(o, shapes[0], "{v}");
}

/// An outcome with the row's fields by name and without what differs between two clusters
/// (versions, checksums), for comparing runs.
fn comparable(m: &Manifest, o: &Value) -> Value {
    let names: std::collections::HashMap<&str, &str> = m.tables[0]
        .fields
        .iter()
        .map(|f| (f.field_id.as_str(), f.name.as_str()))
        .collect();
    let mut o = o.clone();
    let members = o.as_object_mut().unwrap();
    members.remove("server_version");
    members.remove("row_checksum");
    if let Some(Value::Object(row)) = members.get_mut("row") {
        *row = row
            .iter()
            .map(|(k, v)| (names[k.as_str()].to_owned(), v.clone()))
            .collect();
    }
    o
}

/// Issue 15.5: a batch mixing allowed, forbidden, invisible, conflicting and missing rows
/// (and a forbidden write that a later mutation of the same row depends on being undone),
/// authorized in one evaluation, gets exactly the outcomes, and leaves exactly the rows, of
/// the same mutations pushed one by one.
#[tokio::test]
async fn a_mixed_batch_equals_its_mutations_pushed_one_by_one() {
    // Rows: 1 (alice, red), 2 (bob, blue), 3 (bob, red); alice holds user:alice, team:red.
    async fn mutations(s: &Stack) -> (Manifest, Vec<Value>) {
        let m = s.manifest().await;
        let (v1, v2, v3) = (s.version(1).await, s.version(2).await, s.version(3).await);
        let ms = vec![
            // Allowed.
            mutation(&m, "a1", "update", 1, Some(&v1), &[("title", json!("x"))]),
            // Invisible: like a missing row.
            mutation(&m, "a2", "update", 2, Some(&v2), &[("title", json!("y"))]),
            // Forbidden (adds user:carol), so undone...
            mutation(
                &m,
                "a3",
                "update",
                3,
                Some(&v3),
                &[("owner", json!("carol"))],
            ),
            // ...which is why this one, from the same base, applies.
            mutation(&m, "a4", "update", 3, Some(&v3), &[("title", json!("z"))]),
            // A new row its author could not see: forbidden.
            mutation(
                &m,
                "a5",
                "insert",
                300,
                None,
                &[("owner", json!("bob")), ("team", json!("blue"))],
            ),
            // A new row in her scopes: allowed.
            mutation(
                &m,
                "a6",
                "insert",
                301,
                None,
                &[("owner", json!("alice")), ("team", json!("red"))],
            ),
            // A stale base (a1 moved row 1 on): a conflict carrying the visible row.
            mutation(&m, "a7", "update", 1, Some(&v1), &[("title", json!("w"))]),
            // A missing row.
            mutation(&m, "a8", "delete", 999, Some(&v1), &[]),
            // Stale after a4: a conflict carrying row 3 as a4 left it.
            mutation(&m, "a9", "update", 3, Some(&v3), &[("team", json!("blue"))]),
        ];
        (m, ms)
    }
    let batched = Stack::start().await;
    let (m_batched, ms) = mutations(&batched).await;
    let alice = batched.session("alice", "c1").await;
    let (st, v) = batched.push(&alice, "b1", ms).await;
    assert_eq!(st, 200, "{v}");
    let batch_outcomes: Vec<Value> = v["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| comparable(&m_batched, o))
        .collect();

    let single = Stack::start().await;
    let (m_single, ms) = mutations(&single).await;
    let alice = single.session("alice", "c1").await;
    let mut single_outcomes = Vec::new();
    for (i, mutation) in ms.into_iter().enumerate() {
        let (st, v) = single.push(&alice, &format!("s{i}"), vec![mutation]).await;
        assert_eq!(st, 200, "{v}");
        single_outcomes.push(comparable(&m_single, &v["outcomes"][0]));
    }
    assert_eq!(batch_outcomes, single_outcomes);
    let statuses: Vec<(&str, Option<&str>)> = batch_outcomes
        .iter()
        .map(|o| (o["status"].as_str().unwrap(), o["code"].as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("applied", None),
            ("conflict", Some("version_conflict")),
            ("rejected_terminal", Some("forbidden")),
            ("applied", None),
            ("rejected_terminal", Some("forbidden")),
            ("applied", None),
            ("conflict", Some("version_conflict")),
            ("conflict", Some("version_conflict")),
            ("conflict", Some("version_conflict")),
        ],
        "{batch_outcomes:?}"
    );
    for id in [1, 2, 3, 300, 301] {
        let (a, b) = (batched.source(id).await, single.source(id).await);
        assert_eq!(
            a.map(|r| (r.0, r.1, r.2)),
            b.map(|r| (r.0, r.1, r.2)),
            "row {id}"
        );
    }
}

/// A push that cannot get a database connection within `push_pool_wait` (every pooled
/// connection busy) is refused at once with the typed answer, 503 `temporary_unavailable`,
/// reason `push_busy` and `Retry-After`, having written nothing; never left waiting.
#[tokio::test]
async fn an_exhausted_pool_is_a_typed_503_never_a_hang() {
    use std::sync::Arc;
    use synchro_server::api::{router, AppState, Config, ConnectionPool};
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one')",
    )
    .await;
    tokio::spawn(synchro_server::capture::worker::run_forever(
        env.cluster.url("synchro_dev_worker", "app"),
        std::time::Duration::from_millis(25),
    ));
    let state = Arc::new(AppState {
        db: env.login("synchro_dev_adapter").await.into(),
        snapshot_db: ConnectionPool::new(vec![env.login("synchro_dev_adapter").await]),
        auth: synchro_server::auth::Authenticator::hs256(SECRET.as_bytes()).unwrap(),
        cursor_keys: synchro_protocol::token::Keyring::new("k1", &[3; 32]).unwrap(),
        config: Config {
            push_pool_wait: std::time::Duration::from_millis(300),
            ..Config::default()
        },
        events: Default::default(),
        membership_db: Some(ConnectionPool::new(vec![
            env.login("synchro_dev_adapter").await,
        ])),
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let s = Stack {
        env,
        base,
        http: reqwest::Client::new(),
        _server: Server::from(std::process::Command::new("true").spawn().unwrap()),
    };
    let m = s.manifest().await;
    let alice = s.session("alice", "c1").await;
    let v1 = s.version(1).await;
    let write = || {
        vec![mutation(
            &m,
            "p1",
            "update",
            1,
            Some(&v1),
            &[("title", json!("busy"))],
        )]
    };
    let refused = |st: u16, v: &Value| {
        assert_eq!(st, 503, "{v}");
        assert_eq!(v["error"]["code"], "temporary_unavailable", "{v}");
        assert_eq!(v["error"]["reason"], "push_busy", "{v}");
        assert_eq!(v["error"]["retryable"], true, "{v}");
    };
    for pool in [&state.snapshot_db, state.membership_db.as_ref().unwrap()] {
        let held = pool.lock().await;
        let started = std::time::Instant::now();
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            s.http
                .post(format!("{}/sync/push", s.base))
                .header("authorization", format!("Bearer {}", alice.token))
                .body(
                    json!({"protocol_version": 3, "client_id": alice.client,
                           "client_generation": alice.generation, "schema": alice.schema,
                           "batch_id": "b1", "mutations": write()})
                    .to_string(),
                )
                .send(),
        )
        .await
        .expect("a busy pool never leaves a push waiting")
        .unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(r.headers()["retry-after"], "2");
        let st = r.status().as_u16();
        refused(st, &r.json().await.unwrap());
        drop(held);
        assert_eq!(s.source(1).await.unwrap().2.as_deref(), Some("one"));
    }
    // With connections free again, the same batch executes (nothing was recorded).
    let (st, v) = s.push(&alice, "b1", write()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["outcomes"][0]["status"], "applied", "{v}");
}

/// One batch sent several times at once (a client retrying over a flaky network): exactly
/// one request executes it, every answer is its outcomes, the row is written once, and the
/// race leaves nothing in PostgreSQL's log (it used to log the unique violation with the
/// user and client IDs in its `Key (...)=(...)` detail, and answer 503).
#[tokio::test]
async fn one_batch_sent_several_times_at_once_executes_once_and_logs_nothing() {
    let s = Stack::start().await;
    let m = s.manifest().await;
    let a = s.session("alice", "phone").await;
    for round in 0..5 {
        let written = s.source(1).await.unwrap().3;
        // The first write's base is the captured version; later ones, the written one.
        let base = if round == 0 {
            s.version(1).await
        } else {
            written.to_string()
        };
        let batch = format!("dup{round}");
        let m1 = mutation(
            &m,
            &format!("dup{round}"),
            "update",
            1,
            Some(&base),
            &[("title", json!(format!("once {round}")))],
        );
        let answers =
            futures_util::future::join_all((0..6).map(|_| s.push(&a, &batch, vec![m1.clone()])))
                .await;
        for (status, body) in &answers {
            assert_eq!(*status, 200, "round {round}: {body}");
            assert_eq!(body, &answers[0].1, "round {round}: one answer");
        }
        assert_eq!(answers[0].1["outcomes"][0]["status"], json!("applied"));
        assert_eq!(s.source(1).await.unwrap().3, written + 1, "written once");
    }
    let log = s.env.cluster.server_log().unwrap();
    assert!(
        !log.contains("duplicate key") && !log.contains("alice"),
        "{log}"
    );
}

/// A write whose row the table's membership rule fails on (here it divides by zero for one
/// title) is refused for good, as a CHECK constraint would refuse it, and the batch's other
/// writes apply (the whole batch used to answer 503 for ever, holding the client's queue).
#[tokio::test]
async fn a_write_its_tables_rule_fails_on_is_refused_and_the_rest_of_the_batch_applies() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text NOT NULL, title text);
         INSERT INTO app.docs VALUES (1, 'alice', 'red', 'one'), (2, 'alice', 'red', 'two');",
    )
    .await;
    common::register_with_rule(
        &env,
        "docs",
        "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'user:' || owner
                  || CASE WHEN title = 'boom' THEN (length(title) / (length(title) - 4))::text ELSE '' END
             FROM synchro_projection.\"app.docs\" WHERE id = p_id;
         END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');",
    )
    .await;
    let port = free_port();
    let server = start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;
    let s = Stack {
        env,
        base,
        http,
        _server: server,
    };
    let m = s.manifest().await;
    let a = s.session("alice", "phone").await;
    let (v1, v2) = (s.version(1).await, s.version(2).await);
    let batch = vec![
        mutation(
            &m,
            "boom",
            "update",
            1,
            Some(&v1),
            &[("title", json!("boom"))],
        ),
        mutation(
            &m,
            "fine",
            "update",
            2,
            Some(&v2),
            &[("title", json!("fine"))],
        ),
    ];
    let (st, body) = s.push(&a, "b1", batch.clone()).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        body["outcomes"][0]["status"],
        json!("rejected_terminal"),
        "{body}"
    );
    assert_eq!(
        body["outcomes"][0]["code"],
        json!("constraint_violation"),
        "{body}"
    );
    assert_eq!(body["outcomes"][1]["status"], json!("applied"), "{body}");
    assert_eq!(s.source(1).await.unwrap().2.as_deref(), Some("one"));
    assert_eq!(s.source(2).await.unwrap().2.as_deref(), Some("fine"));
    // The answer is final: the same batch again is its exact replay.
    assert_eq!(s.push(&a, "b1", batch).await, (200, body));
}
