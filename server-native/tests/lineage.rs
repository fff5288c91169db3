//! Issue 38.1: the capture stream's lineage is recorded and checked. A slot dropped while the
//! worker was away, or invalidated by `max_slot_wal_keep_size`, blocks capture with a typed
//! reason (readiness and health name it) instead of being replaced by a new slot at the
//! current WAL position, which skipped every change written meanwhile without a word; the
//! worker never creates a replacement on its own. The way out needs no superuser and loses
//! nothing: `capture unblock` accepts a new lineage (the worker creates the slot), then
//! `registry reset` of each relation copies it afresh into the new slot's stream (every scope
//! holding its rows rebuilds; issue 38.2's `lineage reset` is to send only the differences).

mod common;

use common::Env;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};

async fn setup() -> Env {
    let env = Env::installed().await;
    env.as_app_owner("CREATE TABLE app.items (id bigint PRIMARY KEY, label text)")
        .await;
    let op = env.login("synchro_dev_operator").await;
    register(
        &op,
        &RegisterRequest::synced("app", "items", "single_scope"),
    )
    .await
    .unwrap();
    env
}

async fn drain(worker: &mut Worker) {
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(0) => return,
            StepOutcome::Applied(_) => {}
            other => panic!("{other:?}"),
        }
    }
}

/// Steps until the projection holds `n` rows (the stream delivers a commit a moment after it).
async fn step_until_projected(env: &Env, worker: &mut Worker, n: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while projected(env).await != n {
        if std::time::Instant::now() > deadline {
            let state: String = env
                .admin
                .query_one(
                    "SELECT (SELECT string_agg(status || ':' || coalesce(rows_copied, -1)::text, ',') FROM synchro.relation_capture)
                         || ' rows=' || (SELECT string_agg(row_json, ' ') FROM synchro.projection_rows) || ' states=' || (SELECT string_agg(generation::text || state || change, ',') FROM synchro.registry_generations)
                         || ' blocked=' || coalesce((SELECT blocked_reason FROM synchro.capture_state), '-') || ' state=' || (SELECT confirmed_lsn::text || '/' || acknowledged_lsn::text || '/' || coalesce(lineage_slot_began_lsn::text, 'null') FROM synchro.capture_state) || ' slot=' || coalesce((SELECT confirmed_flush_lsn::text || '/' || active::text FROM pg_replication_slots), 'none') || ' wal=' || pg_current_wal_lsn()::text",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            panic!("never {n} rows: {state}");
        }
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(_) => {}
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn slots(env: &Env) -> i64 {
    env.admin
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'synchro_capture'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn check(env: &Env, name: &str) -> String {
    env.admin
        .query_one("SELECT synchro.synchro_health_detail() ->> $1", &[&name])
        .await
        .unwrap()
        .get(0)
}

async fn projected(env: &Env) -> i64 {
    env.admin
        .query_one("SELECT count(*) FROM synchro.projection_rows", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_slot_dropped_while_the_worker_was_away_blocks_capture_and_is_not_replaced() {
    let env = setup().await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    env.admin
        .batch_execute("INSERT INTO app.items VALUES (1, 'before')")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 1).await;
    let recorded: Option<String> = env
        .admin
        .query_one(
            "SELECT lineage_system_identifier FROM synchro.capture_state",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let system: String = env
        .admin
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        recorded.as_deref(),
        Some(system.as_str()),
        "the lineage is recorded"
    );

    // The worker goes away; the operator drops the slot (freeing WAL); a row is written
    // while no slot exists.
    drop(worker);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    env.admin
        .batch_execute(
            "SELECT pg_drop_replication_slot('synchro_capture');
             INSERT INTO app.items VALUES (2, 'while no slot existed');",
        )
        .await
        .unwrap();
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_missing".into())
    );
    assert_eq!(slots(&env).await, 0, "no replacement slot");
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_missing".into()),
        "it stays blocked"
    );
    assert_eq!(slots(&env).await, 0);
    assert_eq!(check(&env, "capture_slot").await, "failed");
    assert_eq!(check(&env, "capture_lineage").await, "failed");
    assert_eq!(check(&env, "capture_not_blocked").await, "failed");
    let ready: bool = env
        .admin
        .query_one("SELECT synchro.synchro_readiness()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!ready, "not ready while the lineage is broken");

    // The operator accepts the new lineage (no superuser): a new slot, capture goes on.
    let op = env.login("synchro_dev_operator").await;
    let answer: serde_json::Value = serde_json::from_str(
        op.query_one("SELECT synchro.synchro_capture_unblock()::text", &[])
            .await
            .unwrap()
            .get(0),
    )
    .unwrap();
    assert_eq!(answer["reason"], "slot_missing");
    assert_eq!(answer["lineage_accepted"], true);
    drain(&mut worker).await;
    assert_eq!(slots(&env).await, 1);
    // Then, once the new slot exists, each relation is copied afresh (`registry reset`: its
    // copy and activation message go into the new slot's stream), so nothing written while
    // no slot existed is skipped.
    let mut op = op;
    synchro_server::registry::reset(&mut op, "app", "items")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 2).await;
    env.admin
        .batch_execute("INSERT INTO app.items VALUES (3, 'after')")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 3).await;
    assert_eq!(check(&env, "capture_lineage").await, "ok");
    assert_eq!(check(&env, "capture_slot").await, "ok");
    // Every row, the one written while no slot existed too.
    let ids: Vec<i64> = env
        .admin
        .query(
            "SELECT (row_json::jsonb ->> (SELECT field_id FROM synchro.fields WHERE column_name = 'id'))::bigint
               FROM synchro.projection_rows ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[tokio::test]
async fn a_slot_invalidated_by_max_slot_wal_keep_size_blocks_capture() {
    let env = setup().await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    drop(worker);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The slot may keep 1 MB of WAL; 8 segments' worth is written and checkpointed away.
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    for i in 0..8 {
        env.admin
            .batch_execute(&format!(
                "INSERT INTO app.items SELECT g, repeat('x', 1000) FROM generate_series({0}, {0} + 999) g",
                10_000 + i * 1000
            ))
            .await
            .unwrap();
        for sql in ["SELECT pg_switch_wal()", "CHECKPOINT"] {
            env.admin.batch_execute(sql).await.unwrap();
        }
    }
    let status: String = env
        .admin
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'synchro_capture'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "lost", "the slot was invalidated");
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_invalidated".into())
    );
    assert_eq!(check(&env, "capture_slot").await, "failed");
    assert_eq!(check(&env, "capture_lineage").await, "failed");
    for sql in [
        "ALTER SYSTEM RESET max_slot_wal_keep_size",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
}

#[tokio::test]
async fn a_database_with_a_history_but_no_recorded_lineage_is_not_given_a_new_slot() {
    // As a database installed by a binary before lineage was recorded: transactions applied,
    // no lineage columns; its slot is gone.
    let env = setup().await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    env.admin
        .batch_execute("INSERT INTO app.items VALUES (1, 'before')")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 1).await;
    drop(worker);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    env.admin
        .batch_execute(
            "UPDATE synchro.capture_state SET lineage_system_identifier = NULL, lineage_timeline = NULL,
                    lineage_slot_began_lsn = NULL, lineage_recorded_at = NULL;
             SELECT pg_drop_replication_slot('synchro_capture');",
        )
        .await
        .unwrap();
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_missing".into())
    );
    assert_eq!(slots(&env).await, 0, "no replacement slot");
}
