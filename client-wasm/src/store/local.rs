//! The application's own local-only tables: a ladder of SQL rungs versioned by
//! `PRAGMA user_version` (which belongs to the application; synchro's own tables are
//! versioned apart, in `_synchro_meta`).

use rusqlite::Connection;
use synchro_protocol::migration::RESERVED_PREFIX;

use super::Storage;
use crate::error::StorageError;

/// One `sqlite_schema` row: type, name, table name, SQL.
type SchemaObject = (String, String, String, Option<String>);

/// Every schema object that belongs to synchro: `_synchro_` objects and the synced tables
/// with their indexes and triggers.
fn protected_schema(conn: &Connection, synced: &[String]) -> rusqlite::Result<Vec<SchemaObject>> {
    let mut q =
        conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name")?;
    let all = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<Vec<SchemaObject>>>()?;
    let protected = |n: &str| n.starts_with(RESERVED_PREFIX) || synced.iter().any(|s| s == n);
    Ok(all
        .into_iter()
        .filter(|(_, name, tbl, _)| protected(name) || protected(tbl))
        .collect())
}

impl Storage {
    /// Evolves the application's own local-only tables with `ladder`: rung `i` (1-based)
    /// takes `PRAGMA user_version` from `i - 1` to `i` in its own transaction, together with
    /// the version bump. A database from a newer ladder (a version above `ladder.len()`) is
    /// refused untouched, and a rung that creates, alters or drops a synced table or
    /// anything named `_synchro_` is rolled back with its error. Returns the version after.
    pub fn migrate_local(&mut self, ladder: &[&str]) -> Result<u32, StorageError> {
        let mut version: u32 = self
            .connection()
            .query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version as usize > ladder.len() {
            return Err(StorageError::Schema(format!(
                "the local tables are at version {version}, newer than this application's {}",
                ladder.len()
            )));
        }
        let synced: Vec<String> = self
            .active_schema()?
            .map(|m| m.tables.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        while (version as usize) < ladder.len() {
            self.with_tx(|tx| {
                let before = protected_schema(tx, &synced)?;
                tx.execute_batch(ladder[version as usize])?;
                if protected_schema(tx, &synced)? != before {
                    return Err(StorageError::Schema(format!(
                        "local migration {} changes a synced or synchro table",
                        version + 1
                    )));
                }
                tx.execute_batch(&format!("PRAGMA user_version = {}", version + 1))?;
                Ok(())
            })?;
            // The application's SQL may have written anything: the scope index is built
            // again from the tables.
            self.index.invalidate();
            version += 1;
        }
        Ok(version)
    }
}
