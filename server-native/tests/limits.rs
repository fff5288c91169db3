//! Connection exhaustion (issue 12), against the real server binary started with small
//! limits: header, body and idle timeouts; the global and the per-peer connection caps
//! (refused at once with 503 while other connections are served); the caps on
//! change-notification streams; and the per-client cap on rebuild sessions, where a repeated
//! rebuild of a scope replaces the earlier session instead of adding one.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{free_port, Env, Server};
use serde_json::{json, Value};
use synchro_server::auth::mint;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const SECRET: &str = "limits-secret-0123456789abcdefghij";

/// `synchro-server serve` (with the capture worker) on a free port with `flags`.
fn start(env: &Env, flags: &[&str]) -> (Server, SocketAddr) {
    start_limited(env, flags, None)
}

/// [`start`], with the open-file limit (soft and hard) set to `nofile` when given.
fn start_limited(env: &Env, flags: &[&str], nofile: Option<u32>) -> (Server, SocketAddr) {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let binary = env!("CARGO_BIN_EXE_synchro-server");
    let mut command = match nofile {
        Some(n) => {
            let mut c = std::process::Command::new("sh");
            c.args([
                "-c",
                &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                binary,
            ]);
            c
        }
        None => std::process::Command::new(binary),
    };
    let server = Server::from(
        command
            .args(common::serve_args(env, port, SECRET))
            .args(flags)
            .env("SYNCHRO_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    (server, addr)
}

/// A cluster with a registered, published table (so the server can become ready).
async fn env() -> Env {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(&env, "").await;
    env
}

/// Waits until the worker has materialized at least `rows` rows of `scope`.
async fn wait_for_scope_rows(env: &Env, scope: &str, rows: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.synchro_scope_rows($1)",
            &[&scope],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        < rows
    {
        assert!(Instant::now() < deadline, "rows were never captured");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Posts `body` to `path` with `token`: (status, body, Retry-After).
async fn post_answer(
    addr: SocketAddr,
    token: &str,
    path: &str,
    body: &Value,
) -> (u16, Value, Option<String>) {
    let r = http()
        .post(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, r.json().await.unwrap(), retry_after)
}

/// An HTTP client that keeps no idle connection (a pooled one would hold a slot).
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Waits until `GET /ready` answers 200.
async fn wait_ready(addr: SocketAddr) {
    common::wait_ready(&http(), &format!("http://{addr}")).await;
}

/// A response read off a raw connection.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads one response (head and Content-Length body) within `within`; `None` when the
/// connection closed or nothing complete arrived in time.
async fn read_answer(s: &mut TcpStream, within: Duration) -> Option<Answer> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                let body = text[end + 4..end + 4 + length].to_owned();
                return Some(Answer { status, head, body });
            }
        }
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// Whether the server closes `s` within `within` (anything it sends first is skipped).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

fn ready_request() -> &'static [u8] {
    b"GET /ready HTTP/1.1\r\nhost: synchro\r\n\r\n"
}

/// A request other than `GET /ready` (which is answered over a cap too).
fn connect_request() -> &'static [u8] {
    b"POST /sync/connect HTTP/1.1\r\nhost: synchro\r\ncontent-length: 2\r\n\r\n{}"
}

/// Asserts that a fresh connection from `from` (or 127.0.0.1) is refused at once with 503
/// `too_many_connections`.
async fn assert_refused(addr: SocketAddr, from: Option<&str>) {
    let started = Instant::now();
    let mut s = connect_from(addr, from).await;
    let _ = s.write_all(connect_request()).await;
    let a = read_answer(&mut s, Duration::from_secs(2))
        .await
        .expect("a refused connection is answered");
    assert_eq!(a.status, 503, "{}", a.head);
    assert_eq!(
        a.json(),
        json!({"error": {"code": "temporary_unavailable", "message": "the service is temporarily unavailable",
                         "retryable": true, "reason": "too_many_connections"}})
    );
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    // "At once": far below any timeout the tests configure (bounds are generous because
    // these machines are loaded and the tests time nothing finer than that).
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    assert!(started.elapsed() < Duration::from_secs(5), "refused fast");
}

async fn connect_from(addr: SocketAddr, from: Option<&str>) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(ip) = from {
        socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    }
    socket.connect(addr).await.unwrap()
}

