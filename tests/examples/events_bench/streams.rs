//! Many open `POST /sync/events` streams from one process: each stream is one HTTP/1.1
//! connection (hyper's client connection, no pool) whose body is decoded with the protocol
//! crate's `SseDecoder`. Streams are futures held by a few shard tasks in
//! `FuturesUnordered` sets, so 10,000 of them cost 10,000 sockets and futures, not 10,000
//! tasks. Idle streams only count what they receive; a watched stream reports the instant
//! of each `changed` event naming its scope.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use synchro_protocol::wire::{SseDecoder, StreamEvent};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// What a stream does with its events.
pub enum Role {
    /// Counts them (a client whose scopes the commits do not touch).
    Idle,
    /// Sends `(watcher, instant)` for every `changed` event that names `scope`.
    Watched {
        watcher: usize,
        scope: String,
        events: mpsc::UnboundedSender<(usize, Instant)>,
    },
}

/// One stream to open.
pub struct Spec {
    pub addr: SocketAddr,
    pub token: String,
    /// The JSON request body (`client_id`, `client_generation`).
    pub body: String,
    pub role: Role,
    /// Held until the stream is open (`ready`) or has failed: bounds the opens in flight.
    pub permit: OwnedSemaphorePermit,
}

/// What every stream of a pool has seen.
#[derive(Default)]
pub struct Counters {
    /// Streams that received `ready`.
    pub opened: AtomicUsize,
    /// Streams that failed before `ready`, by reason (no ids: status, error kind).
    pub failed: Mutex<BTreeMap<String, usize>>,
    /// Open streams that ended since (`end` event, end of body, connection error).
    pub ended: AtomicUsize,
    /// `changed` events received by idle streams.
    pub idle_changed: AtomicU64,
    /// Idle streams that received at least one `changed` event.
    pub idle_woken: AtomicUsize,
}

impl Counters {
    /// Streams that opened or failed so far.
    pub fn settled(&self) -> usize {
        self.opened.load(Ordering::Relaxed) + self.failed.lock().unwrap().values().sum::<usize>()
    }

    fn fail(&self, reason: String) {
        *self.failed.lock().unwrap().entry(reason).or_default() += 1;
    }
}

/// Shard tasks holding the streams; dropping the pool closes every stream.
pub struct Pool {
    shards: Vec<mpsc::UnboundedSender<Spec>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    next: usize,
    pub counters: Arc<Counters>,
}

impl Pool {
    /// A pool of `shards` tasks.
    pub fn new(shards: usize) -> Pool {
        let counters = Arc::new(Counters::default());
        let (mut senders, mut tasks) = (Vec::new(), Vec::new());
        for _ in 0..shards {
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            tasks.push(tokio::spawn(shard(rx, counters.clone())));
        }
        Pool {
            shards: senders,
            tasks,
            next: 0,
            counters,
        }
    }

    /// Opens a stream (in the background, round robin over the shards).
    pub fn open(&mut self, spec: Spec) {
        let i = self.next % self.shards.len();
        self.next += 1;
        let _ = self.shards[i].send(spec);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn shard(mut new: mpsc::UnboundedReceiver<Spec>, counters: Arc<Counters>) {
    let mut running = FuturesUnordered::new();
    let mut accepting = true;
    loop {
        tokio::select! {
            spec = new.recv(), if accepting => match spec {
                Some(spec) => running.push(run(spec, counters.clone())),
                None => accepting = false,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
            else => return,
        }
    }
}

/// One stream, from the TCP connect until it ends.
async fn run(spec: Spec, counters: Arc<Counters>) {
    let Spec {
        addr,
        token,
        body,
        role,
        permit,
    } = spec;
    let tcp = match tokio::net::TcpStream::connect(addr).await {
        Ok(tcp) => tcp,
        Err(e) => return counters.fail(format!("TCP connect: {:?}", e.kind())),
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp)).await {
            Ok(v) => v,
            Err(_) => return counters.fail("HTTP handshake".into()),
        };
    let request = hyper::Request::post("/sync/events")
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    let counters_ = counters.clone();
    let stream = async move {
        let counters = counters_;
        let mut permit = Some(permit);
        let response = match sender.send_request(request).await {
            Ok(r) => r,
            Err(_) => return counters.fail("HTTP request".into()),
        };
        let status = response.status();
        let mut body = response.into_body();
        if status != 200 {
            let text = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let reason = serde_json::from_slice::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["reason"].as_str().map(str::to_owned))
                .map(|r| format!(" {r}"))
                .unwrap_or_default();
            return counters.fail(format!("HTTP {}{reason}", status.as_u16()));
        }
        let mut decoder = SseDecoder::new();
        let mut woken = false;
        'read: while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            decoder.push(&data);
            while let Some(event) = decoder.next_event() {
                let at = Instant::now();
                match event {
                    Ok(StreamEvent::Ready) => {
                        if permit.take().is_some() {
                            counters.opened.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(StreamEvent::Changed { scopes }) => match &role {
                        Role::Idle => {
                            counters.idle_changed.fetch_add(1, Ordering::Relaxed);
                            if !std::mem::replace(&mut woken, true) {
                                counters.idle_woken.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Role::Watched {
                            watcher,
                            scope,
                            events,
                        } => {
                            if scopes.contains(scope) {
                                let _ = events.send((*watcher, at));
                            }
                        }
                    },
                    Ok(StreamEvent::End { .. }) | Err(_) => break 'read,
                }
            }
        }
        match permit {
            Some(_) => counters.fail("ended before ready".into()),
            None => {
                counters.ended.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Dropping the sender lets the connection future finish.
    };
    let _ = futures_util::future::join(connection, stream).await;
}
