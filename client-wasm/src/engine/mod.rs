//! The sync engine: client identity, the migration journal with the ten-step procedure of
//! spec 000 "Client Migration Rules", and the connect / push / rebuild / pull loop behind a
//! [`Transport`].
//!
//! One [`Client`] owns one local database. [`Client::open`] reads the durable journal before
//! anything else: a journal still waiting for its DDL is executed from its persisted plan
//! (re-derived from the persisted manifests and checked against its hash), a committed one
//! resumes push-first reconciliation and rebuild, and any other combination enters
//! `blocked` without a single sync request. [`Client::sync_once`] then connects, executes the
//! schema action, pushes, rebuilds every scope marked for rebuild and pulls to the terminal
//! page.
//!
//! This file is the facade and the order of a round; each step is its own file and none of
//! them calls another: `connect` (the exchange and its scope updates), `migrate` (journal,
//! DDL, recovery), `push`, `rebuild`, `pull`. No step holds SQL: they call the store.
//! `config` holds what the application sets when it opens a client ([`ClientConfig`]: the
//! runtime version presented on connect). `live` is the long-running session
//! ([`Client::run_live`]): connect once, then push and pull when the events stream, a local
//! write or the safety poll asks, with the same rounds and the same verification.
//!
//! Every state change goes through the spec 001 state machine first; an illegal transition
//! is refused before anything durable is touched.

mod config;
mod connect;
mod live;
mod migrate;
mod pull;
mod push;
mod rebuild;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::rc::Rc;

use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, SchemaRef};
use synchro_protocol::state::{ClientState, StateMachine};
use synchro_protocol::wire::Message;
/// The schema action a connect names (the wire's `schema.action`).
pub use synchro_protocol::wire::SchemaActionKind;

pub use crate::error::{ClientError, UpgradeReason};
pub use crate::store::seed::SeedOutcome;
pub use crate::store::JOURNAL_VERSION;
use crate::store::{hex, JournalError, LocalWrite, Phase, Storage, StorageError};
pub use crate::transport::{Response, Transport, TransportError};
pub use config::{ClientConfig, DEFAULT_CLIENT_VERSION};
pub use live::{LiveConfig, LiveEnd, LiveError, LiveHandle, LiveStatus, NotRunning};

/// Largest page the engine asks for (the server's limit is 1..=1000).
pub const DEFAULT_PAGE_LIMIT: u32 = 1000;

/// Where an injected crash interrupts the engine (tests only ever set one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// No interruption.
    None,
    /// After the journal commit, before the DDL transaction.
    AfterJournal,
    /// Inside the DDL transaction, after its first statement.
    InsideDdl,
    /// Inside the DDL transaction, after every statement but before the commit.
    BeforeDdlCommit,
    /// After the DDL commit, before push and rebuild.
    AfterDdlCommit,
    /// After the first rebuild page was staged.
    InsideRebuild,
    /// After every rebuild, before the journal is cleared.
    BeforeJournalClear,
    /// After a push response arrived, before its outcomes are stored.
    BeforeOutcomes,
}

/// What a long operation has done so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// `"pull"` or `"rebuild"`.
    pub phase: &'static str,
    /// The scope being rebuilt (none for pull).
    pub scope: Option<String>,
    /// Pages applied so far in this operation.
    pub pages: u64,
    /// Rows applied so far in this operation.
    pub rows: u64,
    /// A rebuild's total rows, when the server said (its `x-synchro-scope-rows` header).
    pub total_rows: Option<u64>,
}

/// What one [`Client::sync_once`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The connect action (`none`, `replace`, `rebuild_local`).
    pub action: SchemaActionKind,
    /// The scopes a `rebuild_local` action named.
    pub affected: BTreeSet<String>,
    /// Scopes rebuilt and verified.
    pub rebuilt: BTreeSet<String>,
    /// Pull pages applied.
    pub pull_pages: u64,
    /// Row changes applied from pull pages.
    pub pulled_changes: u64,
    /// Scopes whose terminal digest verified.
    pub verified: BTreeSet<String>,
}

