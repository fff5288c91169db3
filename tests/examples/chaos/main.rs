//! A bounded chaos run on loopback: several native clients (`synchro-client`, each on its
//! own SQLite file) write and sync through a fault proxy (latency, dropped requests,
//! truncated responses, connection resets) while the HTTP server (`synchro-server serve`),
//! the capture worker (`synchro-server capture`) and PostgreSQL are killed with SIGKILL and
//! started again at random. Then faults stop, every queue drains, every client syncs to
//! quiescence, and the end state is checked against PostgreSQL read directly:
//!
//! 1. every client's local rows equal the source rows of the scopes it holds, and its last
//!    round verified both scopes' terminal digests;
//! 2. every queued mutation has exactly one outcome (applied, conflict or rejected), none is
//!    pending, and a write into another user's scope is never applied;
//! 3. nothing was applied twice: an audit trigger records each application of a write with
//!    the write's own tag, and its rows match the `applied` outcomes one to one.
//!
//! Faults start at once, so first connects meet them too (a lost answer to a client's very
//! first connect used to block it for ever: `tests/tests/whole_stack.rs`
//! `a_lost_answer_to_the_first_connect_does_not_block_the_client`); `--faults-after-install`
//! starts them once every client has installed the schema.
//!
//! It prints what it did and the figures (mutations by outcome, faults by kind, kills and
//! restarts per process, recoveries and the longest one: from a restart to the end of the
//! first successful round every client started after it), and exits 0 only if every check
//! holds; a failed check is printed (row IDs and tags of the run's synthetic data only).
//!
//! `scripts/chaos.sh [--seconds N] [--clients N] [--seed N]` builds and runs it. The seed
//! decides the kill schedule, the proxy's fault choices and every client's writes; what
//! they meet depends on timing, so a repeated seed repeats the plan, not every interleaving.
//! Options: `--server-bin PATH` (default: `synchro-server-under-test` beside this example),
//! `--keep` keeps the run directory (server and capture logs, client databases); it is kept
//! anyway when a check fails. `SYNCHRO_CHAOS_LOG` sets the servers' log level (`info`).

mod checks;
mod client;
mod conductor;
mod procs;
mod proxy;
mod rng;
mod setup;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use synchro_server::auth::mint;
use synchro_server::connect_db;
use synchro_server::pg_harness::TempCluster;

use client::Shared;
use conductor::{say, Stack, Victim};
use procs::Proc;
use rng::Rng;

const SECRET: &str = "chaos-secret-0123456789abcdefghijk";

