//! Issue 38: the events that take the capture slot away, end to end against the real server
//! on real PostgreSQL. Capture blocks visibly (`/ready` 503, `health` names the reason, pulls
//! are told to retry) instead of skipping what was written meanwhile, and after
//! `synchro-server lineage reset` (the operator login, the real command) a caught-up client
//! downloads only what it missed, a client that synced a history the database lost (a
//! restored base backup) rebuilds, and a fresh client holds exactly the source's rows.

mod common;

use common::{
    docs_with_owner_and_team, free_port, local_doc_titles, start_server, wait_ready, Env,
};
use synchro_client::engine::Client;
use synchro_client::http::HttpTransport;
use synchro_client::storage::Storage;
use synchro_server::auth::mint;

const SECRET: &str = "lineage-reset-test-secret-0123456789ab";
const BIN: &str = env!("CARGO_BIN_EXE_synchro-server-under-test");

/// A new client of `user` (`seed` keeps the random bytes, so the client IDs, apart).
fn client(base: &str, user: &str, seed: u8) -> Client<HttpTransport> {
    let token = mint(SECRET.as_bytes(), user, 3600);
    let mut n = seed.wrapping_mul(64);
    Client::open(
        Storage::open_in_memory().unwrap(),
        HttpTransport::new(base.to_owned(), move || token.clone()),
        move || {
            n = n.wrapping_add(1);
            [n; 16]
        },
    )
    .unwrap()
}

