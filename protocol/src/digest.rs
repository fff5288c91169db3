//! Row identity, row digest and the streaming scope digest (spec 001), byte-exact.
//!
//! ```text
//! row_identity = ROW_ID_DOMAIN || text(table_id) || text(pk_field_id) || typed_value
//! row_digest   = SHA-256(ROW_DIGEST_DOMAIN || schema_hash_raw || u64be(len(row_identity))
//!                || row_identity || u64be(len(row_body)) || row_body || text(server_version))
//! scope_digest = SHA-256(SCOPE_DOMAIN || schema_hash_raw || text(scope_id) || u64be(cardinality)
//!                || ordered(u64be(len(row_identity)) || row_identity || row_digest))
//! ```

use sha2::{Digest, Sha256};

use crate::binary::{
    put_text, put_u32, put_u64, Reader, ROW_DIGEST_DOMAIN, ROW_ID_DOMAIN, SCOPE_DOMAIN,
};
use crate::error::{Error, Result};
use crate::json::Json;
use crate::manifest::{Manifest, Table};
use crate::types::PortableType;
use crate::value::TypedValue;

/// The canonical octets of one row identity. Orders by unsigned octet comparison.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowIdentity(Vec<u8>);

impl AsRef<[u8]> for RowIdentity {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl RowIdentity {
    /// Builds the identity of a row of `table` with primary key `pk`, which must be a
    /// non-null value of the table's primary-key type.
    pub fn new(table: &Table, pk: &TypedValue) -> Result<RowIdentity> {
        let pk_field = table.primary_key();
        if pk.is_null() {
            return Err(Error::NullNotAllowed);
        }
        if pk.ty() != pk_field.spec.ty {
            return Err(Error::TypeMismatch {
                ty: pk_field.spec.ty,
            });
        }
        let mut out = Vec::with_capacity(ROW_ID_DOMAIN.len() + 64);
        out.extend_from_slice(ROW_ID_DOMAIN);
        put_text(&mut out, &table.table_id);
        put_text(&mut out, &pk_field.field_id);
        pk.encode(&mut out);
        Ok(RowIdentity(out))
    }

    /// Parses octets that must be exactly one well-formed row identity: the domain, a
    /// nonempty UTF-8 table ID and key field ID, and one non-null string, int or int64 typed
    /// value, with nothing after it.
    pub fn from_bytes(bytes: &[u8]) -> Result<RowIdentity> {
        let bad = |reason| Error::InvalidRowIdentity { reason };
        let mut r = Reader::new(bytes);
        if r.take(ROW_ID_DOMAIN.len()) != Some(ROW_ID_DOMAIN) {
            return Err(bad("missing row-identity domain"));
        }
        for _ in 0..2 {
            match r.text() {
                Some(s) if !s.is_empty() => {}
                Some(_) => return Err(bad("empty table or key field ID")),
                None => return Err(bad("truncated or non-UTF-8 ID")),
            }
        }
        let ty = r
            .u8()
            .and_then(PortableType::from_tag)
            .filter(|t| t.is_key_type())
            .ok_or(bad("key type tag is not string, int or int64"))?;
        if r.u8() != Some(0x01) {
            return Err(bad("key presence must be 0x01"));
        }
        let ok = match ty {
            PortableType::String => r.text().is_some(),
            PortableType::Int => r.take(4).is_some(),
            _ => r.take(8).is_some(),
        };
        if !ok {
            return Err(bad("truncated or non-UTF-8 key value"));
        }
        if !r.is_empty() {
            return Err(bad("trailing octets after the key value"));
        }
        Ok(RowIdentity(bytes.to_vec()))
    }