struct Args {
    seconds: u64,
    clients: usize,
    seed: u64,
    server_bin: PathBuf,
    keep: bool,
    tamper: Option<String>,
    faults_after_install: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        seconds: 120,
        clients: 4,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as u64
            % 1_000_000_007,
        server_bin: std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .context("the example's directory")?
            .join("synchro-server-under-test"),
        keep: false,
        tamper: None,
        faults_after_install: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => a.seconds = value()?.parse()?,
            "--clients" => a.clients = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--server-bin" => a.server_bin = value()?.into(),
            "--keep" => a.keep = true,
            "--tamper" => a.tamper = Some(value()?),
            "--faults-after-install" => a.faults_after_install = true,
            other => bail!("unknown option {other} (--seconds N --clients N --seed N --server-bin PATH --keep --tamper KIND --faults-after-install)"),
        }
    }
    if !(1..=16).contains(&a.clients) {
        bail!("--clients must be 1..=16");
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: the run could not complete: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Waits up to `secs` for `GET {base}/ready` to answer 200.
async fn wait_ready(base: &str, secs: u64) -> bool {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Ok(r) = http.get(format!("{base}/ready")).send().await {
            if r.status() == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Waits up to `secs` until `count()` reaches `n`; returns the seconds it took, or none.
async fn wait_count(count: impl Fn() -> usize, n: usize, secs: u64) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        if count() >= n {
            return Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Long on purpose: the run's steps in order (set up, chaos, heal, drain, converge, check,
/// figures), sharing the stack, the clients and the counters.
async fn run() -> Result<bool> {
    let args = args()?;
    println!(
        "chaos: seed {}, {} s, {} clients (repeat with --seed {})",
        args.seed, args.seconds, args.clients, args.seed
    );
    anyhow::ensure!(
        args.server_bin.exists(),
        "no server binary at {} (build synchro-server-under-test, or pass --server-bin)",
        args.server_bin.display()
    );
    let dir = std::env::temp_dir().join(format!("synchro-chaos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    let cluster = TempCluster::start()?;
    setup::database(&cluster).await?;
    let (adapter_url, worker_url, admin_url) = (
        cluster.url("synchro_dev_adapter", setup::DB),
        cluster.url("synchro_dev_worker", setup::DB),
        cluster.url("postgres", setup::DB),
    );
    let port = synchro_testkit::pg::free_port();
    let serve = Proc::new(
        "serve",
        &args.server_bin,
        vec![
            "serve".into(),
            "--database-url".into(),
            adapter_url,
            "--worker-url".into(),
            worker_url.clone(),
            "--no-capture".into(),
            "--jwt-secret".into(),
            SECRET.into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ],
        dir.join("serve.log"),
    );
    let capture = Proc::new(
        "capture",
        &args.server_bin,
        vec![
            "capture".into(),
            "--database-url".into(),
            worker_url.clone(),
        ],
        dir.join("capture.log"),
    );
    let mut stack = Stack {
        cluster,
        serve,
        capture,
        pg_up: true,
        kills: BTreeMap::new(),
        restarts: BTreeMap::new(),
        exits: BTreeMap::new(),
        restarted_at: Vec::new(),
        killed_at: Vec::new(),
    };
    stack.capture.start()?;
    stack.serve.start()?;
    let origin = format!("http://127.0.0.1:{port}");
    anyhow::ensure!(
        wait_ready(&origin, 90).await,
        "the server never became ready; logs in {}",
        dir.display()
    );
    let stats = Arc::new(proxy::ProxyStats::default());
    let proxy_port = proxy::start(port, Rng::new(args.seed, 2), stats.clone()).await?;
    let shared = Arc::new(Shared {
        phase: client::CHAOS.into(),
        drained: 0.into(),
        converged: 0.into(),
        installed: 0.into(),
        gave_up: 0.into(),
        t0: Instant::now(),
        ok_rounds: (0..args.clients).map(|_| Mutex::new(Vec::new())).collect(),
    });
    say(
        &shared,
        &format!(
            "stack up: postgres :{}, serve :{port}, capture, proxy :{proxy_port}; run directory {}",
            stack.cluster.port(),
            dir.display()
        ),
    );
    let mut threads = Vec::new();
    for i in 0..args.clients {
        let setup = client::Setup {
            i,
            n: args.clients,
            base: format!("http://127.0.0.1:{proxy_port}"),
            token: mint(SECRET.as_bytes(), &format!("c{i}"), 3600),
            path: dir.join(format!("c{i}.db")),
            seed: args.seed,
        };
        let shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("client-c{i}"))
                .spawn(move || client::run(setup, shared))?,
        );
    }

    // --faults-after-install: faults start once every client has installed the schema (its
    // first round).
    if args.faults_after_install {
        let took = wait_count(
            || shared.installed.load(Ordering::Relaxed),
            args.clients,
            60,
        )
        .await;
        say(
            &shared,
            &match took {
                Some(_) => "every client installed the schema; faults on".to_owned(),
                None => "not every client installed the schema within 60 s; faults on".into(),
            },
        );
    }
    stats.enabled.store(true, Ordering::Relaxed);

    // Chaos: a kill every 2..6 s, each victim down 0.1..3 s.
    let mut schedule = Rng::new(args.seed, 1);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut next = Instant::now() + Duration::from_millis(schedule.range(2000, 6000));
    let mut events = 0u64;
    while Instant::now() < deadline {
        stack.supervise(&shared)?;
        if Instant::now() >= next {
            let victim = match schedule.range(0, 100) {
                0..=34 => Victim::Serve,
                35..=64 => Victim::Capture,
                65..=89 => Victim::Postgres,
                _ => Victim::All,
            };
            let down = schedule.range(100, 3000);
            events += 1;
            say(
                &shared,
                &format!("kill -9 {victim:?}, restart {down} ms after the kill").to_lowercase(),
            );
            stack.kill(victim, &shared).await?;
            tokio::time::sleep(Duration::from_millis(down)).await;
            stack.heal(&shared)?;
            next = Instant::now() + Duration::from_millis(schedule.range(2000, 6000));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Faults off, everything running, then drain and converge.
    stats.enabled.store(false, Ordering::Relaxed);
    stack.heal(&shared)?;
    stack.supervise(&shared)?;
    say(&shared, "chaos over: faults off, everything running");
    let ready = wait_ready(&origin, 90).await;
    if !ready {
        say(&shared, "the server did not become ready within 90 s");
    }
    shared.phase.store(client::DRAIN, Ordering::Relaxed);
    let drain_secs = wait_count(|| shared.drained.load(Ordering::Relaxed), args.clients, 120).await;
    say(
        &shared,
        &match drain_secs {
            Some(s) => format!("every queue drained in {s:.1} s"),
            None => "a queue did not drain within 120 s".into(),
        },
    );
    let admin = connect_db(&admin_url).await?;
    let mut sentinels = String::from("INSERT INTO app.items VALUES (-1, 'shared', 0, 'sentinel')");
    for i in 0..args.clients {
        sentinels += &format!(", ({}, 'c{i}', 0, 'sentinel')", -100 - i as i64);
    }
    admin.batch_execute(&sentinels).await?;
    shared.phase.store(client::CONVERGE, Ordering::Relaxed);
    let converge_secs = wait_count(
        || shared.converged.load(Ordering::Relaxed) + shared.gave_up.load(Ordering::Relaxed),
        args.clients,
        120,
    )
    .await;
    say(
        &shared,
        &match converge_secs {
            Some(s) => format!("every client reached quiescence in {s:.1} s"),
            None => "a client did not reach quiescence within 120 s".into(),
        },
    );
    shared.phase.store(client::STOP, Ordering::Relaxed);
    let reports: Vec<client::Report> = threads
        .into_iter()
        .map(|t| t.join().expect("a client thread"))
        .collect();
    stack.supervise(&shared)?;

    if let Some(kind) = &args.tamper {
        let sql = checks::tamper(kind)?;
        admin.batch_execute(sql).await?;
        say(
            &shared,
            &format!("tampered with the end state: {kind} (a check must fail)"),
        );
    }
    let (outcomes, failed) = checks::run(&admin, &reports).await?;
    let source_rows: i64 = admin
        .query_one("SELECT count(*) FROM app.items", &[])
        .await?
        .get(0);
    let applications: i64 = admin
        .query_one("SELECT count(*) FROM app.items_audit", &[])
        .await?
        .get(0);

    // Figures.
    println!("\n=== figures (seed {})", args.seed);
    let state = |s: &str| outcomes.by_state.get(s).copied().unwrap_or(0);
    println!(
        "mutations queued {}: applied {}, conflicts {}, rejected {}, pending {}, missing {}",
        outcomes.queued,
        state("applied"),
        state("conflict"),
        state("rejected_terminal"),
        state("pending"),
        state("missing")
    );
    println!(
        "  writes into another user's scope {} (rejected {}); conflicts of own-scope writes {}; writes refused locally {}",
        outcomes.forbidden.0,
        outcomes.forbidden.1,
        outcomes.private_conflicts,
        reports.iter().map(|r| r.refused_locally).sum::<u64>()
    );
    for r in &reports {
        println!(
            "  {}: {} writes, {} rounds ok, {} failed {:?}, {} crashes (round abandoned, engine reopened), {} local rows",
            r.name,
            r.writes.len(),
            r.rounds_ok,
            r.errors.values().sum::<u64>(),
            r.errors,
            r.crashes,
            r.rows.len()
        );
    }
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "proxy: {} requests; faults: latency {}, drop {}, truncate {}, reset {} (total {}); server unreachable {}",
        load(&stats.requests),
        load(&stats.latency),
        load(&stats.dropped),
        load(&stats.truncated),
        load(&stats.reset),
        load(&stats.latency) + load(&stats.dropped) + load(&stats.truncated) + load(&stats.reset),
        load(&stats.upstream_down)
    );
    println!(
        "kill events {events}; kills {:?}; restarts {:?}; exits on their own {:?}",
        stack.kills, stack.restarts, stack.exits
    );
    let (measured, overlapped, max, mean, worst) = conductor::recoveries(&stack, &shared);
    println!(
        "recoveries: {measured} of {} restarts measured ({overlapped} overlapped by the next kill); max {max} ms{}, mean {mean} ms",
        stack.restarted_at.len(),
        worst.map_or(String::new(), |(t, what)| format!(
            " (after the {what} restart at {:.1} s)",
            t as f64 / 1000.0
        ))
    );
    println!(
        "end: drain {}, quiescence {}; PostgreSQL rows {source_rows}, audited applications {applications}",
        drain_secs.map_or("-".into(), |s| format!("{s:.1} s")),
        converge_secs.map_or("-".into(), |s| format!("{s:.1} s"))
    );

    drop(stack);
    if failed.is_empty() {
        println!("\nchaos: every check holds (seed {})", args.seed);
        if args.keep {
            println!("run directory kept: {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(true)
    } else {
        println!("\nchaos: FAILED checks (seed {}):", args.seed);
        for f in &failed {
            println!("  - {f}");
        }
        println!("run directory kept: {}", dir.display());
        Ok(false)
    }
}
