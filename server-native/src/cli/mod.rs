//! The `synchro-server` command line: install, register, publish, serve, capture, compact,
//! health, and a one-command dev server. The binary is `main()`; it lives in the library so
//! test packages can build the same program (`synchro-tests` does).
//!
//! | module | owns |
//! |---|---|
//! | this file | the arguments (clap), `main`, and which command runs what |
//! | `registry` | `registry ...`: registration, plans and reconfigurations, indexes, retirement |
//! | `operator` | `install`, `publish`, `health`, `settings`, `compact`, `capture unblock|...`, `seed ...` |
//! | `serve` | `serve`, `capture` (the worker), `probe` and `dev` |

mod operator;
mod registry;
mod serve;

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::api::Config;

#[derive(Parser)]
#[command(name = "synchro-server", version, about = "synchro native server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install or upgrade the synchro schema and roles (as a superuser, or the database's owner
    /// with CREATEROLE, as managed services give).
    Install {
        /// PostgreSQL connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Change nothing: list every prerequisite (wal_level, free slots and WAL senders, TLS,
        /// the logins, the install) as ok, warning or missing with what to do; exit 1 when
        /// one is missing.
        #[arg(long)]
        check: bool,
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
    Serve(ServeArgs),
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
    /// The capture stream's lineage (synchro_operator login; no superuser).
    Lineage {
        #[command(subcommand)]
        command: LineageCommand,
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
    /// Retention compaction (synchro_operator login; nothing else compacts, so schedule it):
    /// expires stale client generations, deletes acknowledged scope effects and raises
    /// resume floors. One pass, or with --every one pass per interval for ever. Prints one
    /// JSON object of counts per pass.
    Compact {
        /// Operator login connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Effects deleted per transaction (compaction.batch_size), a positive integer.
        #[arg(
            long,
            default_value_t = crate::retention::DEFAULT_BATCH_SIZE,
            value_parser = clap::value_parser!(i32).range(1..)
        )]
        batch_size: i32,
        /// Run for ever, one pass every this many seconds (1 to 86400); a failed pass is
        /// logged and the next one tried.
        #[arg(
            long,
            env = "SYNCHRO_COMPACT_EVERY_SECS",
            value_parser = clap::value_parser!(u64).range(1..=86_400)
        )]
        every: Option<u64>,
    },
    /// Types for apps: `codegen typescript` writes the TypeScript types of the served
    /// schema's tables for @synchro/client (`createClient<Schema>`), from the database
    /// (an adapter or operator login).
    Codegen {
        /// What to write: typescript (the tables' types) or manifest (the served schema as
        /// JSON).
        #[arg(value_enum)]
        language: CodegenLanguage,
        /// Connection string of an adapter or operator login.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Write the types to this file (default: standard output).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Portable seeds: which shared scopes may be exported into a seed artifact
    /// (synchro_operator login).
    Seed {
        #[command(subcommand)]
        command: SeedCommand,
    },
    /// Development server: a PostgreSQL cluster of its own kept in --data-dir (or a
    /// throwaway one, or DATABASE_URL), installed, with a demo schema registered, serving on
    /// 127.0.0.1:8787.
    Dev {
        /// Use this database instead of a cluster of its own (needs superuser rights).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true, conflicts_with_all = ["data_dir", "fresh"])]
        database_url: Option<String>,
        /// Keep the development PostgreSQL cluster here: a restart serves the same database,
        /// manifests and clients (browser databases continue).
        #[arg(long, env = "SYNCHRO_DEV_DATA_DIR", default_value = ".synchro-dev")]
        data_dir: std::path::PathBuf,
        /// A throwaway cluster instead, deleted when dev stops.
        #[arg(long, conflicts_with = "data_dir")]
        fresh: bool,
        /// Browser origins allowed to call it (repeatable; `*` for any): by default Vite's
        /// dev server, http://localhost:5173 and http://127.0.0.1:5173.
        #[arg(
            long = "cors-origin",
            env = "SYNCHRO_CORS_ORIGINS",
            value_delimiter = ',',
            default_values = ["http://localhost:5173", "http://127.0.0.1:5173"]
        )]
        cors_origins: Vec<String>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        /// Serve the portable seeds in this directory at GET /seeds/{name} (with a token);
        /// dev prints the command that exports `board:demo` into it.
        #[arg(long, env = "SYNCHRO_SEED_DIR")]
        seed_dir: Option<std::path::PathBuf>,
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
            Command::Lineage { .. } => "synchro-server lineage",
            Command::Settings { .. } => "synchro-server settings",
            Command::Probe { .. } => "synchro-server probe",
            Command::Compact { .. } => "synchro-server compact",
            Command::Codegen { .. } => "synchro-server codegen",
            Command::Seed { .. } => "synchro-server seed",
            Command::Dev { .. } => "synchro-server dev",
        }
    }
}

