//! Change-notification fan-out (`POST /sync/events`) with many open streams: commit →
//! event latency at a watched client, and the database statements the server runs per
//! commit, with 1, 1,000 and 10,000 open streams, on one `serve` instance and on two behind
//! the same PostgreSQL (they learn of commits through `LISTEN`/`NOTIFY`).
//!
//! Set-up: a throwaway PostgreSQL with `pg_stat_statements` preloaded, synchro installed,
//! a table `app.items (id, owner, note)` registered with the membership rule `user:<owner>`,
//! `synchro-server capture` as its own process (streaming the slot), and for each
//! run fresh `synchro-server serve` processes without a worker, each as its own adapter
//! login. Every client is its own user (so its only assigned scope is `user:<id>`) with its
//! own client ID, connected once (`POST /sync/connect`) before the runs. In a run of N
//! streams, one client per instance is *watched* — all watched clients belong to one user,
//! whose scope every commit touches — and the other streams are *idle*: no commit touches
//! their scopes.
//!
//! Per run: open the N streams (64 opens in flight, progress on stderr), then
//! - quiet window (11 s, no commits): server statements per second (fallback ticks);
//! - K commits back to back: `INSERT` one row owned by the watched user, take the time at
//!   the commit's acknowledgement, wait until every watched stream has received a `changed`
//!   event naming the scope (10 s at most: otherwise counted as missed), then 100 ms before
//!   the next commit. Latency is commit → event decoded at the client;
//! - S sparse commits, 5.5 to 9 s apart (longer than the dispatcher's 5 s fallback tick, at
//!   varying phases of it), timed the same way: what a commit after a quiet spell sees.
//!
//! Counted (`stats.rs`): statements executed by the instances' logins
//! (`pg_stat_statements.calls`, top-level statements), split into the dispatcher's query,
//! streams' own queries and others; the idle streams' share is the streams' own queries
//! minus the events the watched streams received (each comes from one such query).
//! Client side: idle streams that received any `changed` event. Also the instances'
//! resident memory after the commits. No timed assertions: the program prints figures.
//!
//! `cargo run --release -p synchro-tests --example events_bench -- [commits]
//! [stream counts, one instance] [stream counts, two instances] [sparse commits]` (defaults
//! `50 1,1000,10000 1000,10000 10`), or `scripts/bench-events.sh`. The server binary is
//! `SYNCHRO_BENCH_SERVER_BIN`, by default `synchro-server-under-test` beside the examples
//! directory (`cargo build --release -p synchro-tests --bin synchro-server-under-test`).
//! Output never contains tokens, ids or row values.

mod servers;
mod stats;
mod streams;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::stream::StreamExt;
use serde_json::{json, Value};
use synchro_server::auth::mint;
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish};
use tokio::sync::{mpsc, Semaphore};

use servers::{Instance, Process};
use stats::Calls;
use streams::{Pool, Role, Spec};

const SECRET: &[u8] = b"events-bench-secret-0123456789abc";
/// The user every commit touches (never printed).
const WATCHED_USER: &str = "watched";
/// Adapter logins, one per instance.
const LOGINS: [&str; 2] = ["bench_server_a", "bench_server_b"];
const WORKER_LOGIN: &str = "synchro_dev_worker";
/// Tasks holding the streams.
const SHARDS: usize = 16;
/// Stream opens (and connects) in flight at once.
const OPENS_IN_FLIGHT: usize = 64;
const CONNECTS_IN_FLIGHT: usize = 16;
/// The quiet window: longer than two of the server's 5-second fallback ticks.
const QUIET: Duration = Duration::from_secs(11);
/// Pause after a commit's events before the next commit.
const GAP: Duration = Duration::from_millis(100);
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected client (ids and token stay in memory).
struct Client {
    token: String,
    body: String,
}

impl Client {
    fn events_spec(
        &self,
        addr: std::net::SocketAddr,
        role: Role,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Spec {
        Spec {
            addr,
            token: self.token.clone(),
            body: self.body.clone(),
            role,
            permit,
        }
    }
}

/// The figures of one run.
struct Run {
    instances: usize,
    asked: usize,
    opened: usize,
    failed: BTreeMap<String, usize>,
    open_secs: f64,
    commits: usize,
    /// Per watched stream (one per instance): latencies in ms.
    latencies: Vec<Vec<f64>>,
    missed: usize,
    /// The sparse commits: latencies (ms, sorted, every watched stream), missed events,
    /// the instances' statements and the window's length (s).
    sparse: usize,
    sparse_latencies: Vec<f64>,
    sparse_missed: usize,
    sparse_calls: Calls,
    sparse_secs: f64,
    /// Per instance, over the commits.
    calls: Vec<Calls>,
    worker_calls: i64,
    /// All instances, over the quiet window.
    quiet: Calls,
    idle_streams: usize,
    idle_woken: usize,
    idle_events: u64,
    ended: usize,
    rss_mb: Vec<f64>,
}

impl Run {
    fn delivered(&self) -> usize {
        self.latencies.iter().map(Vec::len).sum()
    }

