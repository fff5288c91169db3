//! Authenticated opaque tokens: scope cursors, rebuild continuation tokens and portable seed
//! tokens ([`crate::seed`]) (spec 003
//! "Per-Scope Retention and Client Generations", spec 001 token rules).
//!
//! Wire form: `<prefix>.<base64url(RFC 8785 payload)>.<base64url(mac)>`, unpadded, where
//! `mac = HMAC-SHA-256(key, DOMAIN || 0x00 || payload)` with a purpose-specific domain and a
//! purpose-specific keyring. The payload names its `key_id`, so keys can rotate: tokens are
//! signed with the current key and verified with any key still in the ring. The MAC is
//! checked in constant time before the payload is trusted.
//!
//! A malformed, forged or misbound token is an error (HTTP 400 `invalid_request`, no detail);
//! a well-formed cursor whose generations or position are obsolete is [`CursorStatus::Stale`]
//! and puts its scope into rebuild.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};
use crate::jcs;
use crate::json::Json;

/// Longest token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 4096;

/// What a token is for; each purpose has its own prefix, MAC domain and keyring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// An incremental scope cursor.
    ScopeCursor,
    /// A rebuild session continuation token.
    RebuildContinuation,
    /// A portable seed page token ([`crate::seed::SeedPage`]).
    SeedPage,
    /// A portable seed continuation receipt ([`crate::seed::SeedReceipt`]).
    SeedContinuation,
}

impl Purpose {
    fn prefix(self) -> &'static str {
        match self {
            Purpose::ScopeCursor => "c1",
            Purpose::RebuildContinuation => "r1",
            Purpose::SeedPage => "sp1",
            Purpose::SeedContinuation => "sc1",
        }
    }

    fn domain(self) -> &'static [u8] {
        match self {
            Purpose::ScopeCursor => b"synchro:v3:scope-cursor:v1\0",
            Purpose::RebuildContinuation => b"synchro:v3:rebuild-continuation:v1\0",
            Purpose::SeedPage => b"synchro:v3:seed-page:v1\0",
            Purpose::SeedContinuation => b"synchro:v3:seed-continuation:v1\0",
        }
    }
}

/// The keys of one purpose: the current signing key and older keys still accepted.
#[derive(Clone)]
pub struct Keyring {
    current: String,
    keys: BTreeMap<String, Vec<u8>>,
}

impl core::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print key material.
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("key_ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// A ring with one key, at least 32 bytes.
    pub fn new(key_id: &str, key: &[u8]) -> Result<Keyring> {
        let mut ring = Keyring {
            current: key_id.to_owned(),
            keys: BTreeMap::new(),
        };
        ring.add(key_id, key)?;
        Ok(ring)
    }

    /// Adds a key (for verification); [`Keyring::rotate_to`] makes it the signing key.
    pub fn add(&mut self, key_id: &str, key: &[u8]) -> Result<()> {
        if key.len() < 32 || key_id.is_empty() || key_id.len() > 64 {
            return Err(Error::InvalidToken {
                reason: "keys are at least 32 bytes with a 1..=64 byte key id",
            });
        }
        self.keys.insert(key_id.to_owned(), key.to_vec());
        Ok(())
    }

    /// Signs with `key_id` from now on (it must be in the ring).
    pub fn rotate_to(&mut self, key_id: &str) -> Result<()> {
        if !self.keys.contains_key(key_id) {
            return Err(Error::InvalidToken {
                reason: "unknown key id",
            });
        }
        self.current = key_id.to_owned();
        Ok(())
    }

    /// Drops a retired key: its tokens stop verifying.
    pub fn retire(&mut self, key_id: &str) {
        if key_id != self.current {
            self.keys.remove(key_id);
        }
    }
}

fn mac(purpose: Purpose, key: &[u8], payload: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(purpose.domain());
    m.update(payload);
    m
}

/// Signs `payload` (an object; `key_id` is added) and returns the token.
pub fn sign(purpose: Purpose, ring: &Keyring, payload: Vec<(String, Json)>) -> String {
    let mut members = payload;
    members.retain(|(k, _)| k != "key_id");
    members.push(("key_id".into(), Json::String(ring.current.clone())));
    let text = jcs::to_output_string(&Json::Object(members));
    let key = &ring.keys[&ring.current];
    let tag = mac(purpose, key, text.as_bytes()).finalize().into_bytes();
    format!(
        "{}.{}.{}",
        purpose.prefix(),
        URL_SAFE_NO_PAD.encode(text.as_bytes()),
        URL_SAFE_NO_PAD.encode(tag)
    )
}

