//! The accept loop: HTTP/1.1 connections with a global and a per-peer cap, a header read
//! timeout, an idle keep-alive timeout, back-off on `accept` errors and graceful shutdown.
//!
//! TCP connections arrive before any authentication, so the only "client" at this level is
//! the peer address (IPv6 peers are grouped by /64, which one host usually holds whole). A
//! connection over a cap is answered with 503 `temporary_unavailable`, reason
//! `too_many_connections`, and closed as soon as its request line is in (a silent one after
//! [`PROBE_HEAD_WAIT`]); only the request line is parsed, and `GET /ready` is answered as
//! usual, so a load balancer's or orchestrator's readiness probe still gets the truth when
//! idle or slow connections hold every slot. At most [`PROBE_SLOTS`] such connections are
//! read at once; beyond them a connection is refused without reading anything.
//!
//! Timeouts per connection (hyper 1.x has one `header_read_timeout` that also bounds the
//! idle wait between requests, so both are kept here instead, from the bytes read and the
//! requests served):
//! - from the accept, and from the first byte of each later request, the whole request head
//!   must arrive within the header timeout;
//! - after a response has been sent, the next request must begin within the idle timeout.
//!
//! The request body is bounded by the handlers (`Config::body_timeout`); while a request is
//! being handled or its response streamed (an events stream) neither timeout runs. Over a
//! timeout the connection is closed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::api::ConnectionLimits;

/// File descriptors kept free for everything but client connections (database sessions,
/// the listener, logs).
const RESERVED_FDS: u64 = 128;

/// Serves `app` on `listener` within `config.connections` until `shutdown` completes; then
/// stops accepting, lets in-flight requests finish (idle connections close at once) and
/// returns when every connection has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: &crate::api::Config,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = config.connections.clone();
    let retry_after = config.retry_after_seconds;
    let max = fit_open_file_limit(limits.max_connections.max(1));
    let permits = Arc::new(Semaphore::new(max));
    let probes = Arc::new(Semaphore::new(PROBE_SLOTS));
    let peers = Arc::new(PeerCounts::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let limits = Arc::new(limits);
    tokio::pin!(shutdown);
    let mut backoff = Duration::ZERO;
    let mut refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(v) => {
                backoff = Duration::ZERO;
                v
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors or memory: retrying at once would spin. Existing
                // connections keep being served and free resources as they end.
                if backoff.is_zero() {
                    tracing::warn!(error = %e, "accept failed; backing off");
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(backoff) => continue,
                }
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refusals.count("global");
            over_cap(tcp, &app, &probes, retry_after);
            continue;
        };
        let Some(peer_slot) = peers.enter(&peer, limits.max_connections_per_peer) else {
            refusals.count("peer");
            over_cap(tcp, &app, &probes, retry_after);
            continue;
        };
        // Small responses must not wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(
            tcp,
            app.clone(),
            limits.clone(),
            stop_rx.clone(),
            (permit, peer_slot),
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it ends.
    let _ = permits.acquire_many(max as u32).await;
    Ok(())
}

/// Connections refused over a cap, reported at most once a minute.
#[derive(Default)]
struct Refusals {
    since_report: u64,
    reported: Option<Instant>,
}

impl Refusals {
    fn count(&mut self, cap: &'static str) {
        self.since_report += 1;
        tracing::debug!(cap, "connection refused");
        if self
            .reported
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            tracing::warn!(
                refused = self.since_report,
                cap,
                "connections refused over a connection cap"
            );
            self.since_report = 0;
            self.reported = Some(Instant::now());
        }
    }
}

