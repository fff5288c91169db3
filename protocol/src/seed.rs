//! Portable seeds' bindings (spec 001 "Snapshot-bound portable seed export", "Seed page
//! token", "Seed continuation receipt"): the export manifest and its hash, the `sp1.` page
//! token and the `sc1.` continuation receipt.
//!
//! Both tokens have the wire form of [`crate::token`] (`<prefix>.<base64url(RFC 8785
//! payload)>.<base64url(HMAC-SHA-256)>`) with their own prefix, MAC domain and keyring, and
//! carry exactly the members the spec lists; every generation, ordinal, cardinality and
//! limit is a canonical unsigned decimal string. The spec leaves the export manifest's
//! members and the boundary's shape to us (docs/protocol-decisions.md "Portable seeds"):
//!
//! - the boundary is `{"kind":"transaction_end","commit_lsn":"<X/Y>","position":"<n>"}`,
//!   the commit of the last materialized source transaction and the stream position (the
//!   effect position pull cursors carry) it ends at, or `{"kind":"generation_start",
//!   "position":"<n>"}` when the stream generation has materialized no transaction yet;
//! - the export manifest body (what [`export_manifest_hash`] covers) is
//!   `{kind:"portable_seed_export", version:1, key_id, export_id, schema_version,
//!   schema_hash, stream_generation, snapshot_boundary, page_limit, scopes:[{scope_id,
//!   registry_generation, membership_generation, retention_generation, cardinality,
//!   checksum}]}` with the scopes in byte order of their IDs, each once.
//!
//! The database issues and checks both tokens (it holds their keys); this module is their
//! one definition, used to check what the database issues and by whoever holds a key.

use crate::checksum::Checksum;
use crate::error::{Error, Result};
use crate::jcs;
use crate::json::Json;
use crate::token::{open, sign, Keyring, Purpose};

/// The MAC domain of the export manifest hash.
pub const EXPORT_MANIFEST_DOMAIN: &[u8] = b"synchro:v3:seed-export-manifest:v1\0";

/// Where an export's snapshot ends in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotBoundary {
    /// The stream generation has materialized no source transaction yet.
    GenerationStart {
        /// The stream position of the generation's start.
        position: u64,
    },
    /// The end of the last materialized source transaction.
    TransactionEnd {
        /// Its commit LSN, as PostgreSQL writes it (`X/Y`, uppercase hex).
        commit_lsn: String,
        /// The stream position it ends at.
        position: u64,
    },
}

impl SnapshotBoundary {
    /// The stream position a continuation resumes after.
    pub fn position(&self) -> u64 {
        match self {
            SnapshotBoundary::GenerationStart { position }
            | SnapshotBoundary::TransactionEnd { position, .. } => *position,
        }
    }

    /// The boundary as JSON.
    pub fn to_json(&self) -> Json {
        match self {
            SnapshotBoundary::GenerationStart { position } => Json::Object(vec![
                ("kind".into(), Json::String("generation_start".into())),
                ("position".into(), counter(*position)),
            ]),
            SnapshotBoundary::TransactionEnd {
                commit_lsn,
                position,
            } => Json::Object(vec![
                ("commit_lsn".into(), Json::String(commit_lsn.clone())),
                ("kind".into(), Json::String("transaction_end".into())),
                ("position".into(), counter(*position)),
            ]),
        }
    }

    /// Reads a boundary: exactly the members of its kind, a canonical position and a
    /// well-formed LSN.
    pub fn from_json(v: &Json) -> Result<SnapshotBoundary> {
        let Json::Object(members) = v else {
            return Err(bad("snapshot_boundary is not an object"));
        };
        let kind = v.get("kind").and_then(Json::as_str);
        let position = decimal(v.get("position"))?;
        match kind {
            Some("generation_start") if members.len() == 2 => {
                Ok(SnapshotBoundary::GenerationStart { position })
            }
            Some("transaction_end") if members.len() == 3 => {
                let commit_lsn = v
                    .get("commit_lsn")
                    .and_then(Json::as_str)
                    .filter(|l| is_lsn(l))
                    .ok_or(bad("commit_lsn is not an LSN"))?;
                Ok(SnapshotBoundary::TransactionEnd {
                    commit_lsn: commit_lsn.to_owned(),
                    position,
                })
            }
            _ => Err(bad("snapshot_boundary has the wrong members")),
        }
    }
}