/// `n` silent connections the server has accepted and counted: a connection it refused is
/// answered within its 250 ms wait for a request line (a 503 arrives), so such a one is
/// dropped and made again — the
/// readiness check's own connection may be counted for a moment after it closes.
async fn held_sockets(addr: SocketAddr, from: Option<&str>, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::new();
    let mut attempts = 0;
    while v.len() < n {
        attempts += 1;
        assert!(
            attempts < n + 50,
            "the server kept refusing the held connections"
        );
        let s = connect_from(addr, from).await;
        let mut probe = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(400), s.peek(&mut probe)).await {
            Err(_) => v.push(s), // nothing arrived: accepted and waiting for a request
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    v
}

/// Opens `n` connections that send nothing, and gives the server time to accept them.
async fn idle_sockets(addr: SocketAddr, from: Option<&str>, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(connect_from(addr, from).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    v
}

#[tokio::test]
async fn silent_and_slow_header_connections_are_closed_after_the_header_timeout() {
    let env = env().await;
    let (_server, addr) = start(&env, &["--header-timeout-ms", "600"]);
    wait_ready(addr).await;

    // Nothing sent at all.
    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)).await);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(500), "{waited:?}");

    // A head that trickles in, one byte every 50 ms, never completes in time.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    slow.write_all(b"POST /sync/connect HTTP/1.1\r\nhost: synchro\r\n")
        .await
        .unwrap();
    let mut closed = false;
    for b in b"x-padding: "
        .iter()
        .chain([b'a'; 200].iter())
        .cycle()
        .take(200)
    {
        if slow.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    assert!(closed || closed_within(&mut slow, Duration::from_millis(100)).await);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(10),
        "{waited:?}"
    );

    // A normal request is served.
    let r = http()
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_only() {
    let env = env().await;
    // An idle timeout shorter than the header timeout, and one longer.
    let (_short, short) = start(
        &env,
        &["--header-timeout-ms", "5000", "--idle-timeout-ms", "700"],
    );
    let (_long, long) = start(
        &env,
        &["--header-timeout-ms", "400", "--idle-timeout-ms", "3000"],
    );
    wait_ready(short).await;
    wait_ready(long).await;

    let mut s = TcpStream::connect(short).await.unwrap();
    s.write_all(ready_request()).await.unwrap();
    assert_eq!(
        read_answer(&mut s, Duration::from_secs(5))
            .await
            .unwrap()
            .status,
        200
    );
    // Kept alive: a second request on the same connection within the idle timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.write_all(ready_request()).await.unwrap();
    assert_eq!(
        read_answer(&mut s, Duration::from_secs(5))
            .await
            .unwrap()
            .status,
        200
    );
    let answered = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(10)).await);
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(600) && idle < Duration::from_secs(10),
        "closed after {idle:?} idle"
    );

    // The idle wait is bounded by the idle timeout, not by the (shorter) header timeout.
    let mut s = TcpStream::connect(long).await.unwrap();
    s.write_all(ready_request()).await.unwrap();
    assert_eq!(
        read_answer(&mut s, Duration::from_secs(5))
            .await
            .unwrap()
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    s.write_all(ready_request()).await.unwrap();
    assert_eq!(
        read_answer(&mut s, Duration::from_secs(5))
            .await
            .unwrap()
            .status,
        200
    );
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_slow_body_is_answered_503_and_closed_after_the_body_timeout() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--body-timeout-ms",
            "600",
            "--header-timeout-ms",
            "5000",
            "--idle-timeout-ms",
            "5000",
            "--retry-after-seconds",
            "3",
        ],
    );
    wait_ready(addr).await;
    let head = b"POST /sync/connect HTTP/1.1\r\nhost: synchro\r\ncontent-length: 100\r\n\r\n";

    // A body sent in two parts well within the bound is read (401: no token).
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    s.write_all(&[b' '; 50]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(br#"{"protocol_version":3}"#).await.unwrap();
    s.write_all(&[b' '; 28]).await.unwrap();
    let a = read_answer(&mut s, Duration::from_secs(5)).await.unwrap();
    assert_eq!(a.status, 401, "{}", a.body);

    // A body that trickles in, a byte every 100 ms, is refused once the bound has passed
    // (with a valid token: without one the shorter unauthenticated bound applies, below).
    let token = mint(SECRET.as_bytes(), "alice", 600);
    let authed = format!(
        "POST /sync/connect HTTP/1.1\r\nhost: synchro\r\nauthorization: Bearer {token}\r\ncontent-length: 100\r\n\r\n"
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    s.write_all(authed.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(4), rd.read_to_end(&mut buf)).await;
    let waited = started.elapsed();
    trickle.abort();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 3"),
        "{text}"
    );
    assert!(
        text.contains(r#""reason":"request_body_timeout""#),
        "{text}"
    );
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(10),
        "answered and closed after {waited:?}"
    );
}

/// A request without a valid token holds its connection no longer than the unauthenticated
/// body bound (2 s by default, 500 ms here): its trickling body is answered 401 and the
/// connection closed, long before the body timeout of an authenticated request (it used to
/// hold one of the connection slots for the whole 30 s).
#[tokio::test]
async fn an_unauthenticated_slow_body_is_answered_401_after_the_short_bound() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--body-timeout-ms",
            "30000",
            "--unauthenticated-body-timeout-ms",
            "500",
        ],
    );
    wait_ready(addr).await;
    for authorization in ["", "authorization: Bearer not-a-token\r\n"] {
        let head = format!(
            "POST /sync/pull HTTP/1.1\r\nhost: synchro\r\n{authorization}content-length: 100\r\n\r\n"
        );
        let mut s = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        s.write_all(head.as_bytes()).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let trickle = tokio::spawn(async move {
            for _ in 0..100 {
                if wr.write_all(b" ").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(8), rd.read_to_end(&mut buf)).await;
        let waited = started.elapsed();
        trickle.abort();
        let text = String::from_utf8_lossy(&buf);
        assert!(
            text.starts_with("HTTP/1.1 401"),
            "{authorization:?}: {text}"
        );
        assert!(text.contains(r#""code":"unauthorized""#), "{text}");
        assert!(
            waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
            "{authorization:?}: answered and closed after {waited:?}"
        );
    }
}

#[tokio::test]
async fn connections_over_the_global_cap_are_refused_at_once_and_served_again_after() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--max-connections",
            "6",
            "--max-connections-per-peer",
            "0",
            "--header-timeout-ms",
            "4000",
            "--retry-after-seconds",
            "1",
        ],
    );
    wait_ready(addr).await;
    // Six silent sockets fill the cap; every further connection is answered 503 and closed
    // at once, from any peer, instead of waiting in the backlog.
    let mut held = held_sockets(addr, None, 6).await;
    let filled = Instant::now();
    for _ in 0..20 {
        assert_refused(addr, None).await;
    }
    assert_refused(addr, Some("127.0.0.2")).await;
    // The held ones time out (header timeout) and the server is reachable again.
    for s in &mut held {
        assert!(closed_within(s, Duration::from_secs(10)).await);
    }
    assert!(filled.elapsed() >= Duration::from_millis(3000));
    let r = http()
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Idle connections holding every slot (3,000 from one address made a fresh `GET /ready`
/// answer 503, taking a healthy server out of its load balancer): over the cap a readiness
/// probe is still answered with the truth, and every other request is refused.
#[tokio::test]
async fn a_readiness_probe_is_answered_when_idle_connections_hold_every_slot() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--max-connections",
            "4",
            "--max-connections-per-peer",
            "0",
            "--header-timeout-ms",
            "60000",
            "--retry-after-seconds",
            "1",
        ],
    );
    wait_ready(addr).await;
    let _held = held_sockets(addr, None, 4).await;
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(ready_request()).await.unwrap();
        let a = read_answer(&mut s, Duration::from_secs(5))
            .await
            .expect("the probe is answered");
        assert_eq!(a.status, 200, "{}", a.head);
        assert_eq!(a.json(), json!({"status": "ready"}));
        assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    }
    assert_refused(addr, None).await;
    // A silent connection over the cap is refused after the short wait for its request.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let a = read_answer(&mut silent, Duration::from_secs(3))
        .await
        .expect("answered");
    assert_eq!(a.status, 503, "{}", a.head);
}