    /// The identity octets.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A validated complete authoritative row and its digest input.
#[derive(Debug, Clone)]
pub struct RowDigest {
    /// The row's canonical identity.
    pub identity: RowIdentity,
    /// The exact octets hashed.
    pub input: Vec<u8>,
    /// SHA-256 of `input`.
    pub digest: [u8; 32],
}

impl RowDigest {
    fn hash(
        schema_hash: &[u8; 32],
        identity: RowIdentity,
        body: &[u8],
        server_version: &str,
    ) -> Self {
        let input = row_digest_input(schema_hash, &identity, body, server_version);
        let digest = Sha256::digest(&input).into();
        RowDigest {
            identity,
            input,
            digest,
        }
    }
}

/// Validates a complete row against its table and builds `row_body`: every synced field
/// exactly once, the key inside the row equal to `pk`, fields ordered by field-ID octets.
pub fn row_body(table: &Table, row: &Json, pk: &TypedValue) -> Result<Vec<u8>> {
    let Json::Object(members) = row else {
        return Err(Error::row("row must be a JSON object"));
    };
    let values = place_values(
        table,
        members.iter().map(|(k, v)| (k.as_str(), v)),
        TypedValue::from_wire,
        pk,
    )?;
    let mut body = Vec::with_capacity(16 * table.fields.len());
    encode_body(table, &values, &mut body);
    Ok(body)
}

/// The values of a complete row given as wire JSON (which is consumed), one per field in
/// the table's field order, with exactly the checks of [`row_body`]: every synced field
/// exactly once, no other member, each value canonical for its field, the key inside the
/// row equal to `pk`.
pub fn row_values(table: &Table, row: Json, pk: &TypedValue) -> Result<Vec<TypedValue>> {
    let Json::Object(members) = row else {
        return Err(Error::row("row must be a JSON object"));
    };
    let mut values = vec![None; table.fields.len()];
    for (name, value) in members {
        let i = field_index(table, &name)?;
        values[i] = Some(TypedValue::from_wire_owned(&table.fields[i].spec, value)?);
    }
    complete(table, values, pk)
}

/// The field position of member `name`.
fn field_index(table: &Table, name: &str) -> Result<usize> {
    // Fields are sorted by ID octets.
    table
        .fields
        .binary_search_by(|f| f.field_id.as_bytes().cmp(name.as_bytes()))
        .map_err(|_| Error::row("row has a field that is not in the table"))
}

/// Places each member at its field's position (the parser already rejects duplicate
/// member names).
fn place_values<'a, V>(
    table: &Table,
    members: impl Iterator<Item = (&'a str, V)>,
    convert: impl Fn(&crate::types::FieldSpec, V) -> Result<TypedValue>,
    pk: &TypedValue,
) -> Result<Vec<TypedValue>> {
    let mut slots: Vec<Option<TypedValue>> = vec![None; table.fields.len()];
    for (name, value) in members {
        let i = field_index(table, name)?;
        slots[i] = Some(convert(&table.fields[i].spec, value)?);
    }
    complete(table, slots, pk)
}

/// Every field present, the key equal to `pk`.
fn complete(
    table: &Table,
    slots: Vec<Option<TypedValue>>,
    pk: &TypedValue,
) -> Result<Vec<TypedValue>> {
    let mut values = Vec::with_capacity(slots.len());
    for (field, slot) in table.fields.iter().zip(slots) {
        let Some(value) = slot else {
            return Err(Error::row(format!(
                "row is missing field {}",
                field.field_id
            )));
        };
        if field.field_id == table.primary_key_field_id && value != *pk {
            return Err(Error::PrimaryKeyMismatch);
        }
        values.push(value);
    }
    Ok(values)
}

/// Appends `row_body` for values already checked against `table` (one per field, in field
/// order).
fn encode_body(table: &Table, values: &[TypedValue], out: &mut Vec<u8>) {
    put_u32(out, table.fields.len() as u32);
    for (field, value) in table.fields.iter().zip(values) {
        put_text(out, &field.field_id);
        value.encode(out);
    }
}

/// Computes row digests of many rows with one reusable buffer (the verification loop of a
/// client applying a page): the same octets as [`row_digest_input`], hashed without keeping
/// them.
#[derive(Debug, Default)]
pub struct RowHasher {
    body: Vec<u8>,
    input: Vec<u8>,
}

impl RowHasher {
    /// A hasher with empty buffers.
    pub fn new() -> RowHasher {
        RowHasher::default()
    }