/// `X/Y` with 1..=8 uppercase hex digits on each side, as PostgreSQL prints an LSN.
fn is_lsn(text: &str) -> bool {
    let hex = |s: &str| {
        (1..=8).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
    };
    matches!(text.split_once('/'), Some((hi, lo)) if hex(hi) && hex(lo))
}

/// One portable scope of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportScope {
    /// The scope.
    pub scope_id: String,
    /// The registry generation its rows were materialized under.
    pub registry_generation: u64,
    /// Its membership generation.
    pub membership_generation: u64,
    /// Its retention generation.
    pub retention_generation: u64,
    /// How many rows it holds.
    pub cardinality: u64,
    /// Its scope digest.
    pub checksum: Checksum,
}

/// What one export binds: the scopes, their digests and the continuation boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportManifest {
    /// The page key's ID.
    pub key_id: String,
    /// Canonical lowercase UUID.
    pub export_id: String,
    /// The schema version.
    pub schema_version: u64,
    /// The schema hash.
    pub schema_hash: [u8; 32],
    /// The stream generation.
    pub stream_generation: u64,
    /// Where the snapshot ends.
    pub snapshot_boundary: SnapshotBoundary,
    /// Records per page at most.
    pub page_limit: u64,
    /// The portable scopes, in byte order of their IDs, each once.
    pub scopes: Vec<ExportScope>,
}

impl ExportManifest {
    /// The body the hash covers (no hash, no page tokens).
    pub fn to_json(&self) -> Json {
        let scopes = self
            .scopes
            .iter()
            .map(|s| {
                Json::Object(vec![
                    ("cardinality".into(), counter(s.cardinality)),
                    (
                        "checksum".into(),
                        Json::parse(&s.checksum.to_json_string()).expect("a checksum object"),
                    ),
                    (
                        "membership_generation".into(),
                        counter(s.membership_generation),
                    ),
                    ("registry_generation".into(), counter(s.registry_generation)),
                    (
                        "retention_generation".into(),
                        counter(s.retention_generation),
                    ),
                    ("scope_id".into(), Json::String(s.scope_id.clone())),
                ])
            })
            .collect();
        Json::Object(vec![
            ("export_id".into(), Json::String(self.export_id.clone())),
            ("key_id".into(), Json::String(self.key_id.clone())),
            ("kind".into(), Json::String("portable_seed_export".into())),
            ("page_limit".into(), counter(self.page_limit)),
            (
                "schema_hash".into(),
                Json::String(hex::encode(self.schema_hash)),
            ),
            ("schema_version".into(), counter(self.schema_version)),
            ("scopes".into(), Json::Array(scopes)),
            ("snapshot_boundary".into(), self.snapshot_boundary.to_json()),
            ("stream_generation".into(), counter(self.stream_generation)),
            ("version".into(), Json::Number("1".into())),
        ])
    }

    /// Reads a manifest body (extra members `export_manifest_hash` and `page_tokens` of the
    /// full manifest are left to the caller): exactly its members, the scopes strictly in
    /// byte order (so none twice).
    pub fn from_json(v: &Json) -> Result<ExportManifest> {
        let m = exact(
            v,
            &[
                "export_id",
                "key_id",
                "kind",
                "page_limit",
                "schema_hash",
                "schema_version",
                "scopes",
                "snapshot_boundary",
                "stream_generation",
                "version",
            ],
        )?;
        if m.text("kind")? != "portable_seed_export" || !m.version_one() {
            return Err(bad("not a version 1 portable seed export"));
        }
        let Some(Json::Array(items)) = v.get("scopes") else {
            return Err(bad("scopes is not an array"));
        };
        let mut scopes: Vec<ExportScope> = Vec::with_capacity(items.len());
        for item in items {
            let s = exact(
                item,
                &[
                    "cardinality",
                    "checksum",
                    "membership_generation",
                    "registry_generation",
                    "retention_generation",
                    "scope_id",
                ],
            )?;
            let scope = ExportScope {
                scope_id: s.text("scope_id")?.to_owned(),
                registry_generation: s.counter("registry_generation")?,
                membership_generation: s.counter("membership_generation")?,
                retention_generation: s.counter("retention_generation")?,
                cardinality: s.counter("cardinality")?,
                checksum: Checksum::from_json(item.get("checksum").expect("member checked"))?,
            };
            if let Some(last) = scopes.last() {
                if last.scope_id.as_bytes() >= scope.scope_id.as_bytes() {
                    return Err(bad("scopes are not in strict byte order"));
                }
            }
            scopes.push(scope);
        }
        Ok(ExportManifest {
            key_id: m.text("key_id")?.to_owned(),
            export_id: uuid(m.text("export_id")?)?,
            schema_version: m.counter("schema_version")?,
            schema_hash: hash(m.text("schema_hash")?)?,
            stream_generation: m.counter("stream_generation")?,
            snapshot_boundary: SnapshotBoundary::from_json(
                v.get("snapshot_boundary").expect("member checked"),
            )?,
            page_limit: m.counter("page_limit")?,
            scopes,
        })
    }

