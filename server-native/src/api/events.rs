//! Change notification: `POST /sync/events` answers with a server-sent-events stream that
//! tells a connected client, without any row data, which of its assigned scopes have new
//! effects, so it pulls right after a commit instead of polling on a timer. Pull itself is
//! unchanged.
//!
//! The capture worker sends an empty `NOTIFY synchro_effects` in every materialization
//! transaction that wrote effects; [`Notifier::listen`] keeps one `LISTEN` session and bumps
//! a counter. One dispatcher per server then asks the database, once, which scopes have
//! effects since its last answer (`synchro_changed_scopes_since`) and hands that set to every
//! stream, which intersects it with its client's assigned scopes in memory: a notification
//! costs one query per server plus one per client it concerns, not one per connected client.
//! That client's own query (`synchro_changed_scopes`, also for a stream that missed an answer
//! and for one whose dispatcher has been silent for 30–60 s) names its scopes, re-reads its
//! assigned scopes and checks its generation. The dispatcher's own fallback tick covers notifications lost while
//! the listener reconnects.
//!
//! What can change the manifest connect serves sends `NOTIFY synchro_schema` in its
//! transaction: a publish, and the capture commits that activate a reconfiguration, finish a
//! table's bootstrap or make a staged membership rule live. On each, one task per server
//! ([`Notifier`]'s served-schema watch) reads the served lineage once; only when its current
//! manifest differs from the last one seen does every stream end with `schema_changed`, each
//! after a random delay below [`schema_spread`] (the larger of 2 s and 1 ms per open stream
//! of this server, at most 30 s, so that the connects that follow do not all arrive at once),
//! and its client connects to learn its schema action (`replace`, `rebuild_local`,
//! `unsupported`) at once instead of at its next round. A stream opened after the change
//! needs no notice: its `ready` makes the client pull, and the pull's 422 makes it connect.
//!
//! Stream events (each `data` is a JSON object):
//! - `ready` `{}`: subscribed; pull once now to cover anything committed before it.
//! - `changed` `{"scopes": [...]}`: these assigned scopes have new effects; pull them.
//! - `end` `{"reason": "client_generation_expired" | "schema_changed" | "lifetime" |
//!   "shutdown"}`: the stream closes; reconnect (after `connect` for an expired generation
//!   or a changed schema). `shutdown`: the server is stopping ([`Notifier::stop`], at
//!   SIGTERM), so its graceful shutdown need not wait for the streams' lifetime.
//!
//! Comment lines (`: keepalive`) are sent when the stream has been quiet for a while.
//!
//! Open streams are capped server-wide (`Config::max_event_streams`) and per (user, client
//! ID) (`Config::max_event_streams_per_client`); over a cap the request is answered 503
//! `temporary_unavailable`, reason `too_many_event_streams`, before any database work. A
//! stream's slot is freed as soon as its client goes away.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, watch};

use synchro_protocol::manifest::SchemaRef;
use synchro_protocol::wire::{EventsRequest, StreamEvent};

use super::{ApiError, AppState};

/// How often the dispatcher asks without a notification (covers notifications lost while
/// the listener reconnects).
const FALLBACK_TICK: Duration = Duration::from_secs(5);
/// How long a stream waits for a dispatcher answer (one comes at least every
/// [`FALLBACK_TICK`] while the database answers) before it runs its own query; each stream
/// adds a random part of as much again, so 10,000 streams never query at once. (A 5 s
/// per-stream tick restarted at every dispatcher answer fired for all of them together:
/// ~N/10 queries/s, ahead of the queries commits needed.)
const DISPATCHER_SILENCE: Duration = Duration::from_secs(30);
/// Quiet time after which a keepalive comment is sent.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// A stream's lifetime; the client reconnects (and re-authenticates) after it.
const LIFETIME: Duration = Duration::from_secs(300);
/// After the served manifest changed, each of `open` streams ends within this (at random):
/// the connects that follow reach this server at about 1,000 per second at most, up to
/// 30,000 streams.
fn schema_spread(open: usize) -> Duration {
    Duration::from_millis((open as u64).clamp(2_000, 30_000))
}