/// What `codegen` writes.
#[derive(Clone, Copy, clap::ValueEnum)]
enum CodegenLanguage {
    /// A `.d.ts` for @synchro/client.
    Typescript,
    /// The served manifest as JSON, for @synchro/client's `schema` option (a first visit
    /// offline can write).
    Manifest,
}

/// The options of `serve` (each also an environment variable).
#[derive(clap::Args)]
struct ServeArgs {
    /// PostgreSQL connection string (synchro_adapter login).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Address to listen on.
    #[arg(long, env = "SYNCHRO_LISTEN", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// HS256 secret for bearer JWTs (at least 16 bytes). Optional with --jwks-url; both
    /// may be given.
    #[arg(long, env = "SYNCHRO_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// The identity provider's JSON Web Key Set URL (Auth0, Clerk, Supabase, Firebase,
    /// Cognito, Keycloak...): RS256, ES256 and EdDSA tokens are verified with its keys,
    /// fetched at start, every 10 minutes and when a token names an unknown `kid`. https://
    /// only (http:// to localhost). Needs --jwt-issuer.
    #[arg(long, env = "SYNCHRO_JWKS_URL")]
    jwks_url: Option<String>,
    /// The `iss` every token must carry (required with --jwks-url; checked for HS256 tokens
    /// too when given).
    #[arg(long, env = "SYNCHRO_JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// The audience every token's `aud` must name. Without it, tokens carrying an `aud` are
    /// refused (a token meant for another service is not taken).
    #[arg(long, env = "SYNCHRO_JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// Shortest interval, in seconds, between two key set fetches caused by tokens naming a
    /// `kid` the set does not hold: a rotated-in key is accepted within it.
    #[arg(
        long,
        env = "SYNCHRO_JWKS_REFETCH_SECS",
        default_value_t = synchro_protocol::jwt::jwks::MIN_REFETCH_SECS,
        value_parser = clap::value_parser!(u64).range(1..=86400)
    )]
    jwks_refetch_secs: u64,
    /// Root secret for scope cursor keys, at least 16 bytes (default: derived from the JWT
    /// secret with a purpose label; required without --jwt-secret). Rotating it invalidates
    /// every cursor (scopes rebuild).
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
    /// Largest accepted request body in bytes: 1 MiB (the default) to 64 MiB. Not less: a
    /// client seals push batches of up to 512 KiB of mutations for a server with the
    /// default, and a server that refused them would hold its queue for ever.
    #[arg(
        long,
        env = "SYNCHRO_MAX_BODY_BYTES",
        default_value_t = 1_048_576,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1_048_576..=67_108_864)
    )]
    max_body_bytes: usize,
    /// Minimum client runtime version (SemVer 2.0.0): a connect whose `client_version` is
    /// absent or of lower precedence is answered 426 `upgrade_required`. A malformed
    /// value refuses to start.
    #[arg(long, env = "SYNCHRO_MIN_CLIENT_VERSION", value_parser = semver_version)]
    min_client_version: Option<String>,
    /// Also run the capture worker in this process, as this worker login (REPLICATION,
    /// member of synchro_worker). Without it, run `synchro-server capture` separately;
    /// every endpoint, push included, is served with the adapter login alone.
    #[arg(long, env = "SYNCHRO_WORKER_DATABASE_URL", hide_env_values = true)]
    worker_url: Option<String>,
    /// Run no capture worker in this process even with --worker-url (it runs as
    /// `synchro-server capture`, e.g. its own container).
    #[arg(long, env = "SYNCHRO_NO_CAPTURE")]
    no_capture: bool,
    /// Serve the seed artifacts `synchro-server seed export` wrote in this directory, and
    /// their evidence, at `GET /seeds/{name}` (behind a bearer token unless
    /// --public-seeds).
    #[arg(long, env = "SYNCHRO_SEED_DIR")]
    seed_dir: Option<std::path::PathBuf>,
    /// Serve seeds without a bearer token (they hold only declared shared scopes' rows).
    #[arg(long, env = "SYNCHRO_PUBLIC_SEEDS", requires = "seed_dir")]
    public_seeds: bool,
    /// A browser origin allowed to call the server (an app served from elsewhere, such as
    /// http://localhost:5173), repeatable, or `*` for any; preflights answered, errors
    /// readable by the app. None: no CORS headers (serve the app and the server from one
    /// origin).
    #[arg(
        long = "cors-origin",
        env = "SYNCHRO_CORS_ORIGINS",
        value_delimiter = ','
    )]
    cors_origins: Vec<String>,
    #[command(flatten)]
    limits: LimitArgs,
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

