//! The fault proxy: a loopback TCP proxy between the clients and the server that reads each
//! HTTP/1.1 exchange whole (a `Content-Length` or chunked body) and, while faults are on,
//! does one of these to it, chosen by its own seeded stream:
//!
//! - `latency`: holds the request (or the response) back 50..1000 ms, then passes it;
//! - `drop`: closes the client's connection before the request is forwarded (the server
//!   never sees it);
//! - `truncate`: forwards the request, reads the whole response, sends the client a part of
//!   it (possibly nothing) and closes (the server acted; the client lost the answer);
//! - `reset`: forwards the request and closes the client's connection with `SO_LINGER` 0, so
//!   the client gets a TCP RST, before or after the server answered.
//!
//! Rates are bounded (about one request in six fails) so rounds still complete. An upstream
//! that cannot be reached (the server is down) closes the client's connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::rng::Rng;

/// What the proxy did, and the switch for its faults.
#[derive(Default)]
pub struct ProxyStats {
    /// Faults are injected while this is true.
    pub enabled: AtomicBool,
    /// Requests read from clients.
    pub requests: AtomicU64,
    /// Requests or responses held back.
    pub latency: AtomicU64,
    /// Requests closed before forwarding.
    pub dropped: AtomicU64,
    /// Responses cut short.
    pub truncated: AtomicU64,
    /// Connections reset.
    pub reset: AtomicU64,
    /// Requests met by an unreachable or vanished server.
    pub upstream_down: AtomicU64,
}

#[derive(Clone, Copy)]
enum Fault {
    Pass,
    LatencyBefore(u64),
    LatencyAfter(u64),
    Drop,
    Truncate,
    ResetBefore,
    ResetAfter,
}

/// Starts the proxy on a free loopback port in front of `127.0.0.1:upstream`; returns the
/// port. Runs until the process ends.
pub async fn start(upstream: u16, rng: Rng, stats: Arc<ProxyStats>) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let rng = Arc::new(Mutex::new(rng));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (rng, stats) = (rng.clone(), stats.clone());
            tokio::spawn(async move {
                let _ = relay(client, upstream, rng, stats).await;
            });
        }
    });
    Ok(port)
}

fn choose(rng: &Mutex<Rng>, stats: &ProxyStats) -> Fault {
    if !stats.enabled.load(Ordering::Relaxed) {
        return Fault::Pass;
    }
    let mut r = rng.lock().unwrap();
    let roll = r.range(0, 100);
    let delay = r.range(50, 1000);
    let early = r.chance(50);
    match roll {
        0..=7 if early => Fault::LatencyBefore(delay),
        0..=7 => Fault::LatencyAfter(delay),
        8..=11 => Fault::Drop,
        12..=15 => Fault::Truncate,
        16..=19 if early => Fault::ResetBefore,
        16..=19 => Fault::ResetAfter,
        _ => Fault::Pass,
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Closes `stream` with a TCP RST. (tokio deprecates `set_linger` because a non-zero linger
/// blocks the thread on drop; a zero linger does not block.)
#[allow(deprecated)]
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Relays one client connection's exchanges, each with its own fault.
async fn relay(
    client: TcpStream,
    upstream: u16,
    rng: Arc<Mutex<Rng>>,
    stats: Arc<ProxyStats>,
) -> std::io::Result<()> {
    let mut client = Framed::new(client);
    let mut server: Option<Framed> = None;
    loop {
        let Some(request) = client.message(false).await? else {
            return Ok(());
        };
        count(&stats.requests);
        let fault = choose(&rng, &stats);
        match fault {
            Fault::Drop => {
                count(&stats.dropped);
                return Ok(());
            }
            Fault::LatencyBefore(ms) => {
                count(&stats.latency);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            _ => {}
        }
        if server.is_none() {
            match TcpStream::connect(("127.0.0.1", upstream)).await {
                Ok(s) => server = Some(Framed::new(s)),
                Err(_) => {
                    count(&stats.upstream_down);
                    return Ok(());
                }
            }
        }
        let up = server.as_mut().unwrap();
        if up.stream.write_all(&request).await.is_err() {
            count(&stats.upstream_down);
            return Ok(());
        }
        if let Fault::ResetBefore = fault {
            count(&stats.reset);
            // Give the server the request before the client's side goes.
            tokio::time::sleep(Duration::from_millis(5)).await;
            reset(client.stream);
            return Ok(());
        }
        let response = match up.message(true).await {
            Ok(Some(r)) => r,
            _ => {
                count(&stats.upstream_down);
                return Ok(());
            }
        };
        match fault {
            Fault::Truncate => {
                count(&stats.truncated);
                let cut = rng.lock().unwrap().range(0, response.len() as u64) as usize;
                let _ = client.stream.write_all(&response[..cut]).await;
                return Ok(());
            }
            Fault::ResetAfter => {
                count(&stats.reset);
                reset(client.stream);
                return Ok(());
            }
            Fault::LatencyAfter(ms) => {
                count(&stats.latency);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            _ => {}
        }
        client.stream.write_all(&response).await?;
    }
}

/// A stream with what was read past the last message.
struct Framed {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Framed {
    fn new(stream: TcpStream) -> Framed {
        Framed {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more bytes into the buffer; false at the end of the stream.
    async fn fill(&mut self) -> std::io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// Takes `n` bytes from the front of the buffer, reading as needed.
    async fn take(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Takes bytes up to and including the first `needle`, reading as needed (at most 1 MiB).
    async fn take_through(&mut self, needle: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(i) = self.buf.windows(needle.len()).position(|w| w == needle) {
                return Ok(Some(self.buf.drain(..i + needle.len()).collect()));
            }
            if self.buf.len() > 1 << 20 {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// One whole HTTP/1.1 message (head and body), or none at a clean end of the stream.
    /// A response without a length runs to the end of the stream.
    async fn message(&mut self, response: bool) -> std::io::Result<Option<Vec<u8>>> {
        let Some(mut head) = self.take_through(b"\r\n\r\n").await? else {
            if self.buf.is_empty() {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        };
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let header = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
        };
        if let Some(n) = header("content-length:") {
            let n: usize = n
                .parse()
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
            head.extend(self.take(n).await?);
        } else if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
            loop {
                let line = self
                    .take_through(b"\r\n")
                    .await?
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                let size = String::from_utf8_lossy(&line);
                let size = size.trim().split(';').next().unwrap_or("").to_owned();
                let size = usize::from_str_radix(&size, 16)
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
                head.extend(line);
                if size == 0 {
                    let trailer = self
                        .take_through(b"\r\n")
                        .await?
                        .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                    head.extend(trailer);
                    break;
                }
                head.extend(self.take(size + 2).await?);
            }
        } else if response {
            while self.fill().await? {}
            head.append(&mut self.buf);
        }
        Ok(Some(head))
    }
}
