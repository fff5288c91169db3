//! kill -9 of the capture process during a write load, then a restart: nothing is lost or
//! applied twice, and the projection equals the source tables. SIGTERM (a container stop)
//! stops it with exit 0.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::Env;
use synchro_server::registry::{register, RegisterRequest};

/// The capture process; killed on drop so a failing test never leaks it.
struct Capture(Child);

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_capture(url: &str) -> Capture {
    Capture(
        Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args(["capture", "--database-url", url])
            .env("SYNCHRO_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Waits (up to 30 s) for the capture worker's first heartbeat.
async fn wait_heartbeat(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let beat: Option<std::time::SystemTime> = env
            .admin
            .query_one("SELECT heartbeat_at FROM synchro.capture_state", &[])
            .await
            .unwrap()
            .get(0);
        if beat.is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "capture never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_stops_the_capture_worker_with_exit_0() {
    // Without a handler the process would die of the signal (and as a container's PID 1 it
    // would ignore it until the engine's SIGKILL).
    let env = Env::installed().await;
    let mut capture = start_capture(&env.cluster.url("synchro_dev_worker", "app"));
    wait_heartbeat(&env).await;
    Command::new("kill")
        .args(["-TERM", &capture.0.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = capture.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "capture did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn kill_9_during_a_write_load_loses_and_duplicates_nothing() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.events (id bigint PRIMARY KEY, n integer NOT NULL, note text)",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    register(
        &op,
        &RegisterRequest::synced("app", "events", "single_scope"),
    )
    .await
    .unwrap();
    let worker_url = env.cluster.url("synchro_dev_worker", "app");
    let mut capture = start_capture(&worker_url);
    // Capture covers commits after its slot exists (bootstrapping rows that predate the
    // slot is a separate, not yet built step): wait for the first heartbeat.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let beat: Option<std::time::SystemTime> = env
            .admin
            .query_one("SELECT heartbeat_at FROM synchro.capture_state", &[])
            .await
            .unwrap()
            .get(0);
        if beat.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "capture never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Writers: 3 connections × 60 transactions of inserts and updates.
    let mut writers = Vec::new();
    for w in 0..3i64 {
        let url = env.cluster.url("postgres", "app");
        writers.push(tokio::spawn(async move {
            let db = synchro_server::connect_db(&url).await.unwrap();
            for i in 0..60i64 {
                db.batch_execute(&format!(
                    "BEGIN; INSERT INTO app.events VALUES ({id}, {i}, 'w{w}'); UPDATE app.events SET n = n + 1 WHERE id = {prev}; COMMIT;",
                    id = w * 10_000 + i,
                    prev = w * 10_000 + i.max(1) - 1,
                ))
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    // Kill the capture process hard twice while the load runs.
    let kills: usize = std::env::var("KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(2);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(150)).await;
        capture.0.kill().unwrap(); // SIGKILL
        capture.0.wait().unwrap();
        capture = start_capture(&worker_url);
    }
    for w in writers {
        w.await.unwrap();
    }
    // Wait until capture caught up with the source.
    let deadline = Instant::now() + Duration::from_secs(30);
    let source_count = 180i64;
    loop {
        let (rows, applied): (i64, i64) = {
            let r = env
                .admin
                .query_one(
                    "SELECT (SELECT count(*) FROM synchro.projection_rows), applied_transactions FROM synchro.capture_state",
                    &[],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1))
        };
        if rows == source_count && applied == source_count + 1 {
            break;
        }
        if Instant::now() >= deadline {
            let state: String = env
                .admin
                .query_one(
                    "SELECT row_to_json(c)::text || ' ' || (SELECT row_to_json(s)::text FROM pg_replication_slots s)
                       FROM synchro.capture_state c",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let missing: Vec<i64> = env
                .admin
                .query("SELECT e.id FROM app.events e WHERE NOT EXISTS (SELECT 1 FROM synchro.projection_rows p WHERE p.pk = '\"' || e.id || '\"') ORDER BY 1", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("capture did not catch up: {rows} rows, {applied} transactions; missing {missing:?}; {state}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(capture);
    // Every source transaction applied exactly once, and the projection equals the source.
    let mismatches: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM app.events e FULL JOIN synchro.projection_rows p ON p.pk = '\"' || e.id || '\"'
              WHERE p.pk IS NULL OR e.id IS NULL
                 OR (p.row_json::jsonb -> (SELECT field_id FROM synchro.fields WHERE column_name = 'n'))::text::int <> e.n",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mismatches, 0);
    let applied: i64 = env
        .admin
        .query_one(
            "SELECT applied_transactions FROM synchro.capture_state",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Plus one: the bootstrap transaction of the (then empty) relation.
    assert_eq!(applied, source_count + 1);
}
