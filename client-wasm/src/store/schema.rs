//! What the local database holds besides the application's tables: every `_synchro_*`
//! metadata table of the client, defined once here under a metadata version with its own
//! upgrade ladder, and the installed manifest.
//!
//! ## The metadata layout and its version
//!
//! [`V1`] is the layout (client identity, journal, scopes, server rows, staged rebuild rows,
//! the queue, outcomes, shadows), each later version a rung of `UPGRADES` (2: the client
//! version a server refused; 3: the queue's counters; 4: a seed's receipts), and the one row
//! of `_synchro_meta`
//! records the version.
//! [`ensure`] brings a database to [`METADATA_VERSION`] inside the caller's transaction, so
//! the layout and whatever needs it commit together or not at all:
//!
//! - no version recorded: `V1` is adopted object by object. A missing object is created; one
//!   that exists must be exactly the `V1` definition (as `sqlite_schema` keeps it), or the
//!   database is refused untouched. This covers a fresh database and one written before the
//!   version existed, whose tables were created with `IF NOT EXISTS` from these very
//!   definitions on first need, so it holds any subset of them;
//! - then every rung of [`UPGRADES`] above the recorded version runs in order, and the version
//!   is recorded. A fresh database takes the same path as an old one (`V1`, then every rung),
//!   so "installed fresh" and "upgraded" cannot drift apart;
//! - a version above this engine's is refused untouched (a newer engine wrote it).
//!
//! `V1` is never edited: a change to a metadata table is a new rung.
//!
//! The per-manifest objects (`_synchro_schema`, one `_synchro_provenance:<table_id>` table
//! with its scope index per synced table, and `_synchro_rebuild:` scratch tables) are not
//! here: their shape follows the manifest, and they are created by the hashed migration plan
//! of `synchro_protocol::migration`.

use rusqlite::{Connection, OptionalExtension};
use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::MigrationPlan;

use super::Storage;
use crate::error::StorageError;

/// The metadata layout this engine writes and reads.
pub const METADATA_VERSION: i64 = 1 + UPGRADES.len() as i64;

const META: &str = "_synchro_meta";

