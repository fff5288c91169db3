//! The in-memory scope index: for every scope, its rows ordered by canonical row identity,
//! and the verified row digest of each row, mirroring what the provenance tables and
//! `_synchro_rows` hold. A terminal page's scope digests are computed from it (spec 001
//! allows "maintain an ordered index, or cache a complete scope digest while its inputs are
//! unchanged"): no query, no sort, and an unchanged scope answers from its cached digest. A
//! changed scope's digest comes from its [`ScopeEntries`] (the hashed octets with kept
//! hasher states), brought forward by the keys changed since its last digest (a log of
//! them), so it hashes from the first changed entry on instead of walking every row.
//!
//! Correctness comes first, so the index is only ever a copy it can prove current:
//!
//! - it is built from SQLite when first needed, under one manifest (a different schema hash
//!   drops it);
//! - every store function that writes a provenance edge or a stored row digest updates it in
//!   the same step (`rows::record_server_row`, `rows::forget_row`, `scopes::add_edge`,
//!   `scopes::remove_edge`, `scopes::release_scope`);
//! - every store transaction runs between [`ScopeIndex::begin`] and [`ScopeIndex::commit`]
//!   (or [`ScopeIndex::rollback`]): a rolled-back transaction undoes its index changes, and
//!   a commit records the connection's stamp (its total row changes, `PRAGMA data_version`
//!   and `PRAGMA schema_version`). Any write the store did not make through those functions,
//!   by the application on [`super::Storage::connection`], by another connection, or by DDL,
//!   changes the stamp, and the next transaction drops the index and builds it again;
//! - writes the store makes outside a transaction and knows leave digests alone go through
//!   [`ScopeIndex::neutral`]; paths that rewrite digests wholesale (a migration's DDL
//!   transaction, installing a manifest, local migrations) call
//!   [`ScopeIndex::invalidate`].
//!
//! This file is the index alone, with no SQL: the connection's stamp, loading the index from
//! the provenance tables and stored digests, and a digest from the tables alone are
//! `index_load`'s.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use synchro_protocol::digest::{RowIdentity, ScopeDigester};
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::scope_entries::ScopeEntries;
use synchro_protocol::value::TypedValue;

use crate::error::StorageError;

/// A row's canonical identity octets, shared by the digest map and every scope holding it.
type Key = Arc<[u8]>;

/// Row digests by identity. A terminal digest looks up every row of its scope, so the
/// hasher matters: std's SipHash was about a sixth of a 100,000-row scope digest (profile in
/// docs/protocol-decisions.md, "Terminal digests"); foldhash (hashbrown's) is several
/// times cheaper. Keys are row identities the server sent and this client verified.
type Digests = HashMap<Key, [u8; 32], foldhash::fast::RandomState>;

/// Most changes logged between two digests before every scope's entries are dropped.
const MAX_LOG: usize = 1 << 20;

/// What the connection has written and seen: when it moves without the store knowing, the
/// index may be stale (read by `index_load::stamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    /// The connection's total row changes.
    pub(super) changes: u64,
    /// `PRAGMA data_version`: moves when another connection commits.
    pub(super) data_version: i64,
    /// `PRAGMA schema_version`: moves with any DDL.
    pub(super) schema_version: i64,
}

impl Stamp {
    /// Nothing but this connection's own row writes happened since `self`.
    fn same_outside(&self, later: &Stamp) -> bool {
        self.data_version == later.data_version && self.schema_version == later.schema_version
    }
}

/// One scope's rows in identity order, with its digest while nothing it covers changed.
#[derive(Debug, Default, Clone)]
struct Scope {
    rows: BTreeSet<Key>,
    /// `(epoch, digest)`: valid while the digest map's epoch is unchanged.
    cached: Option<(u64, [u8; 32])>,
    /// The scope's entries as the digest hashes them, with kept hasher states
    /// ([`ScopeEntries`]), as of a position in the change log: a later digest brings them
    /// forward by the keys logged since, and hashes from the first changed entry on.
    entries: Option<(u64, ScopeEntries)>,
}

