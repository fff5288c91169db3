//! The `synchro-server` command line: install, register, publish, serve, capture, compact,
//! health, and a one-command dev server. The binary is `main()`; it lives in the library so
//! test packages can build the same program (`synchro-tests` does).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use crate::api::{router, AppState, Config, ConnectionPool, SharedConnection};
use crate::auth::{mint, Authenticator};
use crate::registry::{register, RegisterRequest, RegistrationError};
use crate::{connect_db, dev, install, pg_harness, publish};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "synchro-server", version, about = "synchro native server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install or upgrade the synchro schema and roles (needs a superuser connection).
    Install {
        /// PostgreSQL connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Registry operations (as a synchro_operator login).
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
    /// Publish the registry as a new immutable manifest when it changed.
    Publish {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Print the detailed health checks (synchro_monitor or synchro_operator login).
    Health {
        /// PostgreSQL connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Serve the sync HTTP API (as a synchro_adapter login). Every option can also be set by
    /// the environment variable shown in `--help` (the container is configured that way).
    /// SIGTERM or SIGINT: stop accepting, end event streams (`end` `{"reason":"shutdown"}`),
    /// let in-flight requests finish, exit 0.
    Serve {
        /// PostgreSQL connection string (synchro_adapter login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Address to listen on.
        #[arg(long, env = "SYNCHRO_LISTEN", default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        /// HS256 secret for bearer JWTs.
        #[arg(long, env = "SYNCHRO_JWT_SECRET", hide_env_values = true)]
        jwt_secret: String,
        /// Root secret for scope cursor keys (default: derived from the JWT secret with a
        /// purpose label). Rotating it invalidates every cursor (scopes rebuild).
        #[arg(long, env = "SYNCHRO_CURSOR_SECRET", hide_env_values = true)]
        cursor_secret: Option<String>,
        /// Longest accepted bearer-token lifetime: a token whose `exp` lies further than
        /// this from now is refused (401).
        #[arg(
            long,
            env = "SYNCHRO_MAX_TOKEN_LIFETIME_SECS",
            default_value_t = crate::auth::DEFAULT_MAX_TOKEN_LIFETIME_SECS
        )]
        max_token_lifetime_secs: u64,
        /// Largest accepted request body in bytes.
        #[arg(long, env = "SYNCHRO_MAX_BODY_BYTES", default_value_t = 1_048_576)]
        max_body_bytes: usize,
        /// Minimum client runtime version (SemVer 2.0.0): a connect whose `client_version` is
        /// absent or of lower precedence is answered 426 `upgrade_required`. A malformed
        /// value refuses to start.
        #[arg(long, env = "SYNCHRO_MIN_CLIENT_VERSION", value_parser = semver_version)]
        min_client_version: Option<String>,
        /// Connection as the owner of the registered scope-assignment function (evaluated
        /// with that owner's privileges).
        #[arg(long, env = "SYNCHRO_ASSIGNMENT_DATABASE_URL", hide_env_values = true)]
        assignment_url: Option<String>,
        /// Also run the capture worker in this process, as this worker login (REPLICATION,
        /// member of synchro_worker). Without it, run `synchro-server capture` separately.
        #[arg(long, env = "SYNCHRO_WORKER_DATABASE_URL", hide_env_values = true)]
        worker_url: Option<String>,
        /// With --worker-url, use that login only for push's scope evaluation and run no
        /// capture worker in this process (it runs as `synchro-server capture`, e.g. its
        /// own container).
        #[arg(long, env = "SYNCHRO_NO_CAPTURE", requires = "worker_url")]
        no_capture: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Run the capture worker (one leader per database; others wait). SIGTERM or SIGINT
    /// stops it and exits 0: a step in progress is abandoned (its transaction rolls back)
    /// and the next worker resumes from the last committed progress. With a subcommand: the
    /// operator's ways out of a blocked capture or a stopped staging (synchro_operator login).
    Capture {
        #[command(subcommand)]
        action: Option<CaptureCommand>,
        /// Worker login connection string (REPLICATION, member of synchro_worker).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
    /// Print the operator settings as JSON (value, and range when settable), or change one
    /// with `--set KEY VALUE` (synchro_operator login): client_ttl_days,
    /// rebuild_session_ttl_minutes, backfill_batch_size, capture_max_heartbeat_age_seconds,
    /// capture_max_wal_lag_bytes.
    Settings {
        /// PostgreSQL connection string (synchro_operator login; synchro_monitor to read).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The setting to change and its new value.
        #[arg(long, num_args = 2, value_names = ["KEY", "VALUE"])]
        set: Option<Vec<String>>,
    },
    /// GET /ready of a local `serve`: exits 0 when it answers 200 within 5 s, 1 otherwise
    /// (the container's health check; it needs no curl in the image).
    Probe {
        /// The address `serve` listens on (an unspecified address such as 0.0.0.0 is
        /// probed on loopback).
        #[arg(long, env = "SYNCHRO_LISTEN", default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
    },
    /// Run one retention compaction pass now (the capture leader also runs one every
    /// minute): expires stale client generations, deletes acknowledged scope effects and
    /// raises resume floors. Prints counts only.
    Compact {
        /// Operator or worker login connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Effects deleted per transaction (compaction.batch_size), a positive integer.
        #[arg(long, default_value_t = crate::retention::DEFAULT_BATCH_SIZE)]
        batch_size: i32,
    },
    /// Development server: an embedded throwaway PostgreSQL (or DATABASE_URL), installed,
    /// with a demo schema registered, serving on 127.0.0.1:8787.
    Dev {
        /// Use this database instead of a throwaway cluster (needs superuser rights).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
    },
}

impl Command {
    /// The sessions' `application_name`: what they are for, per command.
    fn application_name(&self) -> &'static str {
        match self {
            Command::Install { .. } => "synchro-server install",
            Command::Registry { .. } => "synchro-server registry",
            Command::Publish { .. } => "synchro-server publish",
            Command::Health { .. } => "synchro-server health",
            Command::Serve { .. } => "synchro-server serve",
            Command::Capture { action: None, .. } => "synchro-server capture",
            Command::Capture { .. } => "synchro-server capture (operator)",
            Command::Settings { .. } => "synchro-server settings",
            Command::Probe { .. } => "synchro-server probe",
            Command::Compact { .. } => "synchro-server compact",
            Command::Dev { .. } => "synchro-server dev",
        }
    }
}

/// The operator's recoveries (each prints one JSON object and changes nothing else).
#[derive(Subcommand)]
enum CaptureCommand {
    /// Lift a durable capture block once its cause is fixed (a rule or grant repaired, a
    /// value corrected): the worker tries again from the last applied transaction, and blocks
    /// again with the same reason if the cause remains. Prints the block lifted.
    Unblock {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Stage a relation's pending membership rule again from its first row (after its
    /// staging stopped on a failed evaluation and the rule or a grant was fixed).
    RetryStaging(StagedRelation),
    /// Abandon a relation's pending membership rule: a changed rule is dropped and the live
    /// one keeps serving; a first rule is removed (its rows are in no scope until a rule is
    /// registered).
    SkipStaging(StagedRelation),
}

/// The relation whose staging `capture retry-staging|skip-staging` acts on.
#[derive(clap::Args)]
struct StagedRelation {
    /// PostgreSQL connection string (synchro_operator login).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The registered schema name.
    #[arg(long)]
    schema: String,
    /// The registered relation name.
    #[arg(long)]
    relation: String,
}

/// Load limits of `serve` (over one: 503 `temporary_unavailable` with a `reason` and
/// `Retry-After`, or the connection is closed).
#[derive(clap::Args)]
struct LimitArgs {
    /// Open connections at most (lowered at start if the open-file limit is smaller).
    #[arg(
        long,
        env = "SYNCHRO_MAX_CONNECTIONS",
        default_value_t = limits_default().max_connections,
        value_parser = positive::<usize>()
    )]
    max_connections: usize,
    /// Open connections per peer address (IPv6: per /64) at most; 0 = no per-peer cap
    /// (behind a reverse proxy, whose address every connection has).
    #[arg(long, env = "SYNCHRO_MAX_CONNECTIONS_PER_PEER", default_value_t = limits_default().max_connections_per_peer)]
    max_connections_per_peer: usize,
    /// Milliseconds within which a request head must arrive (from the accept, or from its
    /// first byte on a kept-alive connection).
    #[arg(
        long,
        env = "SYNCHRO_HEADER_TIMEOUT_MS",
        default_value_t = millis(limits_default().header_timeout),
        value_parser = positive::<u64>()
    )]
    header_timeout_ms: u64,
    /// Milliseconds within which the whole request body must arrive after its head.
    #[arg(
        long,
        env = "SYNCHRO_BODY_TIMEOUT_MS",
        default_value_t = millis(Config::default().body_timeout),
        value_parser = positive::<u64>()
    )]
    body_timeout_ms: u64,
    /// Milliseconds a kept-alive connection may wait for its next request.
    #[arg(
        long,
        env = "SYNCHRO_IDLE_TIMEOUT_MS",
        default_value_t = millis(limits_default().idle_timeout),
        value_parser = positive::<u64>()
    )]
    idle_timeout_ms: u64,
    /// Open `POST /sync/events` streams at most, server-wide.
    #[arg(long, env = "SYNCHRO_MAX_EVENT_STREAMS", default_value_t = Config::default().max_event_streams)]
    max_event_streams: usize,
    /// Open `POST /sync/events` streams per user and client ID at most.
    #[arg(
        long,
        env = "SYNCHRO_MAX_EVENT_STREAMS_PER_CLIENT",
        default_value_t = Config::default().max_event_streams_per_client
    )]
    max_event_streams_per_client: usize,
    /// Rebuild sessions in progress per user and client ID at most.
    #[arg(
        long,
        env = "SYNCHRO_MAX_REBUILD_SESSIONS_PER_CLIENT",
        default_value_t = Config::default().max_rebuild_sessions_per_client,
        value_parser = positive::<u32>()
    )]
    max_rebuild_sessions_per_client: u32,
    /// `Retry-After` seconds sent with a refusal for load.
    #[arg(long, env = "SYNCHRO_RETRY_AFTER_SECONDS", default_value_t = Config::default().retry_after_seconds)]
    retry_after_seconds: u64,
}

