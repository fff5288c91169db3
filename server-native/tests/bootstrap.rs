//! Bootstrap of rows that existed before capture: a relation with rows written before the
//! slot existed, and written to concurrently while it is copied, ends with a projection and
//! membership equal to the source, each change applied once (no regression to an older
//! state, no lost write).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::Env;
use synchro_protocol::json::Json;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};

async fn register_docs(env: &Env) {
    let op = env.login("synchro_dev_operator").await;
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
         BEGIN ATOMIC
           SELECT 'team:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id AND team IS NOT NULL;
         END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');",
    )
    .await
    .unwrap();
}

/// `id -> (team, rev)` in the source.
async fn source(env: &Env) -> BTreeMap<i64, (Option<String>, i32)> {
    env.admin
        .query("SELECT id, team, rev FROM app.docs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

/// The same shape decoded from the projection.
async fn projection(env: &Env) -> BTreeMap<i64, (Option<String>, i32)> {
    let fields: BTreeMap<String, String> = env
        .admin
        .query(
            "SELECT column_name::text, field_id FROM synchro.fields",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    env.admin
        .query("SELECT row_json FROM synchro.projection_rows", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let row = Json::parse(r.get::<_, &str>(0)).unwrap();
            let get = |c: &str| row.get(&fields[c]).cloned().unwrap();
            let id: i64 = get("id").as_str().unwrap().parse().unwrap();
            let team = get("team").as_str().map(str::to_owned);
            let rev: i32 = match get("rev") {
                Json::Number(t) => t.parse().unwrap(),
                other => panic!("{other:?}"),
            };
            (id, (team, rev))
        })
        .collect()
}

/// Per scope, the keys whose last effect is an upsert (what a client replaying the effect
/// log from the start ends with).
async fn replayed(env: &Env) -> BTreeMap<String, BTreeSet<String>> {
    let mut last: BTreeMap<(String, String), String> = BTreeMap::new();
    for r in env
        .admin
        .query(
            "SELECT scope_id, pk, kind FROM synchro.scope_effects ORDER BY position",
            &[],
        )
        .await
        .unwrap()
    {
        last.insert((r.get(0), r.get(1)), r.get(2));
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((scope, pk), kind) in last {
        if kind == "upsert" {
            out.entry(scope).or_default().insert(pk);
        }
    }
    out
}

/// Per scope, the keys the source says belong to it.
async fn expected_scopes(env: &Env) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (id, (team, _)) in source(env).await {
        if let Some(t) = team {
            out.entry(format!("team:{t}"))
                .or_default()
                .insert(format!("\"{id}\""));
        }
    }
    out
}

#[tokio::test]
async fn rows_before_the_slot_and_writes_during_the_copy_are_captured_exactly_once() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, team text, rev integer NOT NULL DEFAULT 0);
         INSERT INTO app.docs SELECT g, 't' || (g % 7), 0 FROM generate_series(1, 3000) g",
    )
    .await;
    register_docs(&env).await;

    // Writers run before, during and after the worker's first step (slot creation, the
    // copy under its SHARE lock, and the catch-up).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3i64 {
        let url = env.cluster.url("postgres", "app");
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let db = synchro_server::connect_db(&url).await.unwrap();
            let mut i = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 40 {
                i += 1;
                let id = 1 + (i * 37 + w * 1000) % 3000;
                db.batch_execute(&format!(
                    "BEGIN;
                     UPDATE app.docs SET rev = rev + 1, team = 't' || ((rev + {w}) % 5) WHERE id = {id};
                     INSERT INTO app.docs VALUES ({new}, 'w{w}', 0);
                     DELETE FROM app.docs WHERE id = {old};
                     COMMIT;",
                    new = 10_000 + w * 100_000 + i,
                    old = 10_000 + w * 100_000 + i - 2,
                ))
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            i
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    for _ in 0..5 {
        assert!(matches!(
            worker.step(Failpoint::None).await.unwrap(),
            StepOutcome::Applied(_)
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        assert!(w.await.unwrap() >= 40);
    }
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}

    let (status, copied): (String, Option<i64>) = {
        let r = env
            .admin
            .query_one(
                "SELECT status, rows_copied FROM synchro.relation_capture",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(status, "active");
    assert!(copied.unwrap() >= 3000, "{copied:?}");

    let src = source(&env).await;
    assert!(src.values().any(|(_, rev)| *rev > 0));
    assert_eq!(projection(&env).await, src);
    let expected = expected_scopes(&env).await;
    assert!(expected.len() >= 5);
    assert_eq!(replayed(&env).await, expected);
    let edges: BTreeMap<String, BTreeSet<String>> = env
        .admin
        .query("SELECT scope_id, pk FROM synchro.membership_edges", &[])
        .await
        .unwrap()
        .iter()
        .fold(BTreeMap::new(), |mut m, r| {
            m.entry(r.get::<_, String>(0))
                .or_default()
                .insert(r.get::<_, String>(1));
            m
        });
    assert_eq!(edges, expected);
}

#[tokio::test]
async fn a_relation_registered_while_capture_runs_is_copied_then_followed() {
    let env = Env::installed().await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(0)
    );
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, team text, rev integer NOT NULL DEFAULT 0);
         INSERT INTO app.docs VALUES (1, 'a', 0), (2, 'b', 0), (3, NULL, 0)",
    )
    .await;
    register_docs(&env).await;
    // Before the worker copies it the relation is pending and readiness says so.
    let detail: String = env
        .admin
        .query_one(
            "SELECT synchro.synchro_health_detail() ->> 'capture_bootstrap'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "unknown");
    env.admin
        .batch_execute("UPDATE app.docs SET team = 'c', rev = 1 WHERE id = 3")
        .await
        .unwrap();
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
    env.admin
        .batch_execute("UPDATE app.docs SET team = 'a', rev = 2 WHERE id = 2; DELETE FROM app.docs WHERE id = 1")
        .await
        .unwrap();
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
    assert_eq!(projection(&env).await, source(&env).await);
    assert_eq!(replayed(&env).await, expected_scopes(&env).await);
    let detail: String = env
        .admin
        .query_one(
            "SELECT synchro.synchro_health_detail() ->> 'capture_bootstrap'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "ok");
    // The effect log of scope team:a: rows 1 (copied), then 2 entered and 1 was deleted.
    let log: Vec<(String, String)> = env
        .admin
        .query(
            "SELECT kind, pk FROM synchro.scope_effects WHERE scope_id = 'team:a' ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        log,
        [
            ("upsert".to_owned(), "\"1\"".to_owned()),
            ("upsert".to_owned(), "\"2\"".to_owned()),
            ("delete".to_owned(), "\"1\"".to_owned()),
        ]
    );
}
