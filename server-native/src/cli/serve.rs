//! The long-running commands: `serve` (the HTTP API, with the capture worker unless it runs
//! apart), `capture` (the worker alone) and `dev` (everything on a throwaway cluster).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::ServeArgs;
use crate::api::{router, AppState, Config, ConnectionPool, SharedConnection};
use crate::auth::{mint, AuthSettings, Authenticator};
use crate::{connect_db, dev, install, pg_harness, publish};

/// `serve`: the API on its listener until SIGTERM or SIGINT.
pub(super) async fn serve_command(args: ServeArgs) -> Result<ExitCode> {
    let ServeArgs {
        database_url,
        listen,
        jwt_secret,
        jwks_url,
        jwt_issuer,
        jwt_audience,
        jwks_refetch_secs,
        max_body_bytes,
        seed_dir,
        public_seeds,
        cors_origins,
        min_client_version,
        worker_url,
        no_capture,
        cursor_secret,
        max_token_lifetime_secs,
        limits,
    } = args;
    // Secrets are checked before anything connects (here, not by clap, whose error would
    // repeat the value).
    let min = synchro_protocol::jwt::MIN_SECRET_BYTES;
    anyhow::ensure!(
        jwt_secret.as_ref().is_none_or(|s| s.len() >= min),
        "--jwt-secret (SYNCHRO_JWT_SECRET) must be at least {min} bytes"
    );
    anyhow::ensure!(
        cursor_secret.as_ref().is_none_or(|s| s.len() >= min),
        "--cursor-secret (SYNCHRO_CURSOR_SECRET) must be at least {min} bytes"
    );
    let cursor_root = cursor_secret.or_else(|| jwt_secret.clone()).context(
        "--cursor-secret (SYNCHRO_CURSOR_SECRET) is required without --jwt-secret: it keys every scope cursor",
    )?;
    let auth = Authenticator::new(&AuthSettings {
        secret: jwt_secret,
        jwks_url,
        issuer: jwt_issuer,
        audience: jwt_audience,
        max_lifetime_secs: max_token_lifetime_secs,
        jwks_refetch_secs,
    })?;
    let cors_origins =
        crate::api::cors::CorsOrigins::parse(cors_origins.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("--cors-origin (SYNCHRO_CORS_ORIGINS): {e}"))?;
    // Push evaluates written rows' scopes (each rule as its owner, through its evaluator) on
    // adapter connections of their own, so concurrent pushes do not queue behind one: the
    // worker login serves capture only.
    let mut membership = Vec::new();
    for _ in 0..4 {
        membership.push(connect_db(&database_url).await?);
    }
    let membership_db = Some(ConnectionPool::reconnecting(&database_url, membership));
    let capture = worker_url
        .filter(|_| !no_capture)
        .map(|url| tokio::spawn(capture_loop(url)));
    // Every connection is replaced when found closed (PostgreSQL restarted, the
    // session was terminated): the server needs no restart after the database's.
    let db = SharedConnection::new(&database_url, connect_db(&database_url).await?);
    // Pull and rebuild snapshots run on their own connections, concurrently.
    let mut snapshot_db = Vec::new();
    for _ in 0..4 {
        snapshot_db.push(connect_db(&database_url).await?);
    }
    let snapshot_db = ConnectionPool::reconnecting(&database_url, snapshot_db);
    if let Some(dir) = &seed_dir {
        anyhow::ensure!(dir.is_dir(), "--seed-dir is not a directory");
    }
    let config = limits.apply(Config {
        max_body_bytes,
        min_client_version,
        seed_dir,
        public_seeds,
        cors_origins,
        ..Config::default()
    });
    serve(
        (db, snapshot_db, membership_db),
        crate::api::Notifier::listen(database_url.clone()),
        auth,
        cursor_root.as_bytes(),
        config,
        bind(listen).await?,
    )
    .await?;
    // The worker stops with the server (its step rolls back, as `capture` does on
    // SIGTERM), so its sessions close before the process exits.
    if let Some(capture) = capture {
        capture.abort();
        let _ = capture.await;
    }
    Ok(ExitCode::SUCCESS)
}