/// How to take back one change when a transaction rolls back.
enum Undo {
    Digest(Key, Option<[u8; 32]>),
    /// `inserted`: the edge was added (remove it again), else removed (add it back).
    Edge(Arc<str>, Key, bool),
    Scope(Arc<str>, Option<Scope>),
}

struct Built {
    schema_hash: [u8; 32],
    digests: Digests,
    scopes: HashMap<Arc<str>, Scope>,
    /// Bumped by every digest change: cached scope digests older than it are recomputed.
    epoch: u64,
    /// Changes of the open transaction, in order.
    undo: Vec<Undo>,
    /// Built inside the open transaction (from its uncommitted state): a rollback drops it.
    in_tx: bool,
    /// Every key whose digest or edges changed, in order, from position `log_base` on (see
    /// [`Scope::entries`]); trimmed to what the scope entries still need.
    log: Vec<Key>,
    log_base: u64,
}

impl Built {
    fn logged(&mut self, key: &Key) {
        self.log.push(key.clone());
        self.cap_log();
    }

    /// A log longer than [`MAX_LOG`] costs more than building the entries again.
    fn cap_log(&mut self) {
        if self.log.len() > MAX_LOG {
            self.drop_entries();
        }
    }

    /// Drops every scope's entries and the log (they are built again when needed).
    fn drop_entries(&mut self) {
        for s in self.scopes.values_mut() {
            s.entries = None;
        }
        self.log_base += self.log.len() as u64;
        self.log.clear();
    }
}

/// The index and the stamp it is current at (see the module docs).
#[derive(Default)]
pub(super) struct ScopeIndex {
    built: Option<Built>,
    stamp: Cell<Option<Stamp>>,
    /// How many times the index was built from the tables.
    builds: u64,
    /// A transaction is being tracked: still set at the next [`ScopeIndex::begin`] means
    /// the last one never ended (its closure panicked), and the index is dropped.
    open: bool,
}

/// What [`ScopeIndex::begin`] saw.
pub(super) struct Begun(Stamp);

impl ScopeIndex {
    /// Drops the index (it is built again when needed).
    pub(super) fn invalidate(&mut self) {
        self.built = None;
        self.stamp.set(None);
    }

    /// Takes the index as current at `now`, the stamp of the connection it now serves (an
    /// index built from a database by another connection of the same file, with nothing
    /// written since: a seed checked before it was opened).
    pub(super) fn adopt(&mut self, now: Stamp) {
        if self.built.is_some() {
            self.open = false;
            self.stamp.set(Some(now));
        }
    }

    /// How many times the index was built from the tables.
    pub(super) fn builds(&self) -> u64 {
        self.builds
    }

    /// Whether the index is current at `now`.
    fn current(&self, now: &Stamp) -> bool {
        !self.open && self.built.is_some() && self.stamp.get() == Some(*now)
    }

    /// Starts a transaction's tracking at the connection's stamp `now`: a stale index is
    /// dropped first.
    pub(super) fn begin(&mut self, now: Stamp) -> Begun {
        if !self.current(&now) {
            self.invalidate();
        }
        if let Some(b) = &mut self.built {
            b.undo.clear();
        }
        self.open = true;
        Begun(now)
    }

    /// The transaction committed: the index is current at the connection's new stamp `now`
    /// (none: it could not be read), unless something outside this connection's rows changed
    /// meanwhile.
    pub(super) fn commit(&mut self, begun: Begun, now: Option<Stamp>) {
        self.open = false;
        match (&mut self.built, now) {
            (Some(b), Some(now)) if begun.0.same_outside(&now) => {
                b.undo.clear();
                b.in_tx = false;
                self.stamp.set(Some(now));
            }
            _ => self.invalidate(),
        }
    }

