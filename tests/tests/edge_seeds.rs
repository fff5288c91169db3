//! Seed files through the edge gateway's cache (issue 30, item 4): `GET /seeds/{name}` under
//! `wrangler dev` (real workerd and its Cache API) in front of the real server
//! (`serve --seed-dir`) on real PostgreSQL, with a seed the real exporter wrote. Built and
//! run by `scripts/test-edge.sh` (feature `edge`).
//!
//! The origin's request counter (`GET /metrics`, `seeds`) shows which requests reached it:
//! - the first request is a cache miss and one origin request; the bytes are the file's,
//!   their SHA-256 the evidence's, the ETag that SHA-256; the second is a hit and reaches
//!   nothing; ranges (206, 416), `If-None-Match` (304) and `HEAD` are answered from the cache,
//!   and a range asked first is answered from one full origin request then cached;
//! - no token or a bad one is 401 with the server's body and never reaches the origin,
//!   before and after the file is cached;
//! - an unknown name, or a `v` that is not the current version, is 404 from the origin each
//!   time (never cached); `?v=<sha256>` is cached under its own key, immutable;
//! - the edge's log line says `cache=miss` (with the origin time) or `cache=hit`;
//! - with `PUBLIC_SEEDS` (and the server's `--public-seeds`) no token is needed.

mod common;

use std::path::PathBuf;

use common::{start_server_with, wait_ready, Env};
use serde_json::Value;
use sha2::{Digest, Sha256};
use synchro_protocol::wire::{ErrorBody, ErrorCode, Message};
use synchro_server::auth::mint;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_testkit::edge::Edge;

const SECRET: &str = "edge-seed-secret-0123456789abcdef";
const SEED: &str = "team.seed.sqlite";

/// A cluster whose shared scope `team:blue` (300 rows) is declared portable and captured,
/// exported by `synchro-server seed export` into a fresh directory: (cluster, directory,
/// evidence).
async fn exported() -> (Env, PathBuf, Value) {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', 'blue', 'seed row ' || g
           FROM generate_series(1, 300) g",
    )
    .await;
    env.admin
        .batch_execute(
            "SELECT synchro.synchro_add_shared_scope('team:blue');
             SELECT synchro.synchro_declare_portable_scope('team:blue');",
        )
        .await
        .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
    drop(worker);
    let dir = std::env::temp_dir().join(format!(
        "synchro-edge-seeds-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server-under-test"))
        .args(["seed", "export", "--scope", "team:blue", "--out"])
        .arg(dir.join(SEED))
        .env("DATABASE_URL", env.cluster.url("synchro_dev_seed", "app"))
        .env_remove("SYNCHRO_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "seed export failed: {stdout}");
    let evidence: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap();
    assert_eq!(evidence["scopes"][0]["cardinality"], 300, "{evidence}");
    (env, dir, evidence)
}

/// The server serving `dir` and the gateway in front of it, both ready.
struct Stack {
    origin: String,
    edge: Edge,
    http: reqwest::Client,
    dir: PathBuf,
    _server: common::Server,
    _env: Env,
}

struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
    request_id: String,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }
}

impl Stack {
    async fn start(public: bool) -> (Stack, Value) {
        let (env, dir, evidence) = exported().await;
        let port = common::free_port();
        let origin = format!("http://127.0.0.1:{port}");
        let mut args = vec!["--seed-dir".to_owned(), dir.to_str().unwrap().to_owned()];
        let mut vars = vec![];
        if public {
            args.push("--public-seeds".to_owned());
            vars.push(("PUBLIC_SEEDS", "true"));
        }
        let server = start_server_with(&env, port, SECRET, &args);
        let http = reqwest::Client::new();
        wait_ready(&http, &origin).await;
        let edge = Edge::start(&origin, SECRET, &vars).await;
        wait_ready(&http, &edge.base).await;
        let stack = Stack {
            origin,
            edge,
            http,
            dir,
            _server: server,
            _env: env,
        };
        (stack, evidence)
    }

