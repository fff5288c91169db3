//! Portable seeds in the local database (spec 001 "Seed verification and artifact
//! publication", checks 8 and 9): a verified seed written into a fresh database the way a
//! synced client's rows are (rows, their verified server versions and digests, each scope's
//! provenance), with each scope's continuation receipt kept instead of a cursor: its scopes
//! stay marked for rebuild, so until connect turns a receipt into a cursor the rows are a
//! verified cache and nothing is pulled from them; and the database's own check of a seed.

use std::collections::{BTreeMap, HashMap};

/// A map keyed by a key's wire text (foldhash: these maps hold every row of a seed).
type Map<V> = HashMap<String, V, foldhash::fast::RandomState>;

use rusqlite::params;
use synchro_protocol::digest::{row_digest, row_digest_of_values, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::quote_ident;
use synchro_protocol::seed::SeedReceipt;
use synchro_protocol::value::TypedValue;

use super::index::{Loading, ScopeIndex};
use super::index_load::stamp;
use super::rows::{record_server_row, wire_row_values, write_row};
use super::scopes::{add_edge, mark_rebuild, provenance};
use super::values::{decode_row, from_sql};
use super::{run, Storage};
use crate::error::StorageError;

fn integrity(what: &'static str) -> StorageError {
    StorageError::Seed(what)
}

/// One row of a seed.
#[derive(Debug, Clone, Copy)]
pub struct SeedRow<'a> {
    /// Its table's ID.
    pub table_id: &'a str,
    /// The key's wire value.
    pub pk: &'a Json,
    /// The complete row, keyed by field ID.
    pub row: &'a Json,
    /// Its server version.
    pub server_version: &'a str,
    /// Its digest when the caller recomputed and checked it already (the exporter's check
    /// 4); otherwise it is computed here. Either way the scope digest is checked against the
    /// receipt, and an artifact is checked again from its values (check 9).
    pub digest: Option<[u8; 32]>,
}

/// One scope of a seed to install.
#[derive(Debug, Clone, Copy)]
pub struct SeedScope<'a> {
    /// Its rows, in any order.
    pub rows: &'a [SeedRow<'a>],
    /// Its `sc1.` continuation receipt (names the scope, its cardinality and its digest).
    pub receipt: &'a str,
}

/// What [`Storage::verify_seed`] found: each scope with its cardinality.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSummary {
    /// (scope, cardinality, digest), in receipt order.
    pub scopes: Vec<(String, u64, [u8; 32])>,
}