    /// The transaction rolled back: its index changes are taken back (an index built inside
    /// it is dropped).
    pub(super) fn rollback(&mut self) {
        self.open = false;
        let Some(b) = &mut self.built else {
            return;
        };
        if b.in_tx {
            self.invalidate();
            return;
        }
        while let Some(u) = b.undo.pop() {
            match u {
                Undo::Digest(key, None) => {
                    b.digests.remove(&key);
                }
                Undo::Digest(key, Some(d)) => {
                    b.digests.insert(key, d);
                }
                Undo::Edge(scope, key, true) => {
                    if let Some(s) = b.scopes.get_mut(&scope) {
                        s.rows.remove(&key);
                    }
                }
                Undo::Edge(scope, key, false) => {
                    b.scopes.entry(scope).or_default().rows.insert(key);
                }
                Undo::Scope(scope, None) => {
                    b.scopes.remove(&scope);
                }
                Undo::Scope(scope, Some(old)) => {
                    b.scopes.insert(scope, old);
                }
            }
        }
        // Digests cached inside the transaction saw its state.
        for s in b.scopes.values_mut() {
            s.cached = None;
        }
        b.drop_entries();
        b.epoch += 1;
    }

    /// Runs `f`, a write outside any transaction that touches no provenance edge and no
    /// stored row digest: an index current before stays current after. `stamp` reads the
    /// connection's stamp.
    pub(super) fn neutral<T>(
        &self,
        stamp: impl Fn() -> Result<Stamp, StorageError>,
        f: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let before = stamp()?;
        let current = self.current(&before);
        let out = f();
        if current {
            match stamp() {
                Ok(now) if before.same_outside(&now) => self.stamp.set(Some(now)),
                _ => self.stamp.set(None),
            }
        }
        out
    }

    /// Drops an index built under another manifest (call at the start of a transaction that
    /// writes edges or digests under `manifest`).
    pub(super) fn for_manifest(&mut self, manifest: &Manifest) {
        if self
            .built
            .as_ref()
            .is_some_and(|b| b.schema_hash != manifest.schema_hash())
        {
            self.invalidate();
        }
    }

    /// Whether the index is there (`index_load::ensure` loads it when it is not).
    pub(super) fn is_built(&self) -> bool {
        self.built.is_some()
    }

    /// Takes a loaded index as the index.
    pub(super) fn install(&mut self, loaded: Loading) {
        self.built = Some(loaded.built);
        self.builds += 1;
    }

    fn key(table: &Table, pk: &TypedValue) -> Result<Key, StorageError> {
        RowIdentity::new(table, pk)
            .map(|id| Arc::from(id.as_bytes()))
            .map_err(|_| StorageError::Verification("a key cannot form a row identity"))
    }

    /// `_synchro_rows` now holds `digest` for the row.
    pub(super) fn set_digest(
        &mut self,
        table: &Table,
        pk: &TypedValue,
        digest: [u8; 32],
    ) -> Result<(), StorageError> {
        let Some(b) = &mut self.built else {
            return Ok(());
        };
        let key = ScopeIndex::key(table, pk)?;
        let old = b.digests.insert(key.clone(), digest);
        if old != Some(digest) {
            b.epoch += 1;
            b.logged(&key);
            b.undo.push(Undo::Digest(key, old));
        }
        Ok(())
    }

    /// The row's stored digest is gone.
    pub(super) fn forget(&mut self, table: &Table, pk: &TypedValue) -> Result<(), StorageError> {
        let Some(b) = &mut self.built else {
            return Ok(());
        };
        let key = ScopeIndex::key(table, pk)?;
        if let Some((key, old)) = b.digests.remove_entry(&key) {
            b.epoch += 1;
            b.logged(&key);
            b.undo.push(Undo::Digest(key, Some(old)));
        }
        Ok(())
    }