#[tokio::test]
async fn a_cap_beyond_the_open_file_limit_is_lowered_so_the_server_stays_reachable() {
    let env = env().await;
    // 400 descriptors, of which 128 stay spare: at most 272 connections, not 4096.
    let (_server, addr) = start_limited(
        &env,
        &[
            "--max-connections",
            "4096",
            "--max-connections-per-peer",
            "0",
            "--header-timeout-ms",
            "120000",
            "--retry-after-seconds",
            "1",
        ],
        Some(400),
    );
    wait_ready(addr).await;
    let mut sockets = idle_sockets(addr, None, 300).await;
    // A refused silent connection is closed once its wait for a request line ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut closed = 0;
    for s in &mut sockets {
        if closed_within(s, Duration::from_millis(2)).await {
            closed += 1;
        }
    }
    assert_eq!(
        closed,
        300 - 272,
        "connections beyond the lowered cap are refused"
    );
    assert_refused(addr, None).await;
    drop(sockets);
    // Reachable again at once, and ready again once the sessions that could not open a
    // descriptor meanwhile (the capture worker's, the notifier's) have reconnected: a CI run
    // saw 503 at 300 ms.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = http()
            .get(format!("http://{addr}/ready"))
            .send()
            .await
            .expect("the server answers once the idle sockets are gone");
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready 15 s after the sockets closed: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_peer_over_its_cap_is_refused_while_another_peer_is_served() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--max-connections",
            "100",
            "--max-connections-per-peer",
            "3",
            "--header-timeout-ms",
            "120000",
            "--retry-after-seconds",
            "1",
        ],
    );
    // Wait for readiness from another peer address: the readiness request's own connection
    // from 127.0.0.1 may still be counted for a moment after it closes, which let the
    // fourth connection below through once in a few runs.
    let ready = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .local_address("127.0.0.3".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    common::wait_ready(&ready, &format!("http://{addr}")).await;
    let mut held = held_sockets(addr, Some("127.0.0.1"), 3).await;
    assert_refused(addr, Some("127.0.0.1")).await;
    // Another peer address is served normally meanwhile.
    let other = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let r = other
        .get(format!("http://{addr}/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // When one of the peer's connections ends, the peer is served again.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut s = connect_from(addr, Some("127.0.0.1")).await;
    s.write_all(ready_request()).await.unwrap();
    let a = read_answer(&mut s, Duration::from_secs(5)).await.unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_and_closes_idle_connections() {
    let env = env().await;
    let (mut server, addr) = start(&env, &[]);
    wait_ready(addr).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut in_flight = TcpStream::connect(addr).await.unwrap();
    in_flight
        .write_all(b"POST /sync/connect HTTP/1.1\r\nhost: synchro\r\ncontent-length: 22\r\n\r\n{\"protocol")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::process::Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "waits for the request"
    );
    // New connections are no longer accepted.
    assert!(TcpStream::connect(addr).await.is_err());
    in_flight.write_all(b"_version\":3}").await.unwrap();
    let a = read_answer(&mut in_flight, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(closed_within(&mut idle, Duration::from_secs(10)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    // Every session, the replication stream's too, ended with a Terminate: nothing in the
    // PostgreSQL log ("unexpected EOF on standby connection", "could not receive data").
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = env.cluster.server_log().unwrap();
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| {
            [
                "unexpected EOF",
                "could not receive data",
                "could not send data",
                "connection to client lost",
            ]
            .iter()
            .any(|noise| l.contains(noise))
        })
        .collect();
    assert!(noisy.is_empty(), "{noisy:#?}");
}

/// Waits up to `within` for `server` to exit; its status.
async fn exit_within(server: &mut Server, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_ends_open_event_streams_and_the_server_exits_0() {
    // An events stream lasts 5 minutes; a container stop (SIGTERM, then SIGKILL after 10 s)
    // must not wait for it.
    let env = env().await;
    let (mut server, addr) = start(&env, &[]);
    wait_ready(addr).await;
    let (token, generation, _) = connect(addr, "alice", "c1").await;
    let mut stream = reqwest::Client::new()
        .post(format!("http://{addr}/sync/events"))
        .header("authorization", format!("Bearer {token}"))
        .body(
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let ready = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&ready).contains("event: ready"));
    std::process::Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    let mut rest = String::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = stream.chunk().await.unwrap() {
            rest.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the stream stayed open after SIGTERM: {rest:?}"
    );
    assert!(
        rest.contains("event: end") && rest.contains("\"reason\":\"shutdown\""),
        "{rest:?}"
    );
    let status = exit_within(&mut server, Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the server did not exit 0 within 10 s of SIGTERM: {status:?}"
    );
}

#[tokio::test]
async fn probe_exits_0_for_a_ready_server_and_1_otherwise() {
    // `synchro-server probe` is the container's health check.
    let probe = |addr: String| {
        std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args(["probe", "--listen", &addr])
            .env_remove("SYNCHRO_LISTEN")
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .code()
    };
    // Nothing listens.
    assert_eq!(probe(format!("127.0.0.1:{}", free_port())), Some(1));
    // Something that is not a ready synchro server: a 503.
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_addr = other.local_addr().unwrap();
    let answering = tokio::spawn(async move {
        let (mut s, _) = other.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
    });
    let code = tokio::task::spawn_blocking(move || probe(other_addr.to_string()))
        .await
        .unwrap();
    assert_eq!(code, Some(1));
    answering.await.unwrap();
    // A ready server, probed through the unspecified address it could listen on.
    let env = env().await;
    let (_server, addr) = start(&env, &[]);
    wait_ready(addr).await;
    assert_eq!(probe(addr.to_string()), Some(0));
    assert_eq!(probe(format!("0.0.0.0:{}", addr.port())), Some(0));
}

/// A server whose database holds another SQL contract than the one it is built for (its
/// install ledger differs from the binary's steps) is not ready, and `health` says
/// `schema_installed: failed` (the check was a constant "ok"); a readiness check that is
/// null counts as not ok (a missing capture state used to pass).
#[tokio::test]
async fn a_server_on_another_sql_contract_or_a_null_check_is_not_ready() {
    let env = env().await;
    let (_server, addr) = start(&env, &[]);
    wait_ready(addr).await;
    let ready = || async {
        http()
            .get(format!("http://{addr}/ready"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let health = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args([
                "health",
                "--database-url",
                &env.cluster.url("synchro_dev_monitor", "app"),
            ])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let (code, h) = health();
    assert_eq!(
        (code, &h["checks"]["schema_installed"]),
        (Some(0), &json!("ok")),
        "{h}"
    );
    // The observations beside the checks: heartbeat age (seconds) and unconfirmed WAL.
    let age = h["report"]["heartbeat_age_seconds"].as_i64();
    assert!(age.is_some_and(|a| (0..=60).contains(&a)), "{h}");
    assert!(
        h["report"]["unconfirmed_wal_bytes"].as_i64().is_some(),
        "{h}"
    );

    let real: String = env
        .admin
        .query_one(
            "SELECT sha256 FROM synchro.schema_migrations WHERE version = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    env.admin
        .batch_execute(
            "UPDATE synchro.schema_migrations SET sha256 = repeat('0', 64) WHERE version = 1",
        )
        .await
        .unwrap();
    assert_eq!(ready().await, 503);
    let (code, h) = health();
    assert_eq!(
        (code, &h["checks"]["schema_installed"]),
        (Some(1), &json!("failed")),
        "{h}"
    );
    env.admin
        .execute(
            "UPDATE synchro.schema_migrations SET sha256 = $1 WHERE version = 1",
            &[&real],
        )
        .await
        .unwrap();
    assert_eq!(ready().await, 200);

    // A check that is null (no capture state row: the subquery answers nothing).
    let saved = env
        .admin
        .query_one("SELECT to_jsonb(c)::text FROM synchro.capture_state c", &[])
        .await
        .unwrap()
        .get::<_, String>(0);
    env.admin
        .batch_execute("DELETE FROM synchro.capture_state")
        .await
        .unwrap();
    let readiness: bool = env
        .login("synchro_dev_monitor")
        .await
        .query_one("SELECT synchro.synchro_readiness()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!readiness);
    env.admin
        .execute(
            "INSERT INTO synchro.capture_state SELECT * FROM jsonb_populate_record(NULL::synchro.capture_state, $1::text::jsonb)",
            &[&saved],
        )
        .await
        .unwrap();
}

/// Connects `client` for `user`; returns (token, generation, schema).
async fn connect(addr: SocketAddr, user: &str, client: &str) -> (String, u64, Value) {
    let token = mint(SECRET.as_bytes(), user, 3600);
    let r = http()
        .post(format!("http://{addr}/sync/connect"))
        .header("authorization", format!("Bearer {token}"))
        .body(
            json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let schema = json!({"version": v["schema"]["version"], "hash": v["schema"]["hash"]});
    (token, v["client_generation"].as_u64().unwrap(), schema)
}

/// Made-up client IDs cannot grow the clients table without bound (each connect used to
/// leave a durable record): at the cap a new client ID replaces the user's least recently
/// active client, whose next request is 409 client_generation_expired and whose connect
/// starts it again; other users are untouched.
#[tokio::test]
async fn client_records_are_capped_per_user_and_the_least_recent_is_replaced() {
    let env = env().await;
    let (_server, addr) = start(&env, &["--max-clients-per-user", "3"]);
    wait_ready(addr).await;
    let records = |user: &'static str| {
        let admin = &env.admin;
        async move {
            let rows = admin
                .query(
                    "SELECT client_id FROM synchro.clients WHERE user_id = $1 ORDER BY client_id",
                    &[&user],
                )
                .await
                .unwrap();
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
        }
    };
    let (bob, _, _) = connect(addr, "bob", "b1").await;
    drop(bob);
    let (token, g1, schema) = connect(addr, "alice", "c1").await;
    for c in ["c2", "c3"] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        connect(addr, "alice", c).await;
    }
    assert_eq!(records("alice").await, ["c1", "c2", "c3"]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    connect(addr, "alice", "c4").await;
    assert_eq!(records("alice").await, ["c2", "c3", "c4"]);
    assert_eq!(records("bob").await, ["b1"]);
    let r = http()
        .post(format!("http://{addr}/sync/pull"))
        .header("authorization", format!("Bearer {token}"))
        .body(
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": g1,
                   "schema": schema, "scope_cursors": {}, "limit": 10})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "client_generation_expired", "{v}");
    // It connects again, replacing the least recently active of the others.
    connect(addr, "alice", "c1").await;
    assert_eq!(records("alice").await, ["c1", "c3", "c4"]);

    // The health report says since when the least recent unexpired client holds retention
    // back (here: bob's first connect, the oldest record left).
    let report: Value = env
        .admin
        .query_one("SELECT synchro.synchro_capture_report()::text", &[])
        .await
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).unwrap())
        .unwrap();
    let since: String = env
        .admin
        .query_one(
            "SELECT to_jsonb(generation_started_at) #>> '{}' FROM synchro.clients WHERE user_id = 'bob'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        report["oldest_unexpired_client_since"],
        json!(since),
        "{report}"
    );
    assert!(report["retained_effects_estimate"].is_i64(), "{report}");
}

#[tokio::test]
async fn event_streams_are_capped_per_client_per_user_and_in_all() {
    let env = env().await;
    let (_server, addr) = start(
        &env,
        &[
            "--max-event-streams",
            "4",
            "--max-event-streams-per-user",
            "3",
            "--max-event-streams-per-client",
            "2",
        ],
    );
    wait_ready(addr).await;
    let client = reqwest::Client::new();
    let open = |token: String, client_id: &'static str, generation: u64| {
        client
            .post(format!("http://{addr}/sync/events"))
            .header("authorization", format!("Bearer {token}"))
            .body(
                json!({"protocol_version": 3, "client_id": client_id, "client_generation": generation})
                    .to_string(),
            )
            .send()
    };
    let (token, g1, _) = connect(addr, "alice", "c1").await;
    let (_, g2, _) = connect(addr, "alice", "c2").await;
    let (_, g3, _) = connect(addr, "alice", "c3").await;
    let (bob, b1, _) = connect(addr, "bob", "c1").await;
    let (_, b2, _) = connect(addr, "bob", "c2").await;
    let mut first = open(token.clone(), "c1", g1).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.chunk().await.unwrap().is_some(), "ready");
    let second = open(token.clone(), "c1", g1).await.unwrap();
    assert_eq!(second.status(), 200);

    let refused = |r: reqwest::Response| async move {
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (
                v["error"]["code"].clone(),
                v["error"]["retryable"].clone(),
                v["error"]["reason"].clone()
            ),
            (
                json!("temporary_unavailable"),
                json!(true),
                json!("too_many_event_streams")
            ),
            "{v}"
        );
    };
    // A third stream of the same client is refused; another client still gets one...
    refused(open(token.clone(), "c1", g1).await.unwrap()).await;
    let third = open(token.clone(), "c2", g2).await.unwrap();
    assert_eq!(third.status(), 200);
    // ...until the user's cap (another client ID does not help: one token cannot take every
    // slot of the server with made-up client IDs)...
    refused(open(token.clone(), "c3", g3).await.unwrap()).await;
    // ...while another user still gets one, until the server-wide cap.
    let fourth = open(bob.clone(), "c1", b1).await.unwrap();
    assert_eq!(fourth.status(), 200);
    refused(open(bob.clone(), "c2", b2).await.unwrap()).await;

    // A stream whose client went away frees its slot.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = open(token.clone(), "c1", g1).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((second, third, fourth));
}

/// Long on purpose: each cap is reached with the sessions the steps before opened.
#[tokio::test]
async fn rebuild_sessions_are_capped_per_client_and_a_repeated_rebuild_replaces() {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', (ARRAY['red', 'blue', 'green'])[1 + g % 3], 'doc'
           FROM generate_series(1, 6) g",
    )
    .await;
    env.admin
        .batch_execute(
            "SELECT synchro.synchro_grant_user_scope('alice', 'team:blue');
             SELECT synchro.synchro_grant_user_scope('alice', 'team:green');",
        )
        .await
        .unwrap();
    let (_server, addr) = start(&env, &["--max-rebuild-sessions-per-client", "2"]);
    wait_ready(addr).await;
    wait_for_scope_rows(&env, "team:green", 2).await;
    let (token, generation, schema) = connect(addr, "alice", "c1").await;
    let (_, generation2, _) = connect(addr, "alice", "c2").await;
    let rebuild = |client_id: &'static str,
                   generation: u64,
                   scope: &'static str,
                   continuation: Option<Value>| {
        let mut body = json!({"protocol_version": 3, "client_id": client_id, "client_generation": generation,
                              "schema": schema, "scope_id": scope, "limit": 1});
        if let Some(c) = continuation {
            body["continuation"] = c;
        }
        let token = token.clone();
        async move { post_answer(addr, &token, "/sync/rebuild", &body).await }
    };
    let sessions = |scope: &'static str| {
        let admin = &env.admin;
        async move {
            admin
                .query_one(
                    "SELECT count(*) FROM synchro.rebuild_sessions
                      WHERE user_id = 'alice' AND client_id = 'c1' AND scope_id LIKE $1",
                    &[&scope],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };

    // Two sessions in progress (limit 1, more pages to come) fill the client's cap.
    let (st, first, _) = rebuild("c1", generation, "user:alice", None).await;
    assert_eq!(
        (st, first["has_more"].clone()),
        (200, json!(true)),
        "{first}"
    );
    let (st, red, _) = rebuild("c1", generation, "team:red", None).await;
    assert_eq!((st, red["has_more"].clone()), (200, json!(true)), "{red}");
    let (st, v, retry_after) = rebuild("c1", generation, "team:blue", None).await;
    assert_eq!(
        (
            st,
            v["error"]["code"].clone(),
            v["error"]["retryable"].clone(),
            v["error"]["reason"].clone()
        ),
        (
            503,
            json!("temporary_unavailable"),
            json!(true),
            json!("too_many_rebuild_sessions")
        ),
        "{v}"
    );
    assert_eq!(retry_after.as_deref(), Some("2"));
    assert_eq!(
        sessions("team:blue").await,
        0,
        "nothing stored when refused"
    );

    // Rebuilding the same scope again replaces its session: never over the cap, never more
    // than one session per scope, and the replaced session's continuation restarts.
    for _ in 0..5 {
        let (st, v, _) = rebuild("c1", generation, "user:alice", None).await;
        assert_eq!(st, 200, "{v}");
    }
    assert_eq!(sessions("user:alice").await, 1);
    assert_eq!(sessions("%").await, 2);
    let (st, v, _) = rebuild(
        "c1",
        generation,
        "user:alice",
        Some(first["continuation"].clone()),
    )
    .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (409, json!("rebuild_restart_required")),
        "{v}"
    );

    // The cap is per client: another client of the same user rebuilds.
    let (st, v, _) = rebuild("c2", generation2, "team:blue", None).await;
    assert_eq!(st, 200, "{v}");

    // A completed session no longer counts and its rows are gone; its last continuation
    // restarts.
    let mut page = red;
    let mut last_continuation = Value::Null;
    while page["has_more"] == true {
        last_continuation = page["continuation"].clone();
        let (st, next, _) = rebuild(
            "c1",
            generation,
            "team:red",
            Some(last_continuation.clone()),
        )
        .await;
        assert_eq!(st, 200, "{next}");
        page = next;
    }
    assert!(page["checksum"].is_object() && page["final_scope_cursor"].is_string());
    let rows: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.rebuild_chunks r JOIN synchro.rebuild_sessions s USING (session_id)
              WHERE s.client_id = 'c1' AND s.scope_id = 'team:red'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    let (st, v, _) = rebuild("c1", generation, "team:red", Some(last_continuation)).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (409, json!("rebuild_restart_required")),
        "{v}"
    );
    let (st, v, _) = rebuild("c1", generation, "team:blue", None).await;
    assert_eq!(st, 200, "{v}");
}