    /// The row digest of `values` (one per field of `table`, in field order, as returned by
    /// [`row_values`] or read back and validated from storage), whose identity is `identity`,
    /// at `server_version`.
    pub fn digest(
        &mut self,
        schema_hash: &[u8; 32],
        table: &Table,
        identity: &RowIdentity,
        values: &[TypedValue],
        server_version: &str,
    ) -> Result<[u8; 32]> {
        if values.len() != table.fields.len() {
            return Err(Error::row("row must have exactly one value per field"));
        }
        if server_version.is_empty() {
            return Err(Error::InvalidServerVersion);
        }
        self.body.clear();
        encode_body(table, values, &mut self.body);
        let id = identity.as_bytes();
        self.input.clear();
        self.input.extend_from_slice(ROW_DIGEST_DOMAIN);
        self.input.extend_from_slice(schema_hash);
        put_u64(&mut self.input, id.len() as u64);
        self.input.extend_from_slice(id);
        put_u64(&mut self.input, self.body.len() as u64);
        self.input.extend_from_slice(&self.body);
        put_text(&mut self.input, server_version);
        Ok(Sha256::digest(&self.input).into())
    }
}

/// Computes the row digest of a complete row given as validated values, one per field in
/// the table's field order (sorted by field ID), e.g. as read back from local storage.
pub fn row_digest_of_values(
    schema_hash: &[u8; 32],
    table: &Table,
    values: &[TypedValue],
    server_version: &str,
) -> Result<RowDigest> {
    if values.len() != table.fields.len() {
        return Err(Error::row("row must have exactly one value per field"));
    }
    if server_version.is_empty() {
        return Err(Error::InvalidServerVersion);
    }
    let mut body = Vec::with_capacity(16 * values.len());
    put_u32(&mut body, values.len() as u32);
    let mut identity = None;
    for (field, value) in table.fields.iter().zip(values) {
        value.check(&field.spec)?;
        if field.field_id == table.primary_key_field_id {
            identity = Some(RowIdentity::new(table, value)?);
        }
        put_text(&mut body, &field.field_id);
        value.encode(&mut body);
    }
    let identity = identity.expect("validated table has its primary-key field");
    Ok(RowDigest::hash(
        schema_hash,
        identity,
        &body,
        server_version,
    ))
}

/// Computes the row digest of a complete row (`row_json` a JSON object keyed by field ID,
/// `pk_json` the separate primary-key wire value) at `server_version`.
pub fn row_digest(
    manifest: &Manifest,
    table_id: &str,
    pk_json: &Json,
    row_json: &Json,
    server_version: &str,
) -> Result<RowDigest> {
    let table = manifest.table(table_id).ok_or(Error::UnknownTable)?;
    let pk = TypedValue::from_wire(&table.primary_key().spec, pk_json)?;
    let identity = RowIdentity::new(table, &pk)?;
    if server_version.is_empty() {
        return Err(Error::InvalidServerVersion);
    }
    let body = row_body(table, row_json, &pk)?;
    Ok(RowDigest::hash(
        &manifest.schema_hash(),
        identity,
        &body,
        server_version,
    ))
}

/// The exact row-digest input octets.
pub fn row_digest_input(
    schema_hash: &[u8; 32],
    identity: &RowIdentity,
    body: &[u8],
    server_version: &str,
) -> Vec<u8> {
    let id = identity.as_bytes();
    let mut out = Vec::with_capacity(
        ROW_DIGEST_DOMAIN.len() + 32 + 24 + id.len() + body.len() + server_version.len(),
    );
    out.extend_from_slice(ROW_DIGEST_DOMAIN);
    out.extend_from_slice(schema_hash);
    put_u64(&mut out, id.len() as u64);
    out.extend_from_slice(id);
    put_u64(&mut out, body.len() as u64);
    out.extend_from_slice(body);
    put_text(&mut out, server_version);
    out
}

/// The standard streaming scope digest: one SHA-256 context, updated with the header and
/// then each entry in strictly increasing identity order, finalized once.
///
/// The declared cardinality is hashed first, so [`ScopeDigester::finish`] fails unless
/// exactly that many entries were added; [`ScopeDigester::add`] fails on an entry that is
/// not strictly greater than the previous one (duplicate or out of order).
pub struct ScopeDigester {
    hasher: Sha256,
    expected: u64,
    seen: u64,
    last: Vec<u8>,
    /// Entries are staged here and handed to SHA-256 in large blocks: many small
    /// `update` calls cost more than the hashing itself.
    pending: Vec<u8>,
    record: Option<Vec<u8>>,
}

const FLUSH_AT: usize = 16 * 1024;

impl ScopeDigester {
    /// Starts a scope digest. `scope_id` must be nonempty.
    pub fn new(schema_hash: &[u8; 32], scope_id: &str, cardinality: u64) -> Result<Self> {
        ScopeDigester::start(schema_hash, scope_id, cardinality, false)
    }

    /// Like [`ScopeDigester::new`], also keeping every hashed octet (for conformance output).
    pub fn recording(schema_hash: &[u8; 32], scope_id: &str, cardinality: u64) -> Result<Self> {
        ScopeDigester::start(schema_hash, scope_id, cardinality, true)
    }

    fn start(
        schema_hash: &[u8; 32],
        scope_id: &str,
        cardinality: u64,
        record: bool,
    ) -> Result<Self> {
        if scope_id.is_empty() {
            return Err(Error::InvalidScope {
                reason: "scope ID must be nonempty",
            });
        }
        let mut header = Vec::with_capacity(SCOPE_DOMAIN.len() + 32 + 16 + scope_id.len());
        header.extend_from_slice(SCOPE_DOMAIN);
        header.extend_from_slice(schema_hash);
        put_text(&mut header, scope_id);
        put_u64(&mut header, cardinality);
        let mut d = ScopeDigester {
            hasher: Sha256::new(),
            expected: cardinality,
            seen: 0,
            last: Vec::new(),
            pending: Vec::with_capacity(FLUSH_AT + 256),
            record: record.then(Vec::new),
        };
        d.update(&header);
        Ok(d)
    }

