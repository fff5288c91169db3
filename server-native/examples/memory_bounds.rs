//! What the page-byte bound buys under abuse, measured on the real server binary: a scope of
//! large rows (default sixty 2 MB rows, the issue-31 probe's load) is pulled once from a null
//! cursor and rebuilt by four clients at once, against a server with the default
//! `--max-page-bytes` (4 MiB) and, in the same run on the same database, one with the bound
//! lifted (the behaviour before it existed: pages bounded in rows only). Printed per server:
//! the largest response, and the server process's peak resident memory above its resident
//! memory before each load (Linux `VmHWM`, reset through `/proc/<pid>/clear_refs`).
//!
//! `cargo run --release -p synchro-server --example memory_bounds -- [rows] [row_bytes]`
//! (builds `synchro-server` first: `cargo build --release -p synchro-server`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use synchro_server::auth::mint;
use synchro_testkit::pg::{
    docs_with_owner_and_team, free_port, start_server_binary_with, wait_ready, Env,
};

const SECRET: &str = "memory-bounds-secret-0123456789ab";

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// A field of `/proc/<pid>/status` in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} of {pid}"))
}

/// Resets the peak and returns the resident memory now (KiB).
fn reset_peak(pid: u32) -> Result<u64> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    status_kib(pid, "VmRSS:")
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// Posts `body` and reads the answer as it streams; returns it and its size.
    async fn post(&self, path: &str, body: &Value) -> Result<(Value, usize)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .body(body.to_string())
            .send()
            .await?;
        let status = r.status();
        let mut r = r;
        let mut bytes = Vec::new();
        while let Some(chunk) = r.chunk().await? {
            bytes.extend_from_slice(&chunk);
        }
        let size = bytes.len();
        let v: Value = serde_json::from_slice(&bytes)?;
        if status != 200 {
            bail!("{path}: {status} {v}");
        }
        Ok((v, size))
    }
}

/// The figures of one server.
struct Figures {
    pull_largest: usize,
    pull_peak_kib: u64,
    rebuild_largest: usize,
    rebuild_peak_kib: u64,
}

/// A client connected (by the warm-up server) with its cursor of the scope from before the
/// large rows were written, so its pull receives all of them as changes.
struct Puller {
    id: String,
    generation: u64,
    schema: Value,
    cursor: Value,
}

async fn measure(
    env: &Env,
    bin: &str,
    extra: &[String],
    rows: usize,
    puller: &Puller,
) -> Result<Figures> {
    let port = free_port();
    let server = start_server_binary_with(bin, env, port, SECRET, extra);
    let pid = server.0.id();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let client = |id: String| {
        Client {
            http: reqwest::Client::new(),
            base: base.clone(),
            token: token.clone(),
        }
        .connect(id)
    };
    let c = Client {
        http: reqwest::Client::new(),
        base: base.clone(),
        token: token.clone(),
    };

    let before = reset_peak(pid)?;
    let (mut largest, mut changes) = (0, 0);
    let mut cursor = puller.cursor.clone();
    loop {
        let (page, size) = c
            .post(
                "/sync/pull",
                &json!({"protocol_version": 3, "client_id": puller.id, "client_generation": puller.generation,
                        "schema": puller.schema, "scope_cursors": {"user:alice": cursor}, "limit": 1000}),
            )
            .await?;
        largest = largest.max(size);
        changes += page["changes"].as_array().map_or(0, Vec::len);
        if page["has_more"] != true {
            break;
        }
        cursor = page["scope_cursor_updates"]["user:alice"].clone();
    }
    anyhow::ensure!(
        changes == rows,
        "the pull served {changes} of {rows} changes"
    );
    let pull_peak_kib = status_kib(pid, "VmHWM:")?.saturating_sub(before);

    let mut clients = Vec::new();
    for i in 1..=4 {
        clients.push(client(format!("{port}-m{i}")).await?);
    }
    let before = reset_peak(pid)?;
    let rebuilds = clients
        .into_iter()
        .enumerate()
        .map(|(i, (c, g, schema))| async move {
            let mut body = json!({"protocol_version": 3, "client_id": format!("{port}-m{}", i + 1),
                              "client_generation": g, "schema": schema,
                              "scope_id": "user:alice", "limit": 1000});
            let (mut largest, mut records) = (0, 0);
            loop {
                let (page, size) = c.post("/sync/rebuild", &body).await?;
                largest = largest.max(size);
                records += page["records"].as_array().map_or(0, Vec::len);
                if page["has_more"] != true {
                    break;
                }
                body["continuation"] = page["continuation"].clone();
            }
            anyhow::ensure!(
                records == rows,
                "a rebuild served {records} of {rows} records"
            );
            Ok::<_, anyhow::Error>(largest)
        });
    let mut rebuild_largest = 0;
    for r in futures_util::future::join_all(rebuilds).await {
        rebuild_largest = rebuild_largest.max(r?);
    }
    let rebuild_peak_kib = status_kib(pid, "VmHWM:")?.saturating_sub(before);
    drop(server);
    Ok(Figures {
        pull_largest: largest,
        pull_peak_kib,
        rebuild_largest,
        rebuild_peak_kib,
    })
}