    /// `export_manifest_hash`: SHA-256 of the domain and the body's RFC 8785 text.
    pub fn hash(&self) -> [u8; 32] {
        export_manifest_hash(&self.to_json())
    }
}

/// SHA-256(`synchro:v3:seed-export-manifest:v1` 0x00 RFC 8785(body)).
pub fn export_manifest_hash(body: &Json) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(EXPORT_MANIFEST_DOMAIN);
    h.update(jcs::to_output_string(body).as_bytes());
    h.finalize().into()
}

/// What a page token and a receipt both bind: the export and its manifest, the schema, one
/// scope with its generations, and the boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeBinding {
    /// The export.
    pub export_id: String,
    /// The export manifest's hash.
    pub export_manifest_hash: [u8; 32],
    /// The schema hash.
    pub schema_hash: [u8; 32],
    /// The scope.
    pub scope_id: String,
    /// Its registry generation.
    pub registry_generation: u64,
    /// Its membership generation.
    pub membership_generation: u64,
    /// Its retention generation.
    pub retention_generation: u64,
    /// The stream generation.
    pub stream_generation: u64,
    /// Where the snapshot ends.
    pub snapshot_boundary: SnapshotBoundary,
}

/// The members of a [`ScopeBinding`].
const BINDING_MEMBERS: [&str; 9] = [
    "export_id",
    "export_manifest_hash",
    "membership_generation",
    "registry_generation",
    "retention_generation",
    "schema_hash",
    "scope_id",
    "snapshot_boundary",
    "stream_generation",
];

impl ScopeBinding {
    fn members(&self) -> Vec<(String, Json)> {
        vec![
            ("export_id".into(), Json::String(self.export_id.clone())),
            (
                "export_manifest_hash".into(),
                Json::String(hex::encode(self.export_manifest_hash)),
            ),
            (
                "schema_hash".into(),
                Json::String(hex::encode(self.schema_hash)),
            ),
            ("scope_id".into(), Json::String(self.scope_id.clone())),
            (
                "registry_generation".into(),
                counter(self.registry_generation),
            ),
            (
                "membership_generation".into(),
                counter(self.membership_generation),
            ),
            (
                "retention_generation".into(),
                counter(self.retention_generation),
            ),
            ("stream_generation".into(), counter(self.stream_generation)),
            ("snapshot_boundary".into(), self.snapshot_boundary.to_json()),
        ]
    }

    fn read(v: &Json) -> Result<ScopeBinding> {
        let m = Exact(v);
        Ok(ScopeBinding {
            export_id: uuid(m.text("export_id")?)?,
            export_manifest_hash: hash(m.text("export_manifest_hash")?)?,
            schema_hash: hash(m.text("schema_hash")?)?,
            scope_id: m.text("scope_id")?.to_owned(),
            registry_generation: m.counter("registry_generation")?,
            membership_generation: m.counter("membership_generation")?,
            retention_generation: m.counter("retention_generation")?,
            stream_generation: m.counter("stream_generation")?,
            snapshot_boundary: SnapshotBoundary::from_json(
                v.get("snapshot_boundary")
                    .ok_or(bad("snapshot_boundary is missing"))?,
            )?,
        })
    }
}