/// A body limit no push batch could fit (a client seals up to 512 KiB of mutations for the
/// default 1 MiB) is refused before the server starts, with the option named; it used to
/// start and answer every request 400.
#[test]
fn serve_refuses_a_body_limit_below_what_clients_send() {
    for bad in ["0", "1000", "1048575", "67108865", "x"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args([
                "serve",
                "--database-url",
                "host=127.0.0.1 port=1 user=nobody",
            ])
            .args(["--max-body-bytes", bad])
            .env("SYNCHRO_JWT_SECRET", "limits-test-secret-0123456789abcdef")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--max-body-bytes"), "{bad}: {stderr}");
    }
}

/// A secret shorter than 16 bytes is refused before anything connects, with the option
/// named and the value never repeated (`--cursor-secret x` used to be accepted).
#[test]
fn serve_refuses_short_secrets_without_repeating_them() {
    for (flag, jwt, cursor) in [
        ("--jwt-secret", "short-jwt-sec", None),
        (
            "--cursor-secret",
            "limits-test-secret-0123456789abcdef",
            Some("short-cursor"),
        ),
    ] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"));
        command
            .args([
                "serve",
                "--database-url",
                "host=127.0.0.1 port=1 user=nobody",
            ])
            .env("SYNCHRO_JWT_SECRET", jwt)
            .env_remove("SYNCHRO_CURSOR_SECRET");
        if let Some(c) = cursor {
            command.env("SYNCHRO_CURSOR_SECRET", c);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("16 bytes"),
            "{flag}: {stderr}"
        );
        assert!(
            !stderr.contains("short-"),
            "{flag}: the value was repeated: {stderr}"
        );
    }
}

