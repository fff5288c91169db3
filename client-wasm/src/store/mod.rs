//! The local database: every SQL statement the client runs against its own tables lives in
//! this module, and nothing here touches the network.
//!
//! - [`schema`]: every `_synchro_*` metadata table, defined once, under a metadata version
//!   with its own upgrade ladder; installing a manifest; the active schema.
//! - [`values`]: the portable-to-SQLite mapping (spec 000 "Portable To SQLite Mapping").
//! - `rows`: writing, removing and reading synced rows, the shadow of a row with unresolved
//!   intent, and the stored row digests.
//! - `scopes`: cursors, rebuild markers, provenance edges, releasing a scope.
//! - `pull`, `rebuild`: verified application of typed pull and rebuild pages.
//! - `queue`: the durable mutation queue and its outcomes.
//! - `enums`: the states, statuses and operations stored as text.
//! - `journal`: the durable migration journal and the migration's DDL transaction.
//! - `client`: the client's identity and connect state.
//! - `local`: the application's own local-only tables (`PRAGMA user_version` ladder).
//!
//! Dependencies run one way: `values` ← `rows` ← `scopes` ← `pull` / `rebuild` / `queue`
//! ← `journal`; `schema` and `client` stand alone. Each file adds the [`Storage`] methods of
//! its concept; what other files of the store need is `pub(super)`, never a public API.

#[cfg(feature = "bench")]
mod bench;
mod client;
mod enums;
mod journal;
mod local;
mod pull;
mod queue;
mod rebuild;
mod rows;
pub mod schema;
mod scopes;
pub mod values;

use rusqlite::{Connection, Transaction};

pub use crate::error::StorageError;
pub use enums::{parse_operation, MigrationAction, MutationState, OutcomeStatus, Phase};
pub use journal::JOURNAL_VERSION;
pub(crate) use journal::{DdlPoint, JournalError, NewJournal};
pub use pull::Applied;
pub use queue::{LocalWrite, Mutation, Operation, MAX_BATCH};
pub use values::{from_sql, to_sql};

/// A local database.
pub struct Storage {
    conn: Connection,
}

impl Storage {
    /// Opens (or creates) the database at `path`. Nothing is written until the engine opens
    /// it ([`crate::engine::Client::open`]) or a manifest is installed.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Storage, StorageError> {
        Ok(Storage {
            conn: Connection::open(path)?,
        })
    }

    /// A private in-memory database.
    pub fn open_in_memory() -> Result<Storage, StorageError> {
        Ok(Storage {
            conn: Connection::open_in_memory()?,
        })
    }

    /// The underlying connection (for tests and queries by the application).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Runs `f` in one transaction, committed only when it returns `Ok` (an error, or a
    /// panic, rolls everything back).
    pub(crate) fn with_tx<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let tx = self.conn.transaction()?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
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
