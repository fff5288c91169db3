//! Capture, pull and rebuild benchmark against a throwaway PostgreSQL, with the raw rate of
//! reading the same changes through `pg_logical_slot_get_binary_changes` measured in the
//! same run as the baseline (these machines are noisy: compare ratios, not absolutes).
//!
//! `cargo run --release -p synchro-server --example capture_bench -- [transactions]
//! [rows_per_transaction] [latency_samples] [bootstrap_rows]` (or `scripts/bench-capture.sh`).
//!
//! Figures:
//! - raw slot read: decoded pgoutput messages fetched by a client, as row changes per second
//! - capture: the worker decoding, projecting, evaluating membership and writing effects
//!   for the same changes, committed with its progress (exactly-once path)
//! - pull: `POST /sync/pull` from a null cursor, pages of 1000, terminal checksum included
//! - rebuild: `POST /sync/rebuild` of the same scope, pages of 1000, final checksum included
//! - bootstrap (4th argument, default 100,000): a table of that many existing rows
//!   registered, until the relation is active (copied, membership evaluated, effects)
//! - latency: commit of one row until its scope effect is committed (from then on a pull
//!   returns it), with the worker polling the slot every 5 ms; then the duration of the
//!   pull that returns it (its terminal page digests the whole scope)

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};
use synchro_protocol::token::Keyring;
use synchro_server::api::{router, AppState, Config};
use synchro_server::auth::{mint, Authenticator};
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, publish};

#[path = "bench_common/mod.rs"]
mod bench_common;

const SECRET: &[u8] = b"capture-bench-secret-0123456789ab";
const OWNERS: i64 = 4;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

struct Http {
    base: String,
    client: reqwest::Client,
    token: String,
}

impl Http {
    async fn post(&self, path: &str, body: Value) -> Value {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        let status = resp.status();
        let v: Value = resp.json().await.expect("JSON body");
        assert_eq!(status, 200, "{path}: {v}");
        v
    }
}

