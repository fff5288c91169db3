//! A scope's ordered (row identity, row digest) entries, held as the octets the scope digest
//! hashes, so that a terminal digest after a few changes costs a lookup per change plus
//! hashing from the first changed octet on, instead of a walk and a hash of every entry
//! (spec 001: "maintain an ordered index, or cache a complete scope digest while its inputs
//! are unchanged").
//!
//! The octets are `u64be(len(row_identity)) || row_identity || row_digest` for each entry in
//! identity order: exactly the scope digest's input after its header. SHA-256 is a
//! Merkle–Damgård hash: its state after a prefix of the input depends on that prefix alone.
//! So the state after the header and every [`CHECKPOINT`] octets of entries is kept, and a
//! later digest under the same header (schema hash, scope ID and cardinality) resumes from
//! the last kept state before the first octet that changed since. The result is the
//! formula's hash of the whole input (a property test checks it against
//! [`crate::digest::ScopeDigester`] over random changes).

use sha2::{Digest, Sha256};

use crate::binary::{put_text, put_u64, SCOPE_DOMAIN};
use crate::error::{Error, Result};

/// Entry octets between two kept hasher states.
pub const CHECKPOINT: usize = 64 * 1024;

/// Above this many changes at once, [`ScopeEntries::apply`] merges them in one pass over the
/// entries instead of moving the tail of the octets once per inserted or removed entry.
const MERGE_ABOVE: usize = 16;

/// One scope's entries in identity order with their digests (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct ScopeEntries {
    octets: Vec<u8>,
    /// Where each entry starts in `octets`, in identity order.
    starts: Vec<usize>,
    /// The scope digest header the kept states began with.
    header: Vec<u8>,
    /// `states[k]`: the hasher after `header` and `octets[..k * CHECKPOINT]`.
    states: Vec<Sha256>,
    /// The first octet changed since the states were kept (`usize::MAX`: none).
    dirty: usize,
}

impl ScopeEntries {
    /// No entries.
    pub fn new() -> ScopeEntries {
        ScopeEntries {
            dirty: usize::MAX,
            ..ScopeEntries::default()
        }
    }

    /// Entries given in strictly increasing identity order (as the digest requires); a
    /// duplicate or out-of-order identity is refused.
    pub fn from_sorted<I, K>(entries: I) -> Result<ScopeEntries>
    where
        I: IntoIterator<Item = (K, [u8; 32])>,
        K: AsRef<[u8]>,
    {
        let mut out = ScopeEntries::new();
        for (id, digest) in entries {
            let id = id.as_ref();
            if let Some(last) = out.starts.len().checked_sub(1) {
                if id <= out.identity(last) {
                    return Err(order_error(id == out.identity(last)));
                }
            }
            out.push(id, &digest);
        }
        Ok(out)
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The digest of the entry with identity octets `id`.
    pub fn get(&self, id: &[u8]) -> Option<[u8; 32]> {
        self.find(id).ok().map(|i| self.digest_at(i))
    }

    /// The entries in identity order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], [u8; 32])> + '_ {
        (0..self.len()).map(|i| (self.identity(i), self.digest_at(i)))
    }

    /// Sets the digest of `id` (adding the entry if absent); the previous digest.
    pub fn insert(&mut self, id: &[u8], digest: [u8; 32]) -> Option<[u8; 32]> {
        match self.find(id) {
            Ok(i) => {
                let old = self.digest_at(i);
                if old != digest {
                    let at = self.digest_offset(i);
                    self.octets[at..at + 32].copy_from_slice(&digest);
                    self.dirty = self.dirty.min(at);
                }
                Some(old)
            }
            Err(i) => {
                let at = self.starts.get(i).copied().unwrap_or(self.octets.len());
                let mut entry = Vec::with_capacity(8 + id.len() + 32);
                put_entry(&mut entry, id, &digest);
                self.octets.splice(at..at, entry.iter().copied());
                self.starts.insert(i, at);
                for s in &mut self.starts[i + 1..] {
                    *s += entry.len();
                }
                self.dirty = self.dirty.min(at);
                None
            }
        }
    }

    /// Removes the entry of `id`; its digest.
    pub fn remove(&mut self, id: &[u8]) -> Option<[u8; 32]> {
        let i = self.find(id).ok()?;
        let old = self.digest_at(i);
        let at = self.starts[i];
        let n = 8 + id.len() + 32;
        self.octets.drain(at..at + n);
        self.starts.remove(i);
        for s in &mut self.starts[i..] {
            *s -= n;
        }
        self.dirty = self.dirty.min(at);
        Some(old)
    }

