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
    /// A connection as the capture worker's login, which push uses to evaluate a written
    /// row's scopes with the membership function as its owner (in a transaction that is
    /// always rolled back). Without one, push answers 503 `push_unavailable`.
    pub membership_db: Option<tokio::sync::Mutex<Client>>,
}

/// A fixed set of connections handed out one transaction at a time: a free one if any,
/// otherwise the next in turn once it is released.
pub struct SnapshotPool {
    clients: Vec<tokio::sync::Mutex<Client>>,
    next: std::sync::atomic::AtomicUsize,
}

impl SnapshotPool {
    /// A pool of these connections (at least one).
    pub fn new(clients: Vec<Client>) -> SnapshotPool {
        assert!(!clients.is_empty(), "a snapshot pool needs a connection");
        SnapshotPool {
            clients: clients.into_iter().map(tokio::sync::Mutex::new).collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Exclusive use of one connection.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Client> {
        for c in &self.clients {
            if let Ok(guard) = c.try_lock() {
                return guard;
            }
        }
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.clients.len();
        self.clients[i].lock().await
    }
}