/// `lineage ...`.
#[derive(Subcommand)]
enum LineageCommand {
    /// The way out of a lost capture slot (`capture_lineage: failed`: `slot_missing`,
    /// `slot_invalidated`, `lineage_changed`): the capture worker makes a new slot, copies
    /// every registered relation into its stream and records only the rows that differ from
    /// what was materialized, so nothing written while no slot existed is lost; clients
    /// receive just those differences (a client holding changes the database no longer has,
    /// after a restored backup, rebuilds). Prints the plan, then waits until the worker
    /// (`serve` or `capture`) has done it.
    Reset {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Print what would be done and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for the worker to finish (seconds; 0: do not wait).
        #[arg(long, default_value_t = 600)]
        wait_secs: u64,
        /// Reset one scope's lineage instead (the stream is intact): its retention generation
        /// advances, so every client holding it (cursors and seed receipts) rebuilds it from
        /// the current rows; every other scope resumes untouched. Takes effect at once.
        #[arg(long)]
        scope: Option<String>,
    },
}

/// `seed ...`: each prints one JSON object; a refusal prints `{"error": ...}` and exits 1.
#[derive(Subcommand)]
enum SeedCommand {
    /// Declare a shared scope portable (a `user:` scope, or a scope that is not a shared
    /// scope, is refused: `invalid_portable_scope` with its reason).
    Declare(SeedScope),
    /// Withdraw a declaration: no later export includes the scope, and connect no longer
    /// accepts a seed's receipt for it.
    Undeclare(SeedScope),
    /// List the declared scopes and whether each is shared (only those are portable).
    List {
        /// PostgreSQL connection string (synchro_operator or seed login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Export portable scopes into a verified SQLite seed: one SERIALIZABLE READ ONLY
    /// DEFERRABLE transaction of the seed login, every page and row checked, the file
    /// written beside `--out`, checked again as a recipient would, and only then renamed to
    /// `--out`, with its evidence (`<name>.json`: SHA-256, schema, scopes). Prints the
    /// evidence; progress goes to stderr. Nothing is published when any check fails.
    Export {
        /// PostgreSQL connection string (a login that is a member of synchro_seed).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// A scope declared portable (repeat for several).
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// The artifact to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Records per page read from the database.
        #[arg(long, default_value_t = 5000)]
        page_limit: u32,
    },
    /// Check a seed artifact offline (integrity, every row and scope digest against its
    /// receipts, no queue, no cursor, no sidecar file); prints its evidence, exits 1 on any
    /// mismatch.
    Verify {
        /// The artifact.
        file: std::path::PathBuf,
    },
}

/// The scope `seed declare|undeclare` acts on.
#[derive(clap::Args)]
struct SeedScope {
    /// PostgreSQL connection string (synchro_operator login).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The scope.
    #[arg(long)]
    scope: String,
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
    /// Milliseconds within which the body of a request without a valid bearer token must
    /// arrive (then 401 and the connection closes): how long an unauthenticated client can
    /// hold a connection with a slow body.
    #[arg(
        long,
        env = "SYNCHRO_UNAUTHENTICATED_BODY_TIMEOUT_MS",
        default_value_t = millis(Config::default().unauthenticated_body_timeout),
        value_parser = positive::<u64>()
    )]
    unauthenticated_body_timeout_ms: u64,
    /// Bytes of row data after which a pull page is cut short (it still holds at least one
    /// change): bounds a response and the memory it takes when rows are large.
    #[arg(
        long,
        env = "SYNCHRO_MAX_PAGE_BYTES",
        default_value_t = Config::default().max_page_bytes,
        value_parser = positive::<usize>()
    )]
    max_page_bytes: usize,
    /// Milliseconds a kept-alive connection may wait for its next request.
    #[arg(
        long,
        env = "SYNCHRO_IDLE_TIMEOUT_MS",
        default_value_t = millis(limits_default().idle_timeout),
        value_parser = positive::<u64>()
    )]
    idle_timeout_ms: u64,
    /// Open `POST /sync/events` streams at most, server-wide.
    #[arg(
        long,
        env = "SYNCHRO_MAX_EVENT_STREAMS",
        default_value_t = Config::default().max_event_streams,
        value_parser = positive::<usize>()
    )]
    max_event_streams: usize,
    /// Open `POST /sync/events` streams per user (all of their client IDs) at most.
    #[arg(
        long,
        env = "SYNCHRO_MAX_EVENT_STREAMS_PER_USER",
        default_value_t = Config::default().max_event_streams_per_user,
        value_parser = positive::<usize>()
    )]
    max_event_streams_per_user: usize,
    /// Open `POST /sync/events` streams per user and client ID at most.
    #[arg(
        long,
        env = "SYNCHRO_MAX_EVENT_STREAMS_PER_CLIENT",
        default_value_t = Config::default().max_event_streams_per_client,
        value_parser = positive::<usize>()
    )]
    max_event_streams_per_client: usize,
    /// Client records per user at most: a new client ID at the cap replaces the user's
    /// least recently active client, which connects again when it next syncs.
    #[arg(
        long,
        env = "SYNCHRO_MAX_CLIENTS_PER_USER",
        default_value_t = Config::default().max_clients_per_user as u32,
        value_parser = positive::<u32>()
    )]
    max_clients_per_user: u32,
    /// Rebuild sessions in progress per user and client ID at most.
    #[arg(
        long,
        env = "SYNCHRO_MAX_REBUILD_SESSIONS_PER_CLIENT",
        default_value_t = Config::default().max_rebuild_sessions_per_client,
        value_parser = positive::<u32>()
    )]
    max_rebuild_sessions_per_client: u32,
    /// Bytes of stored records of a client's rebuild sessions in progress at most, besides
    /// its first session (a larger scope is still rebuilt, alone).
    #[arg(
        long,
        env = "SYNCHRO_MAX_REBUILD_BYTES_PER_CLIENT",
        default_value_t = Config::default().max_rebuild_bytes_per_client,
        value_parser = positive::<u64>()
    )]
    max_rebuild_bytes_per_client: u64,
    /// `Retry-After` seconds sent with a refusal for load.
    #[arg(long, env = "SYNCHRO_RETRY_AFTER_SECONDS", default_value_t = Config::default().retry_after_seconds)]
    retry_after_seconds: u64,
}