    /// `scope` justifies the row (its provenance edge exists).
    pub(super) fn add_edge(
        &mut self,
        table: &Table,
        pk: &TypedValue,
        scope: &str,
    ) -> Result<(), StorageError> {
        let Some(b) = &mut self.built else {
            return Ok(());
        };
        let key = ScopeIndex::key(table, pk)?;
        // Share the digest map's copy of the identity. A row without a known digest means
        // the index does not mirror `_synchro_rows` here: drop it rather than guess.
        let Some((key, _)) = b.digests.get_key_value(&key) else {
            self.invalidate();
            return Ok(());
        };
        let key = key.clone();
        let (name, s) = scope_entry(&mut b.scopes, scope);
        if s.rows.insert(key.clone()) {
            s.cached = None;
            b.log.push(key.clone());
            b.undo.push(Undo::Edge(name, key, true));
        }
        b.cap_log();
        Ok(())
    }

    /// The edge from `scope` to the row is gone.
    pub(super) fn remove_edge(
        &mut self,
        table: &Table,
        pk: &TypedValue,
        scope: &str,
    ) -> Result<(), StorageError> {
        let Some(b) = &mut self.built else {
            return Ok(());
        };
        let key = ScopeIndex::key(table, pk)?;
        let Some(name) = b.scopes.get_key_value(scope).map(|(n, _)| n.clone()) else {
            return Ok(());
        };
        let s = b.scopes.get_mut(&name).expect("just found");
        if let Some(key) = s.rows.take(&key) {
            s.cached = None;
            b.log.push(key.clone());
            b.undo.push(Undo::Edge(name, key, false));
        }
        b.cap_log();
        Ok(())
    }

    /// Every edge of `scope` in `table` is gone (the rows' digests are forgotten apart).
    pub(super) fn clear_scope(&mut self, table: &Table, scope: &str) {
        let Some(b) = &mut self.built else {
            return;
        };
        let Some(name) = b.scopes.get_key_value(scope).map(|(n, _)| n.clone()) else {
            return;
        };
        let prefix = table_prefix(table);
        let s = b.scopes.get_mut(&name).expect("just found");
        let gone: Vec<Key> = s
            .rows
            .iter()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        s.entries = None;
        b.undo.push(Undo::Scope(name, Some(s.clone())));
        for k in &gone {
            s.rows.remove(k);
        }
        s.cached = None;
    }

    /// The digest of `scope` from the index, which is there (`index_load::scope_digest`
    /// loads it first if needed), by the formula of spec 001: cardinality, then every row in
    /// identity order with its stored digest.
    pub(super) fn scope_digest(&mut self, scope: &str) -> Result<[u8; 32], StorageError> {
        let b = self
            .built
            .as_mut()
            .ok_or(StorageError::Verification("the scope index is not loaded"))?;
        let epoch = b.epoch;
        let empty = Scope::default();
        let s = b.scopes.get(scope).unwrap_or(&empty);
        if let Some((at, d)) = s.cached {
            if at == epoch {
                return Ok(d);
            }
        }
        let Some(s) = b.scopes.get_mut(scope) else {
            return digest_rows(&b.schema_hash, scope, &empty.rows, &b.digests);
        };
        let now = b.log_base + b.log.len() as u64;
        let mut entries = match s.entries.take() {
            Some((at, mut entries)) if at >= b.log_base => {
                // Every key logged since: in the scope with its digest, or not in it.
                let mut changes = Vec::new();
                for key in &b.log[(at - b.log_base) as usize..] {
                    let change = if s.rows.contains(key) {
                        Some(*b.digests.get(key).ok_or(StorageError::Verification(
                            "a provenance edge without its row",
                        ))?)
                    } else {
                        None
                    };
                    changes.push((key.clone(), change));
                }
                entries.apply(changes);
                entries
            }
            _ => entries_of(&s.rows, &b.digests)?,
        };
        let digest = entries
            .digest(&b.schema_hash, scope)
            .map_err(|_| StorageError::Verification("the scope digest cannot be computed"))?;
        s.entries = Some((now, entries));
        s.cached = Some((epoch, digest));
        // The log is kept from the oldest position a scope's entries stand at.
        let oldest = b
            .scopes
            .values()
            .filter_map(|s| s.entries.as_ref().map(|(at, _)| *at))
            .min()
            .unwrap_or(now);
        if oldest > b.log_base {
            b.log.drain(..(oldest - b.log_base) as usize);
            b.log_base = oldest;
        }
        Ok(digest)
    }
}

