//! The capture worker against real PostgreSQL: concurrent writers, commit order, exactly
//! once across a crash between commit and slot advance, leader election, and drift.

mod common;

use std::collections::BTreeMap;

use common::Env;
use synchro_protocol::json::Json;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};

async fn setup() -> (Env, String) {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, label text, qty integer NOT NULL DEFAULT 0, big text);
         ALTER TABLE app.items ALTER COLUMN big SET STORAGE EXTERNAL;",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let reg = register(
        &op,
        &RegisterRequest::synced("app", "items", "single_scope"),
    )
    .await
    .unwrap();
    (env, reg["relation_id"].as_str().unwrap().to_owned())
}

/// Source rows as (id, label, qty, big length).
async fn source(env: &Env) -> BTreeMap<i64, (Option<String>, i32, Option<usize>)> {
    env.admin
        .query("SELECT id, label, qty, length(big) FROM app.items", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get(0),
                (
                    r.get(1),
                    r.get(2),
                    r.get::<_, Option<i32>>(3).map(|n| n as usize),
                ),
            )
        })
        .collect()
}

/// Projection rows decoded to the same shape.
async fn projection(env: &Env) -> BTreeMap<i64, (Option<String>, i32, Option<usize>)> {
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
            let label = get("label").as_str().map(str::to_owned);
            let qty: i32 = match get("qty") {
                Json::Number(t) => t.parse().unwrap(),
                _ => panic!(),
            };
            let big = get("big").as_str().map(str::len);
            (id, (label, qty, big))
        })
        .collect()
}

async fn drain(worker: &mut Worker) -> usize {
    let mut total = 0;
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(0) => return total,
            StepOutcome::Applied(n) => total += n,
            other => panic!("{other:?}"),
        }
    }
}