fn limits_default() -> crate::api::ConnectionLimits {
    crate::api::ConnectionLimits::default()
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
            connections: crate::api::ConnectionLimits {
                max_connections: self.max_connections,
                max_connections_per_peer: self.max_connections_per_peer,
                header_timeout: Duration::from_millis(self.header_timeout_ms),
                idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            },
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            unauthenticated_body_timeout: Duration::from_millis(
                self.unauthenticated_body_timeout_ms
                    .min(self.body_timeout_ms),
            ),
            max_page_bytes: self.max_page_bytes,
            max_event_streams: self.max_event_streams,
            max_event_streams_per_user: self.max_event_streams_per_user,
            max_event_streams_per_client: self.max_event_streams_per_client,
            max_clients_per_user: i32::try_from(self.max_clients_per_user).unwrap_or(i32::MAX),
            max_rebuild_sessions_per_client: self.max_rebuild_sessions_per_client,
            max_rebuild_bytes_per_client: self.max_rebuild_bytes_per_client,
            retry_after_seconds: self.retry_after_seconds,
            ..config
        }
    }
}

#[derive(Subcommand)]
enum RegistryCommand {
    /// Register schema-qualified relations: one, several (--relation repeated) or every table
    /// of the schema not registered yet (--all), in one transaction (all or none).
    Register {
        /// PostgreSQL connection string (synchro_operator login).
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Exact schema name.
        #[arg(long)]
        schema: String,
        /// Exact relation name; repeatable.
        #[arg(long, required_unless_present = "all")]
        relation: Vec<String>,
        /// Every ordinary or partitioned table of the schema not registered yet (partitions
        /// left out).
        #[arg(long, conflicts_with = "relation")]
        all: bool,
        /// Report every column of each relation with the portable type it would get, and
        /// whether the registration would be accepted; changes nothing (exit 1 when one would
        /// be refused).
        #[arg(long)]
        check: bool,
        /// synced or capture_dependency.
        #[arg(long, default_value = "synced")]
        kind: String,
        /// single_scope or multi_scope.
        #[arg(long, default_value = "single_scope")]
        composition: String,
        /// Refuse client pushes to this table.
        #[arg(long)]
        no_push: bool,
        /// Client-visible table name (default: the relation name; one relation only).
        #[arg(long)]
        table_name: Option<String>,
        /// Membership fanout bound.
        #[arg(long, default_value_t = 1000)]
        fanout_bound: i32,
        /// Impact bound.
        #[arg(long, default_value_t = 1000)]
        impact_bound: i32,
        /// A column that is not synced (server-only, or without a portable type); repeatable.
        /// With several relations, RELATION.COLUMN.
        #[arg(long = "server-only")]
        server_only: Vec<String>,
        /// Lifecycle columns, for every relation registered.
        #[command(flatten)]
        lifecycle: LifecycleArgs,
        /// How `timestamp` (without time zone) columns are read: ZONE for every one (a time
        /// zone PostgreSQL knows, such as Europe/Paris), COLUMN=ZONE for one (with several
        /// relations RELATION.COLUMN=ZONE), and `text` instead of a zone to sync the column as
        /// PostgreSQL's text. Default: UTC. Repeatable.
        #[arg(long = "timestamp-zone")]
        timestamp_zone: Vec<String>,
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

/// Which function runs each command (the commands' bodies live in the modules above).
async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Install {
            database_url,
            check,
        } => operator::install(&database_url, check).await,
        Command::Registry { command } => registry::run(command).await,
        Command::Publish { database_url } => operator::publish(&database_url).await,
        Command::Health { database_url } => operator::health(&database_url).await,
        Command::Serve(args) => serve::serve_command(args).await,
        Command::Capture {
            action: Some(action),
            ..
        } => operator::capture_command(action).await,
        Command::Capture {
            action: None,
            database_url,
        } => serve::capture_worker(database_url).await,
        Command::Lineage {
            command:
                LineageCommand::Reset {
                    database_url,
                    dry_run,
                    wait_secs,
                    scope,
                },
        } => match scope {
            Some(scope) => {
                operator::operator_function(
                    &database_url,
                    "SELECT synchro.synchro_lineage_reset_scope($1, $2::text::boolean)::text",
                    &[scope, dry_run.to_string()],
                )
                .await
            }
            None => operator::lineage_reset(&database_url, dry_run, wait_secs).await,
        },
        Command::Settings { database_url, set } => operator::settings(&database_url, set).await,
        Command::Probe { listen } => Ok(match crate::probe::ready(listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("synchro-server probe: {e}");
                ExitCode::FAILURE
            }
        }),
        Command::Compact {
            database_url,
            batch_size,
            every,
        } => operator::compact(&database_url, batch_size, every).await,
        Command::Codegen {
            language,
            database_url,
            out,
        } => {
            let manifest = matches!(language, CodegenLanguage::Manifest);
            operator::codegen(&database_url, manifest, out.as_deref()).await
        }
        Command::Seed { command } => operator::seed_command(command).await,
        Command::Dev {
            database_url,
            data_dir,
            fresh,
            cors_origins,
            listen,
            seed_dir,
        } => serve::run_dev(
            match (database_url, fresh) {
                (Some(url), _) => serve::DevDatabase::Url(url),
                (None, true) => serve::DevDatabase::Throwaway,
                (None, false) => serve::DevDatabase::Kept(data_dir),
            },
            listen,
            seed_dir,
            cors_origins,
        )
        .await
        .map(|()| ExitCode::SUCCESS),
    }
}