/// A pull page is bounded in bytes as well as in changes: with `--max-page-bytes 100000`,
/// ten 30 KB rows come in pages of at most four (the page that passes the bound ends it),
/// every page but the last says `has_more`, and all ten arrive (a page used to hold up to
/// `limit` rows whatever their size: sixty 2 MB rows made one 126 MB response). A rebuild
/// of the scope pages the same way (it used to serve `limit` records a page), each record
/// once, ending with the scope digest the terminal pull page gave (computed apart, from the
/// server's scope index).
#[tokio::test]
async fn pull_and_rebuild_pages_are_bounded_in_bytes() {
    let env = env().await;
    let (_server, addr) = start(&env, &["--max-page-bytes", "100000"]);
    wait_ready(addr).await;
    let (token, generation, schema) = connect(addr, "alice", "c1").await;
    let post = |path: &'static str, body: Value| {
        let token = token.clone();
        async move {
            let r = http()
                .post(format!("http://{addr}{path}"))
                .header("authorization", format!("Bearer {token}"))
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    // The scope's cursor from its (empty) rebuild.
    let (st, rebuilt) = post(
        "/sync/rebuild",
        json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
               "schema": schema, "scope_id": "user:alice", "limit": 1000}),
    )
    .await;
    assert_eq!(st, 200, "{rebuilt}");
    let mut cursor = rebuilt["final_scope_cursor"].clone();
    env.admin
        .batch_execute(
            "INSERT INTO app.docs SELECT g, 'alice', 'blue', repeat('x', 30000) FROM generate_series(1, 10) g",
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pages = Vec::new();
    let mut received = 0;
    let mut terminal = Value::Null;
    while received < 10 {
        assert!(
            Instant::now() < deadline,
            "only {received} arrived: {pages:?}"
        );
        let (st, page) = post(
            "/sync/pull",
            json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                   "schema": schema, "scope_cursors": {"user:alice": cursor}, "limit": 1000}),
        )
        .await;
        assert_eq!(st, 200, "{page}");
        let n = page["changes"].as_array().unwrap().len();
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        pages.push((n, page["has_more"].as_bool().unwrap()));
        received += n;
        terminal = page["checksums"]["user:alice"]["digest"].clone();
        cursor = page["scope_cursor_updates"]["user:alice"].clone();
    }
    assert_eq!(received, 10, "{pages:?}");
    assert!(pages.iter().all(|(n, _)| *n <= 4), "{pages:?}");
    assert!(pages.len() >= 3, "{pages:?}");

    let mut request = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                             "schema": schema, "scope_id": "user:alice", "limit": 1000});
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let last = loop {
        let (st, page) = post("/sync/rebuild", request.clone()).await;
        assert_eq!(st, 200, "{page}");
        let records = page["records"].as_array().unwrap();
        sizes.push(records.len());
        ids.extend(records.iter().map(|r| r["pk"].clone()));
        if page["has_more"] != true {
            break page;
        }
        request["continuation"] = page["continuation"].clone();
    };
    assert!(sizes.iter().all(|n| (1..=4).contains(n)), "{sizes:?}");
    assert!(sizes.len() >= 3, "{sizes:?}");
    let expected: Vec<Value> = (1..=10).map(|i| json!(i.to_string())).collect();
    assert_eq!(ids.len(), 10, "{ids:?}");
    let mut sorted = ids.clone();
    sorted.sort_by_key(|v| v.to_string());
    sorted.dedup();
    assert_eq!(sorted.len(), 10, "each record once: {ids:?}");
    assert!(expected.iter().all(|e| ids.contains(e)), "{ids:?}");
    assert!(terminal.is_string(), "{pages:?}");
    assert_eq!(last["checksum"]["digest"], terminal);
}

