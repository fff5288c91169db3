//! The sync engine: client identity, the migration journal with the ten-step procedure of
//! spec 000 "Client Migration Rules", and the connect / rebuild / pull loop behind a
//! [`Transport`].
//!
//! One [`Client`] owns one local database. [`Client::open`] reads the durable journal before
//! anything else: a journal still waiting for its DDL is executed from its persisted plan
//! (re-derived from the persisted manifests and checked against its hash), a committed one
//! resumes push-first reconciliation and rebuild, and any other combination enters
//! `blocked` without a single sync request. [`Client::sync_once`] then connects, executes the
//! schema action, rebuilds every scope marked for rebuild and pulls to the terminal page.
//!
//! Every state change goes through the spec 001 state machine first; an illegal transition
//! is refused before anything durable is touched.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, OptionalExtension};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, SchemaRef};
use synchro_protocol::migration::{MigrationPlan, MIGRATION_PLAN_VERSION};
use synchro_protocol::state::{ClientState, StateMachine};
use synchro_protocol::wire::{
    ConnectRequest, ConnectResponse, ErrorBody, Message, PullRequest, PullResponse, PushRequest,
    RebuildEnd, RebuildRequest, RebuildResponse,
};

use crate::storage::{Storage, StorageError};

/// Engine tables that exist before any schema is installed.
const CLIENT_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_client" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "client_id" TEXT NOT NULL, "client_generation" INTEGER, "scope_set_version" INTEGER, "upgrade_required" INTEGER NOT NULL DEFAULT 0 CHECK ("upgrade_required" IN (0, 1)), "reset_requested" INTEGER NOT NULL DEFAULT 0 CHECK ("reset_requested" IN (0, 1))) STRICT"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_journal" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "journal_version" INTEGER NOT NULL, "source_version" INTEGER, "source_hash" TEXT, "source_body" TEXT, "target_version" INTEGER NOT NULL, "target_hash" TEXT NOT NULL, "target_body" TEXT NOT NULL, "action" TEXT NOT NULL CHECK ("action" IN ('replace', 'rebuild_local')), "affected_scopes" TEXT NOT NULL, "cursor_updates" TEXT NOT NULL, "migration_plan_version" INTEGER NOT NULL, "plan" TEXT NOT NULL, "plan_hash" TEXT NOT NULL, "phase" TEXT NOT NULL CHECK ("phase" IN ('pending', 'committed')), "reset" INTEGER NOT NULL DEFAULT 0 CHECK ("reset" IN (0, 1))) STRICT"#,
];

/// The journal layout this engine writes and reads.
pub const JOURNAL_VERSION: i64 = 1;

/// Largest page the engine asks for (the server's limit is 1..=1000).
pub const DEFAULT_PAGE_LIMIT: u32 = 1000;

pub use crate::error::ClientError;
pub use crate::transport::{Response, Transport, TransportError};

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
}

/// What one [`Client::sync_once`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The connect action (`none`, `replace`, `rebuild_local`).
    pub action: String,
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

type Listener = Box<dyn FnMut(&BTreeSet<String>)>;
type Random = Box<dyn FnMut() -> [u8; 16]>;
type Clock = Box<dyn Fn() -> u64>;

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
type ProgressFn = Box<dyn FnMut(&Progress)>;

/// A local database kept in sync with one server.
pub struct Client<T: Transport> {
    storage: Storage,
    transport: T,
    machine: StateMachine,
    client_id: String,
    manifest: Option<Manifest>,
    page_limit: u32,
    failpoint: Failpoint,
    progress: Option<ProgressFn>,
    listeners: Vec<Listener>,
    random: Random,
    clock: Clock,
}

/// The persisted journal.
struct Journal {
    source: Option<Manifest>,
    target: Manifest,
    affected: BTreeSet<String>,
    cursor_updates: BTreeMap<String, Option<String>>,
    plan_hash: String,
    phase: String,
    reset: bool,
}

fn json_strings(items: impl IntoIterator<Item = String>) -> Json {
    Json::Array(items.into_iter().map(Json::String).collect())
}

fn string_set(j: Option<&Json>) -> Result<BTreeSet<String>, ClientError> {
    match j {
        None | Some(Json::Null) => Ok(BTreeSet::new()),
        Some(Json::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or(ClientError::Malformed("a scope list holds a non-string"))
            })
            .collect(),
        Some(_) => Err(ClientError::Malformed("a scope list is not an array")),
    }
}

