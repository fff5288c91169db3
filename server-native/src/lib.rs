//! # synchro-server
//!
//! The native server: installs the fixed `synchro` schema and roles into PostgreSQL,
//! registers application relations, publishes immutable schema manifests, and serves the
//! sync HTTP API. Pure protocol decisions (classification, lineage, dispatch) come from
//! `synchro-protocol`; this crate adds the database and the network.
//!
//! | module | owns |
//! |---|---|
//! | [`pg_harness`] | throwaway PostgreSQL clusters for tests and `dev` |
//! | [`install`] | roles, the install script and upgrades (`sql/`), the ledger |
//! | [`registry`] | relation registration |
//! | [`publish`] | manifest publication and history |
//! | [`auth`] | bearer JWT (HS256) |
//! | [`capture`] | logical-decoding capture, bootstrap and membership |
//! | [`api`] | the HTTP API: one file per endpoint, the shared preamble and gates, the error type |
//! | [`serve`] | the accept loop: connection caps, header and idle timeouts, shutdown |
//! | [`retention`] | client expiry and scope-local compaction |
//! | [`cli`] | the `synchro-server` command line |
//! | [`probe`] | `synchro-server probe`: the container's health check on `/ready` |
//! | [`dev`] | the `dev` command's provisioning |
//! | [`logging`] | log filtering that keeps parameters out of logs |
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod capture;
pub mod cli;
pub mod codegen;
pub mod dev;
pub mod digest_cache;
pub mod install;
pub mod logging;
pub mod pg_harness;
pub mod pgconn;
pub mod preflight;
pub mod probe;
pub mod publish;
pub mod registry;
pub mod retention;
pub mod seed;
pub mod serve;

/// The `application_name` of every session [`connect_db`] opens: the command (`synchro-server
/// serve`, `synchro-server capture`, ...), set once by the command line.
pub static APPLICATION_NAME: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// The tasks driving the sessions [`connect_db`] opened (finished ones are pruned as new ones
/// are added).
static CONNECTIONS: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

/// Waits (at most `limit`) for every session whose client was dropped to close with a
/// Terminate message: a process that exits with a session open leaves "could not receive
/// data from client: Connection reset by peer" in the PostgreSQL log. The command line calls
/// it before it exits.
pub async fn close_connections(limit: std::time::Duration) {
    let tasks: Vec<_> = std::mem::take(&mut *CONNECTIONS.lock().expect("connections"));
    let _ = tokio::time::timeout(limit, futures_util::future::join_all(tasks)).await;
}

/// Adds a task that ends a session to those [`close_connections`] waits for.
pub(crate) fn track_session(task: tokio::task::JoinHandle<()>) {
    let mut open = CONNECTIONS.lock().expect("connections");
    open.retain(|t| !t.is_finished());
    open.push(task);
}

/// Connects with tokio-postgres, over TLS as the connection string's libpq parameters say
/// (`sslmode`, by default `prefer`; see [`pgconn`]), and drives the connection on the
/// runtime. Unless the URL sets them, a connect gives up after 10 s, and a path that went
/// silent (no reset from the peer) is found dead within about a minute: TCP keepalives after
/// 30 s idle, every 10 s, 3 tries, and a 60 s TCP user timeout on unacknowledged data; a
/// closed connection is then replaced by the server (`api::SharedConnection`).
pub async fn connect_db(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let failed = |e: tokio_postgres::Error| {
        anyhow::anyhow!("connecting to PostgreSQL: {}", install::describe(&e))
    };
    let mut target = pgconn::parse(url).map_err(|e| e.context("connecting to PostgreSQL"))?;
    let config = &mut target.config;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(std::time::Duration::from_secs(10));
    }
    if config.get_keepalives_interval().is_none() {
        config
            .keepalives_idle(std::time::Duration::from_secs(30))
            .keepalives_interval(std::time::Duration::from_secs(10))
            .keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(std::time::Duration::from_secs(60));
    }
    // pg_stat_activity names what each session is for (unless the URL does).
    if config.get_application_name().is_none() {
        config.application_name(APPLICATION_NAME.get().copied().unwrap_or("synchro-server"));
    }
    let (client, connection) = pgconn::open(&target, None).await.map_err(failed)?;
    let task = tokio::spawn(async move {
        if let Ok(Err(e)) = connection.await {
            tracing::warn!(error = %install::describe_for_log(&e), "database connection ended");
        }
    });
    track_session(task);
    // JIT compilation (PostgreSQL's default `jit = on`) of a plan whose function scans the
    // planner estimates at 1,000 rows each took ~10 ms for a 0.3 ms query: synchro's
    // statements are short, so its sessions never JIT.
    // TOAST compresses with lz4 where the server has it (pg_settings lists what it was built
    // with, so asking writes no error to its log): a rebuild session's chunks of records
    // compress ~3x faster than with pglz, to the same size.
    client
        .batch_execute(
            "SET jit = off;
             SELECT set_config('default_toast_compression', 'lz4', false) FROM pg_settings
              WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)",
        )
        .await
        .map_err(|e| anyhow::anyhow!("configuring the session: {}", install::describe(&e)))?;
    Ok(client)
}