impl Storage {
    /// Writes a verified seed into this database, which must be fresh (no schema yet):
    /// `manifest` installed, then in one transaction every row with its server version and
    /// recomputed digest, each scope's provenance, each scope marked for rebuild with its
    /// receipt kept. Every row digest and each scope's digest and cardinality are checked
    /// against the receipt first; a mismatch writes no row.
    pub fn install_seed(
        &mut self,
        manifest: &Manifest,
        scopes: &[SeedScope<'_>],
    ) -> Result<(), StorageError> {
        let mut checked = Vec::with_capacity(scopes.len());
        for s in scopes {
            let receipt = SeedReceipt::read_unverified(s.receipt)
                .map_err(|_| integrity("a seed receipt does not read"))?;
            if receipt.binding.schema_hash != manifest.schema_hash() {
                return Err(integrity("a seed receipt is of another schema"));
            }
            // Each row digested once: for the scope digest here, and kept for the rows below.
            let mut digests = Vec::with_capacity(s.rows.len());
            let mut entries = Vec::with_capacity(s.rows.len());
            for r in s.rows {
                let (identity, digest) = match r.digest {
                    Some(digest) => {
                        let table = manifest
                            .table(r.table_id)
                            .ok_or(integrity("a seed row does not match its table"))?;
                        let key = TypedValue::from_wire(&table.primary_key().spec, r.pk)
                            .map_err(|_| integrity("a seed key does not match its type"))?;
                        let identity = RowIdentity::new(table, &key)
                            .map_err(|_| integrity("a key cannot form a row identity"))?;
                        (identity, digest)
                    }
                    None => {
                        let d = row_digest(manifest, r.table_id, r.pk, r.row, r.server_version)
                            .map_err(|_| integrity("a seed row does not match its table"))?;
                        (d.identity, d.digest)
                    }
                };
                digests.push(digest);
                entries.push((identity, digest));
            }
            let digest = scope_digest(
                &manifest.schema_hash(),
                &receipt.binding.scope_id,
                &mut entries,
                false,
            )
            .map_err(|_| integrity("a seed scope holds a row twice"))?;
            if digest.cardinality != receipt.cardinality || digest.digest != receipt.checksum.0 {
                return Err(integrity("a seed scope does not match its receipt"));
            }
            checked.push((receipt.binding.scope_id, s, digests));
        }
        self.install(manifest)?;
        self.with_index_tx(|tx, ix| {
            ix.for_manifest(manifest);
            for (scope_id, s, digests) in &checked {
                for (r, digest) in s.rows.iter().zip(digests) {
                    let table = manifest.table(r.table_id).expect("checked above");
                    let key = TypedValue::from_wire(&table.primary_key().spec, r.pk)
                        .map_err(|_| integrity("a seed key does not match its type"))?;
                    write_row(tx, table, wire_row_values(table, r.row, "a seed row")?)?;
                    let text = key.to_wire_text();
                    record_server_row(tx, ix, table, &key, &text, r.server_version, digest)?;
                    add_edge(tx, ix, table, &key, scope_id)?;
                }
                mark_rebuild(tx, scope_id)?;
                run(
                    tx,
                    r#"INSERT INTO "_synchro_seed_receipts" ("scope_id", "receipt") VALUES (?, ?)"#,
                    params![scope_id, s.receipt],
                )?;
            }
            Ok(())
        })
    }

    /// Creates the database at `path` to be written as a seed artifact: without a journal and
    /// without syncing each write, since the file is a scratch copy until
    /// [`Storage::close_as_artifact`] and its checks succeed (a failure or a crash leaves a
    /// file that is discarded, never one that is used).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn create_artifact(path: impl AsRef<std::path::Path>) -> Result<Storage, StorageError> {
        let conn = rusqlite::Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -65536;",
        )?;
        Ok(Storage {
            conn,
            index: super::ScopeIndex::default(),
        })
    }

    /// Closes a database written to be a seed artifact: its write-ahead log folded in and
    /// switched off, so that the file alone is the database (spec 001 check 10: no WAL or
    /// shared-memory sidecar).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn close_as_artifact(self) -> Result<(), StorageError> {
        let conn = self.conn;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        let mode: String = conn.query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))?;
        if mode != "delete" {
            return Err(integrity(
                "the seed's journal mode cannot be switched off WAL",
            ));
        }
        // Written without syncing (create_artifact): on disk once, before it is published.
        let path = conn.path().map(std::path::PathBuf::from);
        conn.close().map_err(|(_, e)| StorageError::from(e))?;
        if let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(|e| StorageError::Schema(format!("syncing the seed: {e}")))?;
        }
        Ok(())
    }

    /// The receipts a seed installed and connect has not yet answered: (scope, receipt).
    pub fn seed_receipts(&self) -> Result<Vec<(String, String)>, StorageError> {
        let mut q = self.connection().prepare(
            r#"SELECT "scope_id", "receipt" FROM "_synchro_seed_receipts" ORDER BY "scope_id""#,
        )?;
        let out = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(out)
    }

    /// Whether this database is a seed no client has opened yet: it holds receipts and no
    /// client identity (a seed copied in place whose check a crash may have interrupted;
    /// it is checked again before it is used).
    pub fn is_unclaimed_seed(&self) -> Result<bool, StorageError> {
        let conn = self.connection();
        let has = |table: &str| -> Result<bool, StorageError> {
            let exists: i64 = conn.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                [table],
                |r| r.get(0),
            )?;
            if exists == 0 {
                return Ok(false);
            }
            let n: i64 = conn.query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |r| {
                r.get(0)
            })?;
            Ok(n > 0)
        };
        Ok(has("_synchro_seed_receipts")? && !has("_synchro_client")?)
    }

    /// Drops every seed receipt: a migration's connect (the seed is of another schema than
    /// the target, so its scopes stay marked for rebuild). Otherwise connect's answer
    /// settles them ([`Storage::apply_connect`]). A receipt is presented once.
    pub(crate) fn forget_seed_receipts(&self) -> Result<(), StorageError> {
        self.neutral(|conn| {
            run(conn, r#"DELETE FROM "_synchro_seed_receipts""#, [])?;
            Ok(())
        })
    }

    /// Checks a seed database as its recipient would (spec 001 check 9, without the key):
    /// SQLite's integrity check, the schema record matches its hash, nothing is queued and no cursor is installed;
    /// every row's digest recomputes from its visible values and stored version; each scope
    /// with a receipt digests, from its provenance, to the receipt's cardinality and
    /// digest under the same schema; no scope is left without a receipt.
    pub fn verify_seed(&self) -> Result<SeedSummary, StorageError> {
        self.verify_seed_indexed().map(|(summary, _)| summary)
    }

    /// [`Storage::verify_seed`], also giving the scope index its check built.
    fn verify_seed_indexed(&self) -> Result<(SeedSummary, ScopeIndex), StorageError> {
        self.check_seed().map_err(|e| match e {
            StorageError::Seed(_) => e,
            // A file that is no SQLite database, or no synchro one, is a bad seed too.
            _ => integrity("the seed is not a readable synchro database"),
        })
    }

    /// Takes `index`, built by [`Storage::verify_seed_indexed`] over this database's file
    /// (by this or another connection) with nothing written since, as this storage's scope
    /// index: the first terminal digest does not load it from the tables again.
    fn adopt_index(&mut self, mut index: ScopeIndex) -> Result<(), StorageError> {
        index.adopt(stamp(&self.conn)?);
        self.index = index;
        Ok(())
    }

    /// [`Storage::verify_seed`] of this database, keeping the scope index its check built
    /// (a seed about to be used where it lies).
    pub(crate) fn verify_seed_in_place(&mut self) -> Result<SeedSummary, StorageError> {
        let (summary, index) = self.verify_seed_indexed()?;
        self.adopt_index(index)?;
        Ok(summary)
    }

    fn check_seed(&self) -> Result<(SeedSummary, ScopeIndex), StorageError> {
        let conn = self.connection();
        let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if check != "ok" {
            return Err(integrity("the seed fails SQLite's integrity check"));
        }
        let manifest = self
            .active_schema()?
            .ok_or(integrity("the seed has no schema"))?;
        // Its database schema is exactly the one this store writes for the manifest: no
        // trigger, view, extra table, index or altered definition (one would act on the
        // client's later writes or queue, which no digest covers), and no application
        // version (`user_version` is the app's local-table ladder).
        let expected = {
            let mut fresh = Storage::open(":memory:")?;
            fresh.install(&manifest)?;
            database_schema(fresh.connection())?
        };
        if database_schema(conn)? != expected {
            return Err(integrity(
                "the seed's database schema is not the one synchro writes",
            ));
        }
        // A seed is no client's database: no identity, journal, queued mutation or outcome,
        // and no scope with a cursor.
        let local: i64 = conn.query_row(
            r#"SELECT (SELECT count(*) FROM "_synchro_client") + (SELECT count(*) FROM "_synchro_journal")
                    + (SELECT count(*) FROM "_synchro_mutations") + (SELECT count(*) FROM "_synchro_outcomes")
                    + (SELECT count(*) FROM "_synchro_scopes" WHERE "cursor" IS NOT NULL OR "pending_cursor" IS NOT NULL OR "rebuild" = 0)"#,
            [],
            |r| r.get(0),
        )?;
        if local != 0 {
            return Err(integrity(
                "the seed holds a client's state (identity, queue or cursor)",
            ));
        }
        // Every row: its digest from the visible values and the stored version (one scan of
        // each table and of its server layer), and no row without a server version; what
        // verified is kept for the scope digests below.
        let hash = manifest.schema_hash();
        let mut verified: Vec<Map<[u8; 32]>> = Vec::with_capacity(manifest.tables.len());
        for table in &manifest.tables {
            let mut stored: Map<(String, Vec<u8>)> = Map::default();
            let mut q = conn.prepare(
                r#"SELECT "pk", "server_version", "digest" FROM "_synchro_rows" WHERE "table_id" = ?"#,
            )?;
            let mut rows = q.query([&table.table_id])?;
            while let Some(r) = rows.next()? {
                stored.insert(r.get(0)?, (r.get(1)?, r.get(2)?));
            }
            let columns: Vec<String> = table.fields.iter().map(|f| quote_ident(&f.name)).collect();
            let pk_index = table
                .fields
                .iter()
                .position(|f| f.field_id == table.primary_key_field_id)
                .ok_or(integrity("a seed table has no primary key"))?;
            let mut q = conn.prepare(&format!(
                "SELECT {} FROM {}",
                columns.join(", "),
                quote_ident(&table.name)
            ))?;
            let mut rows = q.query([])?;
            let mut digests = Map::with_capacity_and_hasher(stored.len(), Default::default());
            while let Some(r) = rows.next()? {
                let values =
                    decode_row(table, r).map_err(|_| integrity("a seed row does not decode"))?;
                let pk = values[pk_index].to_wire_text();
                let (version, digest) = stored
                    .remove(&pk)
                    .ok_or(integrity("a seed row has no server version"))?;
                let d = row_digest_of_values(&hash, table, &values, &version)
                    .map_err(|_| integrity("a seed row does not match its table"))?;
                if d.digest.as_slice() != digest.as_slice() {
                    return Err(integrity("a seed row does not match its digest"));
                }
                digests.insert(pk, d.digest);
            }
            if !stored.is_empty() {
                return Err(integrity("a seed row is missing"));
            }
            verified.push(digests);
        }
        // Each scope with a receipt: its provenance edges (one scan of each table's) with the
        // digests just verified, loaded as the scope index (which the first terminal digest
        // of the opened database then uses), each scope digested and compared with its
        // receipt.
        let receipts = self.seed_receipts()?;
        let mut edges: BTreeMap<&str, u64> = receipts
            .iter()
            .map(|(scope, _)| (scope.as_str(), 0))
            .collect();
        let mut loading = Loading::new(&manifest, false);
        for (table, digests) in manifest.tables.iter().zip(&verified) {
            let mut q = conn.prepare(&format!(
                "SELECT \"scope_id\", \"pk\" FROM {}",
                provenance(table)
            ))?;
            let mut rows = q.query([])?;
            while let Some(r) = rows.next()? {
                let scope: String = r.get(0)?;
                *edges
                    .get_mut(scope.as_str())
                    .ok_or(integrity("a seed scope has no receipt"))? += 1;
                let pk = from_sql(&table.primary_key().spec, r.get_ref(1)?)
                    .ok_or(integrity("a stored key does not match its type"))?;
                let digest = *digests
                    .get(&pk.to_wire_text())
                    .ok_or(integrity("a provenance edge without its row"))?;
                loading
                    .edge(table, &pk, scope, || Some(digest))
                    .map_err(|_| integrity("a key cannot form a row identity"))?;
            }
        }
        let mut index = ScopeIndex::default();
        index.install(loading);
        let mut summary = SeedSummary { scopes: Vec::new() };
        for (scope, receipt) in &receipts {
            let r = SeedReceipt::read_unverified(receipt)
                .map_err(|_| integrity("a seed receipt does not read"))?;
            if &r.binding.scope_id != scope || r.binding.schema_hash != hash {
                return Err(integrity("a seed receipt does not match its scope"));
            }
            let digest = index
                .scope_digest(scope)
                .map_err(|_| integrity("a seed scope cannot be digested"))?;
            if digest != r.checksum.0 || edges[scope.as_str()] != r.cardinality {
                return Err(integrity("a seed scope does not match its receipt"));
            }
            summary.scopes.push((scope.clone(), r.cardinality, digest));
        }
        let scopes: i64 = conn.query_row(r#"SELECT count(*) FROM "_synchro_scopes""#, [], |r| {
            r.get(0)
        })?;
        if scopes as usize != summary.scopes.len() {
            return Err(integrity("a seed scope has no receipt"));
        }
        Ok((summary, index))
    }
}