fn cursor_map(j: Option<&Json>) -> Result<BTreeMap<String, Option<String>>, ClientError> {
    match j {
        None | Some(Json::Null) => Ok(BTreeMap::new()),
        Some(Json::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Json::Null => Ok((k.clone(), None)),
                Json::String(s) => Ok((k.clone(), Some(s.clone()))),
                _ => Err(ClientError::Malformed(
                    "a cursor update is not a string or null",
                )),
            })
            .collect(),
        Some(_) => Err(ClientError::Malformed("cursor updates are not an object")),
    }
}

fn cursor_json(m: &BTreeMap<String, Option<String>>) -> String {
    to_output_string(&Json::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(Json::Null, Json::String)))
            .collect(),
    ))
}

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn server_error(r: &Response) -> ClientError {
    match ErrorBody::from_json(&r.body) {
        Ok(e) => ClientError::Server {
            status: r.status,
            code: e.code.as_str().to_owned(),
            retryable: e.code.retryable(),
        },
        // Not a protocol 3 error body (a proxy's answer, say): a 5xx may be retried.
        Err(_) => ClientError::Server {
            status: r.status,
            code: "unknown_error".to_owned(),
            retryable: r.status >= 500,
        },
    }
}

/// Whether an error means "connect again, then retry" (422 schema_mismatch or
/// 409 client_generation_expired).
fn needs_reconnect(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { code, .. }
        if code == "schema_mismatch" || code == "client_generation_expired")
}