impl ExportManifest {
    /// What a page token or a receipt of `scope` of this export must bind.
    pub fn binding(&self, scope: &ExportScope) -> ScopeBinding {
        ScopeBinding {
            export_id: self.export_id.clone(),
            export_manifest_hash: self.hash(),
            schema_hash: self.schema_hash,
            scope_id: scope.scope_id.clone(),
            registry_generation: scope.registry_generation,
            membership_generation: scope.membership_generation,
            retention_generation: scope.retention_generation,
            stream_generation: self.stream_generation,
            snapshot_boundary: self.snapshot_boundary.clone(),
        }
    }
}

/// The member names of a token: its own, the binding's, `key_id`, `kind` and `version`.
fn token_members<const N: usize>(own: [&'static str; N]) -> Vec<&'static str> {
    let mut all: Vec<&str> = BINDING_MEMBERS.to_vec();
    all.extend(own);
    all.extend(["key_id", "kind", "version"]);
    all
}

/// A seed page token's bindings (its `kind`, `version` and `key_id` are implied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedPage {
    /// The export, scope and boundary it is bound to.
    pub binding: ScopeBinding,
    /// base64url (no padding) of the transaction's 32 random octets.
    pub transaction_nonce: String,
    /// The ordinal (0-based, in unsigned canonical row-identity order) of the page's first
    /// record.
    pub next_row_ordinal: u64,
    /// Records per page at most.
    pub page_limit: u64,
}

impl SeedPage {
    /// The signed `sp1.` token.
    pub fn sign(&self, ring: &Keyring) -> String {
        let mut members = vec![
            ("kind".into(), Json::String("portable_seed_page".into())),
            ("version".into(), Json::Number("1".into())),
            (
                "transaction_nonce".into(),
                Json::String(self.transaction_nonce.clone()),
            ),
            ("next_row_ordinal".into(), counter(self.next_row_ordinal)),
            ("page_limit".into(), counter(self.page_limit)),
        ];
        members.extend(self.binding.members());
        sign(Purpose::SeedPage, ring, members)
    }

    /// Opens a page token: shape, MAC (constant time) and exactly its members.
    pub fn open(ring: &Keyring, token: &str) -> Result<SeedPage> {
        SeedPage::from_payload(&open(Purpose::SeedPage, ring, token)?)
    }

    /// Reads a page token's bindings without its MAC: what the exporter, to which tokens
    /// are opaque and which holds no key, checks each page against (spec 001 "Seed
    /// verification", check 3). Only the database's check makes a token authoritative.
    pub fn read_unverified(token: &str) -> Result<SeedPage> {
        SeedPage::from_payload(&unverified_payload("sp1", token)?)
    }

    fn from_payload(v: &Json) -> Result<SeedPage> {
        let m = exact(
            v,
            &token_members(["next_row_ordinal", "page_limit", "transaction_nonce"]),
        )?;
        if m.text("kind")? != "portable_seed_page" || !m.version_one() {
            return Err(bad("not a version 1 seed page token"));
        }
        let nonce = m.text("transaction_nonce")?;
        if nonce.len() != 43 || !nonce.bytes().all(is_base64url) {
            return Err(bad("transaction_nonce is not 32 octets of base64url"));
        }
        Ok(SeedPage {
            binding: ScopeBinding::read(v)?,
            transaction_nonce: nonce.to_owned(),
            next_row_ordinal: m.counter("next_row_ordinal")?,
            page_limit: m.counter("page_limit")?,
        })
    }
}

/// A seed continuation receipt's bindings (its `kind`, `version` and `key_id` are
/// implied). It names no user or client: connect binds it to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedReceipt {
    /// The export, scope and boundary it is bound to.
    pub binding: ScopeBinding,
    /// How many rows the scope held.
    pub cardinality: u64,
    /// Its scope digest.
    pub checksum: Checksum,
    /// Issue time, canonical datetime.
    pub issued_at: String,
}

impl SeedReceipt {
    /// The signed `sc1.` receipt.
    pub fn sign(&self, ring: &Keyring) -> String {
        let mut members = vec![
            (
                "kind".into(),
                Json::String("portable_seed_continuation".into()),
            ),
            ("version".into(), Json::Number("1".into())),
            ("cardinality".into(), counter(self.cardinality)),
            (
                "checksum".into(),
                Json::parse(&self.checksum.to_json_string()).expect("a checksum object"),
            ),
            ("issued_at".into(), Json::String(self.issued_at.clone())),
        ];
        members.extend(self.binding.members());
        sign(Purpose::SeedContinuation, ring, members)
    }