/// The scope's entry, created empty if needed, with its shared name.
fn scope_entry<'a>(
    scopes: &'a mut HashMap<Arc<str>, Scope>,
    scope: &str,
) -> (Arc<str>, &'a mut Scope) {
    let name = match scopes.get_key_value(scope) {
        Some((n, _)) => n.clone(),
        None => Arc::from(scope),
    };
    let s = scopes.entry(name.clone()).or_default();
    (name, s)
}

/// The identity octets every row of `table` starts with (domain, table ID, key field ID):
/// identities of different tables differ inside these octets.
fn table_prefix(table: &Table) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(synchro_protocol::binary::ROW_ID_DOMAIN);
    synchro_protocol::binary::put_text(&mut out, &table.table_id);
    synchro_protocol::binary::put_text(&mut out, &table.primary_key().field_id);
    out
}

/// A scope's entries from its rows (already in identity order) and their digests.
fn entries_of(rows: &BTreeSet<Key>, digests: &Digests) -> Result<ScopeEntries, StorageError> {
    let mut out = Vec::with_capacity(rows.len());
    for key in rows {
        let digest = digests.get(key).ok_or(StorageError::Verification(
            "a provenance edge without its row",
        ))?;
        out.push((key, *digest));
    }
    ScopeEntries::from_sorted(out)
        .map_err(|_| StorageError::Verification("the scope digest cannot be computed"))
}

/// The streaming scope digest over `rows` (already in identity order).
fn digest_rows(
    schema_hash: &[u8; 32],
    scope: &str,
    rows: &BTreeSet<Key>,
    digests: &Digests,
) -> Result<[u8; 32], StorageError> {
    let fail = |_| StorageError::Verification("the scope digest cannot be computed");
    let mut d = ScopeDigester::new(schema_hash, scope, rows.len() as u64).map_err(fail)?;
    for key in rows {
        let digest = digests.get(key).ok_or(StorageError::Verification(
            "a provenance edge without its row",
        ))?;
        d.add_octets(key, digest).map_err(fail)?;
    }
    Ok(d.finish().map_err(fail)?.digest)
}

/// An index being loaded from the tables, one provenance edge at a time
/// (`index_load::ensure` reads them), then [`ScopeIndex::install`]ed.
pub(super) struct Loading {
    built: Built,
    /// Scope IDs, shared.
    names: HashMap<String, Arc<str>>,
}

impl Loading {
    /// An empty index under `manifest`; `in_tx`: loaded inside an open transaction (from its
    /// uncommitted state, so a rollback drops it).
    pub(super) fn new(manifest: &Manifest, in_tx: bool) -> Loading {
        Loading {
            built: Built {
                schema_hash: manifest.schema_hash(),
                digests: Digests::default(),
                scopes: HashMap::new(),
                epoch: 0,
                undo: Vec::new(),
                in_tx,
                log: Vec::new(),
                log_base: 0,
            },
            names: HashMap::new(),
        }
    }

    /// `scope` justifies the row `pk` of `table`; `stored` gives the row's stored digest (asked
    /// only for a row not seen before). An edge whose row has no stored digest stays in its
    /// scope: computing that scope's digest fails, as it does from the tables.
    pub(super) fn edge(
        &mut self,
        table: &Table,
        pk: &TypedValue,
        scope: String,
        stored: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<(), StorageError> {
        let b = &mut self.built;
        let key = ScopeIndex::key(table, pk)?;
        let key = match b.digests.get_key_value(&key) {
            Some((k, _)) => k.clone(),
            None => {
                if let Some(d) = stored() {
                    b.digests.insert(key.clone(), d);
                }
                key
            }
        };
        let name = self
            .names
            .entry(scope)
            .or_insert_with_key(|s| Arc::from(s.as_str()))
            .clone();
        b.scopes.entry(name).or_default().rows.insert(key);
        Ok(())
    }
}
