//! The latency the edge gateway adds: the same requests sent straight to the server and
//! through `wrangler dev` (real workerd, the built `edge-worker/`) in front of it, in the
//! same run, alternating which goes first, and the p50/p99 of each (`scripts/bench-edge.sh`
//! builds the worker, prints the bundle size and runs this).
//!
//! The requests are what the client engine sends: a first connect of a fresh client; an
//! incremental pull with nothing new (the body the engine sent after its first sync,
//! replayed); and a one-mutation push (the engine's update batch replayed with new batch and
//! mutation IDs, so each is executed afresh: after the first it is answered with a conflict
//! outcome — the same checks, transaction and row read, no write). Each answer must be 200.
//!
//! Last, requests the gateway refuses (no token: 401, no origin request) time the gateway
//! alone under `wrangler dev`.
//!
//! Usage: `edge_bench [iterations]` (default 300). The server is the debug build the test
//! harness uses; the figure of interest is the difference and ratio, not the absolute.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use synchro_client::engine::{Client, Response, Transport, TransportError};
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, Operation};
use synchro_client::storage::Storage;
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::auth::mint;
use synchro_testkit::edge::Edge;
use synchro_testkit::pg::{
    docs_with_owner_and_team, free_port, start_server_binary_with, wait_ready, Env,
};

const SECRET: &str = "edge-bench-secret-0123456789abcdef";

/// The real transport, remembering the last body sent to each path.
struct Capture {
    inner: HttpTransport,
    last: Rc<RefCell<BTreeMap<String, String>>>,
}

impl Transport for Capture {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        self.last.borrow_mut().insert(path.to_owned(), body.clone());
        self.inner.post(path, body).await
    }
}

fn member<'a>(j: &'a mut Json, name: &str) -> &'a mut Json {
    match j {
        Json::Object(m) => m
            .iter_mut()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .unwrap(),
        _ => panic!("not an object"),
    }
}

