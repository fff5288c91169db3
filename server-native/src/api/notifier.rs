//! The change notifier every event stream listens to (see [`super::events`] for the stream
//! itself).
//!
//! The capture worker sends an empty `NOTIFY synchro_effects` in every materialization
//! transaction that wrote effects; [`Notifier::listen`] keeps one `LISTEN` session and bumps
//! a counter. One dispatcher per server then asks the database, once, which scopes have
//! effects since its last answer (`synchro_changed_scopes_since`) and hands that set to every
//! stream, which intersects it with its client's assigned scopes in memory: a notification
//! costs one query per server plus one per client it concerns, not one per connected client.
//! The dispatcher's own fallback tick covers notifications lost while the listener
//! reconnects.
//!
//! What can change the manifest connect serves sends `NOTIFY synchro_schema` in its
//! transaction: a publish, and the capture commits that activate a reconfiguration, finish a
//! table's bootstrap or make a staged membership rule live. On each, one task per server
//! (the served-schema watch) reads the served lineage once and publishes the current
//! manifest's reference only when it differs from the last one seen.
//!
//! The notifier also counts the open streams, in all and per (user, client ID), for their
//! caps, and carries the server's stop signal to every stream.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use synchro_protocol::manifest::SchemaRef;

use super::AppState;

/// How often the dispatcher asks without a notification (covers notifications lost while
/// the listener reconnects).
const FALLBACK_TICK: Duration = Duration::from_secs(5);

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
pub(super) struct Update {
    pub(super) from: i64,
    pub(super) to: i64,
    pub(super) scopes: HashSet<String>,
}

/// Open streams, in all, per user and per (user, client ID).
#[derive(Default)]
struct OpenStreams {
    total: usize,
    per_user: HashMap<String, usize>,
    per_client: HashMap<(String, String), usize>,
}

/// The caps [`Notifier::open_stream`] holds a new stream to.
pub(super) struct StreamCaps {
    pub total: usize,
    pub per_user: usize,
    pub per_client: usize,
}

/// One open stream, counted until dropped.
pub(super) struct StreamSlot {
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
        if let Some(n) = open.per_user.get_mut(&self.key.0) {
            *n -= 1;
            if *n == 0 {
                open.per_user.remove(&self.key.0);
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

    /// Set to `true` once [`Notifier::stop`] was called.
    pub(super) fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// The dispatcher's answers, starting it with the first stream.
    pub(super) async fn updates(&self, state: &Arc<AppState>) -> watch::Receiver<Arc<Update>> {
        self.updates
            .get_or_init(|| async {
                let (tx, rx) = watch::channel(Arc::new(Update {
                    from: i64::MAX,
                    to: i64::MAX,
                    scopes: HashSet::new(),
                }));
                tokio::spawn(dispatch(state.clone(), self.subscribe(), tx));
                rx
            })
            .await
            .clone()
    }

    /// The served current manifest, starting its watch with the first stream.
    pub(super) async fn served(&self, state: &Arc<AppState>) -> watch::Receiver<Option<SchemaRef>> {
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

    pub(super) fn open_streams(&self) -> usize {
        self.streams.lock().expect("open streams").total
    }

    /// A slot for one more stream of (user, client), or `None` over any of the caps.
    pub(super) fn open_stream(
        &self,
        user_id: &str,
        client_id: &str,
        caps: &StreamCaps,
    ) -> Option<StreamSlot> {
        let mut open = self.streams.lock().expect("open streams");
        let key = (user_id.to_owned(), client_id.to_owned());
        let of_client = open.per_client.get(&key).copied().unwrap_or(0);
        let of_user = open.per_user.get(user_id).copied().unwrap_or(0);
        if open.total >= caps.total || of_user >= caps.per_user || of_client >= caps.per_client {
            return None;
        }
        open.total += 1;
        open.per_user.insert(key.0.clone(), of_user + 1);
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
    let target = crate::pgconn::parse(url)?;
    let (messages, mut received) = tokio::sync::mpsc::unbounded_channel();
    let (client, connection) = crate::pgconn::open(&target, Some(messages))
        .await
        .map_err(|e| anyhow::anyhow!("{}", crate::install::describe_for_log(&e)))?;
    let (ended_tx, mut ended_rx) = tokio::sync::oneshot::channel::<()>();
    let bump_tx = tx.clone();
    let schema_tx = schema.clone();
    let pump = tokio::spawn(async move {
        while let Some(m) = received.recv().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let to = if n.channel() == "synchro_schema" {
                    &schema_tx
                } else {
                    &bump_tx
                };
                to.send_modify(|n| *n = n.wrapping_add(1))
            }
        }
        // The sender went with the connection's task: the session ended.
        let _ = connection.await;
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
    state
        .caches
        .lineage
        .serving_lineage(&*db)
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