/// `capture`: the worker alone, until SIGTERM or SIGINT.
pub(super) async fn capture_worker(database_url: Option<String>) -> Result<ExitCode> {
    let database_url = database_url.context(
        "capture needs --database-url (or DATABASE_URL): the worker login's connection string",
    )?;
    tokio::select! {
        _ = capture_loop(database_url) => {}
        _ = shutdown_signal() => tracing::info!("capture worker stopping"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn capture_loop(url: String) {
    // An idle worker steps at least this often (and at once when its stream delivers).
    crate::capture::worker::run_forever(url, std::time::Duration::from_millis(25)).await
}

/// SIGINT or SIGTERM (a container stop): finish in-flight requests, then return, which
/// also stops a `dev` throwaway cluster.
pub(super) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn bind(listen: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))
}

type Connections = (SharedConnection, ConnectionPool, Option<ConnectionPool>);

async fn serve(
    (db, snapshot_db, membership_db): Connections,
    events: crate::api::Notifier,
    auth: Authenticator,
    cursor_root: &[u8],
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<()> {
    let cursor_keys = synchro_protocol::token::Keyring::new(
        "k1",
        &crate::auth::derive_key(cursor_root, "scope-cursor"),
    )?;
    let state = Arc::new(AppState {
        db,
        snapshot_db,
        cursor_keys,
        auth,
        config,
        events,
        membership_db,
        caches: Default::default(),
        rebuild_builds: Default::default(),
    });
    tracing::info!(listen = %listener.local_addr()?, "serving");
    let config = state.config.clone();
    // Event streams never finish on their own: they end at the signal, so the graceful
    // shutdown does not wait for their lifetime.
    let streams = state.events.clone();
    let shutdown = async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        streams.stop();
    };
    crate::serve::serve(listener, router(state), &config, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Where `dev`'s database lives.
pub(super) enum DevDatabase {
    /// A cluster of its own kept in this directory across runs.
    Kept(std::path::PathBuf),
    /// A cluster of its own, deleted when dev stops.
    Throwaway,
    /// This database (a superuser connection); every login is this one.
    Url(String),
}

pub(super) async fn run_dev(
    database: DevDatabase,
    listen: SocketAddr,
    seed_dir: Option<std::path::PathBuf>,
    cors_origins: Vec<String>,
) -> Result<()> {
    let cors_origins =
        crate::api::cors::CorsOrigins::parse(cors_origins.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("--cors-origin (SYNCHRO_CORS_ORIGINS): {e}"))?;
    // Keep the cluster alive for the whole run; dropping it stops it (and deletes a
    // throwaway one).
    let (cluster, kept) = match &database {
        DevDatabase::Url(_) => (None, None),
        DevDatabase::Throwaway => {
            eprintln!("starting a throwaway PostgreSQL cluster (deleted when dev stops)...");
            (Some(pg_harness::TempCluster::start()?), None)
        }
        DevDatabase::Kept(dir) => {
            eprintln!(
                "starting the development PostgreSQL cluster in {} (kept; --fresh for a throwaway one)...",
                dir.display()
            );
            (
                Some(pg_harness::TempCluster::persistent(dir)?),
                Some(dir.clone()),
            )
        }
    };
    // Set when dev's logins get passwords of their own (below).
    let mut dev_password = None;
    let (_cluster, admin_url, url_for) = match (cluster, database) {
        (None, DevDatabase::Url(url)) => {
            let login = connect_db(&url).await?;
            let superuser: bool = login
                .query_one(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
                    &[],
                )
                .await?
                .get(0);
            if superuser {
                (
                    None,
                    url.clone(),
                    Box::new(move |_: &str| url.clone()) as Box<dyn Fn(&str) -> String>,
                )
            } else {
                // A login that is not a superuser (a managed service's database owner, with
                // CREATEROLE) cannot act as every role: dev's logins get a password of this
                // run and sessions of their own, on the same server and database.
                let password: String = login
                    .query_one(
                        "SELECT replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')",
                        &[],
                    )
                    .await?
                    .get(0);
                dev_password = Some(password.clone());
                let base = url.clone();
                (
                    None,
                    url.clone(),
                    Box::new(move |user: &str| dev::with_login(&base, user, &password))
                        as Box<dyn Fn(&str) -> String>,
                )
            }
        }
        (Some(cluster), _) => {
            let admin = connect_db(&cluster.admin_url()).await?;
            let exists = admin
                .query_opt(
                    "SELECT 1 FROM pg_database WHERE datname = 'synchro_dev'",
                    &[],
                )
                .await?
                .is_some();
            if !exists {
                admin.batch_execute("CREATE DATABASE synchro_dev").await?;
            }
            let port = cluster.port();
            (
                Some(cluster),
                format!("host=127.0.0.1 port={port} user=postgres dbname=synchro_dev"),
                Box::new(move |user: &str| {
                    format!("host=127.0.0.1 port={port} user={user} dbname=synchro_dev")
                }) as Box<dyn Fn(&str) -> String>,
            )
        }
        (None, _) => unreachable!("a cluster of its own was started"),
    };
    let mut admin = connect_db(&admin_url).await?;
    if let Err(e) = install::install(&mut admin).await {
        return Err(match kept {
            Some(dir) => e.context(format!(
                "installing synchro into the database kept in {} (one installed by another build \
                 of synchro-server is refused: start with --fresh, or remove that directory)",
                dir.display()
            )),
            None => e,
        });
    }
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    if let Some(password) = &dev_password {
        dev::set_passwords(&admin, password).await?;
    }
    dev::create_demo_schema(&admin).await?;
    let mut operator = connect_db(&url_for("synchro_dev_operator")).await?;
    dev::register_demo(&operator).await?;
    dev::create_board(&admin, &operator).await?;
    publish::publish(&mut operator).await?;
    let adapter_url = url_for("synchro_dev_adapter");
    let adapter = SharedConnection::new(&adapter_url, connect_db(&adapter_url).await?);
    tokio::spawn(capture_loop(url_for("synchro_dev_worker")));
    // Retention compaction, as the operator (what `synchro-server compact --every 60` does
    // in a deployment).
    let operator_url = url_for("synchro_dev_operator");
    tokio::spawn(async move {
        let every = std::time::Duration::from_secs(60);
        crate::retention::every(
            &operator_url,
            crate::retention::DEFAULT_BATCH_SIZE,
            every,
            |c| {
                tracing::info!(
                    clients_expired = c.clients_expired,
                    scopes = c.scopes_compacted,
                    effects = c.effects_deleted,
                    "compaction"
                )
            },
        )
        .await
    });
    let listener = bind(listen).await?;
    let secret = "synchro-dev-secret-not-for-production";
    let token = mint(secret.as_bytes(), "dev-user", 30 * 24 * 3600);
    println!("synchro dev server on http://{listen}");
    println!("  database: {admin_url}");
    println!("  JWT secret (HS256): {secret}");
    println!("  development token for user dev-user:\n  {token}");
    println!(
        "  try: curl -s -X POST http://{listen}/sync/connect -H 'authorization: Bearer <token>' \\"
    );
    println!("         -d '{{\"protocol_version\":3,\"client_id\":\"c1\",\"schema\":{{\"version\":0,\"hash\":\"\"}}}}'");
    println!(
        "  TypeScript types: DATABASE_URL='{}' synchro-server codegen typescript --out src/synchro.d.ts",
        url_for("synchro_dev_adapter")
    );
    // The portable seed of the demo board (README "Portable seeds"), as the seed login.
    if let Some(dir) = &seed_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating the seed directory: {e}"))?;
    }
    let out = seed_dir.as_deref().map_or_else(
        || "board.seed.sqlite".into(),
        |d| d.join("board.seed.sqlite"),
    );
    println!(
        "  export a seed: DATABASE_URL='{}' synchro-server seed export --scope board:demo --out {}",
        url_for("synchro_dev_seed"),
        out.display()
    );
    match &seed_dir {
        Some(_) => println!("  served at: http://{listen}/seeds/board.seed.sqlite (with a token)"),
        None => println!("  (start dev with --seed-dir DIR to serve the seeds in DIR at /seeds/)"),
    }
    let snapshot = vec![
        connect_db(&adapter_url).await?,
        connect_db(&adapter_url).await?,
    ];
    let membership = vec![
        connect_db(&adapter_url).await?,
        connect_db(&adapter_url).await?,
    ];
    serve(
        (
            adapter,
            ConnectionPool::reconnecting(&adapter_url, snapshot),
            Some(ConnectionPool::reconnecting(&adapter_url, membership)),
        ),
        crate::api::Notifier::listen(url_for("synchro_dev_adapter")),
        Authenticator::hs256(secret.as_bytes())?,
        secret.as_bytes(),
        Config {
            seed_dir,
            cors_origins,
            ..Config::default()
        },
        listener,
    )
    .await
}
