//! What every handler shares: the settings, the database connections and the keys.

use tokio_postgres::Client;

use crate::auth::Authenticator;
use synchro_protocol::token::Keyring;

/// Server settings.
#[derive(Clone)]
pub struct Config {
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Minimum client runtime (SemVer); clients below it get 426.
    pub min_client_version: Option<String>,
    /// Push bounds (each violation is 400 before any work).
    pub push_limits: super::push::PushLimits,
    /// Connection caps and the header and idle timeouts (see [`crate::serve`]).
    pub connections: crate::serve::ConnectionLimits,
    /// The whole request body must arrive within this once the head is in; otherwise 503
    /// `temporary_unavailable`, reason `request_body_timeout`, and the connection closes.
    pub body_timeout: std::time::Duration,
    /// Open `POST /sync/events` streams at most, server-wide.
    pub max_event_streams: usize,
    /// Open `POST /sync/events` streams per (user, client ID) at most.
    pub max_event_streams_per_client: usize,
    /// Rebuild sessions in progress per (user, client ID) at most; a new rebuild of a scope
    /// replaces the client's earlier session of that scope.
    pub max_rebuild_sessions_per_client: u32,
    /// `Retry-After` (seconds) of every 503 refused for load.
    pub retry_after_seconds: u64,
    /// How long a push waits for a free database connection (of the snapshot pool, then of
    /// the membership pool) before it is refused: 503 `temporary_unavailable`, reason
    /// `push_busy`, with `Retry-After`.
    pub push_pool_wait: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 1_048_576,
            min_client_version: None,
            push_limits: super::push::PushLimits::default(),
            connections: crate::serve::ConnectionLimits::default(),
            body_timeout: std::time::Duration::from_secs(30),
            max_event_streams: 2048,
            max_event_streams_per_client: 4,
            max_rebuild_sessions_per_client: 8,
            retry_after_seconds: 2,
            push_pool_wait: std::time::Duration::from_secs(5),
        }
    }
}

/// Shared state of the HTTP handlers.
pub struct AppState {
    /// Adapter connection (member of synchro_adapter only).
    pub db: Client,
    /// Connection as the owner of the registered assignment function, which evaluates it
    /// with its owner's privileges and never synchro_owner's (spec 003). Without one, a
    /// registered function makes connect fail closed.
    pub assignment_db: Option<Client>,
    /// Adapter connections for pull's and rebuild's read-only REPEATABLE READ snapshots
    /// (a transaction needs exclusive use of its connection).
    pub snapshot_db: SnapshotPool,
    /// Bearer verification.
    pub auth: Authenticator,
    /// Keys for scope cursors.
    pub cursor_keys: Keyring,
    /// Settings.
    pub config: Config,
    /// Wakes change-notification streams (`POST /sync/events`).
    pub events: super::events::Notifier,
    /// Connections as the capture worker's login, which push uses to evaluate written
    /// rows' scopes with the membership function as its owner (in transactions that are
    /// always rolled back). Without them, push answers 503 `push_unavailable`.
    pub membership_db: Option<ConnectionPool>,
}

/// A fixed set of connections handed out one transaction at a time: a free one at once,
/// otherwise the first one released (waiters are served in arrival order).
pub struct ConnectionPool {
    free: std::sync::Mutex<Vec<Client>>,
    permits: tokio::sync::Semaphore,
}

/// Pull's and rebuild's snapshot connections (the same pool type as push's).
pub type SnapshotPool = ConnectionPool;

/// Exclusive use of one pooled connection; it returns to the pool when dropped.
pub struct Pooled<'a> {
    client: Option<Client>,
    pool: &'a ConnectionPool,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl ConnectionPool {
    /// A pool of these connections (at least one).
    pub fn new(clients: Vec<Client>) -> ConnectionPool {
        assert!(!clients.is_empty(), "a connection pool needs a connection");
        ConnectionPool {
            permits: tokio::sync::Semaphore::new(clients.len()),
            free: std::sync::Mutex::new(clients),
        }
    }

    /// Exclusive use of one connection, waiting as long as it takes.
    pub async fn lock(&self) -> Pooled<'_> {
        let permit = self
            .permits
            .acquire()
            .await
            .expect("the pool is never closed");
        self.take(permit)
    }

    /// Exclusive use of one connection if one is free within `wait`; `None` when every
    /// connection stayed busy that long.
    pub async fn lock_within(&self, wait: std::time::Duration) -> Option<Pooled<'_>> {
        let permit = tokio::time::timeout(wait, self.permits.acquire())
            .await
            .ok()?
            .expect("the pool is never closed");
        Some(self.take(permit))
    }

    fn take<'a>(&'a self, permit: tokio::sync::SemaphorePermit<'a>) -> Pooled<'a> {
        // A permit stands for exactly one free connection.
        let client = self.free.lock().expect("pool").pop();
        Pooled {
            client: Some(client.expect("a permit has a connection")),
            pool: self,
            _permit: permit,
        }
    }
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("held until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        // Back before the permit is released (fields drop after this body).
        if let Some(c) = self.client.take() {
            self.pool.free.lock().expect("pool").push(c);
        }
    }
}