    /// Applies changes: `Some(digest)` sets an entry, `None` removes it. Of several changes
    /// of one identity the last counts. Many changes are merged in one pass.
    pub fn apply<K: AsRef<[u8]>>(&mut self, changes: Vec<(K, Option<[u8; 32]>)>) {
        let mut changes: Vec<(usize, K, Option<[u8; 32]>)> = changes
            .into_iter()
            .enumerate()
            .map(|(n, (k, c))| (n, k, c))
            .collect();
        // By identity, then the last given first, so that a dedup keeps it.
        changes.sort_by(|a, b| a.1.as_ref().cmp(b.1.as_ref()).then(b.0.cmp(&a.0)));
        changes.dedup_by(|later, first| later.1.as_ref() == first.1.as_ref());
        if changes.len() <= MERGE_ABOVE {
            for (_, id, change) in changes {
                match change {
                    Some(d) => {
                        self.insert(id.as_ref(), d);
                    }
                    None => {
                        self.remove(id.as_ref());
                    }
                }
            }
            return;
        }
        let old = std::mem::take(self);
        let mut out = ScopeEntries {
            octets: Vec::with_capacity(old.octets.len()),
            starts: Vec::with_capacity(old.starts.len()),
            header: old.header.clone(),
            states: Vec::new(),
            dirty: old.dirty,
        };
        let mut i = 0;
        let mut first_change: Option<usize> = None;
        for (_, id, change) in &changes {
            let id = id.as_ref();
            while i < old.len() && old.identity(i) < id {
                out.push(old.identity(i), &old.digest_at(i));
                i += 1;
            }
            let existing = (i < old.len() && old.identity(i) == id).then(|| old.digest_at(i));
            if existing.is_some() {
                i += 1;
            }
            if existing != *change {
                first_change.get_or_insert(out.octets.len());
            }
            if let Some(d) = change {
                out.push(id, d);
            }
        }
        while i < old.len() {
            out.push(old.identity(i), &old.digest_at(i));
            i += 1;
        }
        // The octets before the first change are the old ones: so are the states there.
        if let Some(at) = first_change {
            out.dirty = out.dirty.min(at);
        }
        out.states = old.states;
        *self = out;
    }

    /// The scope digest of these entries (spec 001) for `scope_id` under `schema_hash`.
    pub fn digest(&mut self, schema_hash: &[u8; 32], scope_id: &str) -> Result<[u8; 32]> {
        if scope_id.is_empty() {
            return Err(Error::InvalidScope {
                reason: "scope ID must be nonempty",
            });
        }
        let mut header = Vec::with_capacity(SCOPE_DOMAIN.len() + 32 + 16 + scope_id.len());
        header.extend_from_slice(SCOPE_DOMAIN);
        header.extend_from_slice(schema_hash);
        put_text(&mut header, scope_id);
        put_u64(&mut header, self.len() as u64);
        if header != self.header {
            self.states.clear();
            self.header = header;
        }
        // A state is good while every octet it covers is unchanged.
        let good = match self.dirty {
            usize::MAX => self.states.len(),
            d => self.states.len().min(d / CHECKPOINT + 1),
        };
        self.states.truncate(good);
        if self.states.is_empty() {
            let mut h = Sha256::new();
            h.update(&self.header);
            self.states.push(h);
        }
        let k = self.states.len() - 1;
        let mut h = self.states[k].clone();
        let mut at = k * CHECKPOINT;
        while at + CHECKPOINT <= self.octets.len() {
            h.update(&self.octets[at..at + CHECKPOINT]);
            at += CHECKPOINT;
            self.states.push(h.clone());
        }
        h.update(&self.octets[at..]);
        self.dirty = usize::MAX;
        Ok(h.finalize().into())
    }

    fn push(&mut self, id: &[u8], digest: &[u8; 32]) {
        self.starts.push(self.octets.len());
        put_entry(&mut self.octets, id, digest);
    }

    fn identity(&self, i: usize) -> &[u8] {
        let s = self.starts[i];
        let n = u64::from_be_bytes(self.octets[s..s + 8].try_into().expect("8 octets"));
        &self.octets[s + 8..s + 8 + n as usize]
    }

    fn digest_offset(&self, i: usize) -> usize {
        self.starts[i] + 8 + self.identity(i).len()
    }

    fn digest_at(&self, i: usize) -> [u8; 32] {
        let at = self.digest_offset(i);
        self.octets[at..at + 32].try_into().expect("32 octets")
    }

    fn find(&self, id: &[u8]) -> std::result::Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.identity(mid).cmp(id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
}

fn put_entry(out: &mut Vec<u8>, id: &[u8], digest: &[u8; 32]) {
    out.extend_from_slice(&(id.len() as u64).to_be_bytes());
    out.extend_from_slice(id);
    out.extend_from_slice(digest);
}

fn order_error(duplicate: bool) -> Error {
    Error::InvalidScope {
        reason: if duplicate {
            "duplicate row identity"
        } else {
            "row identities out of order"
        },
    }
}