/// Wakes streams when the capture worker commits effects, and counts the open ones.
#[derive(Clone)]
pub struct Notifier {
    tx: Arc<watch::Sender<u64>>,
    /// Bumped by every `NOTIFY synchro_schema`.
    schema: Arc<watch::Sender<u64>>,
    /// The served current manifest, re-read at each schema notification (started with the
    /// first stream).
    served: Arc<tokio::sync::OnceCell<watch::Receiver<Option<SchemaRef>>>>,
    streams: Arc<Mutex<OpenStreams>>,
    updates: Arc<tokio::sync::OnceCell<watch::Receiver<Arc<Update>>>>,
    /// Set once the server stops: every stream ends.
    stopping: Arc<watch::Sender<bool>>,
}

impl Default for Notifier {
    /// A notifier nothing bumps: streams rely on the dispatcher's fallback tick.
    fn default() -> Self {
        Notifier {
            tx: Arc::new(watch::channel(0).0),
            schema: Arc::new(watch::channel(0).0),
            served: Arc::default(),
            streams: Arc::default(),
            updates: Arc::default(),
            stopping: Arc::new(watch::channel(false).0),
        }
    }
}

/// One dispatcher answer: the scopes with effects in `(from, to]`.
#[derive(Debug, Default)]
struct Update {
    from: i64,
    to: i64,
    scopes: std::collections::HashSet<String>,
}

/// Open streams, in all and per (user, client ID).
#[derive(Default)]
struct OpenStreams {
    total: usize,
    per_client: HashMap<(String, String), usize>,
}

/// One open stream, counted until dropped.
struct StreamSlot {
    streams: Arc<Mutex<OpenStreams>>,
    key: (String, String),
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.lock().expect("open streams");
        open.total -= 1;
        if let Some(n) = open.per_client.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.per_client.remove(&self.key);
            }
        }
    }
}

impl Notifier {
    /// A notifier fed by a `LISTEN synchro_effects, synchro_schema` session on `url` (any
    /// login; the channels carry no data). Reconnects forever; every (re)connection also
    /// bumps both (what was committed while it was away is looked at then).
    pub fn listen(url: String) -> Notifier {
        let notifier = Notifier::default();
        let tx = notifier.tx.clone();
        let schema = notifier.schema.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = listen_once(&url, &tx, &schema).await {
                    tracing::warn!(error = %e, "change listener ended; reconnecting");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        notifier
    }

    /// Wakes every stream now.
    pub fn bump(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Ends every open stream (`end` `{"reason":"shutdown"}`) and every later one at once:
    /// the server is stopping.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// The dispatcher's answers, starting it with the first stream.
    async fn updates(&self, state: &Arc<AppState>) -> watch::Receiver<Arc<Update>> {
        self.updates
            .get_or_init(|| async {
                let (tx, rx) = watch::channel(Arc::new(Update {
                    from: i64::MAX,
                    to: i64::MAX,
                    scopes: Default::default(),
                }));
                tokio::spawn(dispatch(state.clone(), self.subscribe(), tx));
                rx
            })
            .await
            .clone()
    }

    /// The served current manifest, starting its watch with the first stream.
    async fn served(&self, state: &Arc<AppState>) -> watch::Receiver<Option<SchemaRef>> {
        self.served
            .get_or_init(|| async {
                let notified = self.schema.subscribe();
                let now = served_schema(state).await;
                let (tx, rx) = watch::channel(now);
                tokio::spawn(watch_served(state.clone(), notified, tx));
                rx
            })
            .await
            .clone()
    }

    fn open_streams(&self) -> usize {
        self.streams.lock().expect("open streams").total
    }

    /// A slot for one more stream of (user, client), or `None` over either cap.
    fn open_stream(
        &self,
        user_id: &str,
        client_id: &str,
        max_total: usize,
        max_per_client: usize,
    ) -> Option<StreamSlot> {
        let mut open = self.streams.lock().expect("open streams");
        let key = (user_id.to_owned(), client_id.to_owned());
        let of_client = open.per_client.get(&key).copied().unwrap_or(0);
        if open.total >= max_total || of_client >= max_per_client {
            return None;
        }
        open.total += 1;
        open.per_client.insert(key.clone(), of_client + 1);
        Some(StreamSlot {
            streams: self.streams.clone(),
            key,
        })
    }
}

async fn listen_once(
    url: &str,
    tx: &watch::Sender<u64>,
    schema: &watch::Sender<u64>,
) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| anyhow::anyhow!("{}", crate::install::describe_for_log(&e)))?;
    let (ended_tx, mut ended_rx) = tokio::sync::oneshot::channel::<()>();
    let bump_tx = tx.clone();
    let schema_tx = schema.clone();
    let pump = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    let to = if n.channel() == "synchro_schema" {
                        &schema_tx
                    } else {
                        &bump_tx
                    };
                    to.send_modify(|n| *n = n.wrapping_add(1))
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = ended_tx.send(());
    });
    client
        .batch_execute("LISTEN synchro_effects; LISTEN synchro_schema")
        .await
        .map_err(|e| anyhow::anyhow!("{}", crate::install::describe_for_log(&e)))?;
    tx.send_modify(|n| *n = n.wrapping_add(1));
    schema.send_modify(|n| *n = n.wrapping_add(1));
    let _ = (&mut ended_rx).await;
    pump.abort();
    anyhow::bail!("listener connection closed")
}