    /// Opens a receipt: shape, MAC (constant time) and exactly its members.
    pub fn open(ring: &Keyring, token: &str) -> Result<SeedReceipt> {
        SeedReceipt::from_payload(&open(Purpose::SeedContinuation, ring, token)?)
    }

    /// Reads a receipt's payload without its MAC: what a client, which holds no key, reads
    /// of the receipts it stores (to compare the scope digest with its rows). Only the
    /// server's [`SeedReceipt::open`] makes a receipt authoritative.
    pub fn read_unverified(token: &str) -> Result<SeedReceipt> {
        SeedReceipt::from_payload(&unverified_payload("sc1", token)?)
    }

    fn from_payload(v: &Json) -> Result<SeedReceipt> {
        let m = exact(v, &token_members(["cardinality", "checksum", "issued_at"]))?;
        if m.text("kind")? != "portable_seed_continuation" || !m.version_one() {
            return Err(bad("not a version 1 seed continuation receipt"));
        }
        let issued_at = m.text("issued_at")?.to_owned();
        crate::temporal::validate_datetime(&issued_at)
            .map_err(|_| bad("issued_at is not a canonical datetime"))?;
        Ok(SeedReceipt {
            binding: ScopeBinding::read(v)?,
            cardinality: m.counter("cardinality")?,
            checksum: Checksum::from_json(v.get("checksum").ok_or(bad("checksum is missing"))?)?,
            issued_at,
        })
    }
}

/// The canonical payload of a `<prefix>.` token, its MAC not checked.
fn unverified_payload(prefix: &str, token: &str) -> Result<Json> {
    use base64::Engine as _;
    let mut parts = token.split('.');
    let (Some(p), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("token must have three dot-separated parts"));
    };
    if p != prefix || token.len() > crate::token::MAX_TOKEN_LEN {
        return Err(bad("token is not of this purpose"));
    }
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| bad("payload is not base64url"))?;
    let text = std::str::from_utf8(&payload).map_err(|_| bad("payload is not UTF-8"))?;
    let v = Json::parse(text).map_err(|_| bad("payload is not JSON"))?;
    if jcs::to_output_string(&v) != text {
        return Err(bad("payload is not canonical"));
    }
    Ok(v)
}

fn bad(reason: &'static str) -> Error {
    Error::InvalidToken { reason }
}

fn counter(v: u64) -> Json {
    Json::String(v.to_string())
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A canonical lowercase UUID (8-4-4-4-12 lowercase hex).
fn uuid(text: &str) -> Result<String> {
    let groups: Vec<&str> = text.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    let ok = groups.len() == 5
        && groups.iter().zip(lens).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
    ok.then(|| text.to_owned())
        .ok_or(bad("export_id is not a canonical lowercase UUID"))
}

fn hash(text: &str) -> Result<[u8; 32]> {
    crate::manifest::parse_hex32(text).map_err(|_| bad("a hash is not 64 lowercase hex"))
}

/// A canonical unsigned decimal string (no sign, no leading zero), in range.
fn decimal(v: Option<&Json>) -> Result<u64> {
    let t = v
        .and_then(Json::as_str)
        .ok_or(bad("a counter is not a string"))?;
    if t.is_empty() || (t.len() > 1 && t.starts_with('0')) || !t.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad("a counter is not a canonical unsigned decimal"));
    }
    t.parse().map_err(|_| bad("a counter is out of range"))
}

/// An object checked to have exactly `names` as members.
struct Exact<'a>(&'a Json);

fn exact<'a>(v: &'a Json, names: &[&str]) -> Result<Exact<'a>> {
    let Json::Object(members) = v else {
        return Err(bad("not an object"));
    };
    if members.len() != names.len() || members.iter().any(|(k, _)| !names.contains(&k.as_str())) {
        return Err(bad("wrong members"));
    }
    Ok(Exact(v))
}

impl Exact<'_> {
    fn text(&self, name: &str) -> Result<&str> {
        self.0
            .get(name)
            .and_then(Json::as_str)
            .ok_or(bad("a member is not a string"))
    }

    fn counter(&self, name: &str) -> Result<u64> {
        decimal(self.0.get(name))
    }

    fn version_one(&self) -> bool {
        self.0.get("version") == Some(&Json::Number("1".into()))
    }
}