/// A migration a connect answer asks for (connect's result, the migrate step's input).
struct Migration {
    /// The verified target manifest.
    target: Manifest,
    /// The scopes the server says must rebuild.
    affected: BTreeSet<String>,
    /// Scopes the server assigns from now on.
    added: BTreeSet<String>,
    /// Scopes the server no longer assigns.
    removed: BTreeSet<String>,
    /// Server-issued cursor replacements.
    cursor_updates: BTreeMap<String, Option<String>>,
    /// The connect asked for the explicit schema reset.
    reset: bool,
    /// The client generation and scope set version the connect gave (recorded with the
    /// journal, which carries their cursor updates).
    client: (i64, Option<i64>),
}

/// What the connect step found.
enum Connected {
    /// The schema is unchanged (its scope updates are recorded).
    Unchanged,
    /// A migration to execute.
    Migrate(Box<Migration>),
}

type Listener = Box<dyn FnMut(&BTreeSet<String>)>;
type Random = Box<dyn FnMut() -> [u8; 16]>;
type Clock = Box<dyn Fn() -> u64>;
type ProgressFn = Box<dyn FnMut(&Progress)>;

/// Milliseconds since the Unix epoch from the platform clock.
fn system_ms() -> u64 {
    #[cfg(target_arch = "wasm32")]
    {
        js_sys::Date::now() as u64
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A UUIDv7 (RFC 9562) from a millisecond Unix time and 16 random bytes.
pub fn uuid_v7(unix_ms: u64, random: [u8; 16]) -> String {
    let mut b = random;
    b[..6].copy_from_slice(&unix_ms.to_be_bytes()[2..]);
    b[6] = 0x70 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Whether `s` is a UUID in canonical form: 8-4-4-4-12 lowercase hexadecimal digits.
fn is_canonical_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// A schema reference as requests carry it (version 0 and an empty hash before install).
fn schema_json(r: Option<SchemaRef>) -> Json {
    match r {
        None => Json::Object(vec![
            ("version".into(), Json::Number("0".into())),
            ("hash".into(), Json::String(String::new())),
        ]),
        Some(r) => Json::Object(vec![
            ("version".into(), Json::Number(r.version.to_string())),
            ("hash".into(), Json::String(hex(&r.hash))),
        ]),
    }
}

/// Whether an error means "connect again, then retry" (422 schema_mismatch, 409
/// client_generation_expired, or 409 rebuild_restart_required that restarting did not clear:
/// a scope revoked since the last connect, which connect takes away).
fn needs_reconnect(e: &ClientError) -> bool {
    e.is_server("schema_mismatch")
        || e.is_server("client_generation_expired")
        || e.is_server("rebuild_restart_required")
}

/// Whether a round that failed with `e` leaves nothing to repair locally: a retryable
/// error, a reconnect the protocol asks for, or a 401 (the transport asks its token provider
/// again on the next request).
fn transient(e: &ClientError) -> bool {
    e.retryable() || needs_reconnect(e) || e.is_server("unauthorized")
}

impl From<JournalError> for ClientError {
    /// A journal that does not verify blocks the engine.
    fn from(e: JournalError) -> ClientError {
        match e {
            JournalError::Storage(e) => ClientError::Storage(e),
            JournalError::Invalid(why) => ClientError::Blocked(why),
        }
    }
}

/// A local database kept in sync with one server.
pub struct Client<T: Transport> {
    storage: Storage,
    /// Shared with the request in flight, so that the live session's closures can run on
    /// the client while it waits ([`Client::awaiting`]).
    transport: Rc<T>,
    machine: StateMachine,
    client_id: String,
    client_version: String,
    /// The opt-in conflict policy ([`ClientConfig::with_conflict_rebase`]).
    rebase_conflicts: bool,
    manifest: Option<Manifest>,
    page_limit: u32,
    failpoint: Failpoint,
    progress: Option<ProgressFn>,
    listeners: Vec<Listener>,
    random: Random,
    clock: Clock,
    /// The schema action of the last successful connect.
    last_action: Option<SchemaActionKind>,
    /// The running live session's handle: its closures run while a request is awaited.
    /// The token lives as long as the session's future (a dropped session leaves none).
    live: Option<(LiveHandle<T>, std::rc::Weak<()>)>,
    /// Whether a closure ran while a request was awaited (since the live session last
    /// took this).
    ran_while_waiting: bool,
}

impl<T: Transport> Client<T> {
    /// Opens the engine over `storage`. A new database gets a client ID from `random`
    /// (16 bytes; injected so tests and the browser choose the source). The metadata tables
    /// are brought to the current version (a database written before the version existed
    /// is adopted), then the durable journal is read: a pending one is executed, an
    /// inconsistent one is [`ClientError::Blocked`]. The client presents the crate's version
    /// ([`DEFAULT_CLIENT_VERSION`]) on connect; [`Client::open_with`] sets another.
    pub fn open(
        storage: Storage,
        transport: T,
        random: impl FnMut() -> [u8; 16] + 'static,
    ) -> Result<Client<T>, ClientError> {
        Client::open_with(storage, transport, random, ClientConfig::new())
    }

    /// [`Client::open`] with the application's settings. A `client_version` that is not
    /// SemVer 2.0.0 is [`ClientError::InvalidClientVersion`] before the database is touched.
    /// A database whose client version a server refused (HTTP 426) opens in
    /// `upgrade_required` unless `config` presents a version of higher precedence: then the
    /// next round connects again.
    pub fn open_with(
        mut storage: Storage,
        transport: T,
        mut random: impl FnMut() -> [u8; 16] + 'static,
        config: ClientConfig,
    ) -> Result<Client<T>, ClientError> {
        config.validate()?;
        let client_version = config.client_version().to_owned();
        let rebase_conflicts = config.rebases_conflicts();
        let identity = storage.open_client(|| hex(&random()))?;
        let manifest = storage.active_schema()?;
        let runtime_refused = identity
            .refused_client_version
            .as_deref()
            .is_some_and(|refused| config::still_refused(&client_version, refused));
        let state = match (&manifest, identity.upgrade_required || runtime_refused) {
            (_, true) => ClientState::UpgradeRequired,
            (None, _) => ClientState::Fresh,
            (Some(_), _) => ClientState::Stopped,
        };
        let mut client = Client {
            storage,
            transport: Rc::new(transport),
            machine: StateMachine::new(state),
            client_id: identity.client_id,
            client_version,
            rebase_conflicts,
            manifest,
            page_limit: DEFAULT_PAGE_LIMIT,
            failpoint: Failpoint::None,
            progress: None,
            listeners: Vec::new(),
            random: Box::new(random),
            clock: Box::new(system_ms),
            last_action: None,
            live: None,
            ran_while_waiting: false,
        };
        client.recover()?;
        Ok(client)
    }

    /// Opens the database at `database`, created from the portable seed artifact at `seed`
    /// when it does not exist yet ([`Storage::open_seeded`]: the seed is verified before
    /// anything of it is used), then the engine over it as [`Client::open_with`] does. The
    /// first connect presents the seed's receipts; each scope the server accepts continues
    /// from the seed's boundary with a normal pull, any other rebuilds (push first). A seed
    /// that fails verification is reported in the outcome and the client starts fresh.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_from_seed(
        database: &std::path::Path,
        seed: &std::path::Path,
        transport: T,
        random: impl FnMut() -> [u8; 16] + 'static,
        config: ClientConfig,
    ) -> Result<(Client<T>, SeedOutcome), ClientError> {
        config.validate()?;
        let (storage, outcome) = Storage::open_seeded(database, seed)?;
        Ok((
            Client::open_with(storage, transport, random, config)?,
            outcome,
        ))
    }

    /// The client ID (random, stable for the database's life).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The runtime version this client presents as `client_version` on connect.
    pub fn client_version(&self) -> &str {
        &self.client_version
    }

    /// The engine state.
    pub fn state(&self) -> ClientState {
        self.machine.state()
    }

    /// The schema action (`none`, `replace`, `rebuild_local`, ...) of the last successful
    /// connect of this engine, if it connected.
    pub fn last_action(&self) -> Option<SchemaActionKind> {
        self.last_action
    }

    /// The active manifest, if one is installed.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// The local database.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Gives the storage back (closing the engine).
    pub fn into_storage(self) -> Storage {
        self.storage
    }

    /// Page size for pull and rebuild requests (1..=1000).
    pub fn set_page_limit(&mut self, limit: u32) {
        self.page_limit = limit.clamp(1, 1000);
    }

    /// Arms an injected interruption (tests).
    pub fn set_failpoint(&mut self, failpoint: Failpoint) {
        self.failpoint = failpoint;
    }

    /// Replaces the clock used for mutation IDs (milliseconds since the Unix epoch).
    pub fn set_clock(&mut self, clock: impl Fn() -> u64 + 'static) {
        self.clock = Box::new(clock);
    }

    /// Writes to a synced table and queues the intent in one transaction (spec 000
    /// "Authored-Schema Queued Mutations"); returns the mutation ID (a UUIDv7 from the
    /// injected clock and randomness). The intent is authored under the active schema.
    pub fn write(&mut self, write: &LocalWrite<'_>) -> Result<String, ClientError> {
        let manifest = self
            .manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))?;
        if self.storage.journal_phase()? == Some(Phase::Pending) {
            return Err(ClientError::Blocked(
                "a pending migration must finish before local writes",
            ));
        }
        let now = (self.clock)();
        let ids = (uuid_v7(now, (self.random)()), uuid_v7(now, (self.random)()));
        self.write_local(&manifest, write, ids)
    }

    /// [`Client::write`] under a mutation ID the caller chose (a canonical lowercase UUID),
    /// at most once: when the queue already holds `mutation_id`, nothing is written and the
    /// ID is returned. A caller that may send one write twice (a request re-sent after the
    /// process that received it went away, not knowing whether it committed) gives each
    /// write its own ID and so never queues it twice.
    pub fn write_once(
        &mut self,
        write: &LocalWrite<'_>,
        mutation_id: &str,
    ) -> Result<String, ClientError> {
        let manifest = self
            .manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))?;
        if !is_canonical_uuid(mutation_id) {
            return Err(ClientError::Storage(StorageError::InvalidValue {
                field_id: "(mutation_id)".into(),
            }));
        }
        if self.storage.has_mutation(mutation_id)? {
            return Ok(mutation_id.to_owned());
        }
        if self.storage.journal_phase()? == Some(Phase::Pending) {
            return Err(ClientError::Blocked(
                "a pending migration must finish before local writes",
            ));
        }
        let batch = uuid_v7((self.clock)(), (self.random)());
        self.write_local(&manifest, write, (mutation_id.to_owned(), batch))
    }

    /// Clears resolved intent from the queue: every mutation that has its outcome (applied,
    /// conflict, rejected_terminal) and that outcome, in one transaction; returns how many
    /// were cleared. The queue keeps an outcome and its mutation for inspection until the
    /// application clears them (spec 003); this is that explicit policy, for an application
    /// that has read what it needs. Unresolved intent is never touched. The IDs cleared
    /// among the last 10,000 local writes are remembered, so [`Client::write_once`] under
    /// one still writes nothing (a re-sent write is not applied locally a second time).
    pub fn clear_resolved(&mut self) -> Result<usize, ClientError> {
        Ok(self.storage.clear_resolved()?)
    }

    fn write_local(
        &mut self,
        manifest: &Manifest,
        write: &LocalWrite<'_>,
        ids: (String, String),
    ) -> Result<String, ClientError> {
        let id = self.storage.write_local(manifest, write, ids)?;
        let name = manifest
            .table(write.table_id)
            .map(|t| t.name.clone())
            .unwrap_or_default();
        self.notify(BTreeSet::from([name]));
        Ok(id)
    }

    /// Reports progress of pulls and rebuilds.
    pub fn on_progress(&mut self, f: impl FnMut(&Progress) + 'static) {
        self.progress = Some(Box::new(f));
    }

    /// Calls `f` with the names of the synced tables a committed page changed.
    pub fn subscribe(&mut self, f: impl FnMut(&BTreeSet<String>) + 'static) {
        self.listeners.push(Box::new(f));
    }

    /// Connects and executes the schema action (steps 1-6 for replace and rebuild_local).
    /// Returns the action and, for `rebuild_local`, the affected scopes.
    pub async fn connect(&mut self) -> Result<(SchemaActionKind, BTreeSet<String>), ClientError> {
        self.may_connect()?;
        self.go(ClientState::Connecting)?;
        match self.connect_and_migrate().await {
            Ok(action) => {
                self.last_action = Some(action.0);
                Ok(action)
            }
            Err(e) => {
                let back = match &e {
                    ClientError::UpgradeRequired(_) => ClientState::UpgradeRequired,
                    // An interrupted migration keeps its durable journal: the engine stops
                    // and the next round (or restart) continues from the journal.
                    _ if self.machine.state() == ClientState::Migrating => ClientState::Stopped,
                    e if transient(e) || matches!(e, ClientError::Injected) => {
                        if self.manifest.is_some() {
                            ClientState::Idle
                        } else {
                            ClientState::Fresh
                        }
                    }
                    _ => ClientState::Blocked,
                };
                // Every `back` above is a legal successor of the state it can fail in.
                let _ = self.go(back);
                Err(e)
            }
        }
    }

    async fn connect_and_migrate(
        &mut self,
    ) -> Result<(SchemaActionKind, BTreeSet<String>), ClientError> {
        let (action, affected, connected) = self.exchange().await?;
        match connected {
            Connected::Unchanged => self.go(ClientState::Idle)?,
            Connected::Migrate(migration) => {
                // Step 1: push and pull are paused while migrating.
                self.go(ClientState::Migrating)?;
                self.migrate(*migration)?;
            }
        }
        Ok((action, affected))
    }

    /// One full round: recover or connect, execute the schema action, push, rebuild every
    /// marked scope (verifying each final checksum), clear a finished journal, and pull to
    /// the terminal page (verifying every terminal scope digest).
    pub async fn sync_once(&mut self) -> Result<SyncReport, ClientError> {
        match self.sync_round().await {
            Err(e) if needs_reconnect(&e) => {
                // A schema or generation change under us: connect again and retry once.
                self.reset_to_idle();
                self.sync_round().await
            }
            other => other,
        }
    }

    async fn sync_round(&mut self) -> Result<SyncReport, ClientError> {
        let mut report = SyncReport::default();
        let state = self.machine.state();
        if state == ClientState::Blocked {
            return Err(ClientError::Blocked("the engine is blocked"));
        }
        self.may_connect()?;
        // A journal still waiting for its DDL (an interruption in this process) runs first.
        if self.storage.journal_phase()? == Some(Phase::Pending) {
            self.recover()?;
        }
        // A committed journal from before a restart resumes after connect: push first,
        // then its rebuilds (the markers are durable), then the journal is cleared.
        (report.action, report.affected) = self.connect().await?;
        let result = self.after_connect(&mut report).await;
        self.settle(&result);
        result.map(|()| report)
    }

    /// A round of an already connected client (a live session between connects): push,
    /// rebuild what is marked, pull to the terminal page, each page verified exactly as in
    /// [`Client::sync_once`]. The engine must be idle after a successful connect.
    async fn connected_round(&mut self) -> Result<SyncReport, ClientError> {
        if self.machine.state() != ClientState::Idle {
            return Err(ClientError::Blocked("the engine is not connected"));
        }
        let mut report = SyncReport {
            action: SchemaActionKind::None,
            ..SyncReport::default()
        };
        let result = self.after_connect(&mut report).await;
        self.settle(&result);
        result.map(|()| report)
    }

    /// The state after a round's steps: idle when the next round can retry (a network or
    /// retryable server error, a refused page, a reconnect or a new token asked for),
    /// blocked otherwise.
    fn settle(&mut self, result: &Result<(), ClientError>) {
        let Err(e) = result else { return };
        let to = if transient(e) || matches!(e, ClientError::Injected) {
            ClientState::Idle
        } else if matches!(e, ClientError::Storage(StorageError::Verification(_))) {
            // A page that fails verification is refused; the next round retries.
            ClientState::Idle
        } else {
            ClientState::Blocked
        };
        // A transition the state map does not list is not made (the machine stays put): the
        // next round starts from there, and every state it can be in may connect again.
        let _ = self.go(to);
    }

    async fn after_connect(&mut self, report: &mut SyncReport) -> Result<(), ClientError> {
        // Step 7: push first (under the target schema after a migration).
        self.go(ClientState::Pushing)?;
        self.push_pending().await?;
        // Step 8: rebuild every marked scope.
        self.rebuild_marked(report).await?;
        // Step 9: the journal goes last.
        self.finish_journal()?;
        // Step 10: normal pull.
        self.go(ClientState::Idle)?;
        self.go(ClientState::Pulling)?;
        self.pull(report).await?;
        // A terminal digest mismatch scheduled a rebuild: do it now, then pull again.
        if self.rebuild_marked(report).await? {
            self.go(ClientState::Idle)?;
            self.go(ClientState::Pulling)?;
            self.pull(report).await?;
        }
        self.go(ClientState::Idle)?;
        Ok(())
    }

    // ----- shared by the steps -----------------------------------------------------------

    /// In `upgrade_required`, nothing is sent while the server's refusal of this client
    /// version holds, nor (after `unsupported`) until the application asked for the reset.
    fn may_connect(&self) -> Result<(), ClientError> {
        if self.machine.state() != ClientState::UpgradeRequired {
            return Ok(());
        }
        if let Some(refused) = self.storage.refused_client_version()? {
            if config::still_refused(&self.client_version, &refused) {
                return Err(ClientError::UpgradeRequired(UpgradeReason::ClientRuntime));
            }
        }
        if !self.storage.reset_requested()? {
            return Err(ClientError::UpgradeRequired(UpgradeReason::SchemaHistory));
        }
        Ok(())
    }

    fn go(&mut self, to: ClientState) -> Result<(), ClientError> {
        if self.machine.state() == to {
            return Ok(());
        }
        self.machine
            .apply(to)
            .map_err(ClientError::IllegalTransition)
    }

    /// Back to idle for a retried round, when the state map allows it; otherwise the state
    /// stays (a fresh, stopped or upgrade-required engine connects from where it is).
    fn reset_to_idle(&mut self) {
        let _ = self.go(ClientState::Idle);
    }

    fn fail(&self, at: Failpoint) -> Result<(), ClientError> {
        if self.failpoint == at {
            Err(ClientError::Injected)
        } else {
            Ok(())
        }
    }

    fn notify(&mut self, tables: BTreeSet<String>) {
        if tables.is_empty() {
            return;
        }
        for l in &mut self.listeners {
            l(&tables);
        }
    }

    fn report(&mut self, p: Progress) {
        if let Some(f) = &mut self.progress {
            f(&p);
        }
    }

    /// A new UUIDv7 from the injected clock and randomness.
    fn new_id(&mut self) -> String {
        uuid_v7((self.clock)(), (self.random)())
    }

    /// Assigned scopes with `(cursor, rebuild)` (none before a schema is installed).
    fn scopes(&self) -> Result<BTreeMap<String, (Option<String>, bool)>, ClientError> {
        if self.manifest.is_none() {
            return Ok(BTreeMap::new());
        }
        Ok(self.storage.scopes()?)
    }

    /// The active manifest, which the step needs.
    fn active(&self) -> Result<Manifest, ClientError> {
        self.manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))
    }

    /// The names of every synced table of `manifest`.
    fn table_names(manifest: &Manifest) -> BTreeSet<String> {
        manifest.tables.iter().map(|t| t.name.clone()).collect()
    }

    async fn post(
        &mut self,
        path: &'static str,
        request: &impl Message,
    ) -> Result<Response, ClientError> {
        let asked = self.send(path, to_output_string(&request.to_json()));
        Ok(self.awaiting(asked).await?)
    }

    /// Sends a request; the future holds the transport, not the client.
    fn send(
        &self,
        path: &'static str,
        body: String,
    ) -> impl Future<Output = Result<Response, TransportError>> {
        let transport = Rc::clone(&self.transport);
        async move { transport.post(path, body).await }
    }

    fn schema_json(&self) -> Json {
        schema_json(self.manifest.as_ref().map(Manifest::schema_ref))
    }

    /// The generation every request after connect carries.
    fn connected_generation(&self) -> Result<u64, ClientError> {
        self.storage.generation()?.ok_or(ClientError::Blocked(
            "the client has no generation; connect first",
        ))
    }
}