/// Version 1, as `(type, name, definition)`: every table the client created before the
/// metadata version existed (in the same text, without its `IF NOT EXISTS`), and
/// `_synchro_meta`.
pub const V1: &[(&str, &str, &str)] = &[
    (
        "table",
        "_synchro_meta",
        r#"CREATE TABLE "_synchro_meta" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "metadata_version" INTEGER NOT NULL) STRICT"#,
    ),
    // The client's identity and connect state (one row).
    (
        "table",
        "_synchro_client",
        r#"CREATE TABLE "_synchro_client" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "client_id" TEXT NOT NULL, "client_generation" INTEGER, "scope_set_version" INTEGER, "upgrade_required" INTEGER NOT NULL DEFAULT 0 CHECK ("upgrade_required" IN (0, 1)), "reset_requested" INTEGER NOT NULL DEFAULT 0 CHECK ("reset_requested" IN (0, 1))) STRICT"#,
    ),
    // The durable migration journal (at most one row).
    (
        "table",
        "_synchro_journal",
        r#"CREATE TABLE "_synchro_journal" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "journal_version" INTEGER NOT NULL, "source_version" INTEGER, "source_hash" TEXT, "source_body" TEXT, "target_version" INTEGER NOT NULL, "target_hash" TEXT NOT NULL, "target_body" TEXT NOT NULL, "action" TEXT NOT NULL CHECK ("action" IN ('replace', 'rebuild_local')), "affected_scopes" TEXT NOT NULL, "cursor_updates" TEXT NOT NULL, "migration_plan_version" INTEGER NOT NULL, "plan" TEXT NOT NULL, "plan_hash" TEXT NOT NULL, "phase" TEXT NOT NULL CHECK ("phase" IN ('pending', 'committed')), "reset" INTEGER NOT NULL DEFAULT 0 CHECK ("reset" IN (0, 1))) STRICT"#,
    ),
    // Assigned scopes: the installed cursor, a cursor waiting for its terminal digest, and
    // the rebuild marker.
    (
        "table",
        "_synchro_scopes",
        r#"CREATE TABLE "_synchro_scopes" ("scope_id" TEXT NOT NULL PRIMARY KEY, "cursor" TEXT, "pending_cursor" TEXT, "rebuild" INTEGER NOT NULL DEFAULT 1 CHECK ("rebuild" IN (0, 1))) STRICT, WITHOUT ROWID"#,
    ),
    // The server layer of every synced row: its version and verified row digest.
    (
        "table",
        "_synchro_rows",
        r#"CREATE TABLE "_synchro_rows" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
    ),
    // Rebuild pages staged until the final checksum verifies.
    (
        "table",
        "_synchro_rebuild_rows",
        r#"CREATE TABLE "_synchro_rebuild_rows" ("scope_id" TEXT NOT NULL, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "row" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("scope_id", "table_id", "pk")) STRICT, WITHOUT ROWID"#,
    ),
    // The queue: batches (one open, the sealed ones with their request), mutations.
    (
        "table",
        "_synchro_batches",
        r#"CREATE TABLE "_synchro_batches" ("batch_id" TEXT NOT NULL PRIMARY KEY, "seq" INTEGER NOT NULL UNIQUE, "sealed" INTEGER NOT NULL DEFAULT 0 CHECK ("sealed" IN (0, 1)), "request" TEXT, "completed" INTEGER NOT NULL DEFAULT 0 CHECK ("completed" IN (0, 1))) STRICT"#,
    ),
    (
        "table",
        "_synchro_mutations",
        r#"CREATE TABLE "_synchro_mutations" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "batch_id" TEXT NOT NULL, "local_order" INTEGER NOT NULL UNIQUE, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "operation" TEXT NOT NULL CHECK ("operation" IN ('insert', 'update', 'delete')), "base_version" TEXT, "client_version" INTEGER NOT NULL, "columns" TEXT NOT NULL, "authored_version" INTEGER NOT NULL, "authored_hash" TEXT NOT NULL, "state" TEXT NOT NULL DEFAULT 'pending' CHECK ("state" IN ('pending', 'applied', 'conflict', 'rejected_terminal'))) STRICT"#,
    ),
    (
        "index",
        "_synchro_mutations_row",
        r#"CREATE INDEX "_synchro_mutations_row" ON "_synchro_mutations" ("table_id", "pk", "state")"#,
    ),
    // Every outcome as received.
    (
        "table",
        "_synchro_outcomes",
        r#"CREATE TABLE "_synchro_outcomes" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "status" TEXT NOT NULL, "code" TEXT, "outcome" TEXT NOT NULL) STRICT"#,
    ),
    // The latest server state of a row with unresolved intent (row: its values by field ID
    // as wire JSON, or NULL when the server has no such row): what the visible row returns
    // to when the intent ends in a conflict or a rejection.
    (
        "table",
        "_synchro_shadow",
        r#"CREATE TABLE "_synchro_shadow" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "row" TEXT, PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
    ),
];

