//! Row digests kept in memory, so a terminal pull page (whose checksum covers the whole
//! scope) digests only the rows it has not seen before instead of every row of the scope.
//!
//! An entry is keyed by a 128-bit SHA-256 prefix of (schema hash, table ID, key, server
//! version): a row's content is fixed for a server version under one schema, and a schema
//! change changes every key. The cache holds at most [`MAX_ENTRIES`] digests (about 64 MiB)
//! and starts over when full. It holds digests only, never row values.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// Most entries kept before the cache is cleared.
pub const MAX_ENTRIES: usize = 1 << 20;

type Key = [u8; 16];

fn cache() -> &'static Mutex<HashMap<Key, [u8; 32]>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, [u8; 32]>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
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

/// The cached digests of `keys`, in order.
pub fn get_many(keys: &[Key]) -> Vec<Option<[u8; 32]>> {
    let c = cache().lock().unwrap_or_else(|e| e.into_inner());
    keys.iter().map(|k| c.get(k).copied()).collect()
}

/// Remembers digests.
pub fn put_many(entries: impl IntoIterator<Item = (Key, [u8; 32])>) {
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    for (k, d) in entries {
        if c.len() >= MAX_ENTRIES {
            c.clear();
        }
        c.insert(k, d);
    }
}