/// One benchmark run, long on purpose: one stack is set up and each measured load runs on
/// it in turn, printing its figure as it ends; the steps share the cluster, the worker and
/// the counters of the one before.
#[tokio::main]
async fn main() -> Result<()> {
    let transactions = arg(1, 4000);
    let rows_per_tx = arg(2, 5);
    let samples = arg(3, 200);
    let changes = transactions * rows_per_tx;

    let (cluster, admin) = bench_common::bench_database(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, owner text NOT NULL, title text, qty integer NOT NULL);",
    )
    .await?;
    let url = |user: &str| cluster.url(user, "bench");
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    bench_common::register_items_by_owner(&mut op).await?;
    let mut worker = Worker::connect(&url("synchro_dev_worker")).await?;
    while worker.step(Failpoint::None).await? != StepOutcome::Applied(0) {}
    admin
        .batch_execute("SELECT pg_create_logical_replication_slot('bench_raw', 'pgoutput')")
        .await?;

    // The write load, with capture idle: transactions of inserts spread over the owners.
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..2usize {
        let db = connect_db(&url("postgres")).await?;
        writers.push(tokio::spawn(async move {
            for t in (w..transactions).step_by(2) {
                let first = (t * rows_per_tx) as i64;
                db.batch_execute(&format!(
                    "INSERT INTO app.items SELECT g, 'u' || (g % {OWNERS}), 'item ' || g, g % 100
                       FROM generate_series({first}, {last}) g",
                    last = first + rows_per_tx as i64 - 1
                ))
                .await
                .expect("write");
            }
        }));
    }
    for w in writers {
        w.await?;
    }
    let write_secs = started.elapsed().as_secs_f64();

    // Baseline: the same changes read raw from a slot by a client.
    let started = Instant::now();
    let raw = admin
        .query(
            "SELECT data FROM pg_logical_slot_get_binary_changes('bench_raw', NULL, NULL,
               'proto_version', '1', 'publication_names', 'synchro_publication', 'messages', 'true')",
            &[],
        )
        .await?;
    let raw_secs = started.elapsed().as_secs_f64();
    let raw_rows = raw
        .iter()
        .filter(|r| r.get::<_, &[u8]>(0)[0] == b'I')
        .count();
    assert_eq!(raw_rows, changes, "the raw slot saw every insert");
    drop(raw);
    admin
        .batch_execute("SELECT pg_drop_replication_slot('bench_raw')")
        .await?;

    let started = Instant::now();
    let mut applied = 0;
    loop {
        match worker.step(Failpoint::None).await? {
            StepOutcome::Applied(0) => break,
            StepOutcome::Applied(n) => applied += n,
            other => anyhow::bail!("capture stopped: {other:?}"),
        }
    }
    let capture_secs = started.elapsed().as_secs_f64();
    assert_eq!(applied, transactions, "every transaction captured once");

    // The HTTP API in this process.
    let state = Arc::new(AppState {
        db: connect_db(&url("synchro_dev_adapter")).await?.into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(vec![
            connect_db(&url("synchro_dev_adapter")).await?,
        ]),
        auth: Authenticator::hs256(SECRET)?,
        cursor_keys: Keyring::new("k1", &[7; 32])?,
        config: Config::default(),
        events: Default::default(),
        membership_db: None,
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    let http = Http {
        base,
        client: reqwest::Client::new(),
        token: mint(SECRET, "u0", 3600),
    };
    let manifest = publish::load_lineage(&op).await?;
    let schema_ref = manifest.current().expect("published").schema_ref();
    let schema = json!({"version": schema_ref.version, "hash": hex::encode(schema_ref.hash)});
    let connect = http
        .post(
            "/sync/connect",
            json!({"protocol_version": 3, "client_id": "bench", "schema": {"version": 0, "hash": ""}}),
        )
        .await;
    let generation = connect["client_generation"].clone();
    let scope_rows = changes.div_ceil(OWNERS as usize);

    // Pull the whole scope from a null cursor.
    let started = Instant::now();
    let mut cursor = Value::Null;
    let mut pulled = 0;
    loop {
        let v = http
            .post(
                "/sync/pull",
                json!({"protocol_version": 3, "client_id": "bench", "client_generation": generation,
                       "schema": schema, "scope_cursors": {"user:u0": cursor}, "limit": 1000}),
            )
            .await;
        pulled += v["changes"].as_array().map_or(0, Vec::len);
        cursor = v["scope_cursor_updates"]["user:u0"].clone();
        if v["has_more"] == false {
            break;
        }
    }
    let pull_secs = started.elapsed().as_secs_f64();
    assert_eq!(pulled, scope_rows, "pull returned the scope's rows");

    // Rebuild the same scope.
    let started = Instant::now();
    let mut continuation = Value::Null;
    let mut rebuilt = 0;
    loop {
        let mut body = json!({"protocol_version": 3, "client_id": "bench", "client_generation": generation,
                              "schema": schema, "scope_id": "user:u0", "limit": 1000});
        if !continuation.is_null() {
            body["continuation"] = continuation.clone();
        }
        let v = http.post("/sync/rebuild", body).await;
        rebuilt += v["records"].as_array().map_or(0, Vec::len);
        if v["has_more"] == false {
            break;
        }
        continuation = v["continuation"].clone();
    }
    let rebuild_secs = started.elapsed().as_secs_f64();
    assert_eq!(rebuilt, scope_rows, "rebuild returned the scope's rows");

    // Latency: the worker polls every 5 ms; one row at a time, pulled until it appears.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let capture = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if worker.step(Failpoint::None).await.expect("capture") == StepOutcome::Applied(0) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    let mut latencies = Vec::with_capacity(samples);
    let mut pulls = Vec::with_capacity(samples);
    let probe = connect_db(&url("postgres")).await?;
    for i in 0..samples {
        let id = 1_000_000_000 + i as i64;
        admin
            .batch_execute(&format!(
                "INSERT INTO app.items VALUES ({id}, 'u0', 'latency', 0)"
            ))
            .await?;
        let committed = Instant::now();
        // Pullable: its scope effect is committed (a pull from then on returns it).
        let pk = format!("\"{id}\"");
        while probe
            .query_opt(
                "SELECT 1 FROM synchro.scope_effects WHERE scope_id = 'user:u0' AND pk = $1",
                &[&pk],
            )
            .await?
            .is_none()
        {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        latencies.push(committed.elapsed());
        let started = Instant::now();
        let v = http
            .post(
                "/sync/pull",
                json!({"protocol_version": 3, "client_id": "bench", "client_generation": generation,
                       "schema": schema, "scope_cursors": {"user:u0": cursor}, "limit": 1000}),
            )
            .await;
        pulls.push(started.elapsed());
        cursor = v["scope_cursor_updates"]["user:u0"].clone();
        assert!(v["changes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["pk"] == json!(id.to_string()))));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    capture.await?;

    // Bootstrap: a table of `seeded` existing rows (the items workload's shape) registered
    // with one shared scope, until the relation is active (copied, membership evaluated).
    let seeded = arg(4, 100_000);
    admin
        .batch_execute(&format!(
            "SET ROLE app_owner;
             CREATE TABLE app.seeded (id int PRIMARY KEY, val int, name text, score float8, flag bool);
             INSERT INTO app.seeded SELECT g, g % 1000, 'item ' || g, g / 7.0, g % 2 = 0
               FROM generate_series(1, {seeded}) g;
             RESET ROLE; ANALYZE app.seeded;"
        ))
        .await?;
    let started = Instant::now();
    register(
        &op,
        &RegisterRequest::synced("app", "seeded", "multi_scope"),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    op.batch_execute(
        "CREATE FUNCTION rules.seeded_scopes(p_id integer) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'seeded' FROM synchro_projection.\"app.seeded\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.seeded_scopes(integer) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.seeded_scopes(integer) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'seeded', 'rules.seeded_scopes(integer)');",
    )
    .await?;
    publish::publish(&mut op).await?;
    let mut worker = Worker::connect(&url("synchro_dev_worker")).await?;
    loop {
        worker.step(Failpoint::None).await?;
        // Served once copied and its membership rule is live (staged, then activated).
        let active: bool = admin
            .query_one(
                "SELECT NOT EXISTS (SELECT 1 FROM synchro.synchro_unready_tables())",
                &[],
            )
            .await?
            .get(0);
        if active {
            break;
        }
    }
    let bootstrap_secs = started.elapsed().as_secs_f64();

    let edges: i64 = admin
        .query_one(
            "SELECT count(*) FROM synchro.membership_edges WHERE scope_id = 'seeded'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(edges, seeded as i64, "every seeded row is in its scope");
    latencies.sort();
    pulls.sort();
    let pct =
        |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;

    let raw_rate = changes as f64 / raw_secs;
    let line = |name: &str, n: usize, secs: f64| {
        let rate = n as f64 / secs;
        println!("{name:<58} {rate:>12.0} /s   {:>6.3}x raw", rate / raw_rate);
    };
    println!(
        "synchro capture benchmark: {transactions} transactions x {rows_per_tx} rows = {changes} changes, \
         {OWNERS} scopes, {scope_rows} rows in the pulled scope (written in {write_secs:.2} s)"
    );
    line(
        "raw slot read (pg_logical_slot_get_binary_changes), changes",
        changes,
        raw_secs,
    );
    line(
        "capture: decode, project, membership, effects, changes",
        changes,
        capture_secs,
    );
    line(
        "pull: pages of 1000 + terminal checksum, rows",
        pulled,
        pull_secs,
    );
    line(
        "rebuild: pages of 1000 + final checksum, rows",
        rebuilt,
        rebuild_secs,
    );
    println!(
        "latency, commit to pullable ({samples} samples, worker polls every 5 ms): p50 {:.1} ms, p99 {:.1} ms",
        pct(&latencies, 0.5),
        pct(&latencies, 0.99),
    );
    println!(
        "then one pull of that change (terminal page: digest of the {}-row scope): p50 {:.1} ms, p99 {:.1} ms",
        scope_rows + samples,
        pct(&pulls, 0.5),
        pct(&pulls, 0.99),
    );
    println!(
        "bootstrap of {seeded} existing rows (register and publish until active: copy, membership, effects): {bootstrap_secs:.2} s = {:.0} rows/s",
        seeded as f64 / bootstrap_secs
    );
    Ok(())
}