/// A client's rebuild sessions in progress store at most --max-rebuild-bytes-per-client
/// besides its first (four concurrent rebuilds of large scopes used to take 2.9 GB): a second
/// session that would pass it is 503 `too_much_rebuild_storage` (retryable) and stores
/// nothing, while one scope larger than the bound is still rebuilt alone; a session left idle
/// past `rebuild_session_idle_minutes` ends at the next compaction (its rows go, its
/// continuation restarts) and counts no more (abandoned sessions used to keep their rows for
/// the hour of the TTL).
#[tokio::test]
async fn rebuild_storage_is_bounded_per_client_and_idle_sessions_end() {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, 'alice', (ARRAY['red', 'blue'])[1 + g % 2], repeat('x', 20000)
           FROM generate_series(1, 20) g",
    )
    .await;
    env.admin
        .batch_execute(
            "SELECT synchro.synchro_grant_user_scope('alice', 'team:red');
             SELECT synchro.synchro_grant_user_scope('alice', 'team:blue');",
        )
        .await
        .unwrap();
    let (_server, addr) = start(
        &env,
        &[
            "--max-rebuild-bytes-per-client",
            "100000",
            "--max-page-bytes",
            "50000",
            "--retry-after-seconds",
            "1",
        ],
    );
    wait_ready(addr).await;
    wait_for_scope_rows(&env, "team:blue", 10).await;
    let (token, generation, schema) = connect(addr, "alice", "c1").await;
    let rebuild = |scope: &'static str, continuation: Option<Value>| {
        let mut body = json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                              "schema": schema, "scope_id": scope, "limit": 1000});
        if let Some(c) = continuation {
            body["continuation"] = c;
        }
        let token = token.clone();
        async move { post_answer(addr, &token, "/sync/rebuild", &body).await }
    };
    let stored = || async {
        env.admin
            .query_one(
                "SELECT count(*) FROM synchro.rebuild_chunks c JOIN synchro.rebuild_sessions s USING (session_id)
                  WHERE s.client_id = 'c1'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // team:red (ten 20 KB rows, over the bound alone) is rebuilt: its first page.
    let (st, red, _) = rebuild("team:red", None).await;
    assert_eq!(st, 200, "{red}");
    assert_eq!(red["has_more"], true, "{red}");
    let chunks = stored().await;
    assert!(chunks >= 1, "{chunks}");
    // A second session while it is in progress would pass the bound.
    let (st, v, retry) = rebuild("team:blue", None).await;
    assert_eq!(st, 503, "{v}");
    assert_eq!(
        (
            v["error"]["code"].clone(),
            v["error"]["retryable"].clone(),
            v["error"]["reason"].clone()
        ),
        (
            json!("temporary_unavailable"),
            json!(true),
            json!("too_much_rebuild_storage")
        ),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(stored().await, chunks, "nothing more was stored");

    // Left idle past the setting (made to look so), the session ends at the next compaction.
    env.admin
        .batch_execute(
            "UPDATE synchro.rebuild_sessions SET last_read_at = now() - interval '11 minutes'
              WHERE client_id = 'c1'",
        )
        .await
        .unwrap();
    let compact = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args([
            "compact",
            "--database-url",
            &env.cluster.url("synchro_dev_operator", "app"),
        ])
        .output()
        .unwrap();
    assert!(compact.status.success(), "{compact:?}");
    assert_eq!(stored().await, 0);
    let (st, v, _) = rebuild("team:red", Some(red["continuation"].clone())).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (409, json!("rebuild_restart_required")),
        "{v}"
    );
    // It no longer counts: team:blue is rebuilt, whole.
    let mut page = rebuild("team:blue", None).await.1;
    while page["has_more"] == true {
        let (st, next, _) = rebuild("team:blue", Some(page["continuation"].clone())).await;
        assert_eq!(st, 200, "{next}");
        page = next;
    }
    assert!(page["checksum"].is_object(), "{page}");
}

/// Issue 33.5: an app on another origin (Vite on :5173, the server elsewhere) calls the
/// server when `--cors-origin` lists it: its preflight is answered, and every response,
/// a 401 included, is readable by it (Access-Control-Allow-Origin, Retry-After exposed).
/// Another origin's preflight is 403 and its responses carry no CORS header; without the
/// option nothing changes. A malformed origin is refused at start, naming the option.
#[tokio::test]
async fn listed_browser_origins_may_call_the_server_and_others_may_not() {
    let env = env().await;
    let app = "http://localhost:5173";
    let (_server, addr) = start(
        &env,
        &[
            "--cors-origin",
            app,
            "--cors-origin",
            "https://app.example.com",
        ],
    );
    wait_ready(addr).await;
    let http = http();
    let preflight = |origin: &'static str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("http://{addr}/sync/connect"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
    };
    let ok = preflight(app).await.unwrap();
    assert_eq!(ok.status().as_u16(), 204);
    let h = ok.headers();
    assert_eq!(h["access-control-allow-origin"], app);
    assert_eq!(h["access-control-allow-methods"], "GET, POST");
    assert_eq!(
        h["access-control-allow-headers"],
        "authorization, content-type"
    );
    let refused = preflight("http://evil.example").await.unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    assert!(refused
        .headers()
        .get("access-control-allow-origin")
        .is_none());

    let body = r#"{"protocol_version":3,"client_id":"c1","schema":{"version":0,"hash":""}}"#;
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    for (client, origin, auth, status) in [
        ("c1", app, Some(token.as_str()), 200),
        ("c2", app, None, 401),
        ("c3", "http://evil.example", Some(token.as_str()), 200),
    ] {
        let mut request = http
            .post(format!("http://{addr}/sync/connect"))
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(body.replace("c1", client));
        if let Some(t) = auth {
            request = request.bearer_auth(t);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{origin}");
        let h = response.headers();
        if origin == app {
            assert_eq!(h["access-control-allow-origin"], app, "{status}");
            assert_eq!(
                h["access-control-expose-headers"],
                "retry-after, x-synchro-scope-rows"
            );
            assert_eq!(h["vary"], "origin");
        } else {
            assert!(h.get("access-control-allow-origin").is_none());
        }
    }
    // Without the option: no CORS header for anyone.
    let (_plain, plain) = start(&env, &[]);
    wait_ready(plain).await;
    let response = http
        .post(format!("http://{plain}/sync/connect"))
        .header("origin", app)
        .bearer_auth(&token)
        .body(body.replace("c1", "c4"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(response
        .headers()
        .get("access-control-allow-origin")
        .is_none());
    for bad in ["localhost:5173", "http://localhost:5173/", "HTTP://X"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args([
                "serve",
                "--database-url",
                "host=127.0.0.1 port=1 user=nobody",
            ])
            .args(["--cors-origin", bad])
            .env("SYNCHRO_JWT_SECRET", SECRET)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("--cors-origin"),
            "{bad}: {stderr}"
        );
    }
}
