//! The client's identity and connect state (`_synchro_client`, one row): the random client
//! ID, the generation and scope set version the last connect returned, the two flags of
//! spec 000 "Explicit Incompatible-Schema Reset" (`upgrade_required`, `reset_requested`),
//! and the client version a server refused with HTTP 426 (`refused_client_version`).

use rusqlite::{params, Connection, OptionalExtension};

use super::{schema, Storage};
use crate::error::StorageError;

/// Who this database is to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Random, stable for the database's life.
    pub client_id: String,
    /// The schema history could not continue; kept across restarts.
    pub upgrade_required: bool,
    /// The client version a server last refused with HTTP 426; kept across restarts.
    pub refused_client_version: Option<String>,
}

impl Storage {
    /// Prepares the database for the engine, in one transaction: the metadata layout
    /// brought to the current version ([`schema::ensure`]), and the identity read, or
    /// created with `new_id()` on first open.
    pub(crate) fn open_client(
        &mut self,
        new_id: impl FnOnce() -> String,
    ) -> Result<Identity, StorageError> {
        self.with_tx(|tx| {
            schema::ensure(tx)?;
            let existing: Option<(String, i64, Option<String>)> = tx
                .query_row(
                    r#"SELECT "client_id", "upgrade_required", "refused_client_version" FROM "_synchro_client" WHERE "id" = 1"#,
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let (client_id, upgrade_required, refused_client_version) = match existing {
                Some(v) => v,
                None => {
                    let id = new_id();
                    tx.execute(
                        r#"INSERT INTO "_synchro_client" ("id", "client_id") VALUES (1, ?)"#,
                        [&id],
                    )?;
                    (id, 0, None)
                }
            };
            Ok(Identity {
                client_id,
                upgrade_required: upgrade_required == 1,
                refused_client_version,
            })
        })
    }

    /// The generation the last connect returned.
    pub(crate) fn generation(&self) -> Result<Option<u64>, StorageError> {
        Ok(self
            .connection()
            .query_row(
                r#"SELECT "client_generation" FROM "_synchro_client" WHERE "id" = 1"#,
                [],
                |r| r.get::<_, Option<i64>>(0),
            )?
            .map(|g| g as u64))
    }

    /// Records what a connect returned (a server that answered 200 refuses this client's
    /// version no longer).
    pub(crate) fn record_connect(
        &self,
        generation: i64,
        scope_set_version: Option<i64>,
    ) -> Result<(), StorageError> {
        self.neutral(|conn| Ok(record_client(conn, generation, scope_set_version)?))
    }

    /// The client version a server last refused with HTTP 426, if any.
    pub(crate) fn refused_client_version(&self) -> Result<Option<String>, StorageError> {
        Ok(self.connection().query_row(
            r#"SELECT "refused_client_version" FROM "_synchro_client" WHERE "id" = 1"#,
            [],
            |r| r.get(0),
        )?)
    }

    /// Records that a server refused the client version `version` with HTTP 426.
    pub(crate) fn set_refused_client_version(&self, version: &str) -> Result<(), StorageError> {
        self.neutral(|conn| {
            conn.execute(
                r#"UPDATE "_synchro_client" SET "refused_client_version" = ? WHERE "id" = 1"#,
                [version],
            )?;
            Ok(())
        })
    }

    /// Gives a client that never connected successfully (no generation) a new ID; `false`
    /// (nothing changed) for any other.
    pub(crate) fn replace_fresh_client_id(&self, id: &str) -> Result<bool, StorageError> {
        self.neutral(|conn| {
            Ok(conn.execute(
                r#"UPDATE "_synchro_client" SET "client_id" = ? WHERE "id" = 1 AND "client_generation" IS NULL"#,
                [id],
            )? == 1)
        })
    }

    /// Whether the application asked for the explicit schema reset.
    pub(crate) fn reset_requested(&self) -> Result<bool, StorageError> {
        Ok(self.connection().query_row(
            r#"SELECT "reset_requested" FROM "_synchro_client" WHERE "id" = 1"#,
            [],
            |r| r.get(0),
        )?)
    }

    /// Records that the next connect asks for the schema reset.
    pub(crate) fn request_reset(&self) -> Result<(), StorageError> {
        self.neutral(|conn| {
            conn.execute(
                r#"UPDATE "_synchro_client" SET "reset_requested" = 1 WHERE "id" = 1"#,
                [],
            )?;
            Ok(())
        })
    }

    /// Records that this client's schema can no longer sync.
    pub(crate) fn set_upgrade_required(&self) -> Result<(), StorageError> {
        self.neutral(|conn| {
            conn.execute(
                r#"UPDATE "_synchro_client" SET "upgrade_required" = 1 WHERE "id" = 1"#,
                [],
            )?;
            Ok(())
        })
    }
}

/// The reset reached the current schema: the client may sync again (inside the migration's
/// DDL transaction).
pub(super) fn clear_reset(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute(
        r#"UPDATE "_synchro_client" SET "upgrade_required" = 0, "reset_requested" = 0 WHERE "id" = 1"#,
        [],
    )?;
    Ok(())
}

/// Records a connect's client generation and scope set version (a server that answered 200
/// refuses this client's version no longer), on `conn` (a transaction that also installs
/// what came with them: see [`Storage::apply_connect`]).
pub(super) fn record_client(
    conn: &Connection,
    generation: i64,
    scope_set_version: Option<i64>,
) -> rusqlite::Result<()> {
    conn.execute(
        r#"UPDATE "_synchro_client" SET "client_generation" = ?, "scope_set_version" = ?, "refused_client_version" = NULL WHERE "id" = 1"#,
        params![generation, scope_set_version],
    )?;
    Ok(())
}
