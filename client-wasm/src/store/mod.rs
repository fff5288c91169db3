//! The local database: every SQL statement the client runs against its own tables lives in
//! this module, and nothing here touches the network.
//!
//! - [`schema`]: every `_synchro_*` metadata table, defined once, under a metadata version
//!   with its own upgrade ladder; installing a manifest; the active schema.
//! - [`values`]: the portable-to-SQLite mapping (spec 000 "Portable To SQLite Mapping").
//! - `rows`: writing, removing and reading synced rows, the shadow of a row with unresolved
//!   intent, and the stored row digests.
//! - `scopes`: cursors, rebuild markers, provenance edges, releasing a scope.
//! - `index`: the in-memory ordered index of every scope's rows and row digests that
//!   terminal scope digests are computed from, kept current by the functions of `rows` and
//!   `scopes` that write edges and digests, and dropped whenever anything else may have. It
//!   holds no SQL.
//! - `index_load`: the index's SQL: the connection's stamp, loading the index from the
//!   provenance tables and stored digests, and a scope digest from the tables alone.
//! - `pull`, `rebuild`: verified application of typed pull and rebuild pages.
//! - `queue`: the durable mutation queue and its outcomes.
//! - `enums`: the states, statuses and operations stored as text.
//! - `journal`: the durable migration journal and the migration's DDL transaction.
//! - `client`: the client's identity and connect state.
//! - `local`: the application's own local-only tables (`PRAGMA user_version` ladder).
//! - [`seed`]: a verified portable seed written into a fresh database, and its check.
//!
//! Dependencies run one way, with no cycle. `values`, `enums`, `index`, `schema` and `local`
//! import no other file of the store; `rows` builds on `values`, `enums` and `index`;
//! `scopes` on `rows`; `index_load` on `rows` and `scopes`; `pull` on `scopes` and
//! `index_load`; `rebuild` and `bench` on `scopes`; `queue` on `rows`; `client` on `schema`;
//! `journal` on `scopes` and `client`; `seed` on `rows`, `scopes` and `index_load`. Each file adds the [`Storage`] methods of its
//! concept; what other files of the store need is `pub(super)`, never a public API.

#[cfg(feature = "bench")]
mod bench;
mod client;
mod enums;
mod index;
mod index_load;
mod journal;
mod local;
mod pull;
mod queue;
mod rebuild;
mod rows;
pub mod schema;
mod scopes;
pub mod seed;
pub mod values;

use rusqlite::{Connection, Transaction};
use synchro_protocol::manifest::Manifest;

use index::ScopeIndex;

pub use crate::error::StorageError;
pub use enums::{MigrationAction, MutationState, OutcomeStatus, Phase};
pub use journal::JOURNAL_VERSION;
pub(crate) use journal::{DdlPoint, JournalError, NewJournal};
pub use pull::{Applied, Terminal};
pub use queue::{LocalWrite, Operation, QueuedMutation, MAX_BATCH};
pub use values::{from_sql, to_sql};

/// A local database.
pub struct Storage {
    conn: Connection,
    index: ScopeIndex,
}

impl Storage {
    /// Opens (or creates) the database at `path`. Nothing but the journal mode is written
    /// until the engine opens it ([`crate::engine::Client::open`]) or a manifest is installed.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Storage, StorageError> {
        let conn = Connection::open(path)?;
        // Natively, write-ahead logging: a commit is one append and one sync of the log (with
        // the default synchronous = FULL, as durable as the rollback journal, which syncs the
        // journal and the database each time). The browser's OPFS VFS keeps its own journal.
        #[cfg(not(target_arch = "wasm32"))]
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        Ok(Storage {
            conn,
            index: ScopeIndex::default(),
        })
    }

    /// Opens the database at `path` read-only (a seed artifact being checked): nothing can
    /// be written through it, not even the journal mode.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_read_only(path: impl AsRef<std::path::Path>) -> Result<Storage, StorageError> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Ok(Storage {
            conn,
            index: ScopeIndex::default(),
        })
    }

    /// A private in-memory database.
    pub fn open_in_memory() -> Result<Storage, StorageError> {
        Ok(Storage {
            conn: Connection::open_in_memory()?,
            index: ScopeIndex::default(),
        })
    }

    /// The underlying connection (for tests and queries by the application). Anything
    /// written through it is seen by the store (the scope index is built again).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The connection for a write the caller tracks itself (the scope index is dropped by
    /// anything it does not know about).
    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Runs `f` in one transaction, committed only when it returns `Ok` (an error, or a
    /// panic, rolls everything back). `f` writes no provenance edge and no stored row digest
    /// (those go through [`Storage::with_index_tx`]).
    pub(crate) fn with_tx<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.with_index_tx(|tx, _| f(tx))
    }

    /// [`Storage::with_tx`] for a transaction that writes edges or digests: `f` passes the
    /// scope index to the functions that write them, and a rollback takes its changes back.
    fn with_index_tx<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>, &mut ScopeIndex) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let begun = self.index.begin(index_load::stamp(&self.conn)?);
        let tx = self.conn.transaction()?;
        match f(&tx, &mut self.index).and_then(|v| Ok(tx.commit().map(|()| v)?)) {
            Ok(v) => {
                self.index.commit(begun, index_load::stamp(&self.conn).ok());
                Ok(v)
            }
            Err(e) => {
                self.index.rollback();
                Err(e)
            }
        }
    }

    /// Runs a write outside any transaction that touches no provenance edge and no stored
    /// row digest (a current scope index stays current).
    fn neutral<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        self.index
            .neutral(|| Ok(index_load::stamp(&self.conn)?), || f(&self.conn))
    }

    /// The digest of `scope`'s local rows under `manifest`, from the scope index (what a
    /// terminal pull page is checked against).
    pub fn local_scope_digest(
        &mut self,
        manifest: &Manifest,
        scope: &str,
    ) -> Result<[u8; 32], StorageError> {
        self.with_index_tx(|tx, ix| index_load::scope_digest(ix, tx, manifest, scope))
    }

    /// The digest of `scope`'s local rows computed from the tables alone, without the scope
    /// index (every provenance edge with its stored row digest, sorted and streamed).
    pub fn recompute_scope_digest(
        &self,
        manifest: &Manifest,
        scope: &str,
    ) -> Result<[u8; 32], StorageError> {
        index_load::digest_from_tables(&self.conn, manifest, scope)
    }

    /// How many times the scope index was built from the tables since the database was
    /// opened (a diagnostic: a maintained index is built once).
    pub fn scope_index_builds(&self) -> u64 {
        self.index.builds()
    }
}

/// Executes `sql` through the connection's prepared-statement cache (the hot paths run
/// the same few statements once per row).
fn run<P: rusqlite::Params>(conn: &Connection, sql: &str, params: P) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
