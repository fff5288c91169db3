//! The workload users compare sync engines on, end to end on one machine: a table
//! `items(id int primary key, val int, name text, score float8, flag bool)` of 100,000 rows
//! on a throwaway PostgreSQL, the server in this process (HTTP API and the capture worker
//! polling every 25 ms, as `serve` does), and a native `synchro-client` over HTTP on a
//! SQLite file.
//!
//! Prints (a) the time for a fresh client to be fully synced and verified (every row's
//! checksum and the scope's terminal digest checked), and (b) commit-to-visible-in-client
//! latency over single-row updates, p50 / p90 / p99, where "visible" means committed in the
//! client's SQLite after a verified page: first for a client calling `sync_once` in a loop
//! (connect + push + pull per round, the figure before live sessions), then for a live
//! client (`Client::run_live`: connected once, it pulls when the events stream names its
//! scope; the time is taken when the page carrying the row has committed); then (c) pushed
//! mutations per second against a raw SQL update of the same rows in the same run, and
//! (d) push-to-visible-in-another-client latency; (e) one transaction updating every row:
//! capture's time to materialize it, and a synced client's catch-up by pull (with the time
//! its pull requests took apart). Before them, the server's initial copy:
//! from registration until the relation is `active` (bootstrap copy and membership
//! evaluated), polled in `synchro.relation_capture`; at the end, resident memory.
//!
//! `cargo run --release -p synchro-tests --example items_bench -- [rows] [updates]`
//! (or `scripts/bench-client.sh`, `scripts/bench-vs-zero.sh`). Environment:
//! - `SYNCHRO_BENCH_SERVER_BIN`: run the server as its own process, this `synchro-server`
//!   binary's `serve` with the capture worker (`server.rs`); without it the server runs in
//!   this process and the memory figure covers server and client together;
//! - `SYNCHRO_BENCH_PG_SETTINGS`: extra PostgreSQL settings for the throwaway cluster,
//!   `name=value` separated by spaces (later ones override the harness's own);
//! - `SYNCHRO_BENCH_BROWSER_CMD`: afterwards, a shell command that runs the browser client
//!   against the same server (`browser.rs`), with its control endpoint on
//!   `SYNCHRO_BENCH_CONTROL_ADDR` (default 127.0.0.1:8798).

mod browser;
mod rss;
mod seed;
mod server;

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use synchro_client::engine::{Client, LiveConfig, LiveEnd, LiveHandle};
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, MutationState, Operation};
use synchro_client::storage::Storage;
use synchro_client::transport::{Response, Transport, TransportError};
use synchro_protocol::token::Keyring;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::api::{router, AppState, Config};
use synchro_server::auth::{mint, Authenticator};
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish};

const SECRET: &[u8] = b"items-bench-secret-0123456789abcd";

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// "p50 … ms, p90 … ms, p99 … ms" of `latencies` (sorted here).
fn spread(latencies: &mut [f64]) -> String {
    latencies.sort_by(f64::total_cmp);
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms",
        percentile(latencies, 0.5),
        percentile(latencies, 0.9),
        percentile(latencies, 0.99)
    )
}

/// Syncs `c` in a loop until its row `id` has `val` (at most 60 s after `since`).
async fn sync_until(
    c: &mut Client<HttpTransport>,
    id: i64,
    val: i32,
    since: Instant,
    what: &str,
) -> Result<()> {
    loop {
        c.sync_once().await?;
        let local: i32 = c.storage().connection().query_row(
            "SELECT val FROM items WHERE id = ?",
            [id],
            |r| r.get(0),
        )?;
        if local == val {
            return Ok(());
        }
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(60),
            "{what} never arrived"
        );
    }
}

fn local_count(c: &Client<HttpTransport>) -> i64 {
    c.storage()
        .connection()
        .query_row("SELECT count(*) FROM items", [], |r| r.get(0))
        .unwrap_or(0)
}

