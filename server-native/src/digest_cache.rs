//! Row digests kept in memory, so a terminal pull page (whose checksum covers the whole
//! scope) digests only the rows it has not seen before instead of every row of the scope;
//! and whole scope digests, reused while the scope's inputs are unchanged (spec 001: "cache
//! a complete scope digest while its inputs are unchanged").
//!
//! An entry is keyed by a 128-bit SHA-256 prefix of (schema hash, table ID, key, server
//! version): a row's content is fixed for a server version under one schema, and a schema
//! change changes every key. The cache holds at most [`MAX_ENTRIES`] digests (about 64 MiB)
//! and starts over when full. It holds digests only, never row values; the scope indexes
//! ([`ScopeIndex`]) also hold row identities (which encode keys), in memory only.
//!
//! One [`DigestCache`] lives in each server's state (`AppState::caches`): two servers in one
//! process (as in tests) share nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// Most entries kept before the cache is cleared.
pub const MAX_ENTRIES: usize = 1 << 20;

/// Most scope digests kept before that cache is cleared.
pub const MAX_SCOPES: usize = 1 << 18;

/// Most rows kept across all scope indexes (about 150 bytes each) before they are dropped.
pub const MAX_INDEXED_ROWS: usize = 2_000_000;

type Key = [u8; 16];

/// A scope's cached digest: under one schema, with the scope's stream fingerprint (see
/// [`DigestCache::scope_get`]) it was computed at.
type ScopeEntry = (i64, [u8; 32]);

/// Scope digests by (schema hash, scope).
type Scopes = HashMap<([u8; 32], String), ScopeEntry>;

/// Scope indexes by (schema hash, scope), and the rows they hold in all.
type Indexes = (HashMap<([u8; 32], String), ScopeIndex>, usize);

/// A server's row digests, scope digests and scope indexes.
#[derive(Default)]
pub struct DigestCache {
    rows: Mutex<HashMap<Key, [u8; 32]>>,
    scopes: Mutex<Scopes>,
    indexes: Mutex<Indexes>,
    index_builds: AtomicU64,
    index_advances: AtomicU64,
}

/// The cache key of one row version under one schema.
pub fn key(schema_hash: &[u8; 32], table_id: &str, pk: &str, server_version: &str) -> Key {
    let mut h = Sha256::new();
    h.update(b"synchro-server:row-digest-cache:v1\0");
    h.update(schema_hash);
    for part in [table_id, pk, server_version] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// A scope's rows in row-identity order with their digests, as of a stream fingerprint:
/// a later terminal digest of the scope replaces just the rows the scope's effects since
/// then name, and hashes from the first changed entry on (spec 001: "maintain an ordered
/// index"; see [`synchro_protocol::scope_entries`]).
pub struct ScopeIndex {
    /// The scope's fingerprint (see [`DigestCache::scope_get`]) this index reflects.
    pub fingerprint: i64,
    /// Row identity octets → row digest, with the hasher states kept along them.
    pub rows: synchro_protocol::scope_entries::ScopeEntries,
}

impl ScopeIndex {
    /// The scope digest of the indexed rows.
    pub fn digest(
        &mut self,
        schema_hash: &[u8; 32],
        scope: &str,
    ) -> synchro_protocol::Result<[u8; 32]> {
        self.rows.digest(schema_hash, scope)
    }
}

impl DigestCache {
    /// The cached digests of `keys`, in order.
    pub fn get_many(&self, keys: &[Key]) -> Vec<Option<[u8; 32]>> {
        let c = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter().map(|k| c.get(k).copied()).collect()
    }

    /// Remembers digests.
    pub fn put_many(&self, entries: impl IntoIterator<Item = (Key, [u8; 32])>) {
        let mut c = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        for (k, d) in entries {
            if c.len() >= MAX_ENTRIES {
                c.clear();
            }
            c.insert(k, d);
        }
    }

    /// The cached digest of `scope` under `schema_hash` when it was computed at
    /// `fingerprint`: the greater of the scope's last effect position and its resume floor.
    /// Every change of a scope's rows or membership writes an effect at a new, higher
    /// position, and compaction only deletes effects at or below the floor it raises, so an
    /// unchanged fingerprint means unchanged inputs (a schema change changes the hash).
    pub fn scope_get(
        &self,
        schema_hash: &[u8; 32],
        scope: &str,
        fingerprint: i64,
    ) -> Option<[u8; 32]> {
        let c = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        c.get(&(*schema_hash, scope.to_owned()))
            .filter(|(f, _)| *f == fingerprint)
            .map(|(_, d)| *d)
    }

    /// Remembers a scope digest computed at `fingerprint`.
    pub fn scope_put(
        &self,
        schema_hash: &[u8; 32],
        scope: &str,
        fingerprint: i64,
        digest: [u8; 32],
    ) {
        let mut c = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= MAX_SCOPES {
            c.clear();
        }
        c.insert((*schema_hash, scope.to_owned()), (fingerprint, digest));
    }

    /// Takes the index of `scope` under `schema_hash` out of the store (a concurrent
    /// terminal digest of the scope builds its own meanwhile).
    pub fn index_take(&self, schema_hash: &[u8; 32], scope: &str) -> Option<ScopeIndex> {
        let mut c = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        let taken = c.0.remove(&(*schema_hash, scope.to_owned()));
        if let Some(i) = &taken {
            c.1 -= i.rows.len();
        }
        taken
    }

    /// Stores a scope's index unless the store holds one at a later fingerprint; when the
    /// rows held would pass [`MAX_INDEXED_ROWS`], the others are dropped first (an index
    /// larger than that is not kept).
    pub fn index_put(&self, schema_hash: &[u8; 32], scope: &str, index: ScopeIndex) {
        if index.rows.len() > MAX_INDEXED_ROWS {
            return;
        }
        let mut c = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        let key = (*schema_hash, scope.to_owned());
        if let Some(old) = c.0.get(&key) {
            if old.fingerprint >= index.fingerprint {
                return;
            }
            let n = old.rows.len();
            c.0.remove(&key);
            c.1 -= n;
        }
        if c.1 + index.rows.len() > MAX_INDEXED_ROWS {
            c.0.clear();
            c.1 = 0;
        }
        c.1 += index.rows.len();
        c.0.insert(key, index);
    }

    /// Counts a scope index built in full.
    pub fn count_index_build(&self) {
        self.index_builds.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a scope index brought forward.
    pub fn count_index_advance(&self) {
        self.index_advances.fetch_add(1, Ordering::Relaxed);
    }

    /// How many scope indexes were built in full and brought forward since the server began.
    pub fn index_counts(&self) -> (u64, u64) {
        (
            self.index_builds.load(Ordering::Relaxed),
            self.index_advances.load(Ordering::Relaxed),
        )
    }
}