/// Every entry of `sqlite_master` (type, name, table, SQL) in name order, with the
/// application's `user_version`, as one text.
fn database_schema(conn: &rusqlite::Connection) -> Result<String, StorageError> {
    Ok(conn.query_row(
        "SELECT coalesce(group_concat(e, char(30)), '') || char(29) || (SELECT user_version FROM pragma_user_version)
           FROM (SELECT type || char(31) || name || char(31) || tbl_name || char(31) || coalesce(sql, '') AS e
                   FROM sqlite_master ORDER BY type, name, tbl_name)",
        [],
        |r| r.get(0),
    )?)
}

/// What opening a database with a seed did.
#[derive(Debug)]
pub enum SeedOutcome {
    /// The database was created from the seed, which verified: its scopes and their
    /// cardinalities, in receipt order.
    Installed(SeedSummary),
    /// The database already existed: the seed was not used.
    Skipped,
    /// The seed did not verify (or could not be read): nothing of it was installed, the
    /// database is fresh and its scopes rebuild as usual. The error says why.
    Refused(StorageError),
}

#[cfg(not(target_arch = "wasm32"))]
impl Storage {
    /// Opens the database at `database`, first creating it from the seed artifact at `seed`
    /// when it does not exist yet. The seed is copied beside the database, checked there as
    /// [`Storage::verify_seed`] does (SQLite's integrity check, every row digest, every scope
    /// digest against its receipt, no identity, queue or cursor) and only then renamed into
    /// place; a seed that fails is removed and the database starts fresh
    /// ([`SeedOutcome::Refused`], typed `seed_invalid`). A database that exists is opened as
    /// it is ([`SeedOutcome::Skipped`]), unless it is a seed whose check was interrupted:
    /// that is checked again, and removed if it fails.
    pub fn open_seeded(
        database: &std::path::Path,
        seed: &std::path::Path,
    ) -> Result<(Storage, SeedOutcome), StorageError> {
        if std::fs::metadata(database).is_ok_and(|m| m.len() > 0) {
            let mut storage = Storage::open(database)?;
            if !storage.is_unclaimed_seed()? {
                return Ok((storage, SeedOutcome::Skipped));
            }
            return match storage.verify_seed_in_place() {
                Ok(summary) => Ok((storage, SeedOutcome::Installed(summary))),
                Err(e) => {
                    drop(storage);
                    remove_database(database);
                    Ok((Storage::open(database)?, SeedOutcome::Refused(e)))
                }
            };
        }
        remove_database(database);
        let mut tmp = database.as_os_str().to_owned();
        tmp.push(".seed-tmp");
        let tmp = std::path::PathBuf::from(tmp);
        remove_database(&tmp);
        let checked = (|| {
            std::fs::copy(seed, &tmp).map_err(|_| integrity("the seed cannot be read"))?;
            let checked = Storage::open_read_only(&tmp)?.verify_seed_indexed()?;
            std::fs::rename(&tmp, database)
                .map_err(|e| StorageError::Schema(format!("installing the seed: {e}")))?;
            Ok(checked)
        })();
        match checked {
            Ok((summary, index)) => {
                let mut storage = Storage::open(database)?;
                storage.adopt_index(index)?;
                Ok((storage, SeedOutcome::Installed(summary)))
            }
            Err(e) => {
                remove_database(&tmp);
                Ok((Storage::open(database)?, SeedOutcome::Refused(e)))
            }
        }
    }
}

/// Removes a database file and its journal sidecars (those that exist).
#[cfg(not(target_arch = "wasm32"))]
fn remove_database(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}
