//! What every handler shares: the settings, the database connections and the keys.

use std::sync::Arc;

use tokio_postgres::Client;

use super::ApiError;
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
    pub push_limits: synchro_protocol::wire::gate::PushLimits,
    /// Connection caps and the header and idle timeouts (see [`crate::serve`]).
    pub connections: ConnectionLimits,
    /// The whole request body must arrive within this once the head is in; otherwise 503
    /// `temporary_unavailable`, reason `request_body_timeout`, and the connection closes.
    pub body_timeout: std::time::Duration,
    /// The body bound of a request without a valid bearer token (at most `body_timeout`):
    /// such a request is answered 401 once it passed, so an unauthenticated slow body holds
    /// a connection no longer than this.
    pub unauthenticated_body_timeout: std::time::Duration,
    /// A pull page holds changes until their rows reach this many bytes (at least one
    /// change, at most the request's limit): a page of large rows is cut short, so a
    /// response and the memory it takes follow this bound rather than the rows' size.
    pub max_page_bytes: usize,
    /// Open `POST /sync/events` streams at most, server-wide.
    pub max_event_streams: usize,
    /// Open `POST /sync/events` streams per user (all of their client IDs) at most.
    pub max_event_streams_per_user: usize,
    /// Open `POST /sync/events` streams per (user, client ID) at most.
    pub max_event_streams_per_client: usize,
    /// How often an events stream reads its client's state itself (generation, current
    /// assignment) at most, whatever the notifications say; a random part of as much again
    /// is added per stream. Bounds how long a stream of a replaced generation runs on.
    pub events_recheck: std::time::Duration,
    /// Client records per user at most: a new client ID at the cap replaces the user's least
    /// recently active client (which must connect again).
    pub max_clients_per_user: i32,
    /// Rebuild sessions in progress per (user, client ID) at most; a new rebuild of a scope
    /// replaces the client's earlier session of that scope.
    pub max_rebuild_sessions_per_client: u32,
    /// Bytes of stored records of a client's rebuild sessions in progress at most, besides
    /// its first session (one scope larger than this is still rebuilt, alone).
    pub max_rebuild_bytes_per_client: u64,
    /// `Retry-After` (seconds) of every 503 refused for load.
    pub retry_after_seconds: u64,
    /// How long a push waits for a free database connection (of the snapshot pool, then of
    /// the membership pool) before it is refused: 503 `temporary_unavailable`, reason
    /// `push_busy`, with `Retry-After`.
    pub push_pool_wait: std::time::Duration,
    /// Where `GET /seeds/{name}` serves seed artifacts from (none: 404).
    pub seed_dir: Option<std::path::PathBuf>,
    /// Seeds served without a bearer token.
    pub public_seeds: bool,
    /// Origins a browser app may call the server from (`--cors-origin`; none: no CORS
    /// headers, the app and the server share one origin).
    pub cors_origins: super::cors::CorsOrigins,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 1_048_576,
            min_client_version: None,
            push_limits: synchro_protocol::wire::gate::PushLimits::default(),
            connections: ConnectionLimits::default(),
            body_timeout: std::time::Duration::from_secs(30),
            unauthenticated_body_timeout: std::time::Duration::from_secs(2),
            max_page_bytes: 4 * 1024 * 1024,
            max_event_streams: 2048,
            max_event_streams_per_user: 16,
            max_event_streams_per_client: 4,
            events_recheck: std::time::Duration::from_secs(30),
            max_clients_per_user: 64,
            max_rebuild_sessions_per_client: 8,
            max_rebuild_bytes_per_client: 256 * 1024 * 1024,
            retry_after_seconds: 2,
            push_pool_wait: std::time::Duration::from_secs(5),
            seed_dir: None,
            public_seeds: false,
            cors_origins: super::cors::CorsOrigins::default(),
        }
    }
}