impl Client {
    /// Connects `id`: the client, its generation and schema.
    async fn connect(self, id: String) -> Result<(Client, u64, Value)> {
        let (v, _) = self
            .post(
                "/sync/connect",
                &json!({"protocol_version": 3, "client_id": id, "schema": {"version": 0, "hash": ""}}),
            )
            .await?;
        let schema = json!({"version": v["schema"]["version"], "hash": v["schema"]["hash"]});
        let generation = v["client_generation"].as_u64().context("generation")?;
        Ok((self, generation, schema))
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows = arg(1, 60);
    let row_bytes = arg(2, 2_000_000);
    let bin = std::env::current_exe()?
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("synchro-server"))
        .context("the target directory")?;
    anyhow::ensure!(
        bin.exists(),
        "build the server first: cargo build --release -p synchro-server"
    );
    let bin = bin.to_string_lossy().into_owned();
    let env = Env::installed().await;
    docs_with_owner_and_team(&env, "").await;
    // The pulling clients and their cursors from before the rows exist; the rows are then
    // materialized once, by this server's capture, before anything is measured.
    let port = free_port();
    let warm = start_server_binary_with(&bin, &env, port, SECRET, &[]);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    let mut pullers = Vec::new();
    for id in ["bounded-puller", "unbounded-puller"] {
        let (c, generation, schema) = Client {
            http: reqwest::Client::new(),
            base: base.clone(),
            token: mint(SECRET.as_bytes(), "alice", 3600),
        }
        .connect(id.into())
        .await?;
        let (v, _) = c
            .post(
                "/sync/rebuild",
                &json!({"protocol_version": 3, "client_id": id, "client_generation": generation,
                        "schema": schema, "scope_id": "user:alice", "limit": 1000}),
            )
            .await?;
        pullers.push(Puller {
            id: id.into(),
            generation,
            schema,
            cursor: v["final_scope_cursor"].clone(),
        });
    }
    env.admin
        .batch_execute(&format!(
            "INSERT INTO app.docs SELECT g, 'alice', 'blue', repeat('x', {row_bytes}) FROM generate_series(1, {rows}) g"
        ))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.synchro_scope_rows('user:alice')",
            &[],
        )
        .await?
        .get::<_, i64>(0)
        < rows as i64
    {
        anyhow::ensure!(Instant::now() < deadline, "capture never caught up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(warm);
    println!(
        "scope user:alice: {rows} rows of {} KB ({} MB)",
        row_bytes / 1000,
        rows * row_bytes / 1_000_000
    );
    let bounded = measure(&env, &bin, &[], rows, &pullers[0]).await?;
    let unbounded = measure(
        &env,
        &bin,
        &["--max-page-bytes".into(), (u64::MAX / 2).to_string()],
        rows,
        &pullers[1],
    )
    .await?;
    let mb = |b: usize| b as f64 / 1e6;
    let mib = |k: u64| k as f64 / 1024.0;
    println!("| load | bound 4 MiB | no byte bound | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| largest pull response | {:.1} MB | {:.1} MB | {:.2}x |",
        mb(bounded.pull_largest),
        mb(unbounded.pull_largest),
        bounded.pull_largest as f64 / unbounded.pull_largest as f64
    );
    println!(
        "| server peak memory above resident, one pull | {:.0} MiB | {:.0} MiB | {:.2}x |",
        mib(bounded.pull_peak_kib),
        mib(unbounded.pull_peak_kib),
        bounded.pull_peak_kib as f64 / unbounded.pull_peak_kib.max(1) as f64
    );
    println!(
        "| largest rebuild response | {:.1} MB | {:.1} MB | {:.2}x |",
        mb(bounded.rebuild_largest),
        mb(unbounded.rebuild_largest),
        bounded.rebuild_largest as f64 / unbounded.rebuild_largest as f64
    );
    println!(
        "| server peak memory above resident, four concurrent rebuilds | {:.0} MiB | {:.0} MiB | {:.2}x |",
        mib(bounded.rebuild_peak_kib),
        mib(unbounded.rebuild_peak_kib),
        bounded.rebuild_peak_kib as f64 / unbounded.rebuild_peak_kib.max(1) as f64
    );
    Ok(())
}