    /// How many seed requests reached the origin.
    async fn origin_seed_requests(&self) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.origin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("synchro_sync_requests_total{endpoint=\"seeds\"} "))
            .expect("the origin counts seed requests")
            .parse()
            .unwrap()
    }

    async fn get(
        &self,
        base: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Got {
        self.request(reqwest::Method::GET, base, path, token, headers)
            .await
    }

    async fn request(
        &self,
        method: reqwest::Method,
        base: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Got {
        let mut r = self.http.request(method, format!("{base}{path}"));
        if let Some(t) = token {
            r = r.header("authorization", t);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let request_id = headers
            .get("x-request-id")
            .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
        Got {
            status,
            headers,
            body: r.bytes().await.unwrap().to_vec(),
            request_id,
        }
    }

    /// The edge's log line for the request `got` answered.
    async fn line(&self, got: &Got) -> String {
        assert_eq!(
            got.request_id.len(),
            32,
            "an edge answer has its correlation ID"
        );
        let needle = format!("request_id={} ", got.request_id);
        let out = self.edge.output_containing(&needle).await;
        out.lines()
            .find(|l| l.contains(&needle))
            .unwrap_or_else(|| panic!("no log line for {needle}:\n{out}"))
            .to_owned()
    }

    /// `path` without a valid token: 401 with the server's body at the edge, and no origin
    /// request (the same request sent direct moves the counter, so the check can fail).
    async fn refused_at_the_edge(&self, what: &str, path: &str, token: Option<&str>) {
        let before = self.origin_seed_requests().await;
        let edge = self.get(&self.edge.base, path, token, &[]).await;
        assert_eq!(edge.status, 401, "{what}");
        let body = String::from_utf8(edge.body.clone()).unwrap();
        assert_eq!(
            ErrorBody::parse(&body).unwrap().code,
            ErrorCode::Unauthorized,
            "{what}"
        );
        assert_eq!(
            self.origin_seed_requests().await,
            before,
            "{what}: reached the origin"
        );
        let line = self.line(&edge).await;
        assert!(
            line.ends_with("endpoint=seed status=401 code=unauthorized outcome=unauthorized"),
            "{what}: refused before the cache: {line}"
        );
        let direct = self.get(&self.origin, path, token, &[]).await;
        assert_eq!(
            (direct.status, direct.body),
            (401, edge.body),
            "{what}: the edge's answer differs from the server's"
        );
        assert_eq!(
            self.origin_seed_requests().await,
            before + 1,
            "{what}: direct"
        );
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bearer(user: &str) -> String {
    format!("Bearer {}", mint(SECRET.as_bytes(), user, 3600))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test]
async fn a_seed_is_fetched_once_then_answered_from_the_edge_cache_after_the_token_check() {
    let (s, evidence) = Stack::start(false).await;
    let bytes = std::fs::read(s.dir.join(SEED)).unwrap();
    let len = bytes.len();
    let sha = evidence["sha256"].as_str().unwrap();
    assert_eq!(sha256_hex(&bytes), sha, "the evidence is the file's");
    assert!(len > 4096, "a file of several pages ({len} bytes)");
    let path = format!("/seeds/{SEED}");
    let token = bearer("alice");
    let auth = Some(token.as_str());
    let other_secret = format!(
        "Bearer {}",
        mint(b"another-secret-0123456789abcdef", "alice", 3600)
    );
    let refusals = [
        ("no token", None),
        ("not a bearer", Some(&token[7..])),
        ("garbage", Some("Bearer not.a.token")),
        ("another secret", Some(other_secret.as_str())),
    ];
    for (what, token) in refusals {
        s.refused_at_the_edge(what, &path, token).await;
    }

    // The first request: a miss, fetched from the origin once.
    let before = s.origin_seed_requests().await;
    let first = s.get(&s.edge.base, &path, auth, &[]).await;
    assert_eq!(first.status, 200);
    assert!(first.body == bytes, "the file's bytes");
    assert_eq!(sha256_hex(&first.body), sha);
    assert_eq!(first.header("etag"), format!("\"{sha}\""));
    assert_eq!(first.header("cache-control"), "private, no-cache");
    assert_eq!(first.header("content-type"), "application/vnd.sqlite3");
    assert_eq!(first.header("accept-ranges"), "bytes");
    assert_eq!(
        s.origin_seed_requests().await,
        before + 1,
        "one origin request"
    );
    let miss = s.line(&first).await;
    assert!(
        miss.contains("endpoint=seed status=200 code=- outcome=forwarded cache=miss origin_ms="),
        "{miss}"
    );
    eprintln!("{miss}");

    // The second: a hit, no origin request, the same bytes and headers.
    let second = s.get(&s.edge.base, &path, auth, &[]).await;
    assert_eq!(second.status, 200);
    assert!(second.body == bytes, "the file's bytes from the cache");
    assert_eq!(second.header("etag"), format!("\"{sha}\""));
    assert_eq!(second.header("cache-control"), "private, no-cache");
    assert_eq!(second.header("content-type"), "application/vnd.sqlite3");
    assert_eq!(second.header("content-length"), len.to_string());
    assert!(second.headers.get("cf-cache-status").is_none());
    assert!(second
        .headers
        .get("x-synchro-origin-cache-control")
        .is_none());
    assert_eq!(
        s.origin_seed_requests().await,
        before + 1,
        "no origin request"
    );
    let hit = s.line(&second).await;
    assert!(
        hit.ends_with("endpoint=seed status=200 code=- outcome=cached cache=hit"),
        "{hit}"
    );
    eprintln!("{hit}");

    // Ranges, conditions and HEAD, from the cache.
    let r = s
        .get(&s.edge.base, &path, auth, &[("range", "bytes=100-199")])
        .await;
    assert_eq!(r.status, 206);
    assert!(r.body == bytes[100..200], "the range's bytes");
    assert_eq!(r.header("content-range"), format!("bytes 100-199/{len}"));
    assert!(s
        .line(&r)
        .await
        .contains("status=206 code=- outcome=cached cache=hit"));
    let r = s
        .get(&s.edge.base, &path, auth, &[("range", "bytes=-10")])
        .await;
    assert_eq!(r.status, 206);
    assert!(r.body == bytes[len - 10..]);
    let r = s
        .get(&s.edge.base, &path, auth, &[("range", "bytes=4096-")])
        .await;
    assert_eq!(r.status, 206);
    assert!(r.body == bytes[4096..]);
    let outside = format!("bytes={len}-");
    let r = s
        .get(&s.edge.base, &path, auth, &[("range", &outside)])
        .await;
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), format!("bytes */{len}"));
    let quoted = format!("\"{sha}\"");
    let r = s
        .get(&s.edge.base, &path, auth, &[("if-none-match", &quoted)])
        .await;
    assert_eq!((r.status, r.body.len()), (304, 0));
    assert_eq!(r.header("etag"), quoted);
    let r = s
        .get(
            &s.edge.base,
            &path,
            auth,
            &[("if-none-match", "\"another\"")],
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body == bytes);
    let r = s
        .request(reqwest::Method::HEAD, &s.edge.base, &path, auth, &[])
        .await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("etag"), quoted);
    assert_eq!(
        s.origin_seed_requests().await,
        before + 1,
        "all from the cache"
    );

    // Cached now, and still nothing without a valid token.
    for (what, token) in refusals {
        s.refused_at_the_edge(what, &path, token).await;
    }

    // An unknown name and a replaced version: the origin's 404 each time, never cached.
    let before = s.origin_seed_requests().await;
    let zeros = "0".repeat(64);
    for p in [
        "/seeds/missing.seed.sqlite".to_owned(),
        format!("{path}?v={zeros}"),
    ] {
        for n in 1..=2 {
            let r = s.get(&s.edge.base, &p, auth, &[]).await;
            assert_eq!(r.status, 404, "{p} #{n}");
            assert!(
                s.line(&r)
                    .await
                    .contains("status=404 code=- outcome=forwarded cache=miss"),
                "{p} #{n}"
            );
        }
    }
    assert_eq!(
        s.origin_seed_requests().await,
        before + 4,
        "every 404 from the origin"
    );

    // Its version: cached under its own key, immutable.
    let versioned = format!("{path}?v={sha}");
    let before = s.origin_seed_requests().await;
    for (n, cache) in [(1, "miss"), (2, "hit")] {
        let r = s.get(&s.edge.base, &versioned, auth, &[]).await;
        assert_eq!(r.status, 200, "#{n}");
        assert!(r.body == bytes, "#{n}");
        assert_eq!(
            r.header("cache-control"),
            "private, max-age=31536000, immutable"
        );
        assert!(s.line(&r).await.contains(&format!("cache={cache}")), "#{n}");
    }
    assert_eq!(s.origin_seed_requests().await, before + 1);

    // The evidence asked first with a range: one full origin request, the range answered
    // from the cache, then the whole file from the cache.
    let evidence_bytes = std::fs::read(s.dir.join("team.seed.json")).unwrap();
    let evidence_path = "/seeds/team.seed.json";
    let before = s.origin_seed_requests().await;
    let r = s
        .get(&s.edge.base, evidence_path, auth, &[("range", "bytes=0-9")])
        .await;
    assert_eq!(r.status, 206);
    assert!(r.body == evidence_bytes[..10]);
    assert!(s
        .line(&r)
        .await
        .contains("status=206 code=- outcome=forwarded cache=miss"));
    let r = s.get(&s.edge.base, evidence_path, auth, &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.body == evidence_bytes);
    assert_eq!(
        r.header("etag"),
        format!("\"{}\"", sha256_hex(&evidence_bytes))
    );
    assert_eq!(r.header("content-type"), "application/json");
    assert!(s.line(&r).await.contains("cache=hit"));
    assert_eq!(s.origin_seed_requests().await, before + 1);

    // Nothing of a token, a file name or a digest in the worker's lines (wrangler's own
    // request log names paths).
    let out = s.edge.output();
    let worker: Vec<&str> = out.lines().filter(|l| l.contains("synchro-edge")).collect();
    assert!(worker.len() > 20, "{out}");
    for secret in [token.as_str(), "team.seed", "missing.seed", sha, SECRET] {
        assert!(
            !worker.iter().any(|l| l.contains(secret)),
            "the worker logged {secret:?}:\n{out}"
        );
    }
}

#[tokio::test]
async fn public_seeds_are_answered_and_cached_without_a_token() {
    let (s, evidence) = Stack::start(true).await;
    let bytes = std::fs::read(s.dir.join(SEED)).unwrap();
    let path = format!("/seeds/{SEED}");
    let before = s.origin_seed_requests().await;
    for (n, token, cache) in [
        (1, None, "miss"),
        (2, None, "hit"),
        (3, Some("Bearer not.a.token"), "hit"),
    ] {
        let r = s.get(&s.edge.base, &path, token, &[]).await;
        assert_eq!(r.status, 200, "#{n}");
        assert!(r.body == bytes, "#{n}");
        assert_eq!(
            r.header("etag"),
            format!("\"{}\"", evidence["sha256"].as_str().unwrap())
        );
        assert_eq!(r.header("cache-control"), "public, no-cache");
        assert!(s.line(&r).await.contains(&format!("cache={cache}")), "#{n}");
    }
    assert_eq!(s.origin_seed_requests().await, before + 1);
}