/// Verifies a token's shape and MAC and returns its payload object.
pub fn open(purpose: Purpose, ring: &Keyring, token: &str) -> Result<Json> {
    let bad = |reason| Error::InvalidToken { reason };
    if token.len() > MAX_TOKEN_LEN {
        return Err(bad("token too long"));
    }
    let mut parts = token.split('.');
    let (Some(prefix), Some(payload), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("token must have three dot-separated parts"));
    };
    if prefix != purpose.prefix() {
        return Err(bad("token is not of this purpose"));
    }
    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| bad("payload is not base64url"))?;
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| bad("mac is not base64url"))?;
    let text = std::str::from_utf8(&payload).map_err(|_| bad("payload is not UTF-8"))?;
    let value = Json::parse(text).map_err(|_| bad("payload is not JSON"))?;
    let Some(Json::String(key_id)) = value.get("key_id") else {
        return Err(bad("payload has no key id"));
    };
    let key = ring.keys.get(key_id).ok_or(bad("unknown key id"))?;
    mac(purpose, key, &payload)
        .verify_slice(&tag)
        .map_err(|_| bad("mac does not verify"))?;
    // Only the exact canonical serialization was ever signed.
    if jcs::to_output_string(&value) != text {
        return Err(bad("payload is not canonical"));
    }
    Ok(value)
}

/// Who presents a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Canonical user id.
    pub user_id: String,
    /// Client id.
    pub client_id: String,
    /// Current client generation.
    pub client_generation: u64,
}

/// The server's current state of one scope, which a cursor must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeStreamState {
    /// Stream generation.
    pub stream_generation: u64,
    /// Membership generation.
    pub membership_generation: u64,
    /// Retention generation.
    pub retention_generation: u64,
    /// Inclusive minimum resumable position.
    pub resume_floor: u64,
    /// Current schema hash.
    pub schema_hash: [u8; 32],
    /// Earlier stream generations whose cursors resume, each with the highest position that
    /// does (a lineage reset's bridge: the history up to it is the one the current generation
    /// continues; a cursor beyond it comes from a history the database no longer has).
    pub bridged: Vec<(u64, u64)>,
}

/// An incremental scope cursor's bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeCursor {
    /// The scope.
    pub scope_id: String,
    /// Stream generation at issue.
    pub stream_generation: u64,
    /// Membership generation at issue.
    pub membership_generation: u64,
    /// Retention generation at issue.
    pub retention_generation: u64,
    /// Stream position (effects at or below it have been delivered).
    pub position: u64,
    /// Schema hash at issue.
    pub schema_hash: [u8; 32],
    /// User, client and client generation it was issued to.
    pub principal: Principal,
    /// Issue time, canonical datetime.
    pub issued_at: String,
}

/// Why a well-formed cursor cannot resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// Another stream generation.
    Stream,
    /// Another membership generation.
    Membership,
    /// Another retention generation.
    Retention,
    /// Another client generation.
    ClientGeneration,
    /// Another schema hash (only the connect bridge may re-issue it).
    Schema,
    /// Below the durable resume floor.
    BelowFloor,
}

/// The verdict on a presented cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorStatus {
    /// Resume after this position.
    Resumable(u64),
    /// The scope must rebuild.
    Stale(StaleReason),
}

fn counter(v: u64) -> Json {
    Json::String(v.to_string())
}