    fn update(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= FLUSH_AT {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.hasher.update(&self.pending);
        if let Some(r) = &mut self.record {
            r.extend_from_slice(&self.pending);
        }
        self.pending.clear();
    }

    /// Adds the next entry; identities must strictly increase.
    pub fn add(&mut self, identity: &RowIdentity, row_digest: &[u8; 32]) -> Result<()> {
        self.add_octets(identity.as_bytes(), row_digest)
    }

    /// [`ScopeDigester::add`] for identity octets held elsewhere (an index of a scope's
    /// rows); they must be the octets of a [`RowIdentity`].
    pub fn add_octets(&mut self, id: &[u8], row_digest: &[u8; 32]) -> Result<()> {
        if self.seen > 0 && id <= self.last.as_slice() {
            return Err(Error::InvalidScope {
                reason: if id == self.last.as_slice() {
                    "duplicate row identity"
                } else {
                    "row identities out of order"
                },
            });
        }
        if self.seen == self.expected {
            return Err(Error::InvalidScope {
                reason: "more entries than the declared cardinality",
            });
        }
        self.pending
            .extend_from_slice(&(id.len() as u64).to_be_bytes());
        self.pending.extend_from_slice(id);
        self.update(row_digest);
        self.seen += 1;
        self.last.clear();
        self.last.extend_from_slice(id);
        Ok(())
    }

    /// Finalizes; fails unless exactly the declared number of entries was added.
    pub fn finish(mut self) -> Result<ScopeDigest> {
        self.flush();
        if self.seen != self.expected {
            return Err(Error::InvalidScope {
                reason: "fewer entries than the declared cardinality",
            });
        }
        Ok(ScopeDigest {
            digest: self.hasher.finalize().into(),
            cardinality: self.seen,
            input: self.record,
        })
    }
}

/// A finished scope digest.
#[derive(Debug, Clone)]
pub struct ScopeDigest {
    /// The SHA-256 result.
    pub digest: [u8; 32],
    /// Number of entries.
    pub cardinality: u64,
    /// Every hashed octet, when recorded.
    pub input: Option<Vec<u8>>,
}

/// Digests a scope state given in any order: sorts entries by identity, rejects duplicates,
/// and streams them. Set `record` to keep the hashed octets.
pub fn scope_digest(
    schema_hash: &[u8; 32],
    scope_id: &str,
    entries: &mut [(RowIdentity, [u8; 32])],
    record: bool,
) -> Result<ScopeDigest> {
    sort_by_identity(entries);
    let mut d = ScopeDigester::start(schema_hash, scope_id, entries.len() as u64, record)?;
    for (identity, digest) in entries.iter() {
        d.add(identity, digest)?;
    }
    d.finish()
}

/// Sorts entries by identity octets. Identities of one scope share a long prefix (domain,
/// table and key field), so comparing them chases pointers through that prefix; instead
/// sort compact 16-byte keys taken just after the common prefix, then settle equal keys by
/// full comparison and permute the entries in place.
pub fn sort_by_identity(entries: &mut [(RowIdentity, [u8; 32])]) {
    if entries.len() < 256 {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        return;
    }
    let first = entries[0].0.as_bytes();
    let lcp = entries.iter().fold(first.len(), |lcp, e| {
        let b = e.0.as_bytes();
        first[..lcp]
            .iter()
            .zip(b)
            .take_while(|(x, y)| x == y)
            .count()
    });
    // Zero padding keeps key order consistent with octet order: a smaller key means a
    // smaller identity; equal keys are compared in full below.
    let key = |b: &[u8]| {
        let tail = &b[lcp.min(b.len())..];
        let mut k = [0u8; 16];
        let n = tail.len().min(16);
        k[..n].copy_from_slice(&tail[..n]);
        u128::from_be_bytes(k)
    };
    let mut order: Vec<(u128, usize)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (key(e.0.as_bytes()), i))
        .collect();
    order.sort_unstable();
    let mut start = 0;
    while start < order.len() {
        let end = start
            + order[start..]
                .iter()
                .take_while(|(k, _)| *k == order[start].0)
                .count();
        if end - start > 1 {
            order[start..end].sort_unstable_by(|a, b| entries[a.1].0.cmp(&entries[b.1].0));
        }
        start = end;
    }
    // Apply the permutation: position i receives the entry at order[i].1.
    let mut source: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    for i in 0..source.len() {
        let mut j = source[i];
        while j < i {
            j = source[j];
        }
        source[i] = j;
        entries.swap(i, j);
    }
}