/// Connection-level limits of `serve` (enforced by [`crate::serve`]).
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Open connections at most (lowered at start when the open-file limit is smaller).
    pub max_connections: usize,
    /// Open connections per peer address (IPv6: per /64) at most; 0 turns the cap off
    /// (behind a reverse proxy every connection comes from the proxy).
    pub max_connections_per_peer: usize,
    /// The request head must arrive within this, from the accept or its first byte.
    pub header_timeout: std::time::Duration,
    /// After a response, the next request must begin within this.
    pub idle_timeout: std::time::Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            max_connections_per_peer: 256,
            header_timeout: std::time::Duration::from_secs(10),
            idle_timeout: std::time::Duration::from_secs(60),
        }
    }
}

/// Shared state of the HTTP handlers.
pub struct AppState {
    /// Adapter connection (member of synchro_adapter only).
    pub db: SharedConnection,
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
    pub events: super::Notifier,
    /// Adapter connections on which push evaluates written rows' scopes, each membership
    /// function as its owner through its evaluator (in transactions that are always rolled
    /// back). Without them, push answers 503 `push_unavailable`.
    pub membership_db: Option<ConnectionPool>,
    /// What this server keeps in memory between requests.
    pub caches: Caches,
    /// Permits to build a rebuild session (`rebuild::BUILDS`): each build holds its scope's
    /// rows in memory.
    pub rebuild_builds: RebuildBuilds,
}

/// The permits of [`AppState::rebuild_builds`].
pub struct RebuildBuilds(tokio::sync::Semaphore);

impl Default for RebuildBuilds {
    fn default() -> Self {
        RebuildBuilds(tokio::sync::Semaphore::new(super::rebuild::BUILDS))
    }
}

impl RebuildBuilds {
    /// Waits for a permit.
    pub(crate) async fn acquire(
        &self,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, tokio::sync::AcquireError> {
        self.0.acquire().await
    }
}

/// A server's in-memory caches: each answers only for the very inputs it was filled from, so
/// a wrong or stale entry cannot be served (see each one's docs).
#[derive(Default)]
pub struct Caches {
    /// Row digests, scope digests and scope indexes for terminal checksums.
    pub digests: crate::digest_cache::DigestCache,
    /// The validated manifest history.
    pub lineage: crate::publish::LineageCache,
}

/// How long a broken connection's replacement may take to connect before the request is
/// answered 503 (PostgreSQL down or restarting).
const RECONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// After a connect failed, requests meeting a closed connection are answered 503 at once
/// for this long, without trying again (while PostgreSQL is down, requests do not queue up
/// behind one connect timeout each).
const RETRY_AFTER_FAILED_CONNECT: std::time::Duration = std::time::Duration::from_secs(1);

/// Connecting again, shared by the connections of one pool or one [`SharedConnection`].
struct Reconnect {
    /// Where to connect again; `None`: never replaced.
    url: Option<String>,
    /// When a connect last failed.
    failed_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Reconnect {
    fn to(url: Option<String>) -> Reconnect {
        Reconnect {
            url,
            failed_at: std::sync::Mutex::new(None),
        }
    }

    /// A new connection for one that was found closed; `None` (logged, without the URL)
    /// when PostgreSQL cannot be reached now, or a connect failed within
    /// [`RETRY_AFTER_FAILED_CONNECT`]. `None` too when this never reconnects.
    async fn connect(&self) -> Option<Client> {
        let url = self.url.as_deref()?;
        let recent = |at: &Option<std::time::Instant>| {
            at.is_some_and(|t| t.elapsed() < RETRY_AFTER_FAILED_CONNECT)
        };
        if recent(&self.failed_at.lock().expect("reconnect")) {
            return None;
        }
        match tokio::time::timeout(RECONNECT_TIMEOUT, crate::connect_db(url)).await {
            Ok(Ok(c)) => {
                *self.failed_at.lock().expect("reconnect") = None;
                tracing::warn!("database connection replaced (the previous one was closed)");
                Some(c)
            }
            failed => {
                *self.failed_at.lock().expect("reconnect") = Some(std::time::Instant::now());
                let why = if failed.is_ok() {
                    "refused"
                } else {
                    "timed out"
                };
                tracing::warn!(
                    why,
                    "database connection closed and connecting again failed"
                );
                None
            }
        }
    }
}

/// One connection shared by concurrent requests, replaced when found closed (PostgreSQL
/// restarted, the session was terminated, the network dropped it): the next request
/// connects again, and requests meanwhile wait for that one connect. A request that meets
/// the closed connection itself is answered 503 (retryable).
pub struct SharedConnection {
    reconnect: Reconnect,
    current: std::sync::Mutex<Arc<Client>>,
    connecting: tokio::sync::Mutex<()>,
}

impl SharedConnection {
    /// `client`, replaced by a new connection to `url` when found closed.
    pub fn new(url: impl Into<String>, client: Client) -> SharedConnection {
        SharedConnection {
            reconnect: Reconnect::to(Some(url.into())),
            ..SharedConnection::from(client)
        }
    }