impl ScopeCursor {
    /// The signed token.
    pub fn sign(&self, ring: &Keyring) -> String {
        sign(
            Purpose::ScopeCursor,
            ring,
            vec![
                ("kind".into(), Json::String("scope_cursor".into())),
                ("version".into(), Json::Number("1".into())),
                ("scope_id".into(), Json::String(self.scope_id.clone())),
                ("stream_generation".into(), counter(self.stream_generation)),
                (
                    "membership_generation".into(),
                    counter(self.membership_generation),
                ),
                (
                    "retention_generation".into(),
                    counter(self.retention_generation),
                ),
                ("position".into(), counter(self.position)),
                (
                    "schema_hash".into(),
                    Json::String(hex::encode(self.schema_hash)),
                ),
                (
                    "user_id".into(),
                    Json::String(self.principal.user_id.clone()),
                ),
                (
                    "client_id".into(),
                    Json::String(self.principal.client_id.clone()),
                ),
                (
                    "client_generation".into(),
                    counter(self.principal.client_generation),
                ),
                ("issued_at".into(), Json::String(self.issued_at.clone())),
            ],
        )
    }

    /// Opens a cursor token: shape, MAC and the exact member set.
    pub fn open(ring: &Keyring, token: &str) -> Result<ScopeCursor> {
        let v = open(Purpose::ScopeCursor, ring, token)?;
        let bad = |reason| Error::InvalidToken { reason };
        let Json::Object(members) = &v else {
            return Err(bad("payload is not an object"));
        };
        const MEMBERS: [&str; 13] = [
            "client_generation",
            "client_id",
            "issued_at",
            "key_id",
            "kind",
            "membership_generation",
            "position",
            "retention_generation",
            "schema_hash",
            "scope_id",
            "stream_generation",
            "user_id",
            "version",
        ];
        if members.len() != MEMBERS.len()
            || members.iter().any(|(k, _)| !MEMBERS.contains(&k.as_str()))
        {
            return Err(bad("cursor payload has the wrong members"));
        }
        let text = |name| {
            v.get(name)
                .and_then(Json::as_str)
                .ok_or(bad("cursor member is not a string"))
        };
        let num = |name| -> Result<u64> {
            let t = text(name)?;
            if t.is_empty()
                || (t.len() > 1 && t.starts_with('0'))
                || !t.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(bad("cursor counter is not a canonical decimal"));
            }
            t.parse().map_err(|_| bad("cursor counter out of range"))
        };
        if text("kind")? != "scope_cursor" || v.get("version") != Some(&Json::Number("1".into())) {
            return Err(bad("not a version 1 scope cursor"));
        }
        let issued_at = text("issued_at")?.to_owned();
        crate::temporal::validate_datetime(&issued_at)
            .map_err(|_| bad("issued_at is not a canonical datetime"))?;
        Ok(ScopeCursor {
            scope_id: text("scope_id")?.to_owned(),
            stream_generation: num("stream_generation")?,
            membership_generation: num("membership_generation")?,
            retention_generation: num("retention_generation")?,
            position: num("position")?,
            schema_hash: crate::manifest::parse_hex32(text("schema_hash")?)
                .map_err(|_| bad("bad schema hash"))?,
            principal: Principal {
                user_id: text("user_id")?.to_owned(),
                client_id: text("client_id")?.to_owned(),
                client_generation: num("client_generation")?,
            },
            issued_at,
        })
    }

    /// Decides whether this (authentic) cursor may resume `scope_id` for `who` now. A
    /// cursor of another user, client or scope is misbound: an error, not staleness.
    pub fn check(
        &self,
        scope_id: &str,
        who: &Principal,
        state: &ScopeStreamState,
    ) -> Result<CursorStatus> {
        if self.scope_id != scope_id
            || self.principal.user_id != who.user_id
            || self.principal.client_id != who.client_id
        {
            return Err(Error::InvalidToken {
                reason: "cursor is bound to another user, client or scope",
            });
        }
        let stale = |r| Ok(CursorStatus::Stale(r));
        if self.stream_generation != state.stream_generation
            && !state
                .bridged
                .iter()
                .any(|&(g, through)| g == self.stream_generation && self.position <= through)
        {
            return stale(StaleReason::Stream);
        }
        if self.membership_generation != state.membership_generation {
            return stale(StaleReason::Membership);
        }
        if self.retention_generation != state.retention_generation {
            return stale(StaleReason::Retention);
        }
        if self.principal.client_generation != who.client_generation {
            return stale(StaleReason::ClientGeneration);
        }
        if self.schema_hash != state.schema_hash {
            return stale(StaleReason::Schema);
        }
        if self.position < state.resume_floor {
            return stale(StaleReason::BelowFloor);
        }
        Ok(CursorStatus::Resumable(self.position))
    }
}