async fn source_rows(env: &Env) -> Vec<(i64, Option<String>)> {
    env.admin
        .query("SELECT id, title FROM app.docs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Runs `synchro-server <args>` as the operator login: its exit code, its stdout as JSON
/// (null when it printed none) and its stderr.
fn cli_output(env: &Env, args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env(
            "DATABASE_URL",
            env.cluster.url("synchro_dev_operator", "app"),
        )
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`cli_output`] of a command that answers JSON.
fn cli(env: &Env, args: &[&str]) -> (i32, serde_json::Value) {
    let (code, json, stderr) = cli_output(env, args);
    assert!(!json.is_null(), "{args:?}: {stderr}");
    (code, json)
}

/// Waits until `health` reports capture blocked with `reason` (the restarted server's worker
/// checks the lineage at its first step), and checks that `/ready` agrees.
async fn assert_blocked(env: &Env, base: &str, reason: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (code, health) = cli(env, &["health"]);
        if health["report"]["blocked"]["reason"] == reason {
            assert_eq!(code, 1, "health exits 1: {health}");
            assert_eq!(health["checks"]["capture_lineage"], "failed");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never blocked: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let ready = reqwest::get(format!("{base}/ready")).await.unwrap();
    assert_eq!(ready.status(), 503);
}

/// Runs `lineage reset` (after a dry run that finds the slot in `slot_state`) and checks it
/// finished.
fn lineage_reset(env: &Env, slot_state: &str) {
    let (code, plan) = cli(env, &["lineage", "reset", "--dry-run"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["slot"]["state"], slot_state);
    assert_eq!(plan["relations"][0]["relation"], "app.docs");
    let (code, done) = cli(env, &["lineage", "reset", "--wait-secs", "120"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["reset"], "done");
}

async fn slots(env: &Env) -> i64 {
    env.admin
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0)
}

/// Drops the capture slot once the stopped server's stream has let go of it.
async fn drop_slot(env: &Env) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Err(e) = env
        .admin
        .batch_execute("SELECT pg_drop_replication_slot('synchro_capture')")
        .await
    {
        assert!(std::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_dropped_slot_blocks_and_lineage_reset_sends_a_caught_up_client_only_what_it_missed() {
    let env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', 'red', 'doc ' || g FROM generate_series(1, 2000) g",
    )
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let server = start_server(&env, port, SECRET);
    wait_ready(&reqwest::Client::new(), &base).await;
    let mut alice = client(&base, "alice", 1);
    let first = alice.sync_once().await.unwrap();
    assert_eq!(first.rebuilt.len(), 2, "{first:?}");
    assert_eq!(local_doc_titles(&alice).len(), 2000);

    // The server stops; the operator drops the slot (to free WAL); the database is written
    // meanwhile: a row added, one changed, one deleted.
    drop(server);
    drop_slot(&env).await;
    env.admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (2001, 'alice', 'red', 'written while no slot existed');
             UPDATE app.docs SET title = 'changed meanwhile' WHERE id = 5;
             DELETE FROM app.docs WHERE id = 7;",
        )
        .await
        .unwrap();
    let server = start_server(&env, port, SECRET);
    assert_blocked(&env, &base, "slot_missing").await;
    assert_eq!(slots(&env).await, 0, "no replacement slot on its own");
    assert!(
        alice.sync_once().await.is_err(),
        "pulls are told to retry while capture is blocked"
    );
    // `capture unblock` would skip the rows: refused, naming the way out.
    let (code, _, stderr) = cli_output(&env, &["capture", "unblock"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("synchro-server lineage reset"), "{stderr}");

    lineage_reset(&env, "missing");
    wait_ready(&reqwest::Client::new(), &base).await;
    let report = alice.sync_once().await.unwrap();
    assert!(report.rebuilt.is_empty(), "no rebuild: {report:?}");
    // Three rows, each in alice's two scopes: at most six changes, not 2,000 rows again.
    assert!(
        (3..=6).contains(&report.pulled_changes),
        "downloaded {report:?}"
    );
    assert_eq!(report.verified.len(), 2, "{report:?}");
    assert_eq!(local_doc_titles(&alice), source_rows(&env).await);
    let mut fresh = client(&base, "alice", 2);
    fresh.sync_once().await.unwrap();
    assert_eq!(local_doc_titles(&fresh), source_rows(&env).await);

    // Capture goes on from the new slot.
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (2002, 'alice', 'red', 'after the reset')")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while local_doc_titles(&alice) != source_rows(&env).await {
        assert!(std::time::Instant::now() < deadline, "2002 never arrived");
        alice.sync_once().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    drop(server);
}

#[tokio::test]
async fn after_a_base_backup_is_restored_a_client_of_the_lost_history_rebuilds_and_the_others_get_the_differences(
) {
    let mut env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', 'red', 'doc ' || g FROM generate_series(1, 500) g",
    )
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let server = start_server(&env, port, SECRET);
    wait_ready(&reqwest::Client::new(), &base).await;
    let mut ahead = client(&base, "alice", 1);
    let mut behind = client(&base, "alice", 2);
    ahead.sync_once().await.unwrap();
    behind.sync_once().await.unwrap();

    // A base backup; then a history the restore will lose, which only `ahead` syncs.
    let backup = env.cluster.base_backup().unwrap();
    env.admin
        .batch_execute(
            "INSERT INTO app.docs SELECT g, 'alice', 'red', 'lost ' || g FROM generate_series(501, 510) g;
             UPDATE app.docs SET title = 'lost change' WHERE id = 3;",
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while local_doc_titles(&ahead) != source_rows(&env).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the lost rows never arrived"
        );
        ahead.sync_once().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // The database is restored from the backup, in place, while the server is away; a row is
    // written before the server is back.
    drop(server);
    env.cluster.restore_in_place(&backup).unwrap();
    env.admin = synchro_server::connect_db(&env.cluster.url("postgres", "app"))
        .await
        .unwrap();
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (600, 'alice', 'red', 'after the restore')")
        .await
        .unwrap();
    let _server = start_server(&env, port, SECRET);
    assert_blocked(&env, &base, "slot_missing").await;

    lineage_reset(&env, "missing");
    wait_ready(&reqwest::Client::new(), &base).await;
    let source = source_rows(&env).await;
    assert_eq!(source.len(), 501);
    // `ahead` holds rows the database no longer has: its scopes rebuild.
    let report = ahead.sync_once().await.unwrap();
    assert_eq!(report.rebuilt.len(), 2, "{report:?}");
    assert_eq!(local_doc_titles(&ahead), source);
    // `behind` synced nothing the restore lost: it receives the one row written since.
    let report = behind.sync_once().await.unwrap();
    assert!(report.rebuilt.is_empty(), "{report:?}");
    assert!((1..=2).contains(&report.pulled_changes), "{report:?}");
    assert_eq!(local_doc_titles(&behind), source);
    let mut fresh = client(&base, "alice", 3);
    fresh.sync_once().await.unwrap();
    assert_eq!(local_doc_titles(&fresh), source);
}

#[tokio::test]
async fn an_invalidated_slot_blocks_and_lineage_reset_sends_a_caught_up_client_only_what_it_missed()
{
    let env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', 'red', 'doc ' || g FROM generate_series(1, 500) g",
    )
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let server = start_server(&env, port, SECRET);
    wait_ready(&reqwest::Client::new(), &base).await;
    let mut alice = client(&base, "alice", 1);
    alice.sync_once().await.unwrap();

    // The server is away while the slot may keep 1 MB of WAL: 8 segments' worth of writes
    // (2,000 rows for alice, 6,000 for others) and checkpoints invalidate it.
    drop(server);
    for sql in [
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    for i in 0..8 {
        let owner = if i % 4 == 0 { "alice" } else { "bob" };
        env.admin
            .batch_execute(&format!(
                "INSERT INTO app.docs SELECT g, '{owner}', 'blue', repeat('x', 1000)
                   FROM generate_series({0}, {0} + 999) g;
                 SELECT pg_switch_wal(); CHECKPOINT;",
                10_000 + i * 1000
            ))
            .await
            .unwrap();
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
    assert_eq!(status, "lost");
    for sql in [
        "ALTER SYSTEM RESET max_slot_wal_keep_size",
        "SELECT pg_reload_conf()",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    let _server = start_server(&env, port, SECRET);
    assert_blocked(&env, &base, "slot_invalidated").await;
    assert!(alice.sync_once().await.is_err());

    lineage_reset(&env, "invalidated");
    wait_ready(&reqwest::Client::new(), &base).await;
    let report = alice.sync_once().await.unwrap();
    assert!(report.rebuilt.is_empty(), "no rebuild: {report:?}");
    // alice's 2,000 new rows (in her user scope; team blue is not hers), not her 500 again.
    assert_eq!(report.pulled_changes, 2000, "{report:?}");
    let alices: Vec<(i64, Option<String>)> = env
        .admin
        .query(
            "SELECT id, title FROM app.docs WHERE owner = 'alice' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(local_doc_titles(&alice), alices);
    let mut fresh = client(&base, "alice", 2);
    fresh.sync_once().await.unwrap();
    assert_eq!(local_doc_titles(&fresh), alices);
}