    fn all_latencies(&self) -> Vec<f64> {
        let mut all: Vec<f64> = self.latencies.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        all
    }

    fn total_calls(&self) -> Calls {
        let mut t = Calls::default();
        for c in &self.calls {
            t.add(c);
        }
        t
    }

    /// Streams' own queries beyond the one per event a watched stream received.
    fn idle_queries(&self) -> i64 {
        (self.total_calls().per_client - self.delivered() as i64).max(0)
    }
}

fn arg_list(i: usize, default: &str) -> Vec<usize> {
    std::env::args()
        .nth(i)
        .unwrap_or_else(|| default.into())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().replace('_', "").parse().expect("a stream count"))
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Raises the soft open-file limit to the hard one (a stream is a socket); returns it.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur as u64
}

fn server_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SYNCHRO_BENCH_SERVER_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("synchro-server-under-test"))
        .context("locating the server binary")?;
    anyhow::ensure!(
        bin.exists(),
        "no server binary at {}: build it (cargo build --release -p synchro-tests --bin \
         synchro-server-under-test) or set SYNCHRO_BENCH_SERVER_BIN",
        bin.display()
    );
    Ok(bin)
}

/// One benchmark run, long on purpose: the stack is set up once and each configuration runs
/// on it in turn ([`run`]), printing its figures as it ends.
#[tokio::main]
async fn main() -> Result<()> {
    let number = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let commits = number(1, 50);
    let one = arg_list(2, "1,1000,10000");
    let two = arg_list(3, "1000,10000");
    let sparse = number(4, 10);
    let open_files = raise_open_files();
    let bin = server_bin()?;
    let largest = one.iter().chain(&two).copied().max().unwrap_or(1);

    let cluster = TempCluster::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track=top",
        "pg_stat_statements.track_utility=on",
        "max_connections=200",
    ])?;
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute("CREATE DATABASE bench")
        .await?;
    let url = |user: &str| cluster.url(user, "bench");
    let mut admin = connect_db(&url("postgres")).await?;
    let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    for login in LOGINS {
        dev::ensure_login(&admin, login, "synchro_adapter").await?;
    }
    dev::ensure_worker_login(&admin, WORKER_LOGIN).await?;
    admin
        .batch_execute(
            "CREATE EXTENSION pg_stat_statements;
             CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE app.items (id bigint PRIMARY KEY, owner text NOT NULL, note text);
             RESET ROLE;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await?;
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    register(&op, &RegisterRequest::synced("app", "items", "multi_scope"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    op.batch_execute(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.items\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');",
    )
    .await?;
    publish::publish(&mut op).await?;

    let logs = std::env::temp_dir().join(format!("synchro-events-bench-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    let _capture = Process::capture(&bin, &url(WORKER_LOGIN), &logs.join("capture.log"))?;
    let started = Instant::now();
    loop {
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
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the table did not become active within 120 s; log: {}",
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "synchro events fan-out benchmark: PostgreSQL {version}, {} cores, open-file limit {open_files}, \
         {commits} commits per run",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    // Every client connects once, through one instance; its generation then stays current.
    let http = reqwest::Client::new();
    let clients = {
        let instance = Instance::start(&bin, &url(LOGINS[0]), SECRET, &logs.join("connect.log"))?;
        synchro_testkit::pg::wait_ready(&http, &instance.base()).await;
        let base = instance.base();
        let users: Vec<(String, String)> = (0..LOGINS.len())
            .map(|w| (WATCHED_USER.to_owned(), format!("watched-device-{w}")))
            .chain((0..largest).map(|i| (format!("idle-user-{i}"), format!("idle-device-{i}"))))
            .collect();
        let total = users.len();
        let started = Instant::now();
        let mut done = 0;
        let mut clients = Vec::with_capacity(total);
        let mut connects = futures_util::stream::iter(users)
            .map(|(user, client_id)| {
                let (http, base) = (http.clone(), base.clone());
                async move { connect(&http, &base, &user, &client_id).await }
            })
            .buffered(CONNECTS_IN_FLIGHT);
        while let Some(c) = connects.next().await {
            clients.push(c?);
            done += 1;
            if done % 1000 == 0 || done == total {
                eprintln!(
                    "  connected {done}/{total} clients ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        clients
    };
    let (watched, idle) = clients.split_at(LOGINS.len());

    let mut runs = Vec::new();
    let mut next_id = 0i64;
    for (instances, n) in one
        .iter()
        .map(|&n| (1, n))
        .chain(two.iter().map(|&n| (2, n)))
    {
        let run = run(
            &bin,
            &url,
            &admin,
            &logs,
            (instances, n),
            (watched, idle),
            (commits, sparse),
            &mut next_id,
        )
        .await?;
        print_run(&run);
        runs.push(run);
    }
    print_table(&runs);
    // Keep the server logs only when something was logged (warnings and errors).
    let logged = std::fs::read_dir(&logs)?
        .flatten()
        .any(|e| e.metadata().is_ok_and(|m| m.len() > 0));
    if logged {
        println!(
            "server logs (warnings or errors were logged): {}",
            logs.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(())
}

/// `POST /sync/connect` for a new client; its events request body and token.
async fn connect(
    http: &reqwest::Client,
    base: &str,
    user: &str,
    client_id: &str,
) -> Result<Client> {
    let token = mint(SECRET, user, 6 * 3600);
    let resp = http
        .post(format!("{base}/sync/connect"))
        .header("authorization", format!("Bearer {token}"))
        .body(
            json!({"protocol_version": 3, "client_id": client_id,
                   "schema": {"version": 0, "hash": ""}})
            .to_string(),
        )
        .send()
        .await?;
    let status = resp.status();
    let v: Value = resp.json().await?;
    anyhow::ensure!(status == 200, "connect answered {status}");
    let generation = v["client_generation"]
        .as_u64()
        .context("connect returned a client generation")?;
    Ok(Client {
        token,
        body: json!({"protocol_version": 3, "client_id": client_id,
                     "client_generation": generation})
        .to_string(),
    })
}

/// One run: `instances` fresh `serve` processes, `n` streams split between them, the
/// quiet window, then `commits` back to back and `sparse` commits far apart.
#[allow(clippy::too_many_arguments)]
async fn run(
    bin: &std::path::Path,
    url: &dyn Fn(&str) -> String,
    admin: &tokio_postgres::Client,
    logs: &std::path::Path,
    (instances, n): (usize, usize),
    (watched, idle): (&[Client], &[Client]),
    (commits, sparse): (usize, usize),
    next_id: &mut i64,
) -> Result<Run> {
    eprintln!("run: {n} streams on {instances} instance(s)");
    let servers = (0..instances)
        .map(|i| {
            Instance::start(
                bin,
                &url(LOGINS[i]),
                SECRET,
                &logs.join(format!("serve-{n}-{instances}-{i}.log")),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let http = reqwest::Client::new();
    for s in &servers {
        synchro_testkit::pg::wait_ready(&http, &s.base()).await;
    }

    // Open the streams: the idle ones first, the watched ones last (freshest lifetime).
    let watchers = instances.min(n);
    let idle_n = n - watchers;
    anyhow::ensure!(idle_n <= idle.len(), "not enough connected clients");
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let mut pool = Pool::new(SHARDS);
    let permits = Arc::new(Semaphore::new(OPENS_IN_FLIGHT));
    let started = Instant::now();
    for (i, c) in idle[..idle_n].iter().enumerate() {
        let permit = permits.clone().acquire_owned().await?;
        pool.open(c.events_spec(servers[i % instances].addr, Role::Idle, permit));
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "  {} streams requested, {} open ({:.1} s)",
                i + 1,
                pool.counters.opened.load(Ordering::Relaxed),
                started.elapsed().as_secs_f64()
            );
        }
    }
    for (w, c) in watched[..watchers].iter().enumerate() {
        let permit = permits.clone().acquire_owned().await?;
        let role = Role::Watched {
            watcher: w,
            scope: format!("user:{WATCHED_USER}"),
            events: events_tx.clone(),
        };
        pool.open(c.events_spec(servers[w].addr, role, permit));
    }
    while pool.counters.settled() < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let open_secs = started.elapsed().as_secs_f64();
    let opened = pool.counters.opened.load(Ordering::Relaxed);
    eprintln!("  {opened}/{n} streams open after {open_secs:.1} s");
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Quiet: no commits.
    stats::reset(admin).await?;
    tokio::time::sleep(QUIET).await;
    let mut quiet = Calls::default();
    let counted = stats::read(admin).await?;
    for login in &LOGINS[..instances] {
        quiet.add(&counted.get(*login).copied().unwrap_or_default());
    }

    // The commits, one at a time, each right after the previous one's events.
    eprintln!("  {commits} commits, {GAP:?} apart");
    stats::reset(admin).await?;
    let mut latencies = vec![Vec::new(); watchers];
    let mut missed = 0;
    for _ in 0..commits {
        for (w, l) in commit(admin, next_id, &mut events_rx, watchers)
            .await?
            .into_iter()
            .enumerate()
        {
            match l {
                Some(ms) => latencies[w].push(ms),
                None => missed += 1,
            }
        }
        tokio::time::sleep(GAP).await;
    }
    let counted = stats::read(admin).await?;
    let calls = LOGINS[..instances]
        .iter()
        .map(|l| counted.get(*l).copied().unwrap_or_default())
        .collect();
    let worker_calls = counted.get(WORKER_LOGIN).map_or(0, Calls::total);

    // Sparse commits: further apart than the 5 s fallback tick, at varying phases of it.
    eprintln!("  {sparse} sparse commits");
    stats::reset(admin).await?;
    let sparse_started = Instant::now();
    let (mut sparse_latencies, mut sparse_missed) = (Vec::new(), 0);
    for i in 0..sparse {
        tokio::time::sleep(sparse_gap(i)).await;
        for l in commit(admin, next_id, &mut events_rx, watchers).await? {
            match l {
                Some(ms) => sparse_latencies.push(ms),
                None => sparse_missed += 1,
            }
        }
    }
    let sparse_secs = sparse_started.elapsed().as_secs_f64();
    let counted = stats::read(admin).await?;
    let mut sparse_calls = Calls::default();
    for login in &LOGINS[..instances] {
        sparse_calls.add(&counted.get(*login).copied().unwrap_or_default());
    }
    sparse_latencies.sort_by(f64::total_cmp);
    let counters = &pool.counters;
    let run = Run {
        instances,
        asked: n,
        opened,
        failed: counters.failed.lock().unwrap().clone(),
        open_secs,
        commits,
        latencies,
        missed,
        sparse,
        sparse_latencies,
        sparse_missed,
        sparse_calls,
        sparse_secs,
        calls,
        worker_calls,
        quiet,
        idle_streams: idle_n,
        idle_woken: counters.idle_woken.load(Ordering::Relaxed),
        idle_events: counters.idle_changed.load(Ordering::Relaxed),
        ended: counters.ended.load(Ordering::Relaxed),
        rss_mb: servers
            .iter()
            .map(|s| s.rss_mb().unwrap_or(f64::NAN))
            .collect(),
    };
    drop(pool); // close the streams before stopping the servers
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(servers);
    Ok(run)
}

/// The pause before sparse commit `i`: 5.5 s to 9 s in steps of 0.5 s, so the commits
/// land at different phases of the dispatcher's 5 s fallback tick.
fn sparse_gap(i: usize) -> Duration {
    Duration::from_millis(5500 + 500 * (i % 8) as u64)
}

/// Commits one row owned by the watched user and waits for the `changed` event at each of
/// the `watchers` watched streams: commit → event in ms per stream, `None` if it did not
/// arrive within [`EVENT_TIMEOUT`].
async fn commit(
    admin: &tokio_postgres::Client,
    next_id: &mut i64,
    events: &mut mpsc::UnboundedReceiver<(usize, Instant)>,
    watchers: usize,
) -> Result<Vec<Option<f64>>> {
    while events.try_recv().is_ok() {}
    *next_id += 1;
    admin
        .execute(
            "INSERT INTO app.items (id, owner, note) VALUES ($1, $2, 'bench')",
            &[&*next_id, &WATCHED_USER],
        )
        .await?;
    let committed = Instant::now();
    let deadline = tokio::time::Instant::from_std(committed + EVENT_TIMEOUT);
    let mut got = vec![None; watchers];
    while got.iter().any(Option::is_none) {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some((w, at))) if got[w].is_none() => {
                got[w] = Some(at.saturating_duration_since(committed).as_secs_f64() * 1e3);
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    Ok(got)
}

fn print_run(r: &Run) {
    let k = r.commits as f64;
    println!(
        "\n{} streams on {} instance(s): {} open after {:.1} s",
        r.asked, r.instances, r.opened, r.open_secs
    );
    if !r.failed.is_empty() {
        let why: Vec<String> = r.failed.iter().map(|(w, n)| format!("{n} x {w}")).collect();
        println!("  streams that did not open: {}", why.join(", "));
    }
    for (i, l) in r.latencies.iter().enumerate() {
        let mut l = l.clone();
        l.sort_by(f64::total_cmp);
        let c = &r.calls[i];
        println!(
            "  instance {}: {}/{} events at its watched stream, commit → event p50 {:.1} ms, p99 {:.1} ms; \
             statements per commit {:.2} (dispatcher {:.2}, streams' own {:.2}, other {:.2}); RSS {:.0} MB",
            i + 1,
            l.len(),
            r.commits,
            percentile(&l, 0.5),
            percentile(&l, 0.99),
            c.total() as f64 / k,
            c.dispatch as f64 / k,
            c.per_client as f64 / k,
            c.other as f64 / k,
            r.rss_mb[i],
        );
    }
    println!(
        "  idle streams: {} — {} received a changed event ({} events); streams' own queries \
         beyond the watched streams' events: {} ({:.5} per idle stream per commit); streams ended meanwhile: {}",
        r.idle_streams,
        r.idle_woken,
        r.idle_events,
        r.idle_queries(),
        if r.idle_streams == 0 {
            0.0
        } else {
            r.idle_queries() as f64 / r.idle_streams as f64 / k
        },
        r.ended,
    );
    let q = &r.quiet;
    println!(
        "  quiet {:.0} s without commits: {} statements by the instances ({:.2}/s; dispatcher {}, streams' own {}, other {}); \
         capture worker during the commits: {:.1} statements per commit",
        QUIET.as_secs_f64(),
        q.total(),
        q.total() as f64 / QUIET.as_secs_f64(),
        q.dispatch,
        q.per_client,
        q.other,
        r.worker_calls as f64 / k,
    );
    let c = &r.sparse_calls;
    println!(
        "  {} sparse commits over {:.0} s: commit → event {} ms (p50 / p99); {} statements by the instances \
         ({:.2}/s; dispatcher {}, streams' own {}, other {})",
        r.sparse,
        r.sparse_secs,
        latency_cell(&r.sparse_latencies, r.sparse_missed),
        c.total(),
        c.total() as f64 / r.sparse_secs,
        c.dispatch,
        c.per_client,
        c.other,
    );
}

/// `p50 / p99`, and the missed events if any.
fn latency_cell(sorted: &[f64], missed: usize) -> String {
    let mut cell = format!(
        "{:.1} / {:.1}",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99)
    );
    if missed > 0 {
        cell += &format!(" ({missed} missed)");
    }
    cell
}

fn print_table(runs: &[Run]) {
    println!(
        "\n| instances | streams open | commit → event p50 / p99 (ms), back to back | \
         statements / commit (dispatcher + streams' own + other) | idle streams woken | \
         idle streams' queries / commit | quiet: statements / s | sparse commits: p50 / p99 (ms) | \
         sparse: statements / s | server RSS (MB) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let t = r.total_calls();
        let k = r.commits as f64;
        let rss: Vec<String> = r.rss_mb.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {} | {}/{} | {} | {:.2} ({:.2} + {:.2} + {:.2}) | {}/{} | {:.2} | {:.1} | {} | {:.1} | {} |",
            r.instances,
            r.opened,
            r.asked,
            latency_cell(&r.all_latencies(), r.missed),
            t.total() as f64 / k,
            t.dispatch as f64 / k,
            t.per_client as f64 / k,
            t.other as f64 / k,
            r.idle_woken,
            r.idle_streams,
            r.idle_queries() as f64 / k,
            r.quiet.total() as f64 / QUIET.as_secs_f64(),
            latency_cell(&r.sparse_latencies, r.sparse_missed),
            r.sparse_calls.total() as f64 / r.sparse_secs,
            rss.join(" + "),
        );
    }
    println!(
        "\nstatements: executions by the serve instances' logins (pg_stat_statements, top level); \
         dispatcher = synchro_changed_scopes_since (one per notification per instance), streams' own = \
         synchro_changed_scopes (a stream whose client's scopes were named, or whose dispatcher was silent); \
         idle streams' queries = streams' own minus the watched streams' events; latency: INSERT \
         acknowledged → changed event decoded at the watched client (capture streams the slot); \
         back to back: {GAP:?} after the previous commit's events; sparse: 5.5–9 s apart, longer \
         than the dispatcher's 5 s fallback tick"
    );
}