/// The dispatcher: on every notification while streams are open, one query for the scopes
/// with effects since its last answer.
async fn dispatch(
    state: Arc<AppState>,
    mut wake: watch::Receiver<u64>,
    tx: watch::Sender<Arc<Update>>,
) {
    let mut after: Option<i64> = None;
    loop {
        tokio::select! {
            r = wake.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(FALLBACK_TICK) => {}
        }
        if state.events.open_streams() == 0 {
            after = None; // nothing to serve; start afresh with the next stream
            continue;
        }
        let Ok(db) = state.db.get().await else {
            continue; // the database is unavailable: streams fall back to their own ticks
        };
        let Ok(row) = db
            .query_one(
                "SELECT watermark, scopes FROM synchro.synchro_changed_scopes_since($1)",
                &[&after.unwrap_or(i64::MAX)],
            )
            .await
        else {
            continue; // the database is unavailable: streams fall back to their own ticks
        };
        let to: i64 = row.get(0);
        let from = after.unwrap_or(to);
        after = Some(to);
        let scopes = row.get::<_, Vec<String>>(1).into_iter().collect();
        tx.send_replace(Arc::new(Update { from, to, scopes }));
    }
}

/// The served current manifest (`None` when there is none, or the database did not answer).
async fn served_schema(state: &AppState) -> Option<SchemaRef> {
    let db = state.db.get().await.ok()?;
    crate::publish::load_serving_lineage(&*db)
        .await
        .ok()
        .and_then(|l| l.current().map(|m| m.schema_ref()))
}