/// Errors of one pending connection, not of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Raises the soft open-file limit (up to the hard one) so `max` connections fit beside
/// [`RESERVED_FDS`]; when they still do not, returns the cap that does, so sockets can never
/// exhaust the descriptors (and `accept` keep failing).
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
fn fit_open_file_limit(max: usize) -> usize {
    let want = max as u64 + RESERVED_FDS;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return max;
    }
    if (lim.rlim_cur as u64) < want {
        let raised = libc::rlimit {
            rlim_cur: want.min(lim.rlim_max as u64) as libc::rlim_t,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    let fits = (lim.rlim_cur as u64).saturating_sub(RESERVED_FDS).max(1) as usize;
    if fits < max {
        tracing::warn!(
            max_connections = fits,
            "the open-file limit is too small for the configured connection cap; using a lower cap"
        );
        return fits;
    }
    max
}

/// Connections over a cap read at once, to answer a readiness probe among them.
const PROBE_SLOTS: usize = 16;
/// How long the request line of a connection over a cap may take to arrive.
const PROBE_HEAD_WAIT: Duration = Duration::from_millis(250);
/// The longest request line looked at (`GET /ready HTTP/1.1` is 20 bytes).
const PROBE_LINE: usize = 256;

/// A connection over a cap: answered `GET /ready` as usual when a probe slot is free and its
/// request line says so, otherwise refused (at once when no probe slot is free).
fn over_cap(tcp: TcpStream, app: &Router, probes: &Arc<Semaphore>, retry_after_seconds: u64) {
    let Ok(slot) = probes.clone().try_acquire_owned() else {
        refuse(tcp, retry_after_seconds);
        return;
    };
    let app = app.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let mut tcp = tcp;
        if is_ready_probe(&mut tcp).await {
            answer_ready(tcp, app).await;
        } else {
            refuse(tcp, retry_after_seconds);
        }
    });
}

/// Reads the request line (within [`PROBE_HEAD_WAIT`]): whether it is `GET /ready`.
async fn is_ready_probe(tcp: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::with_capacity(PROBE_LINE);
    let deadline = Instant::now() + PROBE_HEAD_WAIT;
    let mut buf = [0u8; PROBE_LINE];
    while !line.contains(&b'\n') && line.len() < PROBE_LINE {
        let want = PROBE_LINE - line.len();
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf[..want])).await {
            Ok(Ok(n)) if n > 0 => line.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    line.starts_with(b"GET /ready ") || line.starts_with(b"GET /ready?")
}

/// Answers `GET /ready` from the router on a connection that holds no slot, then closes.
async fn answer_ready(mut tcp: TcpStream, mut app: Router) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower_service::Service;
    let request = Request::get("/ready")
        .body(Body::empty())
        .expect("a valid request");
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        futures_util::future::poll_fn(|cx| {
            <Router as Service<Request<Body>>>::poll_ready(&mut app, cx)
        })
        .await
        .ok()?;
        let response = app.call(request).await.ok()?;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
            .await
            .ok()?;
        Some((status, body))
    })
    .await;
    let Ok(Some((status, body))) = answered else {
        return; // closed unanswered: the probe counts it as a failure
    };
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let mut answer = head.into_bytes();
    answer.extend_from_slice(&body);
    if tcp.write_all(&answer).await.is_ok() && tcp.shutdown().await.is_ok() {
        // The rest of the request is read (briefly) so the close is not a reset that could
        // destroy the answer before the prober reads it.
        let mut scratch = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            while matches!(tcp.read(&mut scratch).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// Answers 503 without reading the request and closes. Whatever already arrived is
/// discarded first so the close is an orderly FIN (not a reset that could destroy the
/// answer before the client reads it). Never waits.
fn refuse(tcp: TcpStream, retry_after_seconds: u64) {
    use std::io::{Read, Write};
    let Ok(mut tcp) = tcp.into_std() else { return };
    let mut scratch = [0u8; 4096];
    for _ in 0..16 {
        match tcp.read(&mut scratch) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
    let body = crate::api::ApiError::unavailable_because("too_many_connections").body_text();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {retry_after_seconds}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tcp.write(format!("{head}{body}").as_bytes());
    let _ = tcp.shutdown(std::net::Shutdown::Write);
}

/// Open connections per peer key.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One counted connection of a peer; uncounted when dropped.
struct PeerSlot {
    peers: Arc<PeerCounts>,
    key: Option<IpAddr>,
}

impl PeerCounts {
    fn enter(self: &Arc<Self>, peer: &SocketAddr, max: usize) -> Option<PeerSlot> {
        if max == 0 {
            return Some(PeerSlot {
                peers: self.clone(),
                key: None,
            });
        }
        let key = peer_key(peer.ip());
        let mut counts = self.0.lock().expect("peer counts");
        let n = counts.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            key: Some(key),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut counts = self.peers.0.lock().expect("peer counts");
        if let Some(n) = counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&key);
            }
        }
    }
}