fn limits_default() -> crate::serve::ConnectionLimits {
    crate::serve::ConnectionLimits::default()
}

fn millis(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

/// A parser of SemVer 2.0.0 versions (kept as given).
fn semver_version(text: &str) -> std::result::Result<String, String> {
    synchro_protocol::semver::Version::parse(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// A parser of integers of at least 1.
fn positive<T>() -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: Send + Sync + 'static + std::error::Error,
{
    clap::builder::RangedU64ValueParser::new().range(1..)
}

impl LimitArgs {
    fn apply(self, config: Config) -> Config {
        use std::time::Duration;
        Config {
            connections: crate::serve::ConnectionLimits {
                max_connections: self.max_connections,
                max_connections_per_peer: self.max_connections_per_peer,
                header_timeout: Duration::from_millis(self.header_timeout_ms),
                idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            },
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            max_event_streams: self.max_event_streams,
            max_event_streams_per_client: self.max_event_streams_per_client,
            max_rebuild_sessions_per_client: self.max_rebuild_sessions_per_client,
            retry_after_seconds: self.retry_after_seconds,
            ..config
        }
    }
}

#[derive(Subcommand)]
enum RegistryCommand {
    /// Register a schema-qualified relation.
    Register {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Exact schema name.
        #[arg(long)]
        schema: String,
        /// Exact relation name.
        #[arg(long)]
        relation: String,
        /// synced or capture_dependency.
        #[arg(long, default_value = "synced")]
        kind: String,
        /// single_scope or multi_scope.
        #[arg(long, default_value = "single_scope")]
        composition: String,
        /// Refuse client pushes to this table.
        #[arg(long)]
        no_push: bool,
        /// Client-visible table name (default: the relation name).
        #[arg(long)]
        table_name: Option<String>,
        /// Membership fanout bound.
        #[arg(long, default_value_t = 1000)]
        fanout_bound: i32,
        /// Impact bound.
        #[arg(long, default_value_t = 1000)]
        impact_bound: i32,
        /// A column that is not synced (server-only, or without a portable type); repeatable.
        #[arg(long = "server-only")]
        server_only: Vec<String>,
        #[command(flatten)]
        lifecycle: LifecycleArgs,
    },
    /// Show what reconfiguring a relation after DDL would do, changing nothing: the class,
    /// the fields added, changed and retired, the affected scopes, and the connect action
    /// active clients on each manifest would get.
    Plan {
        #[command(flatten)]
        change: ReconfigureArgs,
    },
    /// Declare a local index (created in every client's SQLite database; Class 2 at the
    /// next publish). --unique needs a unique index of the source on those columns.
    Index {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The registered schema name.
        #[arg(long)]
        schema: String,
        /// The registered relation name.
        #[arg(long)]
        relation: String,
        /// The index name (letters, digits, underscores).
        #[arg(long)]
        name: String,
        /// A synced column, in index order; repeatable.
        #[arg(long = "column", required = true)]
        columns: Vec<String>,
        /// A unique index.
        #[arg(long)]
        unique: bool,
    },
    /// Index a registered relation's projection on columns a membership or impact function
    /// filters or joins on (docs/operator.md "Writing fast rules"); with `--drop INDEX`, drop one.
    /// Prints `{"index","relation_id","columns","created"}` (or `{"dropped"}`).
    ProjectionIndex {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The registered schema name.
        #[arg(long, required_unless_present = "drop")]
        schema: Option<String>,
        /// The registered relation name.
        #[arg(long, required_unless_present = "drop")]
        relation: Option<String>,
        /// A projected column, in index order; repeatable (1 to 8).
        #[arg(long = "column", required_unless_present = "drop")]
        columns: Vec<String>,
        /// Drop the projection index of this name instead.
        #[arg(long, conflicts_with_all = ["schema", "relation", "columns"])]
        drop: Option<String>,
    },
    /// Retire a synced table (Class 4) and publish: clients across it get unsupported; a
    /// later registration of the same table is a new table ID.
    RetireTable {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The registered schema name.
        #[arg(long)]
        schema: String,
        /// The registered relation name.
        #[arg(long)]
        relation: String,
    },
    /// Reset one relation's stream: capture re-copies it at a new boundary (lifting a block
    /// found at one of its changes, e.g. after a TRUNCATE or a fixed value) and every scope
    /// holding its rows rebuilds.
    Reset {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The registered schema name.
        #[arg(long)]
        schema: String,
        /// The registered relation name.
        #[arg(long)]
        relation: String,
    },
    /// The rollout advisor: per manifest, the active clients on it, the last push authored
    /// under it, the unresolved queued intents seen and the clients held at
    /// upgrade_required (counts only); with --retire, whether retiring those columns is
    /// safe now and what blocks it.
    Rollout {
        /// PostgreSQL connection string (synchro_monitor or synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The registered schema name (with --retire).
        #[arg(long, requires = "relation")]
        schema: Option<String>,
        /// The registered relation name (with --retire).
        #[arg(long, requires = "schema")]
        relation: Option<String>,
        /// A registered column a planned contract retires; repeatable.
        #[arg(long, requires = "relation")]
        retire: Vec<String>,
    },
    /// Reconfigure a relation after DDL and publish the resulting manifest, in one
    /// transaction; capture activates it at a transaction boundary of the stream.
    Reconfigure {
        #[command(flatten)]
        change: ReconfigureArgs,
    },
}

/// Which relation to reconfigure, and how.
#[derive(clap::Args)]
struct ReconfigureArgs {
    /// PostgreSQL connection string (synchro_operator login).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The registered schema name.
    #[arg(long)]
    schema: String,
    /// The registered relation name.
    #[arg(long)]
    relation: String,
    /// A column that is not synced; repeatable. Replaces the current list when given.
    #[arg(long = "server-only")]
    server_only: Vec<String>,
    /// Keep no server-only column (instead of keeping the current list).
    #[arg(long, conflicts_with = "server_only")]
    no_server_only: bool,
    /// A registered column whose field is retired (Class 4); repeatable.
    #[arg(long)]
    retire: Vec<String>,
    /// Declare the lifecycle columns anew (the ones given; a change is Class 4).
    #[arg(long)]
    set_lifecycle: bool,
    #[command(flatten)]
    lifecycle: LifecycleArgs,
}

/// Server-owned lifecycle columns (each a timestamptz column; not writable by clients).
#[derive(clap::Args)]
struct LifecycleArgs {
    /// The creation time column.
    #[arg(long)]
    created_at: Option<String>,
    /// The last update time column.
    #[arg(long)]
    updated_at: Option<String>,
    /// The deletion (tombstone) time column.
    #[arg(long)]
    deleted_at: Option<String>,
}

impl LifecycleArgs {
    fn map(&self) -> std::collections::BTreeMap<String, String> {
        [
            ("created_at", &self.created_at),
            ("updated_at", &self.updated_at),
            ("deleted_at", &self.deleted_at),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_owned(), v)))
        .collect()
    }
}

impl ReconfigureArgs {
    fn request(&self) -> crate::registry::ReconfigureRequest {
        crate::registry::ReconfigureRequest {
            schema: self.schema.clone(),
            relation: self.relation.clone(),
            server_only: if self.no_server_only {
                Some(Vec::new())
            } else if self.server_only.is_empty() {
                None
            } else {
                Some(self.server_only.clone())
            },
            retire: self.retire.clone(),
            lifecycle: (self.set_lifecycle || !self.lifecycle.map().is_empty())
                .then(|| self.lifecycle.map()),
        }
    }
}

/// Runs the command line with the process's arguments and environment.
pub fn main() -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(e) => {
            eprintln!("synchro-server: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main() -> ExitCode {
    use std::io::IsTerminal;
    crate::logging::init(
        &std::env::var("SYNCHRO_LOG").unwrap_or_else(|_| "info".into()),
        std::io::stderr,
        std::io::stderr().is_terminal(),
    );
    let cli = Cli::parse();
    let _ = crate::APPLICATION_NAME.set(cli.command.application_name());
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("synchro-server: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Every client is dropped by now: let the sessions end cleanly (nothing in the
    // PostgreSQL log).
    crate::close_connections(std::time::Duration::from_secs(2)).await;
    code
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Install { database_url } => {
            let mut db = connect_db(&database_url).await?;
            let report = install::install(&mut db).await?;
            println!(
                "{}",
                serde_json::json!({"version": report.version, "applied": report.applied})
            );
        }
        Command::Registry {
            command:
                RegistryCommand::Register {
                    database_url,
                    schema,
                    relation,
                    kind,
                    composition,
                    no_push,
                    table_name,
                    fanout_bound,
                    impact_bound,
                    server_only,
                    lifecycle,
                },
        } => {
            let db = connect_db(&database_url).await?;
            let req = RegisterRequest {
                schema,
                relation,
                kind,
                composition,
                push_enabled: !no_push,
                fanout_bound,
                impact_bound,
                table_name,
                server_only,
                lifecycle: lifecycle.map(),
            };
            match register(&db, &req).await {
                Ok(v) => println!("{v}"),
                Err(RegistrationError::Invalid(body, _)) => {
                    println!("{body}");
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Command::Registry {
            command:
                RegistryCommand::Rollout {
                    database_url,
                    schema,
                    relation,
                    retire,
                },
        } => {
            let db = connect_db(&database_url).await?;
            let contract = match (&schema, &relation) {
                (Some(s), Some(r)) if !retire.is_empty() => {
                    Some((s.as_str(), r.as_str(), retire.as_slice()))
                }
                _ => None,
            };
            match crate::registry::rollout(&db, contract).await {
                Ok(v) => println!("{v}"),
                Err(RegistrationError::Invalid(body, _)) => {
                    println!("{body}");
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Command::Registry {
            command:
                RegistryCommand::Index {
                    database_url,
                    schema,
                    relation,
                    name,
                    columns,
                    unique,
                },
        } => {
            let db = connect_db(&database_url).await?;
            match crate::registry::declare_index(&db, &schema, &relation, &name, &columns, unique)
                .await
            {
                Ok(v) => println!("{v}"),
                Err(RegistrationError::Invalid(body, _)) => {
                    println!("{body}");
                    return Ok(ExitCode::FAILURE);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Command::Registry {
            command:
                RegistryCommand::ProjectionIndex {
                    database_url,
                    schema,
                    relation,
                    columns,
                    drop,
                },
        } => {
            return match drop {
                Some(index) => {
                    operator_function(
                        &database_url,
                        "SELECT jsonb_build_object('dropped', synchro.synchro_drop_projection_index($1))::text",
                        &[index],
                    )
                    .await
                }
                None => {
                    let db = connect_db(&database_url).await?;
                    let row = db
                        .query_one(
                            "SELECT synchro.synchro_index_projection($1, $2, $3)::text",
                            &[&schema, &relation, &columns],
                        )
                        .await;
                    match row.map_err(crate::registry::registration_error) {
                        Ok(row) => {
                            println!("{}", row.get::<_, String>(0));
                            Ok(ExitCode::SUCCESS)
                        }
                        Err(RegistrationError::Invalid(body, _)) => {
                            println!("{body}");
                            Ok(ExitCode::FAILURE)
                        }
                        Err(e) => Err(e.into()),
                    }
                }
            };
        }
        Command::Registry {
            command:
                RegistryCommand::RetireTable {
                    database_url,
                    schema,
                    relation,
                },
        } => return relation_command(&database_url, &schema, &relation, false).await,
        Command::Registry {
            command:
                RegistryCommand::Reset {
                    database_url,
                    schema,
                    relation,
                },
        } => return relation_command(&database_url, &schema, &relation, true).await,
        Command::Registry {
            command: RegistryCommand::Plan { change },
        } => return reconfigure_command(&change, false).await,
        Command::Registry {
            command: RegistryCommand::Reconfigure { change },
        } => return reconfigure_command(&change, true).await,
        Command::Publish { database_url } => {
            let mut db = connect_db(&database_url).await?;
            println!("{}", publish::publish(&mut db).await?.to_json());
        }
        Command::Health { database_url } => {
            let db = connect_db(&database_url).await?;
            let row = db
                .query_one(
                    "SELECT synchro.synchro_health_detail()::text, synchro.synchro_capture_report()::text",
                    &[],
                )
                .await
                .map_err(|e| anyhow::anyhow!(install::describe(&e)))?;
            let checks: serde_json::Value = serde_json::from_str(&row.get::<_, String>(0))?;
            let report: serde_json::Value = serde_json::from_str(&row.get::<_, String>(1))?;
            let ready = checks
                .as_object()
                .is_some_and(|c| c.values().all(|v| v == "ok"));
            let waiting: Vec<&String> = checks
                .as_object()
                .map(|c| {
                    c.iter()
                        .filter(|(_, v)| *v != "ok")
                        .map(|(k, _)| k)
                        .collect()
                })
                .unwrap_or_default();
            // One JSON object; a closed pipe (`| head`) is not an error worth a panic.
            use std::io::Write;
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                serde_json::json!({"ready": ready, "not_ok": waiting, "checks": checks, "report": report})
            );
            // Scripts and probes branch on the exit status: 0 only when every check is ok.
            return Ok(if ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        Command::Serve {
            database_url,
            listen,
            jwt_secret,
            max_body_bytes,
            min_client_version,
            assignment_url,
            worker_url,
            no_capture,
            cursor_secret,
            max_token_lifetime_secs,
            limits,
        } => {
            // The worker login also evaluates written rows' scopes for push, on a pool of
            // its own so concurrent pushes do not queue behind one connection.
            let membership_db = match &worker_url {
                Some(url) => {
                    let mut pool = Vec::new();
                    for _ in 0..4 {
                        pool.push(connect_db(url).await?);
                    }
                    Some(ConnectionPool::reconnecting(url, pool))
                }
                None => None,
            };
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
            let assignment_db = match assignment_url {
                Some(url) => Some(SharedConnection::new(&url, connect_db(&url).await?)),
                None => None,
            };
            let config = limits.apply(Config {
                max_body_bytes,
                min_client_version,
                ..Config::default()
            });
            let cursor_root = cursor_secret.unwrap_or_else(|| jwt_secret.clone());
            serve(
                (db, snapshot_db, assignment_db, membership_db),
                crate::api::events::Notifier::listen(database_url.clone()),
                Authenticator::hs256_with_max_lifetime(
                    jwt_secret.as_bytes(),
                    max_token_lifetime_secs,
                )?,
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
        }
        Command::Capture {
            action: Some(action),
            ..
        } => return capture_command(action).await,
        Command::Settings { database_url, set } => {
            let (sql, args) = match set {
                Some(kv) => ("SELECT synchro.synchro_set_setting($1, $2)::text", kv),
                None => ("SELECT synchro.synchro_settings()::text", vec![]),
            };
            return operator_function(&database_url, sql, &args).await;
        }
        Command::Capture {
            action: None,
            database_url,
        } => {
            let database_url = database_url.context(
                "capture needs --database-url (or DATABASE_URL): the worker login's connection string",
            )?;
            tokio::select! {
                _ = capture_loop(database_url) => {}
                _ = shutdown_signal() => tracing::info!("capture worker stopping"),
            }
        }
        Command::Probe { listen } => {
            return Ok(match crate::probe::ready(listen).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("synchro-server probe: {e}");
                    ExitCode::FAILURE
                }
            })
        }
        Command::Compact {
            database_url,
            batch_size,
        } => {
            let db = connect_db(&database_url).await?;
            let c = crate::retention::compact(&db, batch_size).await?;
            println!(
                "compaction: {} client generations expired, {} scopes compacted, {} effects deleted",
                c.clients_expired, c.scopes_compacted, c.effects_deleted
            );
        }
        Command::Dev {
            database_url,
            listen,
        } => run_dev(database_url, listen).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `registry plan` (dry run) and `registry reconfigure`: prints the plan as JSON; an
/// invalid reconfiguration prints the spec's error body and fails.
async fn reconfigure_command(change: &ReconfigureArgs, apply: bool) -> Result<ExitCode> {
    let mut db = connect_db(&change.database_url).await?;
    match crate::registry::reconfigure(&mut db, &change.request(), apply).await {
        Ok(plan) => {
            println!("{}", plan.to_json());
            Ok(ExitCode::SUCCESS)
        }
        Err(RegistrationError::Invalid(body, _)) => {
            println!("{body}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// `registry reset` (`reset`) and `registry retire-table`: the change and the publish, in one
/// transaction; prints both.
async fn relation_command(
    database_url: &str,
    schema: &str,
    relation: &str,
    reset: bool,
) -> Result<ExitCode> {
    let mut db = connect_db(database_url).await?;
    let done = if reset {
        crate::registry::reset(&mut db, schema, relation).await
    } else {
        crate::registry::retire(&mut db, schema, relation).await
    };
    match done {
        Ok((change, outcome)) => {
            println!(
                "{}",
                serde_json::json!({"change": change, "publish": outcome.to_json()})
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(RegistrationError::Invalid(body, _)) => {
            println!("{body}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// `capture unblock|retry-staging|skip-staging`: one SQL function each, its answer as JSON.
async fn capture_command(action: CaptureCommand) -> Result<ExitCode> {
    let (url, sql, args): (_, _, Vec<String>) = match action {
        CaptureCommand::Unblock { database_url } => (
            database_url,
            "SELECT jsonb_build_object('unblocked', synchro.synchro_capture_unblock())::text",
            vec![],
        ),
        CaptureCommand::RetryStaging(r) => (
            r.database_url,
            "SELECT jsonb_build_object('restarted', synchro.synchro_retry_staging($1, $2))::text",
            vec![r.schema, r.relation],
        ),
        CaptureCommand::SkipStaging(r) => (
            r.database_url,
            "SELECT jsonb_build_object('outcome', synchro.synchro_skip_staging($1, $2))::text",
            vec![r.schema, r.relation],
        ),
    };
    operator_function(&url, sql, &args).await
}

/// Runs one operator SQL function returning JSON text and prints it; a refusal it raises
/// (`invalid_registration`, `invalid_setting`: 22023 with a JSON detail) is printed as
/// `{"error": ...}` with exit code 1.
async fn operator_function(url: &str, sql: &str, args: &[String]) -> Result<ExitCode> {
    let db = connect_db(url).await?;
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
        .iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    match db.query_one(sql, &params).await {
        Ok(row) => {
            println!("{}", row.get::<_, String>(0));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if let Some(d) = e.as_db_error().filter(|d| d.message() == "invalid_setting") {
                let detail: serde_json::Value = d
                    .detail()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or(serde_json::Value::Null);
                let mut error = serde_json::json!({"code": "invalid_setting"});
                if let (Some(e), Some(d)) = (error.as_object_mut(), detail.as_object()) {
                    e.extend(d.clone());
                }
                println!("{}", serde_json::json!({ "error": error }));
                return Ok(ExitCode::FAILURE);
            }
            match crate::registry::registration_error(e) {
                RegistrationError::Invalid(body, _) => {
                    println!("{body}");
                    Ok(ExitCode::FAILURE)
                }
                e => Err(e.into()),
            }
        }
    }
}

async fn capture_loop(url: String) {
    // An idle worker steps at least this often (and at once when its stream delivers).
    crate::capture::worker::run_forever(url, std::time::Duration::from_millis(25)).await
}

/// SIGINT or SIGTERM (a container stop): finish in-flight requests, then return, which
/// also stops a `dev` throwaway cluster.
async fn shutdown_signal() {
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

type Connections = (
    SharedConnection,
    ConnectionPool,
    Option<SharedConnection>,
    Option<ConnectionPool>,
);

async fn serve(
    (db, snapshot_db, assignment_db, membership_db): Connections,
    events: crate::api::events::Notifier,
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
        assignment_db,
        auth,
        config,
        events,
        membership_db,
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

async fn run_dev(database_url: Option<String>, listen: SocketAddr) -> Result<()> {
    // Keep the cluster alive for the whole run; dropping it stops and deletes it.
    let (_cluster, admin_url, url_for) = match database_url {
        Some(url) => (
            None,
            url.clone(),
            Box::new(move |_: &str| url.clone()) as Box<dyn Fn(&str) -> String>,
        ),
        None => {
            eprintln!("starting a throwaway PostgreSQL cluster...");
            let cluster = pg_harness::TempCluster::start()?;
            let admin = connect_db(&cluster.admin_url()).await?;
            admin.batch_execute("CREATE DATABASE synchro_dev").await?;
            let port = cluster.port();
            (
                Some(cluster),
                format!("host=127.0.0.1 port={port} user=postgres dbname=synchro_dev"),
                Box::new(move |user: &str| {
                    format!("host=127.0.0.1 port={port} user={user} dbname=synchro_dev")
                }) as Box<dyn Fn(&str) -> String>,
            )
        }
    };
    let mut admin = connect_db(&admin_url).await?;
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    dev::create_demo_schema(&admin).await?;
    let mut operator = connect_db(&url_for("synchro_dev_operator")).await?;
    dev::register_demo(&operator).await?;
    dev::create_board(&admin, &operator).await?;
    publish::publish(&mut operator).await?;
    let (adapter_url, worker_url) = (
        url_for("synchro_dev_adapter"),
        url_for("synchro_dev_worker"),
    );
    let adapter = SharedConnection::new(&adapter_url, connect_db(&adapter_url).await?);
    let operator_url = url_for("synchro_dev_operator");
    let assignment = SharedConnection::new(&operator_url, connect_db(&operator_url).await?);
    tokio::spawn(capture_loop(url_for("synchro_dev_worker")));
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
    let snapshot = vec![
        connect_db(&adapter_url).await?,
        connect_db(&adapter_url).await?,
    ];
    let membership = vec![
        connect_db(&worker_url).await?,
        connect_db(&worker_url).await?,
    ];
    serve(
        (
            adapter,
            ConnectionPool::reconnecting(&adapter_url, snapshot),
            Some(assignment),
            Some(ConnectionPool::reconnecting(&worker_url, membership)),
        ),
        crate::api::events::Notifier::listen(url_for("synchro_dev_adapter")),
        Authenticator::hs256(secret.as_bytes())?,
        secret.as_bytes(),
        Config::default(),
        listener,
    )
    .await
}
