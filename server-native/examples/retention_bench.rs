//! Retention soak (issue 38.5): a few hundred clients on their own scopes pull while writes
//! go on for minutes and compaction runs on its schedule; some clients go offline, and past
//! the client TTL. Prints the effect log's size over time beside what the slowest live client
//! has not acknowledged, each compaction pass's duration, and pull latency while a pass runs
//! against pulls of the same clients while none does (measured in the same run: ratios, not
//! absolutes, on these noisy machines).
//!
//! `cargo run --release -p synchro-server --example retention_bench -- [seconds] [clients]
//! [writes_per_second] [offline_percent]` (or `scripts/bench-retention.sh`; defaults 600 s,
//! 300 clients, 200 row writes per second, 10 % offline).
//!
//! Going past the TTL is simulated, not waited for: the TTL's minimum is one day, so a third
//! of the way through, the offline clients' acknowledgement and generation times are moved
//! 40 days back (as `server-native/tests/pull_api.rs` does); the next pass expires them and
//! stops keeping their history. Goals: the log plateaus at what the slowest live client has
//! not acknowledged plus a constant (the writes between two passes); pulls during a pass
//! within 1.5x of pulls without one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};
use synchro_protocol::token::Keyring;
use synchro_server::api::{router, AppState, Config};
use synchro_server::auth::{mint, Authenticator};
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::{connect_db, publish};

#[path = "bench_common/mod.rs"]
mod bench_common;

const SECRET: &[u8] = b"retention-bench-secret-0123456789";
/// How often compaction runs (`synchro-server compact --every 10`).
const COMPACT_EVERY: Duration = Duration::from_secs(10);
/// How often a live client pulls.
const PULL_EVERY: Duration = Duration::from_secs(2);

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// One simulated client: its user, generation and cursor.
struct Sim {
    user: String,
    client_id: String,
    generation: u64,
    cursor: Value,
}