/// An IPv4 address, or the /64 of an IPv6 one (IPv4-mapped addresses count as IPv4).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Serves one connection until it closes, times out, or shutdown lets it finish.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: Arc<ConnectionLimits>,
    mut stop: watch::Receiver<bool>,
    _slots: (OwnedSemaphorePermit, PeerSlot),
) {
    let activity = Arc::new(Activity::new(&limits));
    let io = TokioIo::new(Watched {
        io: tcp,
        activity: activity.clone(),
    });
    let service = Tracked {
        app,
        activity: activity.clone(),
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // Kept here (see the module docs); hyper's would also end idle connections early.
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let deadline = activity.deadline();
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = sleep_until(deadline) => {
                if let Some(reason) = activity.expired() {
                    tracing::debug!(reason, "connection closed");
                    return;
                }
            }
            _ = activity.wake.notified() => {}
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What a connection is doing, for its timeouts.
enum Phase {
    /// Reading a request head; it must be complete by the instant.
    Head(Instant),
    /// This many requests are being handled or their responses sent.
    Busy(usize),
    /// Between requests; the next must begin by the instant.
    Idle(Instant),
}

struct Activity {
    phase: Mutex<Phase>,
    /// Wakes the connection's watchdog when a deadline moved earlier or appeared.
    wake: Notify,
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Activity {
    fn new(limits: &ConnectionLimits) -> Activity {
        Activity {
            phase: Mutex::new(Phase::Head(Instant::now() + limits.header_timeout)),
            wake: Notify::new(),
            header_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().expect("connection phase")
    }

    /// Bytes arrived: on an idle connection they begin the next request head.
    fn bytes_read(&self) {
        let mut phase = self.lock();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(Instant::now() + self.header_timeout);
            drop(phase);
            self.wake.notify_one();
        }
    }

    /// A request head is complete and the request is being handled.
    fn begin(&self) {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        };
    }

    /// A response has been sent (or abandoned).
    fn end(&self) {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now() + self.idle_timeout),
        };
        drop(phase);
        self.wake.notify_one();
    }

    fn deadline(&self) -> Option<Instant> {
        match *self.lock() {
            Phase::Head(d) | Phase::Idle(d) => Some(d),
            Phase::Busy(_) => None,
        }
    }

    /// The timeout that has passed, if any.
    fn expired(&self) -> Option<&'static str> {
        let now = Instant::now();
        match *self.lock() {
            Phase::Head(d) if d <= now => Some("header_timeout"),
            Phase::Idle(d) if d <= now => Some("idle_timeout"),
            _ => None,
        }
    }
}

/// The socket, reporting bytes read to the connection's [`Activity`].
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The router as a hyper service that marks the connection busy from each request head to
/// the end of its response body.
struct Tracked {
    app: Router,
    activity: Arc<Activity>,
}

/// Marks a request finished when dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.activity.begin();
        let busy = Busy(self.activity.clone());
        let mut app = self.app.clone();
        Box::pin(async move {
            use tower_service::Service;
            futures_util::future::poll_fn(|cx| {
                <Router as Service<Request<Incoming>>>::poll_ready(&mut app, cx)
            })
            .await?;
            let response = app.call(req).await?;
            Ok(response.map(|body| TrackedBody { body, _busy: busy }))
        })
    }
}

/// A response body that keeps its request counted as busy until it is done.
struct TrackedBody {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_keyed_by_ipv4_address_or_ipv6_64() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(peer_key(v4), v4);
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(peer_key(mapped), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(peer_key(a), peer_key(b));
        assert_ne!(peer_key(a), peer_key("2001:db8:1:3::1".parse().unwrap()));
    }

    #[test]
    fn a_peer_over_its_cap_is_refused_until_a_connection_ends() {
        let peers = Arc::new(PeerCounts::default());
        let p: SocketAddr = "192.0.2.7:1000".parse().unwrap();
        let q: SocketAddr = "192.0.2.8:1000".parse().unwrap();
        let first = peers.enter(&p, 2).unwrap();
        let _second = peers.enter(&p, 2).unwrap();
        assert!(peers.enter(&p, 2).is_none());
        assert!(peers.enter(&q, 2).is_some());
        drop(first);
        assert!(peers.enter(&p, 2).is_some());
        assert!(peers.enter(&p, 0).is_some(), "0 turns the cap off");
    }
}