/// One benchmark run, long on purpose: the stack (a throwaway cluster, the server, the
/// registered table) is set up once and every measurement (a) to (e) below runs on it in
/// order, each headed by its letter, and later ones use the clients earlier ones synced;
/// split into functions they would pass a dozen handles each.
#[tokio::main]
async fn main() -> Result<()> {
    let rows = arg(1, 100_000);
    let updates = arg(2, 100);
    let pg_settings = std::env::var("SYNCHRO_BENCH_PG_SETTINGS").unwrap_or_default();
    let pg_settings: Vec<&str> = pg_settings.split_whitespace().collect();
    let cluster = TempCluster::start_with(&pg_settings)?;
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute("CREATE DATABASE bench")
        .await?;
    let url = |user: &str| cluster.url(user, "bench");
    let mut admin = connect_db(&url("postgres")).await?;
    let mut shown = Vec::new();
    for name in [
        "server_version",
        "wal_level",
        "fsync",
        "full_page_writes",
        "synchronous_commit",
        "shared_buffers",
        "max_wal_senders",
        "max_replication_slots",
        "lc_collate",
    ] {
        let v: String = admin.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
        shown.push(format!("{name}={v}"));
    }
    println!("postgres: {}", shown.join(" "));
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE app.items (id int PRIMARY KEY, val int, name text, score float8, flag bool);
             INSERT INTO app.items SELECT g, g % 1000, 'item ' || g, g / 7.0, g % 2 = 0
               FROM generate_series(1, {rows}) g;
             RESET ROLE;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;"
        ))
        .await?;
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    let registered = Instant::now();
    register(&op, &RegisterRequest::synced("app", "items", "multi_scope"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Every row in one shared scope that every user has.
    op.batch_execute(
        "CREATE FUNCTION rules.item_scopes(p_id integer) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'items' FROM synchro_projection.\"app.items\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(integer) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(integer) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(integer)');
         SELECT synchro.synchro_add_shared_scope('items');",
    )
    .await?;
    publish::publish(&mut op).await?;

    let dir = std::env::temp_dir().join(format!("synchro-items-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Where the portable seed of (s) is exported and served from.
    let seeds = dir.join("seeds");
    std::fs::create_dir_all(&seeds)?;
    let server_process = match std::env::var_os("SYNCHRO_BENCH_SERVER_BIN") {
        Some(bin) => Some(server::ServerProcess::start(
            std::path::Path::new(&bin),
            &url("synchro_dev_adapter"),
            &url("synchro_dev_worker"),
            SECRET,
            &dir.join("server.log"),
            &seeds,
        )?),
        None => None,
    };
    let base = match &server_process {
        Some(s) => {
            println!(
                "server: its own process (synchro-server serve with the capture worker, pid {})",
                s.pid()
            );
            s.base.clone()
        }
        None => {
            println!("server: in this process, with the client");
            serve_in_process(&url, &seeds).await?
        }
    };
    let transport = || {
        let token = mint(SECRET, "bench", 3600);
        HttpTransport::new(base.clone(), move || token.clone())
    };
    let client = |name: &str, id: u8| -> Result<Client<HttpTransport>> {
        let _ = std::fs::remove_file(dir.join(name));
        Ok(Client::open(
            Storage::open(dir.join(name))?,
            transport(),
            ids(id),
        )?)
    };

    // The server's initial copy: registration until the relation is active.
    let started = Instant::now();
    let relation_id: String = admin
        .query_one(
            "SELECT relation_id FROM synchro.relations WHERE physical_schema = 'app' AND physical_relation = 'items'",
            &[],
        )
        .await?
        .get(0);
    // The membership rule registered after the relation is staged and goes live on its own
    // (`synchro.membership_functions.live`): timed too, after the relation is active.
    let (mut copied, mut active, mut live) = (None, None, None);
    while live.is_none() {
        let row = admin
            .query_one(
                "SELECT c.status, coalesce(m.live, true) FROM synchro.relation_capture c
                   LEFT JOIN synchro.membership_functions m USING (relation_id)
                  WHERE c.relation_id = $1",
                &[&relation_id],
            )
            .await?;
        let (status, is_live): (String, bool) = (row.get(0), row.get(1));
        let at = registered.elapsed().as_secs_f64();
        if status == "copied" && copied.is_none() {
            copied = Some(at);
        }
        if status == "active" && active.is_none() {
            active = Some(at);
        }
        if active.is_some() && is_live {
            live = Some(at);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "the relation never became active"
        );
        if live.is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!(
        "server initial copy: {rows} rows, registration to relation active (bootstrap copy + membership evaluated): {:.2} s (status 'copied' seen after {}; membership rule live after {:.2} s; polled every 10 ms)",
        active.unwrap_or_default(),
        copied.map_or("-".into(), |s| format!("{s:.2} s")),
        live.unwrap_or_default()
    );

    // Wait until the server has bootstrapped every row (a warm-up client sees them all).
    let mut warm = client("warm.db", 1)?;
    loop {
        warm.sync_once().await?;
        if local_count(&warm) == rows as i64 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "bootstrap timed out"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "server: {rows} rows bootstrapped and served after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(warm);

    // (a) A fresh client, fully synced and verified.
    let mut fresh = client("fresh.db", 2)?;
    let started = Instant::now();
    let report = fresh.sync_once().await?;
    let fresh_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        local_count(&fresh) == rows as i64,
        "the fresh client is incomplete"
    );
    anyhow::ensure!(
        report.verified.contains("items"),
        "the scope did not verify"
    );
    println!(
        "(a) fresh client fully synced and verified: {fresh_secs:.2} s for {rows} rows ({:.0} rows/s; rebuild pages of 1000, every row checksum and the terminal scope digest verified)",
        rows as f64 / fresh_secs
    );

    // Where a round goes when nothing changed: connect plus one terminal pull page.
    let mut idle = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        fresh.sync_once().await?;
        idle.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    idle.sort_by(f64::total_cmp);
    println!(
        "idle round (connect + terminal pull of the {rows}-row scope, nothing changed): median {:.1} ms",
        idle[2]
    );

    // (s) A fresh client from a portable seed of the same scope.
    let seed_token = mint(SECRET, "bench", 3600);
    let seed_login = url("synchro_dev_seed");
    let seed_setup = seed::Setup {
        rows,
        dir: &dir,
        seeds: &seeds,
        base: &base,
        token: &seed_token,
        operator: &op,
        admin: &admin,
        seed_login: &seed_login,
        transport: &transport,
    };
    seed::fresh_from_seed(&seed_setup).await?;

    // (b) Commit-to-visible latency over single-row updates: a client syncing in a loop.
    let mut latencies = Vec::with_capacity(updates);
    for i in 0..updates {
        let id = 1 + (i * 997) % rows;
        let val: i32 = admin
            .query_one(
                "UPDATE app.items SET val = val + 1 WHERE id = $1 RETURNING val",
                &[&(id as i32)],
            )
            .await?
            .get(0);
        let committed = Instant::now();
        sync_until(&mut fresh, id as i64, val, committed, "update").await?;
        latencies.push(committed.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "(b, before) commit-to-visible latency over {updates} single-row updates, sync_once in a loop: {} (capture streams the slot; connect + pull per round; each changed terminal page digests the {rows}-row scope on both sides)",
        spread(&mut latencies)
    );

    // (b) The same with a live client: connected once, it pulls when the events stream names
    // its scope (safety poll 60 s, so the stream is what brings every row).
    let applied: Rc<Cell<Option<Instant>>> = Rc::default();
    let page = Arc::new(tokio::sync::Notify::new());
    {
        let (applied, page) = (applied.clone(), page.clone());
        fresh.subscribe(move |_| {
            applied.set(Some(Instant::now()));
            page.notify_one();
        });
    }
    let live = LiveHandle::new();
    let config = LiveConfig::new().with_safety_poll_ms(60_000);
    let builds_before = fresh.storage().scope_index_builds();
    let session = fresh.run_live(&live, &config, |_| {});
    let measure = async {
        let mut latencies = Vec::with_capacity(updates);
        for i in 0..updates {
            let id = 1 + (i * 991 + 13) % rows;
            let val: i32 = admin
                .query_one(
                    "UPDATE app.items SET val = val + 1 WHERE id = $1 RETURNING val",
                    &[&(id as i32)],
                )
                .await?
                .get(0);
            let committed = Instant::now();
            applied.set(None);
            loop {
                let local: i32 = live
                    .with_client(move |c| {
                        c.storage().connection().query_row(
                            "SELECT val FROM items WHERE id = ?",
                            [id as i64],
                            |r| r.get(0),
                        )
                    })
                    .await??;
                if local == val {
                    break;
                }
                anyhow::ensure!(
                    tokio::time::timeout(Duration::from_secs(30), page.notified())
                        .await
                        .is_ok(),
                    "update never arrived"
                );
            }
            let at = applied.get().unwrap_or_else(Instant::now);
            latencies.push(at.saturating_duration_since(committed).as_secs_f64() * 1000.0);
        }
        live.stop();
        anyhow::Ok(latencies)
    };
    let (ended, latencies) = tokio::join!(session, measure);
    anyhow::ensure!(ended? == LiveEnd::Stopped, "the live session ended early");
    let mut latencies = latencies?;
    println!(
        "(b) commit-to-visible latency over {updates} single-row updates, live client: {} (NOTIFY -> events stream -> one pull, no connect; every page verified as in sync_once)",
        spread(&mut latencies)
    );
    println!(
        "    client scope index rebuilt from the tables {} time(s) during (b) (0: every terminal digest came from the kept index)",
        fresh.storage().scope_index_builds() - builds_before
    );

    // (c) Push throughput: queued single-row updates, pushed in sealed batches (up to 1,000; each
    // a compare-and-swap write, scope authorization before and after, ledger), against
    // the same updates as one raw SQL transaction in the same run.
    let pushes = 1000usize;
    let docs = fresh.manifest().expect("schema").tables[0].clone();
    let val_id = docs
        .fields
        .iter()
        .find(|f| f.name == "val")
        .unwrap()
        .field_id
        .clone();
    for i in 0..pushes {
        let pk = TypedValue::from_scalar(Scalar::Int((1 + i) as i32))?;
        fresh.write(&LocalWrite {
            table_id: &docs.table_id,
            operation: Operation::Update,
            pk: &pk,
            columns: &[(val_id.clone(), TypedValue::from_scalar(Scalar::Int(-1))?)],
        })?;
    }
    let started = Instant::now();
    let pushed = fresh.push().await?;
    let push_secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(pushed == pushes, "every mutation got an outcome");
    anyhow::ensure!(
        fresh
            .storage()
            .mutations()?
            .iter()
            .all(|m| m.state == MutationState::Applied),
        "every push applied"
    );
    let started = Instant::now();
    admin
        .batch_execute(&format!(
            "BEGIN; UPDATE app.items SET val = -2 WHERE id BETWEEN 1 AND {pushes}; COMMIT;"
        ))
        .await?;
    let raw_secs = started.elapsed().as_secs_f64();
    println!(
        "(c) push: {pushes} queued updates in {push_secs:.2} s = {:.0} mutations/s; raw SQL UPDATE of the same rows in one transaction {:.0} rows/s; ratio {:.4}x",
        pushes as f64 / push_secs,
        pushes as f64 / raw_secs,
        raw_secs / push_secs
    );

    // (d) Push-to-visible in another client: one client writes and pushes a row, another
    // syncs in a loop until its SQLite shows it.
    let mut other = client("other.db", 3)?;
    other.sync_once().await?;
    let mut latencies = Vec::new();
    for i in 0..(updates / 2).max(10) {
        let id = 2000 + i as i32;
        let pk = TypedValue::from_scalar(Scalar::Int(id))?;
        let value = 100_000 + i as i32;
        fresh.write(&LocalWrite {
            table_id: &docs.table_id,
            operation: Operation::Update,
            pk: &pk,
            columns: &[(val_id.clone(), TypedValue::from_scalar(Scalar::Int(value))?)],
        })?;
        let started = Instant::now();
        fresh.push().await?;
        sync_until(&mut other, i64::from(id), value, started, "push").await?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "(d) push-to-visible in another client over {} writes: {}",
        latencies.len(),
        spread(&mut latencies)
    );
    drop(fresh);
    drop(other);
    // The server's memory so far, before the bulk step below adds a 100,000-row transaction.
    let (server_pid, what) = match &server_process {
        Some(s) => (s.pid(), "server"),
        None => (std::process::id(), "server + client"),
    };
    println!("rss {what} before (e): {}", rss::describe(server_pid));

    // (e) Bulk: one source transaction updates every row. Capture materializes it (commit →
    // the worker's confirmed position past it), then a synced client catches up by pulling
    // every changed row (pages of 1000, each row checksum and the terminal digest verified);
    // the time its pull requests took (server, as seen over HTTP) is counted apart from the
    // client's own work.
    let spent = Rc::new(Cell::new(0.0));
    let _ = std::fs::remove_file(dir.join("bulk.db"));
    let mut bulk = Client::open(
        Storage::open(dir.join("bulk.db"))?,
        Timed {
            inner: transport(),
            path: "/sync/pull",
            spent: spent.clone(),
        },
        ids(4),
    )?;
    bulk.sync_once().await?;
    let started = Instant::now();
    admin
        .batch_execute("UPDATE app.items SET val = val + 1")
        .await?;
    let write_secs = started.elapsed().as_secs_f64();
    let lsn: String = admin
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    let started = Instant::now();
    loop {
        let done: bool = admin
            .query_one(
                "SELECT confirmed_lsn >= $1::text::pg_lsn FROM synchro.capture_state",
                &[&lsn],
            )
            .await?
            .get(0);
        if done {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "capture never reached the bulk update"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let capture_secs = started.elapsed().as_secs_f64();
    let expected: i64 = admin
        .query_one("SELECT sum(val)::bigint FROM app.items", &[])
        .await?
        .get(0);
    spent.set(0.0);
    let started = Instant::now();
    let report = bulk.sync_once().await?;
    let catch_up_secs = started.elapsed().as_secs_f64();
    let local: i64 =
        bulk.storage()
            .connection()
            .query_row("SELECT sum(val) FROM items", [], |r| r.get(0))?;
    anyhow::ensure!(local == expected, "the client did not catch up");
    anyhow::ensure!(
        report.verified.contains("items") && report.rebuilt.is_empty(),
        "the catch-up was not a verified pull"
    );
    println!(
        "(e) bulk update of all {rows} rows in one transaction ({write_secs:.2} s): captured in {capture_secs:.2} s = {:.0} changes/s; a synced client caught up in {catch_up_secs:.2} s = {:.0} rows/s, of which its pull requests (server, over HTTP) {:.2} s = {:.0} rows/s",
        rows as f64 / capture_secs,
        rows as f64 / catch_up_secs,
        spent.get(),
        rows as f64 / spent.get()
    );
    drop(bulk);

    // Resident memory: the peak is the whole run so far (warm-up, fresh client, pushes).
    let me = std::process::id();
    match &server_process {
        Some(s) => {
            println!(
                "rss server (synchro-server serve + capture worker, pid {}): {}",
                s.pid(),
                rss::describe(s.pid())
            );
            println!("rss client (this process: the native clients and the benchmark's PostgreSQL connections, pid {me}): {}", rss::describe(me));
        }
        None => println!(
            "rss server + client (one process, pid {me}): {}",
            rss::describe(me)
        ),
    }

    if let Ok(cmd) = std::env::var("SYNCHRO_BENCH_BROWSER_CMD") {
        let listen: std::net::SocketAddr = std::env::var("SYNCHRO_BENCH_CONTROL_ADDR")
            .unwrap_or_else(|_| "127.0.0.1:8798".into())
            .parse()?;
        let token = mint(SECRET, "bench", 3600);
        let log = dir.join("browser.log");
        println!("browser: synchro-client (wasm32) in headless Chromium, dedicated worker, OPFS, against the same server");
        // A seed of now for the browser's (s): the one of the native run is behind every
        // change made since.
        let seed_url = seed::export(&seed_setup).await?;
        let ok = browser::run(
            &cmd,
            listen,
            format!("{base} {token} {rows} {updates} {seed_url}"),
            rows,
            connect_db(&url("postgres")).await?,
            &log,
        )
        .await?;
        if !ok {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            println!("browser: FAILED; the end of its log:");
            for l in tail.into_iter().rev() {
                println!("  {l}");
            }
        }
        if let Some(s) = &server_process {
            println!(
                "rss server after the browser client (pid {}): {}",
                s.pid(),
                rss::describe(s.pid())
            );
        }
    }
    drop(server_process);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// xorshift64*: distinct 16-byte draws for client, mutation and batch IDs.
fn ids(id: u8) -> impl FnMut() -> [u8; 16] {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(id);
    move || {
        let mut out = [0u8; 16];
        for chunk in out.chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            chunk.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        out
    }
}

/// A transport that adds up the time its requests to `path` took.
struct Timed {
    inner: HttpTransport,
    path: &'static str,
    spent: Rc<Cell<f64>>,
}

impl Transport for Timed {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let started = Instant::now();
        let answer = self.inner.post(path, body).await;
        if path == self.path {
            self.spent
                .set(self.spent.get() + started.elapsed().as_secs_f64());
        }
        answer
    }
}

/// The server in this process: the HTTP API and the capture worker polling every 25 ms, as
/// `serve` does. Returns its base URL.
async fn serve_in_process(url: &dyn Fn(&str) -> String, seeds: &Path) -> Result<String> {
    tokio::spawn(synchro_server::capture::worker::run_forever(
        url("synchro_dev_worker"),
        Duration::from_millis(25),
    ));
    let mut pool = Vec::new();
    for _ in 0..4 {
        pool.push(connect_db(&url("synchro_dev_adapter")).await?);
    }
    let state = Arc::new(AppState {
        db: connect_db(&url("synchro_dev_adapter")).await?.into(),
        snapshot_db: synchro_server::api::SnapshotPool::new(pool),
        auth: Authenticator::hs256(SECRET)?,
        cursor_keys: Keyring::new("k1", &[7; 32])?,
        config: Config {
            seed_dir: Some(seeds.to_owned()),
            ..Config::default()
        },
        // As `serve` does: a LISTEN session wakes the events streams after each capture commit.
        events: synchro_server::api::Notifier::listen(url("synchro_dev_adapter")),
        membership_db: Some(synchro_server::api::ConnectionPool::new(vec![
            connect_db(&url("synchro_dev_adapter")).await?,
            connect_db(&url("synchro_dev_adapter")).await?,
        ])),
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    Ok(base)
}