/// The push body with batch and mutation IDs of its own.
fn fresh_push(template: &str, k: usize) -> String {
    let mut j = Json::parse(template).unwrap();
    *member(&mut j, "batch_id") = Json::String(format!("bench-batch-{k}"));
    if let Json::Array(ms) = member(&mut j, "mutations") {
        for (i, m) in ms.iter_mut().enumerate() {
            *member(m, "mutation_id") = Json::String(format!("bench-mutation-{k}-{i}"));
        }
    }
    to_output_string(&j)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// One benchmark run, long on purpose: the server and the gateway start once, and each
/// endpoint is timed in turn against both, side by side, on the same rows.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("iterations"))
        .unwrap_or(300);
    let env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], 'red', 'seed ' || g
           FROM generate_series(1, 200) g",
    )
    .await;
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("synchro-server-under-test");
    let port = free_port();
    let direct = format!("http://127.0.0.1:{port}");
    let _server = start_server_binary_with(bin.to_str().unwrap(), &env, port, SECRET, &[]);
    let http = reqwest::Client::new();
    wait_ready(&http, &direct).await;
    let edge = Edge::start(&direct, SECRET, &[]).await;
    wait_ready(&http, &edge.base).await;

    // The engine's own requests: sync once, write, sync again.
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let dir = std::env::temp_dir().join(format!("synchro-edge-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let t = token.clone();
    let last: Rc<RefCell<BTreeMap<String, String>>> = Rc::default();
    let transport = Capture {
        inner: HttpTransport::new(direct.clone(), move || t.clone()),
        last: last.clone(),
    };
    let mut n = 0u8;
    let mut c = Client::open(
        Storage::open(dir.join("bench.db")).unwrap(),
        transport,
        move || {
            n = n.wrapping_add(1);
            let mut r = [0x42; 16];
            r[15] = n;
            r
        },
    )
    .unwrap();
    c.sync_once().await.unwrap();
    let (table_id, title_id) = {
        let m = c.manifest().unwrap();
        let docs = m.tables.iter().find(|t| t.name == "docs").unwrap();
        let title = docs.fields.iter().find(|f| f.name == "title").unwrap();
        (docs.table_id.clone(), title.field_id.clone())
    };
    let pk = TypedValue::from_scalar(Scalar::Int64(2)).unwrap();
    c.write(&LocalWrite {
        table_id: &table_id,
        operation: Operation::Update,
        pk: &pk,
        columns: &[(
            title_id,
            TypedValue::from_scalar(Scalar::String("bench".into())).unwrap(),
        )],
    })
    .unwrap();
    c.sync_once().await.unwrap();
    c.sync_once().await.unwrap();
    let (pull, push) = {
        let last = last.borrow();
        (last["/sync/pull"].clone(), last["/sync/push"].clone())
    };
    let bearer = format!("Bearer {token}");

    let mut times: BTreeMap<(&str, &str), Vec<Duration>> = BTreeMap::new();
    let targets = [("direct", direct.as_str()), ("edge", edge.base.as_str())];
    for i in 0..iterations {
        for op in ["connect", "pull", "push"] {
            for t in 0..2 {
                // Alternate which target goes first.
                let (name, base) = targets[(i + t) % 2];
                let (path, body) = match op {
                    "connect" => (
                        "/sync/connect",
                        format!(
                            r#"{{"protocol_version":3,"client_id":"bench-{name}-{i}","schema":{{"version":0,"hash":""}}}}"#
                        ),
                    ),
                    "pull" => ("/sync/pull", pull.clone()),
                    _ => ("/sync/push", fresh_push(&push, i * 2 + t)),
                };
                let started = Instant::now();
                let r = http
                    .post(format!("{base}{path}"))
                    .header("authorization", &bearer)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let text = r.text().await.unwrap();
                let took = started.elapsed();
                assert_eq!(status, 200, "{op} {name}: {text}");
                times.entry((op, name)).or_default().push(took);
            }
        }
    }
    // The gateway alone: a request it refuses (no token, 401) never asks the origin.
    let mut refused = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let r = http
            .post(format!("{}/sync/pull", edge.base))
            .body(pull.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let _ = r.text().await.unwrap();
        refused.push(started.elapsed());
        assert_eq!(status, 401);
    }
    refused.sort();
    // A control: the direct pull on a new connection each time (workerd does not keep the
    // connection to this origin), to see what of the added time is connection setup.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut direct_fresh = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let r = fresh
            .post(format!("{direct}/sync/pull"))
            .header("authorization", &bearer)
            .body(pull.clone())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let _ = r.text().await.unwrap();
        direct_fresh.push(started.elapsed());
        assert_eq!(status, 200);
    }
    direct_fresh.sort();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "synchro edge gateway latency: {iterations} requests per cell, same run, alternating order"
    );
    println!("server: debug build on 127.0.0.1; edge: wrangler dev (workerd) on 127.0.0.1 in front of it");
    println!(
        "{:<8} {:>11} {:>11} {:>11} {:>11} {:>12} {:>12}",
        "request", "direct p50", "direct p99", "edge p50", "edge p99", "added p50", "added p99"
    );
    for op in ["connect", "pull", "push"] {
        let mut d = times[&(op, "direct")].clone();
        let mut e = times[&(op, "edge")].clone();
        d.sort();
        e.sort();
        let (d50, d99, e50, e99) = (
            percentile(&d, 0.5),
            percentile(&d, 0.99),
            percentile(&e, 0.5),
            percentile(&e, 0.99),
        );
        println!(
            "{op:<8} {d50:>8.2} ms {d99:>8.2} ms {e50:>8.2} ms {e99:>8.2} ms {:>9.2} ms {:>9.2} ms   (p50 ratio {:.2}x)",
            e50 - d50,
            e99 - d99,
            e50 / d50
        );
    }
    println!(
        "direct pull on a new connection each time: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&direct_fresh, 0.5),
        percentile(&direct_fresh, 0.99)
    );
    println!(
        "refused at the edge (401, no origin request): p50 {:.2} ms, p99 {:.2} ms (wrangler dev's local proxy, workerd and the worker's checks)",
        percentile(&refused, 0.5),
        percentile(&refused, 0.99)
    );
}