/// Pull latencies (ms), split by whether a compaction pass ran while the pull did.
#[derive(Default)]
struct Latencies {
    quiet: Vec<f64>,
    compacting: Vec<f64>,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn post(http: &reqwest::Client, base: &str, path: &str, token: &str, body: Value) -> Value {
    let resp = http
        .post(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let status = resp.status();
    let v: Value = resp.json().await.expect("JSON body");
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// Pulls `sim`'s scope to its terminal page (rebuilding when told to); returns whether any
/// compaction pass overlapped it, and how long it took.
async fn follow(
    http: &reqwest::Client,
    base: &str,
    schema: &Value,
    sim: &mut Sim,
    compacting: &AtomicBool,
) -> (bool, f64) {
    let token = mint(SECRET, &sim.user, 3600);
    let scope = format!("user:{}", sim.user);
    let started = Instant::now();
    let mut overlapped = compacting.load(Ordering::Relaxed);
    loop {
        let v = post(
            http,
            base,
            "/sync/pull",
            &token,
            json!({"protocol_version": 3, "client_id": sim.client_id, "client_generation": sim.generation,
                   "schema": schema, "scope_cursors": {&scope: sim.cursor}, "limit": 1000}),
        )
        .await;
        overlapped |= compacting.load(Ordering::Relaxed);
        if v["rebuild_scopes"]
            .as_array()
            .is_some_and(|r| r.contains(&json!(scope)))
        {
            let mut continuation = Value::Null;
            loop {
                let p = post(
                    http,
                    base,
                    "/sync/rebuild",
                    &token,
                    json!({"protocol_version": 3, "client_id": sim.client_id, "client_generation": sim.generation,
                           "schema": schema, "scope_id": scope, "limit": 1000, "continuation": continuation}),
                )
                .await;
                if p["has_more"] == false {
                    sim.cursor = p["final_scope_cursor"].clone();
                    break;
                }
                continuation = p["continuation"].clone();
            }
            continue;
        }
        sim.cursor = v["scope_cursor_updates"][&scope].clone();
        if v["has_more"] == false {
            return (overlapped, started.elapsed().as_secs_f64() * 1000.0);
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let seconds = arg(1, 600) as u64;
    let clients = arg(2, 300);
    let writes_per_second = arg(3, 200).max(1);
    let offline_percent = arg(4, 10).min(100);
    let offline = clients * offline_percent / 100;
    println!(
        "retention soak: {seconds} s, {clients} clients ({offline} go offline), {writes_per_second} row writes/s, compaction every {} s",
        COMPACT_EVERY.as_secs()
    );

    let (cluster, admin) = bench_common::bench_database(&format!(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, owner text NOT NULL, title text);
         INSERT INTO app.items SELECT g, 'u' || (g % {clients}), 'item ' || g FROM generate_series(1, {rows}) g;",
        rows = clients * 20
    ))
    .await?;
    let url = |user: &str| cluster.url(user, "bench");
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    bench_common::register_items_by_owner(&mut op).await?;
    let mut worker = Worker::connect(&url("synchro_dev_worker")).await?;
    while worker.step(Failpoint::None).await? != StepOutcome::Applied(0) {}
    drop(worker);
    tokio::spawn(synchro_server::capture::worker::run_forever(
        url("synchro_dev_worker"),
        Duration::from_millis(25),
    ));

    let state = Arc::new(AppState {
        db: connect_db(&url("synchro_dev_adapter")).await?.into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(vec![
            connect_db(&url("synchro_dev_adapter")).await?,
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
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    let manifest = publish::load_lineage(&op).await?;
    let schema_ref = manifest.current().expect("published").schema_ref();
    let schema = json!({"version": schema_ref.version, "hash": hex::encode(schema_ref.hash)});
    let http = reqwest::Client::new();

    // Every client connects and syncs its scope once.
    let mut sims = Vec::new();
    for i in 0..clients {
        let user = format!("u{i}");
        let client_id = format!("c{i}");
        let v = post(
            &http,
            &base,
            "/sync/connect",
            &mint(SECRET, &user, 3600),
            json!({"protocol_version": 3, "client_id": client_id, "schema": {"version": 0, "hash": ""}}),
        )
        .await;
        let mut sim = Sim {
            user,
            client_id,
            generation: v["client_generation"].as_u64().expect("generation"),
            cursor: Value::Null,
        };
        // Twice: the second pull presents the first one's cursor, which acknowledges it (a
        // client that never acknowledged pins nothing).
        for _ in 0..2 {
            follow(&http, &base, &schema, &mut sim, &AtomicBool::new(false)).await;
        }
        sims.push(sim);
    }
    println!("{clients} clients synced; the soak begins");

    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let compacting = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Latencies::default()));

    // The write load: updates and inserts spread over every owner, in transactions of ten.
    let writer_db = connect_db(&url("postgres")).await?;
    let writer = tokio::spawn(async move {
        let mut next_id = (clients * 20 + 1) as i64;
        let mut written = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let per_tick = (writes_per_second / 20).max(1) as i64;
        while Instant::now() < end {
            tick.tick().await;
            let first = next_id;
            next_id += per_tick;
            writer_db
                .batch_execute(&format!(
                    "INSERT INTO app.items SELECT g, 'u' || (g % {clients}), 'item ' || g
                       FROM generate_series({first}, {last}) g;
                     UPDATE app.items SET title = title || '.' WHERE id = {upd};",
                    last = next_id - 1,
                    upd = 1 + (first % (clients as i64 * 20)),
                ))
                .await
                .expect("write");
            written += per_tick as u64 + 1;
        }
        written
    });

    // Compaction on its schedule, as `synchro-server compact --every` runs it.
    let operator_db = connect_db(&url("synchro_dev_operator")).await?;
    let passes = Arc::new(Mutex::new(Vec::new()));
    let compactor = {
        let compacting = compacting.clone();
        let passes = passes.clone();
        tokio::spawn(async move {
            while Instant::now() < end {
                tokio::time::sleep(COMPACT_EVERY).await;
                compacting.store(true, Ordering::Relaxed);
                let t = Instant::now();
                let c = synchro_server::retention::compact(&operator_db, 1000)
                    .await
                    .expect("compaction");
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                compacting.store(false, Ordering::Relaxed);
                println!(
                    "  compaction at {:>4} s: {ms:>7.1} ms, {} effects deleted, {} clients expired",
                    started.elapsed().as_secs(),
                    c.effects_deleted,
                    c.clients_expired
                );
                passes
                    .lock()
                    .unwrap()
                    .push((ms, c.effects_deleted, c.clients_expired));
            }
        })
    };

    // The live clients pull every PULL_EVERY, staggered; the offline ones stop at once.
    let live: Vec<Sim> = sims.drain(offline..).collect();
    let mut pullers = Vec::new();
    let workers = 8usize;
    let mut shares: Vec<Vec<Sim>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, s) in live.into_iter().enumerate() {
        shares[i % workers].push(s);
    }
    for mut share in shares {
        let (http, base, schema) = (http.clone(), base.clone(), schema.clone());
        let (compacting, latencies) = (compacting.clone(), latencies.clone());
        pullers.push(tokio::spawn(async move {
            let n = share.len().max(1) as u32;
            while Instant::now() < end {
                for sim in share.iter_mut() {
                    let (overlapped, ms) = follow(&http, &base, &schema, sim, &compacting).await;
                    {
                        let mut l = latencies.lock().unwrap();
                        if overlapped {
                            l.compacting.push(ms);
                        } else {
                            l.quiet.push(ms);
                        }
                    }
                    tokio::time::sleep(PULL_EVERY / n).await;
                }
            }
        }));
    }

    // The log over time, beside what the slowest live client has not acknowledged.
    let offline_ids: Vec<String> = (0..offline).map(|i| format!("c{i}")).collect();
    let mut aged = false;
    let mut samples = Vec::new();
    println!("  time  effects  unacked_by_slowest_live  live_clients");
    while Instant::now() < end {
        tokio::time::sleep(
            Duration::from_secs(30).min(end.saturating_duration_since(Instant::now())),
        )
        .await;
        if !aged && started.elapsed().as_secs() >= seconds / 3 {
            admin
                .execute(
                    "UPDATE synchro.clients SET generation_started_at = now() - interval '40 days',
                            last_acknowledged_at = now() - interval '40 days'
                      WHERE client_id = ANY($1)",
                    &[&offline_ids],
                )
                .await?;
            aged = true;
            println!("  ({offline} offline clients are now past the 30-day TTL)");
        }
        let r = admin
            .query_one(
                "SELECT (SELECT count(*) FROM synchro.scope_effects),
                        (SELECT count(*) FROM synchro.scope_effects e
                          WHERE e.position > (SELECT min(a.position) FROM synchro.client_scope_acks a
                                                JOIN synchro.clients c USING (user_id, client_id)
                                               WHERE c.expired_at IS NULL AND NOT c.client_id = ANY($1))),
                        (SELECT count(*) FROM synchro.clients WHERE expired_at IS NULL AND NOT client_id = ANY($1))",
                &[&offline_ids],
            )
            .await?;
        let (effects, unacked, live): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        println!(
            "  {:>4}s {effects:>8} {unacked:>24} {live:>13}",
            started.elapsed().as_secs()
        );
        samples.push((started.elapsed().as_secs(), effects, unacked));
    }
    let written = writer.await?;
    compactor.await?;
    for p in pullers {
        p.await?;
    }

    let mut l = std::mem::take(&mut *latencies.lock().unwrap());
    let (q50, q99) = (
        percentile(&mut l.quiet, 0.5),
        percentile(&mut l.quiet, 0.99),
    );
    let (c50, c99) = (
        percentile(&mut l.compacting, 0.5),
        percentile(&mut l.compacting, 0.99),
    );
    let passes = passes.lock().unwrap();
    let mut pass_ms: Vec<f64> = passes.iter().map(|p| p.0).collect();
    println!("rows written: {written}");
    println!(
        "compaction: {} passes, p50 {:.1} ms, max {:.1} ms",
        pass_ms.len(),
        percentile(&mut pass_ms, 0.5),
        pass_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "pull (to the terminal page): without compaction p50 {q50:.1} ms p99 {q99:.1} ms (n={}); during compaction p50 {c50:.1} ms p99 {c99:.1} ms (n={})",
        l.quiet.len(),
        l.compacting.len()
    );
    println!(
        "pull during compaction / without: p50 {:.2}x, p99 {:.2}x (goal: at most 1.5x)",
        c50 / q50,
        c99 / q99
    );
    // The plateau: in the last two thirds (after the offline clients expired), the log minus
    // what the slowest live client has not acknowledged stays within a constant.
    let tail: Vec<i64> = samples
        .iter()
        .filter(|s| s.0 > seconds / 3 + COMPACT_EVERY.as_secs() * 2)
        .map(|s| s.1 - s.2)
        .collect();
    if let (Some(lo), Some(hi)) = (tail.iter().min(), tail.iter().max()) {
        println!(
            "log beyond the slowest live client's unacknowledged part, after expiry: {lo}..{hi} effects (writes per compaction interval: about {})",
            writes_per_second as u64 * COMPACT_EVERY.as_secs()
        );
    }
    Ok(())
}