impl<T: Transport> Client<T> {
    /// Opens the engine over `storage`. A new database gets a client ID from `random`
    /// (16 bytes; injected so tests and the browser choose the source). The durable journal
    /// is read first: a pending one is executed, an inconsistent one is
    /// [`ClientError::Blocked`].
    pub fn open(
        mut storage: Storage,
        transport: T,
        mut random: impl FnMut() -> [u8; 16] + 'static,
    ) -> Result<Client<T>, ClientError> {
        let tx = storage.conn_mut().transaction()?;
        for ddl in CLIENT_DDL.iter().chain(crate::queue::QUEUE_DDL) {
            tx.execute_batch(ddl)?;
        }
        let existing: Option<(String, i64)> = tx
            .query_row(
                r#"SELECT "client_id", "upgrade_required" FROM "_synchro_client" WHERE "id" = 1"#,
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (client_id, upgrade_required) = match existing {
            Some(v) => v,
            None => {
                let id = hex(&random());
                tx.execute(
                    r#"INSERT INTO "_synchro_client" ("id", "client_id") VALUES (1, ?)"#,
                    [&id],
                )?;
                (id, 0)
            }
        };
        tx.commit()?;
        let manifest = storage.active_schema()?;
        let state = match (&manifest, upgrade_required) {
            (_, 1) => ClientState::UpgradeRequired,
            (None, _) => ClientState::Fresh,
            (Some(_), _) => ClientState::Stopped,
        };
        let mut client = Client {
            storage,
            transport,
            machine: StateMachine::new(state),
            client_id,
            manifest,
            page_limit: DEFAULT_PAGE_LIMIT,
            failpoint: Failpoint::None,
            progress: None,
            listeners: Vec::new(),
            random: Box::new(random),
            clock: Box::new(system_ms),
        };
        client.recover()?;
        Ok(client)
    }

    /// The client ID (random, stable for the database's life).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The engine state.
    pub fn state(&self) -> ClientState {
        self.machine.state()
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
    pub fn write(&mut self, write: &crate::queue::LocalWrite<'_>) -> Result<String, ClientError> {
        let manifest = self
            .manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))?;
        if self.journal_phase()?.as_deref() == Some("pending") {
            return Err(ClientError::Blocked(
                "a pending migration must finish before local writes",
            ));
        }
        let now = (self.clock)();
        let ids = (
            crate::queue::uuid_v7(now, (self.random)()),
            crate::queue::uuid_v7(now, (self.random)()),
        );
        let id = self.storage.write_local(&manifest, write, ids)?;
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

    fn go(&mut self, to: ClientState) -> Result<(), ClientError> {
        if self.machine.state() == to {
            return Ok(());
        }
        self.machine
            .apply(to)
            .map_err(ClientError::IllegalTransition)
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

    fn conn(&self) -> &rusqlite::Connection {
        self.storage.connection()
    }

    fn generation(&self) -> Result<Option<u64>, ClientError> {
        Ok(self
            .conn()
            .query_row(
                r#"SELECT "client_generation" FROM "_synchro_client" WHERE "id" = 1"#,
                [],
                |r| r.get::<_, Option<i64>>(0),
            )?
            .map(|g| g as u64))
    }

    /// Assigned scopes with `(cursor, rebuild)`.
    fn scopes(&self) -> Result<BTreeMap<String, (Option<String>, bool)>, ClientError> {
        if self.manifest.is_none() {
            return Ok(BTreeMap::new());
        }
        let mut q = self.conn().prepare(
            r#"SELECT "scope_id", coalesce("pending_cursor", "cursor"), "rebuild" FROM "_synchro_scopes""#,
        )?;
        let out = q
            .query_map([], |r| {
                Ok((r.get(0)?, (r.get(1)?, r.get::<_, i64>(2)? == 1)))
            })?
            .collect::<Result<_, _>>()?;
        Ok(out)
    }

    // ----- the journal -------------------------------------------------------------------

    fn read_journal(&self) -> Result<Option<Journal>, ClientError> {
        type Row = (
            i64,
            Option<String>,
            String,
            String,
            String,
            String,
            i64,
            String,
            String,
            bool,
        );
        let row: Option<Row> = self
            .conn()
            .query_row(
                r#"SELECT "journal_version", "source_body", "target_body", "action", "affected_scopes",
                          "cursor_updates", "migration_plan_version", "plan_hash", "phase", "reset"
                     FROM "_synchro_journal" WHERE "id" = 1"#,
                [],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                    ))
                },
            )
            .optional()?;
        let Some((
            version,
            source,
            target,
            action,
            affected,
            cursors,
            plan_version,
            hash,
            phase,
            reset,
        )) = row
        else {
            return Ok(None);
        };
        let bad = |_| ClientError::Blocked("the migration journal does not verify");
        if version != JOURNAL_VERSION || plan_version != MIGRATION_PLAN_VERSION as i64 {
            return Err(ClientError::Blocked(
                "the migration journal has an unknown version",
            ));
        }
        let affected_set = string_set(Some(&Json::parse(&affected).map_err(bad)?))
            .map_err(|_| ClientError::Blocked("the migration journal does not verify"))?;
        if (action == "rebuild_local") == affected_set.is_empty() {
            return Err(ClientError::Blocked(
                "the migration journal's action and affected scopes disagree",
            ));
        }
        Ok(Some(Journal {
            source: source
                .map(|b| Manifest::parse(&b))
                .transpose()
                .map_err(bad)?,
            target: Manifest::parse(&target).map_err(bad)?,
            affected: affected_set,
            cursor_updates: cursor_map(Some(&Json::parse(&cursors).map_err(bad)?))
                .map_err(|_| ClientError::Blocked("the migration journal does not verify"))?,
            plan_hash: hash,
            phase,
            reset,
        }))
    }

    /// Restart recovery (spec 000 "Durable Migration State"): never sends a request.
    fn recover(&mut self) -> Result<(), ClientError> {
        let Some(journal) = self.read_journal()? else {
            return Ok(());
        };
        let active = self.manifest.as_ref().map(Manifest::schema_ref);
        match journal.phase.as_str() {
            "pending" if active == journal.source.as_ref().map(Manifest::schema_ref) => {
                self.go(ClientState::Connecting)?;
                self.go(ClientState::Migrating)?;
                let result = self.execute_journal();
                // The journal stays durable either way; the next round continues from it.
                self.go(ClientState::Stopped)?;
                result
            }
            "committed" if active == Some(journal.target.schema_ref()) => Ok(()),
            _ => {
                self.machine = StateMachine::new(ClientState::Blocked);
                Err(ClientError::Blocked(
                    "the migration journal and the active schema disagree",
                ))
            }
        }
    }

    /// Steps 2-6: persists the journal, then executes it.
    fn migrate(
        &mut self,
        target: Manifest,
        action: &str,
        mut affected: BTreeSet<String>,
        cursor_updates: BTreeMap<String, Option<String>>,
        reset: bool,
    ) -> Result<(), ClientError> {
        let source = self.manifest.clone();
        // A committed journal still waiting for rebuild carries its unfinished scopes over.
        if let Some(earlier) = self.read_journal()? {
            if earlier.phase != "committed" {
                return Err(ClientError::Blocked(
                    "an earlier migration has not committed its DDL",
                ));
            }
            let pending = self.scopes()?;
            affected.extend(
                earlier
                    .affected
                    .into_iter()
                    .filter(|s| pending.get(s).is_some_and(|(_, rebuild)| *rebuild)),
            );
        }
        let plan = MigrationPlan::derive(source.as_ref(), &target, reset)
            .map_err(StorageError::Protocol)?;
        let action = if affected.is_empty() {
            "replace"
        } else {
            match action {
                "replace" | "rebuild_local" => "rebuild_local",
                _ => return Err(ClientError::Malformed("an unknown migration action")),
            }
        };
        let tx = self.storage.conn_mut().transaction()?;
        tx.execute(r#"DELETE FROM "_synchro_journal""#, [])?;
        tx.execute(
            r#"INSERT INTO "_synchro_journal" VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)"#,
            params![
                JOURNAL_VERSION,
                source.as_ref().map(|m| m.schema_version as i64),
                source.as_ref().map(Manifest::schema_hash_hex),
                source.as_ref().map(Manifest::canonical_body),
                target.schema_version as i64,
                target.schema_hash_hex(),
                target.canonical_body(),
                action,
                to_output_string(&json_strings(affected.iter().cloned())),
                cursor_json(&cursor_updates),
                MIGRATION_PLAN_VERSION as i64,
                plan.to_json_string(),
                hex(&plan.plan_hash()),
                reset,
            ],
        )?;
        tx.commit()?;
        self.fail(Failpoint::AfterJournal)?;
        self.execute_journal()
    }

    /// Steps 3-6: the plan's DDL, the target schema record, cursor replacements and rebuild
    /// markers, and the journal phase, in one transaction.
    fn execute_journal(&mut self) -> Result<(), ClientError> {
        let journal = self
            .read_journal()?
            .ok_or(ClientError::Blocked("the migration journal vanished"))?;
        let plan =
            MigrationPlan::derive(journal.source.as_ref(), &journal.target, journal.reset)
                .map_err(|_| ClientError::Blocked("the journaled plan cannot be derived again"))?;
        if hex(&plan.plan_hash()) != journal.plan_hash {
            return Err(ClientError::Blocked(
                "the journaled plan does not match its manifests",
            ));
        }
        let failpoint = self.failpoint;
        let fail = |at| {
            if failpoint == at {
                Err(ClientError::Injected)
            } else {
                Ok(())
            }
        };
        let tx = self.storage.conn_mut().transaction()?;
        for (i, statement) in plan.render().iter().enumerate() {
            tx.execute_batch(statement)?;
            if i == 0 {
                fail(Failpoint::InsideDdl)?;
            }
        }
        for statement in crate::apply::METADATA_DDL
            .iter()
            .chain(crate::queue::QUEUE_DDL)
        {
            tx.execute_batch(statement)?;
        }
        // Row digests bind the schema hash: the rows kept in place are digested again.
        if journal.source.is_some() {
            crate::apply::redigest_rows(&tx, &journal.target)?;
        }
        // Server-issued replacements for unaffected scopes; null means rebuild.
        for (scope, cursor) in &journal.cursor_updates {
            if journal.affected.contains(scope) {
                continue;
            }
            tx.execute(
                r#"INSERT INTO "_synchro_scopes" ("scope_id", "cursor", "rebuild") VALUES (?1, ?2, ?3)
                   ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = ?2, "pending_cursor" = NULL, "rebuild" = ?3"#,
                params![scope, cursor, i64::from(cursor.is_none())],
            )?;
        }
        for scope in &journal.affected {
            tx.execute(
                r#"INSERT INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?1, 1)
                   ON CONFLICT ("scope_id") DO UPDATE SET "cursor" = NULL, "pending_cursor" = NULL, "rebuild" = 1"#,
                [scope],
            )?;
        }
        // A cursor under the source schema that got no replacement cannot continue.
        tx.execute(
            r#"UPDATE "_synchro_scopes" SET "pending_cursor" = NULL"#,
            [],
        )?;
        tx.execute(
            r#"UPDATE "_synchro_journal" SET "phase" = 'committed' WHERE "id" = 1"#,
            [],
        )?;
        if journal.reset {
            // The reset reached the current schema: the client may sync again.
            tx.execute(
                r#"UPDATE "_synchro_client" SET "upgrade_required" = 0, "reset_requested" = 0 WHERE "id" = 1"#,
                [],
            )?;
        }
        fail(Failpoint::BeforeDdlCommit)?;
        tx.commit()?;
        self.manifest = Some(journal.target.clone());
        let tables = journal
            .target
            .tables
            .iter()
            .map(|t| t.name.clone())
            .collect();
        self.notify(tables);
        self.fail(Failpoint::AfterDdlCommit)
    }

    /// Step 9: clears a committed journal once none of its scopes still rebuilds.
    fn finish_journal(&mut self) -> Result<(), ClientError> {
        let Some(journal) = self.read_journal()? else {
            return Ok(());
        };
        if journal.phase != "committed" {
            return Ok(());
        }
        let scopes = self.scopes()?;
        if journal
            .affected
            .iter()
            .any(|s| scopes.get(s).is_some_and(|(_, rebuild)| *rebuild))
        {
            return Ok(());
        }
        self.fail(Failpoint::BeforeJournalClear)?;
        self.conn()
            .execute(r#"DELETE FROM "_synchro_journal""#, [])?;
        Ok(())
    }

    /// Whether a migration journal is durable (pending or waiting for rebuild).
    pub fn journal_phase(&self) -> Result<Option<String>, ClientError> {
        Ok(self
            .conn()
            .query_row(
                r#"SELECT "phase" FROM "_synchro_journal" WHERE "id" = 1"#,
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    // ----- requests ----------------------------------------------------------------------

    async fn post(&self, path: &str, body: Json) -> Result<Response, ClientError> {
        Ok(self.transport.post(path, to_output_string(&body)).await?)
    }

    fn schema_json(&self) -> Json {
        schema_json(self.manifest.as_ref().map(Manifest::schema_ref))
    }

    /// The generation every request after connect carries.
    fn connected_generation(&self) -> Result<u64, ClientError> {
        self.generation()?.ok_or(ClientError::Blocked(
            "the client has no generation; connect first",
        ))
    }

    /// Connects and executes the schema action (steps 1-6 for replace and rebuild_local).
    /// Returns the action's name and, for `rebuild_local`, the affected scopes.
    pub async fn connect(&mut self) -> Result<(String, BTreeSet<String>), ClientError> {
        self.go(ClientState::Connecting)?;
        match self.connect_inner().await {
            Ok(action) => Ok(action),
            Err(e) => {
                let back = match &e {
                    ClientError::UpgradeRequired(_) => ClientState::UpgradeRequired,
                    // An interrupted migration keeps its durable journal: the engine stops
                    // and the next round (or restart) continues from the journal.
                    _ if self.machine.state() == ClientState::Migrating => ClientState::Stopped,
                    e if e.retryable() || matches!(e, ClientError::Injected) => {
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

    async fn connect_inner(&mut self) -> Result<(String, BTreeSet<String>), ClientError> {
        if let Some(j) = self.read_journal()? {
            if j.phase != "committed" {
                return Err(ClientError::Blocked(
                    "a pending migration must finish before connecting",
                ));
            }
        }
        let reset = self.reset_requested()?;
        let request = ConnectRequest {
            client_id: self.client_id.clone(),
            client_generation: self.generation()?,
            schema: self.schema_json(),
            schema_reset: reset,
            client_version: None,
            scope_cursors: self
                .scopes()?
                .into_iter()
                .filter_map(|(s, (c, _))| c.map(|c| (s, Some(c))))
                .collect(),
        };
        let r = self.post("/sync/connect", request.to_json()).await?;
        if r.status == 426 {
            self.set_upgrade_required()?;
            return Err(ClientError::UpgradeRequired(
                "the server requires an upgrade",
            ));
        }
        if r.status != 200 {
            return Err(server_error(&r));
        }
        let b =
            ConnectResponse::from_json(&r.body).map_err(|e| ClientError::Malformed(e.message))?;
        let generation = i64::try_from(b.client_generation)
            .map_err(|_| ClientError::Malformed("client_generation is out of range"))?;
        let scope_set_version = i64::try_from(b.scope_set_version).ok();
        let added: BTreeSet<String> = b.scope_updates.added.iter().cloned().collect();
        let removed: BTreeSet<String> = b.scope_updates.removed.iter().cloned().collect();
        let action = b.schema.action.clone();
        let cursor_updates = b.scope_cursor_updates.clone();
        let affected: BTreeSet<String> = b.affected_scopes.iter().flatten().cloned().collect();
        self.conn().execute(
            r#"UPDATE "_synchro_client" SET "client_generation" = ?, "scope_set_version" = ? WHERE "id" = 1"#,
            params![generation, scope_set_version],
        )?;
        match action.as_str() {
            "none" => {
                if self.manifest.is_none() {
                    return Err(ClientError::Malformed("action none without a schema"));
                }
                self.assign(&added, &removed)?;
                self.go(ClientState::Idle)?;
            }
            "replace" | "rebuild_local" => {
                let definition = b.schema_definition.as_ref().ok_or(ClientError::Malformed(
                    "a migration without schema_definition",
                ))?;
                let target = Manifest::from_json(definition)
                    .map_err(|_| ClientError::Malformed("schema_definition does not verify"))?;
                if (b.schema.version, b.schema.hash.as_str())
                    != (target.schema_version, target.schema_hash_hex().as_str())
                {
                    return Err(ClientError::Malformed(
                        "schema_definition is not the announced schema",
                    ));
                }
                if action == "rebuild_local" && affected.is_empty() {
                    return Err(ClientError::Malformed(
                        "rebuild_local without affected_scopes",
                    ));
                }
                // Step 1: push and pull are paused while migrating.
                self.go(ClientState::Migrating)?;
                if let Some(m) = self.manifest.clone() {
                    let gone: Vec<String> = removed.iter().cloned().collect();
                    self.storage.release_scopes(&m, &gone)?;
                }
                let mut cursor_updates = cursor_updates;
                for s in &added {
                    cursor_updates.entry(s.clone()).or_insert(None);
                }
                self.migrate(target, &action, affected.clone(), cursor_updates, reset)?;
            }
            "unsupported" => {
                self.set_upgrade_required()?;
                return Err(ClientError::UpgradeRequired(
                    "the schema history crossed an incompatible change",
                ));
            }
            _ => return Err(ClientError::Malformed("an unknown schema action")),
        }
        Ok((action, affected))
    }

    fn reset_requested(&self) -> Result<bool, ClientError> {
        Ok(self.conn().query_row(
            r#"SELECT "reset_requested" FROM "_synchro_client" WHERE "id" = 1"#,
            [],
            |r| r.get(0),
        )?)
    }

    /// After an application upgrade in `upgrade_required`: the next round connects with
    /// `schema_reset` (spec 000 "Explicit Incompatible-Schema Reset"), installs the current
    /// manifest with a reset plan (tables rebuilt in their new shape) and rebuilds every
    /// scope. Local-only tables and the whole queue are kept: queued intent authored under
    /// the old schema is pushed and gets its outcome (`schema_incompatible` when it writes
    /// what no longer exists).
    pub fn request_schema_reset(&mut self) -> Result<(), ClientError> {
        if self.machine.state() != ClientState::UpgradeRequired {
            return Err(ClientError::IllegalTransition(
                synchro_protocol::Error::IllegalTransition {
                    from: self.machine.state().as_str(),
                    to: "connecting (schema_reset)",
                },
            ));
        }
        self.conn().execute(
            r#"UPDATE "_synchro_client" SET "reset_requested" = 1 WHERE "id" = 1"#,
            [],
        )?;
        Ok(())
    }

    fn set_upgrade_required(&mut self) -> Result<(), ClientError> {
        self.conn().execute(
            r#"UPDATE "_synchro_client" SET "upgrade_required" = 1 WHERE "id" = 1"#,
            [],
        )?;
        Ok(())
    }

    /// Records connect's scope updates for an unchanged schema.
    fn assign(
        &mut self,
        added: &BTreeSet<String>,
        removed: &BTreeSet<String>,
    ) -> Result<(), ClientError> {
        let manifest = self.manifest.clone().expect("checked by the caller");
        let gone: Vec<String> = removed.iter().cloned().collect();
        self.storage.release_scopes(&manifest, &gone)?;
        for s in added {
            self.conn().execute(
                r#"INSERT OR IGNORE INTO "_synchro_scopes" ("scope_id", "rebuild") VALUES (?, 1)"#,
                [s],
            )?;
        }
        Ok(())
    }

    // ----- rebuild and pull --------------------------------------------------------------

    /// Rebuilds one scope from the server (pages into the staging layer; the final checksum
    /// verified before the final cursor is installed).
    async fn rebuild_scope(&mut self, scope: &str) -> Result<u64, ClientError> {
        let manifest = self
            .manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))?;
        let generation = self.connected_generation()?;
        let mut continuation: Option<String> = None;
        let mut progress = Progress {
            phase: "rebuild",
            scope: Some(scope.to_owned()),
            pages: 0,
            rows: 0,
        };
        let mut restarts = 0;
        loop {
            let request = RebuildRequest {
                client_id: self.client_id.clone(),
                client_generation: generation,
                schema: self.schema_json(),
                scope_id: scope.to_owned(),
                limit: self.page_limit as u64,
                continuation: continuation.clone(),
            };
            let r = self.post("/sync/rebuild", request.to_json()).await?;
            if r.status != 200 {
                let e = server_error(&r);
                if matches!(&e, ClientError::Server { code, .. } if code == "rebuild_restart_required")
                    && restarts < 3
                {
                    restarts += 1;
                    continuation = None;
                    continue;
                }
                return Err(e);
            }
            let first = continuation.is_none();
            let page = RebuildResponse::from_json(&r.body)
                .map_err(|e| StorageError::Verification(e.message))?;
            let done = self
                .storage
                .apply_rebuild_page(&manifest, scope, &page, first)?;
            progress.pages += 1;
            progress.rows += page.records.len() as u64;
            self.report(progress.clone());
            self.fail(Failpoint::InsideRebuild)?;
            match page.end {
                RebuildEnd::Final { .. } => {
                    debug_assert!(done);
                    let tables = manifest.tables.iter().map(|t| t.name.clone()).collect();
                    self.notify(tables);
                    return Ok(progress.rows);
                }
                RebuildEnd::More { continuation: next } => continuation = Some(next),
            }
        }
    }

    /// Pulls every assigned scope to the terminal page.
    async fn pull(&mut self, report: &mut SyncReport) -> Result<(), ClientError> {
        let manifest = self
            .manifest
            .clone()
            .ok_or(ClientError::Blocked("no schema is installed"))?;
        let generation = self.connected_generation()?;
        let mut progress = Progress {
            phase: "pull",
            scope: None,
            pages: 0,
            rows: 0,
        };
        loop {
            let scopes = self.scopes()?;
            let request = PullRequest {
                client_id: self.client_id.clone(),
                client_generation: generation,
                schema: self.schema_json(),
                scope_cursors: scopes
                    .iter()
                    .filter(|(_, (_, rebuild))| !rebuild)
                    .map(|(s, (c, _))| (s.clone(), c.clone()))
                    .collect(),
                limit: self.page_limit as u64,
            };
            let r = self.post("/sync/pull", request.to_json()).await?;
            if r.status != 200 {
                return Err(server_error(&r));
            }
            let page = PullResponse::from_json(&r.body)
                .map_err(|e| StorageError::Verification(e.message))?;
            let mut assigned: BTreeSet<String> = scopes.keys().cloned().collect();
            assigned.extend(page.scope_updates.added.iter().cloned());
            for s in &page.scope_updates.removed {
                assigned.remove(s);
            }
            let tables: BTreeSet<String> = page
                .changes
                .iter()
                .filter_map(|c| manifest.table(&c.table_id).map(|t| t.name.clone()))
                .collect();
            let applied = self.storage.apply_pull_page(&manifest, &page, &assigned)?;
            progress.pages += 1;
            progress.rows += applied.changes as u64;
            report.pull_pages += 1;
            report.pulled_changes += applied.changes as u64;
            report.verified.extend(applied.verified);
            self.report(progress.clone());
            self.notify(tables);
            if !page.has_more {
                return Ok(());
            }
        }
    }

    /// Step 7 (push before rebuild): seals the open batch under the active schema and sends
    /// every sealed batch in order until each has its outcomes, stored durably. A 422
    /// `schema_mismatch` moves the batch's unresolved mutations, unchanged, into a successor
    /// to be sealed after reconnecting; the error makes the round reconnect.
    async fn push_pending(&mut self) -> Result<(), ClientError> {
        let Some(manifest) = self.manifest.clone() else {
            return Ok(());
        };
        let generation = self.connected_generation()?;
        loop {
            let rest = crate::queue::uuid_v7((self.clock)(), (self.random)());
            self.storage
                .seal((manifest.schema_version, manifest.schema_hash_hex()), &rest)?;
            let batches = self.storage.sealed_batches()?;
            if batches.is_empty() {
                return Ok(());
            }
            for (batch_id, request) in batches {
                // The sealed batch (its schema and mutations, kept as sealed) read back
                // through the wire type, so only a well-formed request is ever sent.
                let body = Json::Object(vec![
                    ("protocol_version".into(), Json::Number("3".into())),
                    ("client_id".into(), Json::String(self.client_id.clone())),
                    (
                        "client_generation".into(),
                        Json::Number(generation.to_string()),
                    ),
                    (
                        "schema".into(),
                        request.get("schema").cloned().unwrap_or(Json::Null),
                    ),
                    ("batch_id".into(), Json::String(batch_id.clone())),
                    (
                        "mutations".into(),
                        request.get("mutations").cloned().unwrap_or(Json::Null),
                    ),
                ]);
                let request_body = PushRequest::from_json(&body)
                    .map_err(|_| ClientError::Blocked("a sealed batch is not a valid request"))?;
                let r = self.post("/sync/push", request_body.to_json()).await?;
                if r.status == 200 {
                    self.fail(Failpoint::BeforeOutcomes)?;
                    self.storage
                        .record_outcomes(&manifest, &batch_id, &r.body)?;
                    continue;
                }
                let e = server_error(&r);
                if matches!(&e, ClientError::Server { code, .. } if code == "schema_mismatch") {
                    let successor = crate::queue::uuid_v7((self.clock)(), (self.random)());
                    self.storage.supersede(&batch_id, &successor)?;
                    let current = schema_json(Some(manifest.schema_ref()));
                    if request.get("schema") != Some(&current) {
                        // Sealed under an earlier schema: reseal under this one and go on.
                        break;
                    }
                }
                return Err(e);
            }
        }
    }

    /// Pushes queued intent now, without a full round (the engine must be idle after a
    /// connect). Returns the number of mutations that got an outcome.
    pub async fn push(&mut self) -> Result<usize, ClientError> {
        let before = self
            .storage
            .mutations()?
            .iter()
            .filter(|m| m.state == "pending")
            .count();
        self.go(ClientState::Pushing)?;
        let result = self.push_pending().await;
        self.reset_to_idle();
        result?;
        let after = self
            .storage
            .mutations()?
            .iter()
            .filter(|m| m.state == "pending")
            .count();
        Ok(before - after)
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

    fn reset_to_idle(&mut self) {
        let s = self.machine.state();
        if s != ClientState::Idle && self.go(ClientState::Idle).is_err() {
            self.machine = StateMachine::new(ClientState::Idle);
        }
    }

    async fn sync_round(&mut self) -> Result<SyncReport, ClientError> {
        let mut report = SyncReport::default();
        let state = self.machine.state();
        if state == ClientState::Blocked {
            return Err(ClientError::Blocked("the engine is blocked"));
        }
        if state == ClientState::UpgradeRequired && !self.reset_requested()? {
            return Err(ClientError::UpgradeRequired(
                "this client's schema can no longer sync",
            ));
        }
        // A journal still waiting for its DDL (an interruption in this process) runs first.
        if self.journal_phase()?.as_deref() == Some("pending") {
            self.recover()?;
        }
        // A committed journal from before a restart resumes after connect: push first,
        // then its rebuilds (the markers are durable), then the journal is cleared.
        (report.action, report.affected) = self.connect().await?;
        let result = self.after_connect(&mut report).await;
        if let Err(e) = &result {
            let to = if e.retryable() || needs_reconnect(e) || matches!(e, ClientError::Injected) {
                ClientState::Idle
            } else if matches!(e, ClientError::Storage(StorageError::Verification(_))) {
                // A page that fails verification is refused; the next round retries.
                ClientState::Idle
            } else {
                ClientState::Blocked
            };
            if self.go(to).is_err() {
                self.machine = StateMachine::new(to);
            }
        }
        result.map(|()| report)
    }

    /// Rebuilds every scope marked for rebuild; returns whether there was one.
    async fn rebuild_marked(&mut self, report: &mut SyncReport) -> Result<bool, ClientError> {
        let marked: Vec<String> = self
            .scopes()?
            .into_iter()
            .filter(|(_, (_, rebuild))| *rebuild)
            .map(|(s, _)| s)
            .collect();
        if marked.is_empty() {
            return Ok(false);
        }
        self.go(ClientState::Rebuilding)?;
        for scope in marked {
            self.rebuild_scope(&scope).await?;
            report.rebuilt.insert(scope);
        }
        Ok(true)
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
}
