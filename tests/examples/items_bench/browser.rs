//! The browser variant: the same server answers `synchro-client` compiled to wasm32 in
//! headless Chromium on OPFS (`client-wasm/tests/items_browser.rs`, started by the shell
//! command in `SYNCHRO_BENCH_BROWSER_CMD`). A small control endpoint here tells the page the
//! server's address and a token, runs the UPDATEs of the commit-to-visible loop on
//! PostgreSQL for it (answering after the commit), prints the lines the page reports, and
//! measures the Chromium processes' resident memory when asked.
//!
//! Control API (plain text, so the page's requests need no CORS preflight):
//! `GET /config` → `<server base> <token> <rows> <updates>`; `POST /update` with `i` →
//! `<id> <val>` after the commit; `POST /line` with a line to print; `POST /rss` with a label.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use axum::extract::State;
use axum::http::header::ACCESS_CONTROL_ALLOW_ORIGIN;
use axum::routing::{get, post};
use axum::Router;

use crate::rss;

struct Control {
    config: String,
    rows: usize,
    db: tokio_postgres::Client,
    root: u32,
}

type Reply = ([(axum::http::HeaderName, &'static str); 1], String);

fn reply(body: String) -> Reply {
    ([(ACCESS_CONTROL_ALLOW_ORIGIN, "*")], body)
}

async fn get_config(State(c): State<Arc<Control>>) -> Reply {
    reply(c.config.clone())
}

async fn update(State(c): State<Arc<Control>>, body: String) -> Reply {
    let i: usize = body.trim().parse().unwrap_or(0);
    let id = (1 + (i * 997) % c.rows) as i32;
    let row =
        c.db.query_one(
            "UPDATE app.items SET val = val + 1 WHERE id = $1 RETURNING val",
            &[&id],
        )
        .await;
    match row {
        Ok(row) => reply(format!("{id} {}", row.get::<_, i32>(0))),
        Err(e) => reply(format!("error {e}")),
    }
}

async fn line(body: String) -> Reply {
    println!("{}", body.trim_end());
    reply(String::new())
}

/// Chromium's processes below this one: their summed PSS and `VmRSS` (which counts shared
/// pages in each) and the largest `VmHWM`.
fn chromium_rss(root: u32) -> String {
    let procs: Vec<u32> = rss::descendants(root)
        .into_iter()
        .filter(|&p| {
            let c = rss::comm(p);
            (c.contains("chrom") || c.contains("headless")) && !c.contains("driver")
        })
        .collect();
    let pss: f64 = procs.iter().filter_map(|&p| rss::pss_mb(p)).sum();
    let sum: f64 = procs
        .iter()
        .filter_map(|&p| rss::status_mb(p, "VmRSS"))
        .sum();
    let peak = procs
        .iter()
        .filter_map(|&p| rss::status_mb(p, "VmHWM"))
        .fold(0.0, f64::max);
    format!(
        "{} Chromium processes, summed PSS {pss:.0} MB (summed VmRSS {sum:.0} MB), largest VmHWM {peak:.0} MB",
        procs.len()
    )
}

async fn rss_line(State(c): State<Arc<Control>>, body: String) -> Reply {
    println!("browser rss {}: {}", body.trim(), chromium_rss(c.root));
    reply(String::new())
}

/// Serves the control endpoint on `listen`, runs `cmd` with `sh -c` (its output to `log`)
/// and returns whether it succeeded.
pub async fn run(
    cmd: &str,
    listen: SocketAddr,
    config: String,
    rows: usize,
    db: tokio_postgres::Client,
    log: &Path,
) -> Result<bool> {
    let control = Arc::new(Control {
        config,
        rows,
        db,
        root: std::process::id(),
    });
    let app = Router::new()
        .route("/config", get(get_config))
        .route("/update", post(update))
        .route("/line", post(line))
        .route("/rss", post(rss_line))
        .with_state(control);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let served = tokio::spawn(async move { axum::serve(listener, app).await });
    let out = std::fs::File::create(log)?;
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("SYNCHRO_ITEMS_CONTROL", format!("http://{listen}"))
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .await?;
    served.abort();
    Ok(status.success())
}