/// The upgrade ladder: rung `i` takes metadata version `i + 1` to `i + 2` (statements run
/// in order, in the caller's transaction).
const UPGRADES: &[&[&str]] = &[
    // 1 -> 2: the client version a server refused with HTTP 426 (NULL: none), so that the
    // refusal survives restarts and only an upgraded version connects again.
    &[r#"ALTER TABLE "_synchro_client" ADD COLUMN "refused_client_version" TEXT"#],
    // 2 -> 3: the queue's counters, kept apart from the mutations so that clearing resolved
    // ones (`Storage::clear_resolved`) never hands out a local order or a row's
    // client_version again: the last local order, and each written row's last
    // client_version, both seeded from the queue as it is; and the IDs of recently cleared
    // mutations, so that a write re-sent under a cleared ID is still not queued twice.
    &[
        r#"ALTER TABLE "_synchro_client" ADD COLUMN "last_local_order" INTEGER NOT NULL DEFAULT 0"#,
        r#"UPDATE "_synchro_client" SET "last_local_order" = (SELECT coalesce(max("local_order"), 0) FROM "_synchro_mutations")"#,
        r#"CREATE TABLE "_synchro_row_counters" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "client_version" INTEGER NOT NULL, PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
        r#"INSERT INTO "_synchro_row_counters" SELECT "table_id", "pk", max("client_version") FROM "_synchro_mutations" GROUP BY "table_id", "pk""#,
        r#"CREATE TABLE "_synchro_cleared" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "local_order" INTEGER NOT NULL) STRICT, WITHOUT ROWID"#,
    ],
    // 3 -> 4: the continuation receipts of a portable seed's scopes (spec 001), kept until
    // connect answers them (store/seed.rs).
    &[
        r#"CREATE TABLE "_synchro_seed_receipts" ("scope_id" TEXT NOT NULL PRIMARY KEY, "receipt" TEXT NOT NULL) STRICT, WITHOUT ROWID"#,
    ],
];

/// Brings the metadata layout to [`METADATA_VERSION`] (see the module docs); run inside
/// the caller's transaction.
pub(crate) fn ensure(conn: &Connection) -> Result<(), StorageError> {
    upgrade(conn, UPGRADES).map(|_| ())
}

/// [`ensure`] over any ladder; returns the version reached.
fn upgrade(conn: &Connection, ladder: &[&[&str]]) -> Result<i64, StorageError> {
    let current = 1 + ladder.len() as i64;
    let mut version = match recorded(conn)? {
        Some(v) => v,
        None => {
            adopt_v1(conn)?;
            conn.execute(
                r#"INSERT INTO "_synchro_meta" ("id", "metadata_version") VALUES (1, 1)"#,
                [],
            )?;
            1
        }
    };
    if version < 1 || version > current {
        return Err(StorageError::Schema(format!(
            "the synchro tables are at metadata version {version}, which this engine (version {current}) cannot read"
        )));
    }
    while version < current {
        for statement in ladder[version as usize - 1] {
            conn.execute_batch(statement)?;
        }
        version += 1;
        conn.execute(
            r#"UPDATE "_synchro_meta" SET "metadata_version" = ? WHERE "id" = 1"#,
            [version],
        )?;
    }
    Ok(version)
}

/// The recorded metadata version, if any.
fn recorded(conn: &Connection) -> Result<Option<i64>, StorageError> {
    let exists: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = ?",
        [META],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            r#"SELECT "metadata_version" FROM "_synchro_meta" WHERE "id" = 1"#,
            [],
            |r| r.get(0),
        )
        .optional()?)
}