async fn applied_count(env: &Env) -> i64 {
    env.admin
        .query_one(
            "SELECT applied_transactions FROM synchro.capture_state",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn concurrent_writers_are_captured_exactly_once_across_a_crash() {
    let (env, _) = setup().await;
    let worker_url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&worker_url).await.unwrap();
    // The bootstrap of the (empty) relation is one transaction.
    assert_eq!(drain(&mut worker).await, 1);

    // Four writers, 30 transactions each, interleaved.
    let mut tasks = Vec::new();
    for w in 0..4i64 {
        let url = env.cluster.url("postgres", "app");
        tasks.push(tokio::spawn(async move {
            let db = synchro_server::connect_db(&url).await.unwrap();
            // Transactions that change nothing are not decoded at all; count the others.
            let mut nonempty = 0i64;
            for i in 0..30i64 {
                nonempty += 1;
                let id = w * 1000 + i;
                db.batch_execute(&format!(
                    "BEGIN; INSERT INTO app.items VALUES ({id}, 'w{w}-{i}', {i}, CASE WHEN {i} % 7 = 0 THEN repeat('x', 50000) END);
                     UPDATE app.items SET qty = qty + 1 WHERE id = {w} * 1000 + {i} / 2; COMMIT;"
                ))
                .await
                .unwrap();
                if i % 5 == 4 {
                    nonempty += db.execute(&format!("DELETE FROM app.items WHERE id = {}", id - 1), &[]).await.unwrap() as i64;
                }
                if i % 6 == 5 {
                    nonempty += db
                        .execute(&format!("UPDATE app.items SET label = 'moved' WHERE id = {}", id - 2), &[])
                        .await
                        .unwrap() as i64;
                }
            }
            nonempty
        }));
    }
    // Capture while they write.
    for _ in 0..5 {
        worker.step(Failpoint::None).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut committed = 0;
    for t in tasks {
        committed += t.await.unwrap();
    }
    drain(&mut worker).await;
    assert_eq!(projection(&env).await, source(&env).await);
    assert_eq!(
        applied_count(&env).await,
        committed + 1,
        "every transaction applied exactly once"
    );

    // A crash after a commit but before the slot advances: the replay is skipped.
    env.admin
        .batch_execute("UPDATE app.items SET label = 'after-crash' WHERE id < 3; INSERT INTO app.items VALUES (9999, 'n', 1, NULL);")
        .await
        .unwrap();
    env.admin
        .batch_execute("DELETE FROM app.items WHERE id = 9999")
        .await
        .unwrap();
    assert_eq!(
        worker
            .step(Failpoint::AfterCommitBeforeAdvance)
            .await
            .unwrap(),
        StepOutcome::Applied(1)
    );
    drop(worker);
    let mut restarted = Worker::connect(&worker_url).await.unwrap();
    assert_eq!(
        drain(&mut restarted).await,
        1,
        "only the unapplied transaction is applied after restart"
    );
    assert_eq!(applied_count(&env).await, committed + 3);
    assert_eq!(projection(&env).await, source(&env).await);

    // One leader at a time.
    let mut second = Worker::connect(&worker_url).await.unwrap();
    assert_eq!(
        second.step(Failpoint::None).await.unwrap(),
        StepOutcome::NotLeader
    );
}

/// Consecutive transactions the stream holds at once are materialized in one commit from
/// their final state: an unchanged TOAST value is taken from an earlier transaction of the
/// batch (not yet in the projection), deletes and re-inserts fold in, every transaction
/// is counted, and a crash after that commit but before the slot advance replays none.
#[tokio::test]
async fn transactions_held_together_are_materialized_once_and_exactly_once() {
    let (env, _) = setup().await;
    let worker_url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&worker_url).await.unwrap();
    assert_eq!(drain(&mut worker).await, 1);
    let before = applied_count(&env).await;
    for sql in [
        "INSERT INTO app.items VALUES (1, 'a', 1, NULL), (2, 'b', 2, NULL), (3, 'c', 3, NULL)",
        "INSERT INTO app.items VALUES (4, 'd', 4, repeat('y', 40000))",
        // Unchanged TOAST: `big` comes from the insert just before, in the same batch.
        "UPDATE app.items SET qty = 40 WHERE id = 4",
        "UPDATE app.items SET label = 'a2' WHERE id = 1",
        "DELETE FROM app.items WHERE id = 2",
        "BEGIN; DELETE FROM app.items WHERE id = 3; INSERT INTO app.items VALUES (30, 'c', 3, NULL); COMMIT",
        "BEGIN; INSERT INTO app.items VALUES (2, 'b-again', 5, NULL); UPDATE app.items SET qty = 41 WHERE id = 4; COMMIT",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    assert_eq!(
        worker
            .step(Failpoint::AfterBatchCommitBeforeAdvance)
            .await
            .unwrap(),
        StepOutcome::Applied(7),
        "one materialization commit for the seven transactions"
    );
    assert_eq!(applied_count(&env).await, before + 7);
    assert_eq!(projection(&env).await, source(&env).await);
    assert_eq!(
        projection(&env).await[&4],
        (Some("d".into()), 41, Some(40000))
    );
    drop(worker);
    let mut restarted = Worker::connect(&worker_url).await.unwrap();
    assert_eq!(
        drain(&mut restarted).await,
        0,
        "the batch is not applied again"
    );
    assert_eq!(applied_count(&env).await, before + 7);
    assert_eq!(projection(&env).await, source(&env).await);
}

#[tokio::test]
async fn relation_drift_blocks_capture_without_acknowledging() {
    let (env, _) = setup().await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    env.admin
        .batch_execute("INSERT INTO app.items VALUES (1, 'a', 1, NULL)")
        .await
        .unwrap();
    drain(&mut worker).await;
    let before: String = env
        .admin
        .query_one("SELECT confirmed_lsn::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    env.as_app_owner("ALTER TABLE app.items RENAME TO renamed")
        .await;
    env.admin
        .batch_execute("INSERT INTO app.renamed VALUES (2, 'b', 1, NULL)")
        .await
        .unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("registered_relation_drift".into())
    );
    let after: String = env
        .admin
        .query_one("SELECT confirmed_lsn::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "nothing acknowledged");
    assert_eq!(projection(&env).await.len(), 1);
    // Blocked is durable: a restarted worker stays blocked, and readiness fails.
    let mut again = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drop(worker);
    // The old worker's leader lock goes when the server sees its session end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let held: bool = env
            .admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                   AND ((classid::bigint << 32) | objid::bigint) = 32503137342878319)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if !held {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old leader lock stays"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        again.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("registered_relation_drift".into())
    );
    let monitor = env.login("synchro_dev_monitor").await;
    let detail: String = monitor
        .query_one(
            "SELECT synchro.synchro_health_detail()->>'capture_not_blocked'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "failed");
}

#[tokio::test]
async fn a_column_added_without_a_reconfiguration_is_reported_by_the_drift_check() {
    let (env, relation_id) = setup().await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(health(&env, "registry_drift").await, "ok");
    // The catalog still matches the registration (same name, OID and replica identity):
    // only the stream shows the column nobody declared.
    env.as_app_owner("ALTER TABLE app.items ADD COLUMN note text; INSERT INTO app.items (id, note) VALUES (9, 'x')")
        .await;
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("registered_relation_drift".into())
    );
    assert_eq!(health(&env, "registry_drift").await, "failed");
    let report: serde_json::Value = env
        .login("synchro_dev_monitor")
        .await
        .query_one("SELECT synchro.synchro_capture_report()::text", &[])
        .await
        .map(|r| serde_json::from_str(&r.get::<_, String>(0)).unwrap())
        .unwrap();
    assert_eq!(report["blocked"]["detail"], "column_added", "{report}");
    assert_eq!(report["blocked"]["relation_id"], relation_id.as_str());
}

#[tokio::test]
async fn statistics_put_off_by_a_lock_are_refreshed_once_it_is_released() {
    let (env, _) = setup().await;
    env.admin
        .batch_execute(
            "INSERT INTO app.items SELECT g, 'x', 1, NULL FROM generate_series(1, 500) g",
        )
        .await
        .unwrap();
    let analyzed = || async {
        env.admin
            .query_one(
                "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables
                  WHERE schemaname = 'synchro' AND relname = 'projection_rows'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    };
    // An index build or autovacuum holds a lock ANALYZE would wait for.
    let holder = env.login("postgres").await;
    holder
        .batch_execute("BEGIN; LOCK TABLE synchro.projection_rows IN SHARE UPDATE EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await; // the bootstrap copy, then its ANALYZE is put off
    assert_eq!(projection(&env).await.len(), 500);
    assert!(!analyzed().await);
    worker.step(Failpoint::None).await.unwrap();
    assert!(!analyzed().await, "still locked");
    holder.batch_execute("COMMIT").await.unwrap();
    // (tried again at most once a second)
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    worker.step(Failpoint::None).await.unwrap();
    assert!(analyzed().await, "refreshed at a later step");
}

async fn report(env: &Env) -> serde_json::Value {
    env.login("synchro_dev_monitor")
        .await
        .query_one("SELECT synchro.synchro_capture_report()::text", &[])
        .await
        .map(|r| serde_json::from_str(&r.get::<_, String>(0)).unwrap())
        .unwrap()
}

async fn health(env: &Env, check: &str) -> String {
    env.login("synchro_dev_monitor")
        .await
        .query_one("SELECT synchro.synchro_health_detail()->>$1", &[&check])
        .await
        .unwrap()
        .get(0)
}

/// Amazon RDS and Aurora let no one set REPLICATION: a login replicates there as a member of
/// `rds_replication` (stood in for here). A leader holding it that way is the worker login
/// spec 001 draws; another runtime login holding it is a second replication principal.
#[tokio::test]
async fn readiness_counts_rds_replication_membership_as_replication() {
    let (env, _) = setup().await;
    env.admin
        .batch_execute(
            "ALTER ROLE synchro_dev_worker NOREPLICATION;
             CREATE ROLE rds_replication NOLOGIN;
             CREATE ROLE rds_worker LOGIN NOINHERIT IN ROLE synchro_worker, rds_replication",
        )
        .await
        .unwrap();
    // The leader lock taken by hand: this cluster gives rds_replication no real right to stream.
    let leader = env.login("rds_worker").await;
    leader
        .batch_execute("SELECT pg_advisory_lock(32503137342878319)")
        .await
        .unwrap();
    assert_eq!(health(&env, "capture_worker").await, "ok");
    assert_eq!(health(&env, "capture_worker_login").await, "ok");
    for (break_it, undo) in [
        (
            "REVOKE rds_replication FROM rds_worker",
            "GRANT rds_replication TO rds_worker",
        ),
        (
            "GRANT rds_replication TO synchro_dev_adapter",
            "REVOKE rds_replication FROM synchro_dev_adapter",
        ),
        (
            "GRANT synchro_monitor TO rds_worker",
            "REVOKE synchro_monitor FROM rds_worker",
        ),
    ] {
        env.admin.batch_execute(break_it).await.unwrap();
        assert_eq!(
            health(&env, "capture_worker_login").await,
            "failed",
            "{break_it}"
        );
        env.admin.batch_execute(undo).await.unwrap();
        assert_eq!(health(&env, "capture_worker_login").await, "ok", "{undo}");
    }
}

#[tokio::test]
async fn readiness_checks_the_leader_slot_publication_and_wal_lag_limits() {
    let (env, _) = setup().await;
    // No worker yet: no leader, no slot, lag unknown.
    assert_eq!(health(&env, "capture_worker").await, "failed");
    assert_eq!(health(&env, "capture_worker_login").await, "unknown");
    assert_eq!(health(&env, "capture_slot").await, "failed");
    assert_eq!(health(&env, "capture_wal_lag").await, "unknown");
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    // The leading login must be the worker login spec 001 draws, and the sole runtime login
    // with REPLICATION: each way it stops being so fails the check, and undoing it clears it.
    for (break_it, undo) in [
        (
            "ALTER ROLE synchro_dev_worker INHERIT",
            "ALTER ROLE synchro_dev_worker NOINHERIT",
        ),
        (
            "ALTER ROLE synchro_dev_worker CREATEROLE",
            "ALTER ROLE synchro_dev_worker NOCREATEROLE",
        ),
        (
            "GRANT synchro_monitor TO synchro_dev_worker",
            "REVOKE synchro_monitor FROM synchro_dev_worker",
        ),
        (
            "ALTER ROLE synchro_dev_adapter REPLICATION",
            "ALTER ROLE synchro_dev_adapter NOREPLICATION",
        ),
        (
            "CREATE ROLE second_worker LOGIN REPLICATION NOINHERIT IN ROLE synchro_worker",
            "DROP ROLE second_worker",
        ),
    ] {
        env.admin.batch_execute(break_it).await.unwrap();
        assert_eq!(
            health(&env, "capture_worker_login").await,
            "failed",
            "{break_it}"
        );
        env.admin.batch_execute(undo).await.unwrap();
        assert_eq!(health(&env, "capture_worker_login").await, "ok", "{undo}");
    }
    for check in [
        "capture_fences",
        "capture_worker",
        "capture_worker_login",
        "capture_slot",
        "capture_wal_lag",
        "capture_publication",
        "capture_heartbeat",
        "capture_bootstrap",
        "capture_lag_seconds",
        "capture_registry_generation",
        "capture_progress_order",
    ] {
        assert_eq!(health(&env, check).await, "ok", "{check}");
    }
    // Everything but the manifest (this test publishes none) is ready.
    let failing: Vec<String> = env
        .admin
        .query(
            "SELECT key FROM jsonb_each_text(synchro.synchro_health_detail()) WHERE value <> 'ok'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(failing, ["current_manifest"]);

    // WAL that publishes nothing (an unregistered table) is confirmed by an idle step, so
    // the slot's lag stays bounded.
    env.admin
        .batch_execute(
            "CREATE TABLE public.noise (x text); INSERT INTO public.noise SELECT repeat('n', 100) FROM generate_series(1, 20000)",
        )
        .await
        .unwrap();
    env.admin
        .batch_execute(
            "UPDATE synchro.settings SET value = '65536' WHERE key = 'capture_max_wal_lag_bytes'",
        )
        .await
        .unwrap();
    assert_eq!(health(&env, "capture_wal_lag").await, "failed");
    assert_eq!(drain(&mut worker).await, 0);
    assert_eq!(health(&env, "capture_wal_lag").await, "ok");
    // A limit that is not a positive integer cannot be stored, not even by a superuser
    // (readiness would fail closed on one).
    assert_eq!(
        common::sqlstate(
            &env.admin,
            "UPDATE synchro.settings SET value = '0' WHERE key = 'capture_max_wal_lag_bytes'",
        )
        .await,
        "23514"
    );
    assert_eq!(health(&env, "capture_wal_lag").await, "ok");

    // A registered table leaving the publication, or gaining a row filter, is not exact.
    env.admin
        .batch_execute(
            "ALTER PUBLICATION synchro_publication SET TABLE ONLY app.items WHERE (qty > 0)",
        )
        .await
        .unwrap();
    assert_eq!(health(&env, "capture_publication").await, "failed");
    env.admin
        .batch_execute("ALTER PUBLICATION synchro_publication SET TABLE ONLY app.items")
        .await
        .unwrap();
    assert_eq!(health(&env, "capture_publication").await, "ok");
    env.admin
        .batch_execute("ALTER PUBLICATION synchro_publication ADD TABLE public.noise")
        .await
        .unwrap();
    assert_eq!(health(&env, "capture_publication").await, "failed");
    env.admin
        .batch_execute("ALTER PUBLICATION synchro_publication DROP TABLE public.noise")
        .await
        .unwrap();

    // The oldest unmaterialized commit: a write the worker has not applied for longer than
    // the limit fails the check (the limit's lower bound is 1 s), until it is applied and
    // the worker has recorded that it is caught up.
    env.admin
        .batch_execute(
            "UPDATE synchro.settings SET value = '1' WHERE key = 'capture_max_lag_seconds'",
        )
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    worker.step(Failpoint::None).await.unwrap(); // caught up, recorded (its heartbeat is due)
    assert_eq!(health(&env, "capture_lag_seconds").await, "ok");
    env.admin
        .batch_execute("INSERT INTO app.items (id, label) VALUES (700, 'late')")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(health(&env, "capture_lag_seconds").await, "failed");
    assert_eq!(drain(&mut worker).await, 1);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    worker.step(Failpoint::None).await.unwrap();
    assert_eq!(health(&env, "capture_lag_seconds").await, "ok");
    assert!(
        report(&env).await["lag_seconds"]
            .as_i64()
            .is_some_and(|s| s <= 1),
        "{}",
        report(&env).await
    );
    env.admin
        .batch_execute(
            "UPDATE synchro.settings SET value = '300' WHERE key = 'capture_max_lag_seconds'",
        )
        .await
        .unwrap();

    // A registration the worker has not run a step with yet: its registry generation is
    // not applied.
    env.as_app_owner("CREATE TABLE app.more (id bigint PRIMARY KEY)")
        .await;
    register(
        &env.login("synchro_dev_operator").await,
        &RegisterRequest::synced("app", "more", "single_scope"),
    )
    .await
    .unwrap();
    assert_eq!(health(&env, "capture_registry_generation").await, "failed");
    drain(&mut worker).await;
    assert_eq!(health(&env, "capture_registry_generation").await, "ok");
    assert_eq!(
        report(&env).await["applied_registry_generation"],
        report(&env).await["registry_generation"]
    );

    // The slot acknowledged past what was materialized (advanced by hand, skipping a
    // change): the order is broken and readiness fails.
    env.admin
        .batch_execute("INSERT INTO app.items (id, label) VALUES (701, 'skipped')")
        .await
        .unwrap();
    let slot: String = env
        .admin
        .query_one("SELECT slot_name::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    drop(worker); // releases the slot
    let worker_gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let advanced = env
            .admin
            .query(
                "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
                &[&slot],
            )
            .await;
        if advanced.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < worker_gone,
            "slot never released"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(health(&env, "capture_progress_order").await, "failed");

    // The leader gone: its lock is released.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while health(&env, "capture_worker").await != "failed" {
        assert!(std::time::Instant::now() < deadline, "lock never released");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn versions_come_from_the_writers_fence_and_a_missing_fence_blocks() {
    let (env, _) = setup().await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    // The version is allocated in the writer's transaction, before the row changes.
    let allocated: Vec<String> = env
        .admin
        .simple_query(
            "BEGIN; INSERT INTO app.items VALUES (1, 'a', 1, NULL);
             SELECT currval('synchro.row_version_seq')::text;
             UPDATE app.items SET qty = 2 WHERE id = 1;
             SELECT currval('synchro.row_version_seq')::text; COMMIT;",
        )
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    assert_eq!(allocated.len(), 2);
    assert_ne!(allocated[0], allocated[1]);
    assert_eq!(drain(&mut worker).await, 1);
    let version: String = env
        .admin
        .query_one(
            "SELECT server_version FROM synchro.projection_rows WHERE pk = '\"1\"'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, allocated[1], "the last change's fence");

    // A write that bypasses the fence trigger is never captured with an invented version.
    let before: String = env
        .admin
        .query_one("SELECT confirmed_lsn::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    env.admin
        .batch_execute(
            "ALTER TABLE app.items DISABLE TRIGGER synchro_source_fence;
             INSERT INTO app.items VALUES (2, 'b', 1, NULL);",
        )
        .await
        .unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("missing_fence".into())
    );
    let after: String = env
        .admin
        .query_one("SELECT confirmed_lsn::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "nothing acknowledged");
    assert_eq!(health(&env, "capture_fences").await, "failed");
}

/// The definitions of the CHECK constraints over one column of `synchro.capture_state`, read
/// from the catalog.
async fn check_constraints(env: &Env, column: &str) -> Vec<String> {
    env.admin
        .query(
            "SELECT pg_catalog.pg_get_constraintdef(c.oid)
               FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_attribute a
                 ON a.attrelid = c.conrelid AND a.attname = $1
              WHERE c.conrelid = 'synchro.capture_state'::regclass AND c.contype = 'c'
                AND a.attnum = ANY (c.conkey)",
            &[&column],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Every quoted literal of a constraint definition (every other piece between quotes).
fn quoted_literals(def: &str) -> std::collections::BTreeSet<String> {
    def.split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// `BlockDetail` is exactly the list the installed CHECK constraint on
/// `synchro.capture_state.blocked_detail` allows (read from the catalog).
#[tokio::test]
async fn drift_details_are_exactly_what_the_check_constraint_allows() {
    use std::collections::BTreeSet;
    use synchro_server::capture::BlockDetail;

    let env = Env::installed().await;
    let defs = check_constraints(&env, "blocked_detail").await;
    assert_eq!(defs.len(), 1, "one CHECK over blocked_detail: {defs:?}");
    let def = &defs[0];
    let allowed = quoted_literals(def);
    let codes: BTreeSet<String> = BlockDetail::ALL
        .iter()
        .map(|d| d.as_str().to_owned())
        .collect();
    assert_eq!(codes.len(), BlockDetail::ALL.len(), "distinct codes");
    assert_eq!(codes, allowed, "BlockDetail against {def}");
    assert_eq!(
        common::sqlstate(
            &env.admin,
            "UPDATE synchro.capture_state SET blocked_detail = 'not_a_detail'"
        )
        .await,
        "23514"
    );
}

/// `BlockReason` is exactly the list the installed CHECK constraint on
/// `synchro.capture_state.blocked_reason` allows: read from the catalog (not from a
/// migration file), every code the enum has is accepted, and no other is.
#[tokio::test]
async fn block_reasons_are_exactly_what_the_check_constraint_allows() {
    use std::collections::BTreeSet;
    use synchro_server::capture::BlockReason;

    let env = Env::installed().await;
    let defs = check_constraints(&env, "blocked_reason").await;
    assert_eq!(defs.len(), 1, "one CHECK over blocked_reason: {defs:?}");
    // `CHECK ((blocked_reason = ANY (ARRAY['a'::text, …])))`: every quoted literal.
    let allowed = quoted_literals(&defs[0]);
    let codes: BTreeSet<String> = BlockReason::ALL
        .iter()
        .map(|r| r.as_str().to_owned())
        .collect();
    assert_eq!(codes.len(), BlockReason::ALL.len(), "distinct codes");
    assert_eq!(codes, allowed, "BlockReason against {}", defs[0]);
    // The parse above is checked against the constraint itself.
    for reason in BlockReason::ALL {
        let n = env
            .admin
            .execute(
                "UPDATE synchro.capture_state SET blocked_reason = $1",
                &[&reason.as_str()],
            )
            .await
            .unwrap_or_else(|e| panic!("{reason}: {}", synchro_server::install::describe(&e)));
        assert_eq!(n, 1);
    }
    assert_eq!(
        common::sqlstate(
            &env.admin,
            "UPDATE synchro.capture_state SET blocked_reason = 'not_a_reason'"
        )
        .await,
        "23514"
    );
    env.admin
        .batch_execute("UPDATE synchro.capture_state SET blocked_reason = NULL")
        .await
        .unwrap();
}