/// At each schema notification, reads the served manifest and publishes it when it changed.
/// A read the database does not answer is tried again every second.
async fn watch_served(
    state: Arc<AppState>,
    mut notified: watch::Receiver<u64>,
    tx: watch::Sender<Option<SchemaRef>>,
) {
    let mut last = *tx.borrow();
    while notified.changed().await.is_ok() {
        let now = loop {
            match served_schema(&state).await {
                Some(r) => break Some(r),
                None if last.is_none() => break None,
                None => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        if now != last {
            last = now;
            tx.send_replace(now);
        }
    }
}

/// A random duration below `max` (std's per-map random keys: no RNG dependency needed).
fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_millis(r % (max.as_millis() as u64).max(1))
}

fn event(e: &StreamEvent) -> Bytes {
    Bytes::from(e.to_sse())
}

/// The handler body after the shared preamble: checks the members and the client
/// generation, then streams.
pub(crate) async fn events(
    state: Arc<AppState>,
    user_id: String,
    req: EventsRequest,
) -> Result<Response, ApiError> {
    let client_id = req.client_id;
    let generation = req.client_generation as i64;
    let config = &state.config;
    let Some(slot) = state.events.open_stream(
        &user_id,
        &client_id,
        config.max_event_streams,
        config.max_event_streams_per_client,
    ) else {
        return Err(ApiError::overloaded(
            "too_many_event_streams",
            config.retry_after_seconds,
        ));
    };
    let first = changed(&state, &user_id, &client_id, generation, i64::MAX).await?;
    if !first.current {
        let stored = state
            .db
            .get()
            .await?
            .query_opt(
                "SELECT client_generation FROM synchro.synchro_client_state($1, $2)",
                &[&user_id, &client_id],
            )
            .await?
            .map(|r| r.get::<_, i64>(0) as u64);
        return Err(ApiError::generation_expired(stored));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let mut updates = state.events.updates(&state).await;
    updates.mark_unchanged();
    let mut stopping = state.events.stopping.subscribe();
    let mut served = state.events.served(&state).await;
    served.mark_unchanged();
    tokio::spawn(async move {
        let _slot = slot;
        let deadline = tokio::time::Instant::now() + LIFETIME;
        let mut after = first.watermark;
        let mut assigned: std::collections::HashSet<String> = first.assigned.into_iter().collect();
        let mut last_sent = tokio::time::Instant::now();
        let silence = DISPATCHER_SILENCE + jitter(DISPATCHER_SILENCE);
        let mut heard = last_sent;
        // Set when the served manifest changed: the stream ends then.
        let mut schema_end: Option<tokio::time::Instant> = None;
        if tx.send(event(&StreamEvent::Ready)).await.is_err() {
            return;
        }
        loop {
            // The dispatcher's answer when it continues where this stream is; otherwise (a
            // missed answer, a silent dispatcher) this client's own query.
            let shared = tokio::select! {
                r = updates.changed() => {
                    if r.is_err() { break }
                    heard = tokio::time::Instant::now();
                    let u = updates.borrow_and_update().clone();
                    (u.from <= after && u.to != i64::MAX).then_some(u)
                }
                _ = tokio::time::sleep_until(heard + silence) => {
                    heard = tokio::time::Instant::now();
                    None
                }
                _ = tokio::time::sleep_until(last_sent + KEEPALIVE) => {
                    if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        break;
                    }
                    last_sent = tokio::time::Instant::now();
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = tx.send(end("lifetime")).await;
                    break;
                }
                _ = stopped(&mut stopping) => {
                    let _ = tx.send(end("shutdown")).await;
                    break;
                }
                _ = bumped(&mut served), if schema_end.is_none() => {
                    let spread = schema_spread(state.events.open_streams());
                    schema_end = Some(tokio::time::Instant::now() + jitter(spread));
                    continue;
                }
                _ = tokio::time::sleep_until(schema_end.unwrap_or(deadline)), if schema_end.is_some() => {
                    let _ = tx.send(end("schema_changed")).await;
                    break;
                }
                _ = tx.closed() => break, // the client went away
            };
            // A shared answer naming none of the client's scopes costs nothing; one naming
            // some is confirmed by the client's own query (which also checks its generation),
            // so the database work follows the clients a commit concerns.
            let c = match shared {
                Some(u) if u.to <= after => continue, // nothing new for this stream
                Some(u) if !u.scopes.iter().any(|s| assigned.contains(s)) => {
                    after = u.to;
                    continue;
                }
                _ => {
                    let Ok(c) = changed(&state, &user_id, &client_id, generation, after).await
                    else {
                        continue; // the database is unavailable: try again on the next wake
                    };
                    if !c.current {
                        let _ = tx.send(end("client_generation_expired")).await;
                        break;
                    }
                    assigned = c.assigned.iter().cloned().collect();
                    c
                }
            };
            after = c.watermark;
            if !c.scopes.is_empty() {
                if tx
                    .send(event(&StreamEvent::Changed { scopes: c.scopes }))
                    .await
                    .is_err()
                {
                    break; // the client went away
                }
                last_sent = tokio::time::Instant::now();
            }
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    tracing::info!(status = 200, "events stream opened");
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    Ok((StatusCode::OK, headers, body).into_response())
}

/// Completes at the next change of `rx`.
async fn bumped<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await; // no notifier left to bump it
    }
}

/// Completes once [`Notifier::stop`] was called.
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await; // no notifier left to stop us
    }
}

fn end(reason: &str) -> Bytes {
    event(&StreamEvent::End {
        reason: reason.to_owned(),
    })
}

struct Changed {
    watermark: i64,
    scopes: Vec<String>,
    current: bool,
    /// The client's assigned scopes.
    assigned: Vec<String>,
}

async fn changed(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    generation: i64,
    after: i64,
) -> Result<Changed, ApiError> {
    let r = state
        .db
        .get()
        .await?
        .query_one(
            "SELECT watermark, scopes, current_generation, assigned FROM synchro.synchro_changed_scopes($1, $2, $3, $4)",
            &[&user_id, &client_id, &generation, &after],
        )
        .await
        ?;
    Ok(Changed {
        watermark: r.get(0),
        scopes: r.get(1),
        current: r.get(2),
        assigned: r.get(3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_spread_grows_with_the_open_streams_within_its_bounds() {
        assert_eq!(schema_spread(0), Duration::from_secs(2));
        assert_eq!(schema_spread(2_000), Duration::from_secs(2));
        assert_eq!(schema_spread(10_000), Duration::from_secs(10));
        assert_eq!(schema_spread(1_000_000), Duration::from_secs(30));
    }
}