/// Checks every present object of [`V1`], then (only when all of them are exactly `V1`)
/// creates the missing ones.
fn adopt_v1(conn: &Connection) -> Result<(), StorageError> {
    let mut missing = Vec::new();
    for (kind, name, definition) in V1 {
        let existing: Option<(String, Option<String>)> = conn
            .query_row(
                "SELECT type, sql FROM sqlite_schema WHERE name = ?",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        match existing {
            None => missing.push(*definition),
            Some((k, Some(sql))) if k == *kind && sql == *definition => {}
            Some(_) => {
                return Err(StorageError::Schema(format!(
                    "the synchro table {name} is not one this engine knows"
                )))
            }
        }
    }
    for definition in missing {
        conn.execute_batch(definition)?;
    }
    Ok(())
}

impl Storage {
    /// The installed manifest, verified against its recorded hash; `None` before install.
    pub fn active_schema(&self) -> Result<Option<Manifest>, StorageError> {
        let exists: bool = self.connection().query_row(
            "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = '_synchro_schema'",
            [],
            |r| r.get(0),
        )?;
        if !exists {
            return Ok(None);
        }
        let row: Option<(i64, String, String)> = self
            .connection()
            .query_row(
                "SELECT version, hash, body FROM \"_synchro_schema\" WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((version, hash, body)) = row else {
            return Ok(None);
        };
        let manifest = Manifest::parse(&body)?;
        if manifest.schema_hash_hex() != hash || manifest.schema_version as i64 != version {
            return Err(StorageError::Schema(
                "the recorded schema does not match its hash".into(),
            ));
        }
        Ok(Some(manifest))
    }

    /// Installs a fresh database from `manifest`: the metadata layout, the plan's DDL and
    /// the schema record in one transaction (all or nothing). Refuses a database that
    /// already has a schema.
    pub fn install(&mut self, manifest: &Manifest) -> Result<(), StorageError> {
        if self.active_schema()?.is_some() {
            return Err(StorageError::Schema(
                "the database already has a schema; migrate instead".into(),
            ));
        }
        let plan = MigrationPlan::derive(None, manifest, false)?;
        let out = self.with_tx(|tx| {
            ensure(tx)?;
            for statement in plan.render() {
                tx.execute_batch(&statement)?;
            }
            Ok(())
        });
        // New provenance tables (the schema change would drop the index anyway).
        self.index.invalidate();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MigrationAction, MutationState, Phase};

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn definition(name: &str) -> &'static str {
        V1.iter().find(|(_, n, _)| *n == name).expect("in V1").2
    }

    fn check_list(column: &str, values: impl IntoIterator<Item = &'static str>) -> String {
        let quoted: Vec<String> = values.into_iter().map(|v| format!("'{v}'")).collect();
        format!("CHECK (\"{column}\" IN ({}))", quoted.join(", "))
    }

    #[test]
    fn every_enum_is_exactly_its_check_list() {
        let mutations = definition("_synchro_mutations");
        assert!(mutations.contains(&check_list(
            "state",
            MutationState::ALL.iter().map(|s| s.as_str())
        )));
        assert!(mutations.contains(&check_list(
            "operation",
            synchro_protocol::wire::Operation::ALL
                .iter()
                .map(|o| o.as_str())
        )));
        let journal = definition("_synchro_journal");
        assert!(journal.contains(&check_list("phase", Phase::ALL.iter().map(|p| p.as_str()))));
        assert!(journal.contains(&check_list(
            "action",
            MigrationAction::ALL.iter().map(|a| a.as_str())
        )));
    }

    #[test]
    fn a_fresh_database_gets_v1_and_the_ladder_runs_each_rung_once() {
        let conn = Connection::open_in_memory().unwrap();
        ensure(&conn).unwrap();
        assert_eq!(recorded(&conn).unwrap(), Some(METADATA_VERSION));
        let objects: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name LIKE '\\_synchro\\_%' ESCAPE '\\'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        // V1, the two tables of rung 2 -> 3 (the row counters, the cleared IDs) and the one
        // of rung 3 -> 4 (a seed's receipts).
        assert_eq!(objects as usize, V1.len() + 3);
        // Again: nothing to do.
        ensure(&conn).unwrap();
        assert_eq!(recorded(&conn).unwrap(), Some(METADATA_VERSION));
        // Rung 1 -> 2 gave the client table its refused client version.
        let refused: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('_synchro_client') WHERE name = 'refused_client_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(refused, 1);
        // Rung 2 -> 3 gave it the last local order, from 0.
        let last: i64 = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('_synchro_client') WHERE name = 'last_local_order' AND dflt_value = '0'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(last, 1);
        // On a database at version 1, a ladder with two rungs takes it to 3, each rung once,
        // in order.
        let conn = Connection::open_in_memory().unwrap();
        assert_eq!(upgrade(&conn, &[]).unwrap(), 1);
        let ladder: &[&[&str]] = &[
            &[r#"ALTER TABLE "_synchro_scopes" ADD COLUMN "note" TEXT"#],
            &[r#"UPDATE "_synchro_scopes" SET "note" = 'v3'"#],
        ];
        assert_eq!(upgrade(&conn, ladder).unwrap(), 3);
        assert_eq!(recorded(&conn).unwrap(), Some(3));
        assert_eq!(upgrade(&conn, ladder).unwrap(), 3, "no rung runs twice");
        // This engine refuses the database a newer one wrote.
        conn.execute(
            r#"UPDATE "_synchro_meta" SET "metadata_version" = ?"#,
            [METADATA_VERSION + 1],
        )
        .unwrap();
        let e = ensure(&conn).unwrap_err();
        assert_eq!(e.code(), "local_schema_error");
    }

    #[test]
    fn a_synchro_table_of_another_shape_is_refused_untouched() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(r#"CREATE TABLE "_synchro_scopes" ("scope_id" TEXT PRIMARY KEY)"#)
            .unwrap();
        let e = ensure(&conn).unwrap_err();
        assert_eq!(e.code(), "local_schema_error");
        let objects: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(objects, 1, "nothing was created");
    }
}
