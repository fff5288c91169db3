//! Issue 38.1: the capture stream's lineage is recorded and checked. A slot dropped while the
//! worker was away, or invalidated by `max_slot_wal_keep_size`, blocks capture with a typed
//! reason (readiness and health name it) instead of being replaced by a new slot at the
//! current WAL position, which skipped every change written meanwhile without a word; the
//! worker never creates a replacement on its own. The way out needs no superuser and loses
//! nothing: `lineage reset` (issue 38.2) has the worker make a new slot and copy every
//! relation into its stream, recording only the rows that differ as changes.

mod common;

use common::Env;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};

/// `app.docs`, registered with its membership rule (each row in `user:<owner>` and
/// `team:<team>`) and published.
async fn setup() -> Env {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(&env, "").await;
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

/// A worker materializes row 1 and goes away; the operator drops the slot (freeing WAL);
/// row 2 is written while no slot exists.
async fn lose_the_slot(env: &Env) {
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red', 'before')")
        .await
        .unwrap();
    step_until_projected(env, &mut worker, 1).await;
    drop(worker);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    env.admin
        .batch_execute(
            "SELECT pg_drop_replication_slot('synchro_capture');
             INSERT INTO app.docs VALUES (2, 'alice', 'red', 'while no slot existed');",
        )
        .await
        .unwrap();
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

/// `synchro_lineage_reset(dry_run)` as the operator.
/// `synchro_capture_report()`, what `health` prints as its report.
async fn capture_report(env: &Env) -> serde_json::Value {
    let text: String = env
        .admin
        .query_one("SELECT synchro.synchro_capture_report()::text", &[])
        .await
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

async fn lineage_reset(op: &tokio_postgres::Client, dry_run: bool) -> serde_json::Value {
    let text: String = op
        .query_one(
            "SELECT synchro.synchro_lineage_reset($1)::text",
            &[&dry_run],
        )
        .await
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

/// The current stream generation and the highest effect position.
async fn stream(env: &Env) -> (i64, i64) {
    let r = env
        .admin
        .query_one(
            "SELECT (SELECT stream_generation FROM synchro.capture_state),
                    (SELECT effect_position FROM synchro.synchro_pull_watermark())",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
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
    lose_the_slot(&env).await;
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

    // `capture unblock` is refused: a new slot alone would skip the row.
    let op = env.login("synchro_dev_operator").await;
    let refused = op
        .query_one("SELECT synchro.synchro_capture_unblock()", &[])
        .await
        .unwrap_err();
    assert_eq!(refused.code().unwrap().code(), "55000");
    // The operator asks for a lineage reset (no superuser); a dry run first changes nothing.
    let plan = lineage_reset(&op, true).await;
    assert_eq!(plan["slot"]["state"], "missing");
    assert_eq!(plan["capture_blocked"], "slot_missing");
    assert_eq!(plan["relations"][0]["relation"], "app.docs");
    assert_eq!(plan["relations"][0]["action"], "copy");
    assert!(plan["requested_at"].is_null());
    assert_eq!(slots(&env).await, 0);
    let (generation_before, watermark_before) = stream(&env).await;
    let plan = lineage_reset(&op, false).await;
    assert!(!plan["requested_at"].is_null());
    // The worker makes the new slot and copies the relation from its exported snapshot (no
    // write gate); a row written after that snapshot, before the stream is read, comes
    // through the stream. The row written while no slot existed and that one arrive, as the
    // only changes.
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(1)
    );
    assert_eq!(slots(&env).await, 1);
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (3, 'alice', 'red', 'between the snapshot and the stream')")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 3).await;
    let from_snapshot: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.registry_generations
              WHERE change = 'resync' AND state = 'active' AND snapshot_lsn IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(from_snapshot, 1, "copied from the slot's snapshot");
    let (generation, watermark) = stream(&env).await;
    assert!(generation > generation_before);
    let bridge: (i64, i64) = {
        let r = env
            .admin
            .query_one(
                "SELECT previous_generation, bridged_through FROM synchro.stream_generations
                  WHERE stream_generation = $1",
                &[&generation],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(bridge, (generation_before, watermark_before));
    let changed: (i64, i64) = {
        let r = env
            .admin
            .query_one(
                "SELECT count(DISTINCT pk), count(*) FROM synchro.scope_effects WHERE position > $1",
                &[&watermark_before],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        changed,
        (2, 4),
        "the missing row and the later one (each in its two scopes), not the one the projection already had"
    );
    assert_eq!(watermark - watermark_before, 4);
    assert_eq!(lineage_reset(&op, true).await["in_progress"], 0);
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (4, 'alice', 'red', 'after')")
        .await
        .unwrap();
    step_until_projected(&env, &mut worker, 4).await;
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
    assert_eq!(ids, vec![1, 2, 3, 4]);
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
                "INSERT INTO app.docs SELECT g, 'alice', 'red', repeat('x', 1000) FROM generate_series({0}, {0} + 999) g",
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
    // The lineage reset replaces the invalidated slot and copies what its lost WAL held.
    let op = env.login("synchro_dev_operator").await;
    assert_eq!(
        lineage_reset(&op, true).await["slot"]["state"],
        "invalidated"
    );
    lineage_reset(&op, false).await;
    step_until_projected(&env, &mut worker, 8000).await;
    assert_eq!(check(&env, "capture_slot").await, "ok");
    assert_eq!(check(&env, "capture_lineage").await, "ok");
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
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red', 'before')")
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

#[tokio::test]
async fn a_reset_staged_while_the_slot_was_lost_is_staged_again_by_the_lineage_reset() {
    let env = setup().await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    lose_the_slot(&env).await;
    // A `registry reset` while no slot exists: its copy's message goes into no stream.
    let mut op = env.login("synchro_dev_operator").await;
    synchro_server::registry::reset(&mut op, "app", "docs")
        .await
        .unwrap();
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_missing".into())
    );
    // The lineage reset stages it again (no second copy of its own for that relation), and
    // it activates in the new stream.
    lineage_reset(&op, false).await;
    step_until_projected(&env, &mut worker, 2).await;
    let generations: Vec<(String, String)> = env
        .admin
        .query(
            "SELECT change, state FROM synchro.registry_generations
              WHERE change IN ('reset', 'resync') ORDER BY generation",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(generations, vec![("reset".into(), "active".into())]);
    assert_eq!(lineage_reset(&op, true).await["in_progress"], 0);
}

/// Issue 38.2: on PostgreSQL 17 and later the slot a lineage reset creates has failover
/// enabled (a standby configured to synchronize it continues capture when promoted); before
/// 17, where slots have no such property, it is an ordinary logical slot of pgoutput. (CI runs
/// this on every major version the matrix of issue 39 brings.)
#[tokio::test]
async fn the_slot_a_lineage_reset_creates_has_failover_where_postgresql_has_it() {
    let env = setup().await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    lose_the_slot(&env).await;
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_missing".into())
    );
    let op = env.login("synchro_dev_operator").await;
    lineage_reset(&op, false).await;
    step_until_projected(&env, &mut worker, 2).await;
    let version: i32 = env
        .admin
        .query_one("SELECT current_setting('server_version_num')::integer", &[])
        .await
        .unwrap()
        .get(0);
    let (plugin, kind): (String, String) = {
        let r = env
            .admin
            .query_one(
                "SELECT plugin::text, slot_type FROM pg_replication_slots WHERE slot_name = 'synchro_capture'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((plugin.as_str(), kind.as_str()), ("pgoutput", "logical"));
    if version >= 170_000 {
        let failover: bool = env
            .admin
            .query_one(
                "SELECT failover FROM pg_replication_slots WHERE slot_name = 'synchro_capture'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            failover,
            "PostgreSQL {version}: the slot has failover enabled"
        );
    }
    // `health` says so too (null where the version has no such flag), beside the slot's
    // decoding statistics.
    let report = capture_report(&env).await;
    let expected = if version >= 170_000 {
        serde_json::json!(true)
    } else {
        serde_json::Value::Null
    };
    assert_eq!(report["slot_failover"], expected, "{report}");
    assert!(report["slot_stats"]["total_txns"].is_i64(), "{report}");
    assert_eq!(
        report["slot_invalidation_reason"],
        serde_json::Value::Null,
        "{report}"
    );
}

/// Issue 39: PostgreSQL 18 invalidates a slot left idle longer than
/// `idle_replication_slot_timeout` (at a checkpoint), keeping its WAL status: capture blocks
/// with `slot_invalidated` as for lost WAL, `/ready` fails, and a lineage reset recovers.
/// Before 18 the setting does not exist (checked, so the test cannot pass on 18 by skipping).
#[tokio::test]
async fn a_slot_invalidated_for_idleness_blocks_capture_where_postgresql_has_the_timeout() {
    let env = setup().await;
    let has_timeout: bool = env
        .admin
        .query_one(
            "SELECT count(*) = 1 FROM pg_settings WHERE name = 'idle_replication_slot_timeout'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let version: i32 = env
        .admin
        .query_one("SELECT current_setting('server_version_num')::integer", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(has_timeout, version >= 180_000);
    if !has_timeout {
        return;
    }
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    drop(worker);
    for sql in [
        "ALTER SYSTEM SET idle_replication_slot_timeout = '1s'",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        env.admin.batch_execute("CHECKPOINT").await.unwrap();
        let reason: Option<String> = env
            .admin
            .query_one(
                "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = 'synchro_capture'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if reason.as_deref() == Some("idle_timeout") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never invalidated: {reason:?}"
        );
    }
    for sql in [
        "ALTER SYSTEM RESET idle_replication_slot_timeout",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    let mut worker = Worker::connect(&url).await.unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("slot_invalidated".into())
    );
    assert_eq!(check(&env, "capture_slot").await, "failed");
    assert_eq!(check(&env, "capture_lineage").await, "failed");
    let report = capture_report(&env).await;
    assert_eq!(
        report["slot_invalidation_reason"], "idle_timeout",
        "{report}"
    );
    assert!(report["slot_inactive_since"].is_string(), "{report}");
    let op = env.login("synchro_dev_operator").await;
    assert_eq!(
        lineage_reset(&op, true).await["slot"]["state"],
        "invalidated"
    );
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (50, 'alice', 'red', 'after')")
        .await
        .unwrap();
    lineage_reset(&op, false).await;
    step_until_projected(&env, &mut worker, 1).await;
    assert_eq!(check(&env, "capture_slot").await, "ok");
    assert_eq!(check(&env, "capture_lineage").await, "ok");
}