    /// The connection, connected again first if it was found closed; 503 when PostgreSQL
    /// cannot be reached.
    pub async fn get(&self) -> Result<Arc<Client>, ApiError> {
        let now = self.current.lock().expect("connection").clone();
        if !now.is_closed() || self.reconnect.url.is_none() {
            return Ok(now);
        }
        let _one = self.connecting.lock().await;
        let now = self.current.lock().expect("connection").clone();
        if !now.is_closed() {
            return Ok(now); // replaced while this request waited
        }
        let fresh = Arc::new(
            self.reconnect
                .connect()
                .await
                .ok_or_else(ApiError::unavailable)?,
        );
        *self.current.lock().expect("connection") = fresh.clone();
        Ok(fresh)
    }
}

impl From<Client> for SharedConnection {
    /// A connection that is never replaced (a state built by hand in tests).
    fn from(client: Client) -> SharedConnection {
        SharedConnection {
            reconnect: Reconnect::to(None),
            current: std::sync::Mutex::new(Arc::new(client)),
            connecting: tokio::sync::Mutex::new(()),
        }
    }
}

/// A fixed set of connections handed out one transaction at a time: a free one at once,
/// otherwise the first one released (waiters are served in arrival order). A connection
/// found closed when it is handed out is replaced first (see [`SharedConnection`]).
pub struct ConnectionPool {
    reconnect: Reconnect,
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
    /// A pool of these connections (at least one), never replaced.
    pub fn new(clients: Vec<Client>) -> ConnectionPool {
        assert!(!clients.is_empty(), "a connection pool needs a connection");
        ConnectionPool {
            reconnect: Reconnect::to(None),
            permits: tokio::sync::Semaphore::new(clients.len()),
            free: std::sync::Mutex::new(clients),
        }
    }

    /// A pool of these connections to `url`, each replaced when found closed.
    pub fn reconnecting(url: impl Into<String>, clients: Vec<Client>) -> ConnectionPool {
        ConnectionPool {
            reconnect: Reconnect::to(Some(url.into())),
            ..ConnectionPool::new(clients)
        }
    }

    /// Exclusive use of one connection, waiting as long as it takes for one to be free;
    /// 503 when it was closed and PostgreSQL cannot be reached.
    pub async fn lock(&self) -> Result<Pooled<'_>, ApiError> {
        let permit = self
            .permits
            .acquire()
            .await
            .expect("the pool is never closed");
        self.take(permit).await
    }

    /// Exclusive use of one connection if one is free within `wait`; `Ok(None)` when every
    /// connection stayed busy that long.
    pub async fn lock_within(
        &self,
        wait: std::time::Duration,
    ) -> Result<Option<Pooled<'_>>, ApiError> {
        let Ok(permit) = tokio::time::timeout(wait, self.permits.acquire()).await else {
            return Ok(None);
        };
        let permit = permit.expect("the pool is never closed");
        self.take(permit).await.map(Some)
    }

    async fn take<'a>(
        &'a self,
        permit: tokio::sync::SemaphorePermit<'a>,
    ) -> Result<Pooled<'a>, ApiError> {
        // A permit stands for exactly one free connection.
        let client = self.free.lock().expect("pool").pop();
        let mut pooled = Pooled {
            client: Some(client.expect("a permit has a connection")),
            pool: self,
            _permit: permit,
        };
        if self.reconnect.url.is_some() && pooled.is_closed() {
            // On failure the closed one goes back (with the permit), to be tried again.
            let fresh = self.reconnect.connect().await;
            pooled.client = Some(fresh.ok_or_else(ApiError::unavailable)?);
        }
        Ok(pooled)
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
