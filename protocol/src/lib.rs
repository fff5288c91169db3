//! # synchro-protocol
//!
//! The pure core of synchro's protocol version 3: everything two implementations must agree
//! on to the octet. No I/O, no async runtime, no clock, no randomness; it builds for native
//! targets and for `wasm32-unknown-unknown`.
//!
//! | module | owns |
//! |---|---|
//! | [`json`] | strict JSON parsing (number tokens verbatim, duplicates and lone surrogates rejected) |
//! | [`jcs`] | RFC 8785 canonicalization with the I-JSON number domain |
//! | [`types`] | the eleven portable types and field specifications |
//! | [`value`] | canonical wire values and the typed-value octets |
//! | [`decimal`] | exact decimal canonicalization, precision and scale |
//! | [`temporal`] | datetime, date and time grammars |
//! | [`binary`] | the typed binary grammar primitives and domain prefixes |
//! | [`manifest`] | schema manifests: validation, canonical body, schema hash |
//! | [`digest`] | row identity, row digest, streaming scope digest |
//! | [`scope_entries`] | a scope's ordered entries with kept SHA-256 states (incremental scope digests) |
//! | [`checksum`] | the strict wire checksum object |
//! | [`lineage`] | manifest history, parent links, presented schema references |
//! | [`classify`] | schema change classes 1-4 |
//! | [`dispatch`] | connect schema dispatch and the cursor bridge |
//! | [`migration`] | hash-bound local SQLite migration plans and their SQL |
//! | [`semver`] | SemVer 2.0.0 precedence |
//! | [`state`] | the client state machine |
//! | [`token`] | HMAC scope cursors and rebuild continuation tokens |
//! | [`jwt`] | HS256 bearer JWT verification (the server's and the edge's one verifier) |
//! | [`wire`] | the HTTP messages of connect, pull, rebuild, push and events, error bodies, and the request gate |
//! | [`conformance`] | the cross-language conformance command set |
//!
//! ```
//! use synchro_protocol::{digest, json::Json, manifest::Manifest};
//!
//! let manifest = Manifest::parse(r#"{"schema_version":1,"parent_schema":null,
//!   "transition_class":"initial","compatibility_floor":1,"tables":[{"table_id":"t",
//!   "relation_id":"r","name":"notes","composition":"single_scope","primary_key_field_id":"id",
//!   "lifecycle":{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null},
//!   "fields":[{"field_id":"id","name":"id","type":"int64","nullable":false,"writable":false},
//!             {"field_id":"body","name":"body","type":"string","nullable":true,"writable":true}],
//!   "indexes":[]}]}"#)?;
//! let row = Json::parse(r#"{"id":"42","body":"hello"}"#)?;
//! let d = digest::row_digest(&manifest, "t", &Json::parse(r#""42""#)?, &row, "v1")?;
//! assert_eq!(d.digest.len(), 32);
//! # Ok::<(), synchro_protocol::Error>(())
//! ```
#![warn(missing_docs)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod binary;
pub mod checksum;
pub mod classify;
pub mod conformance;
pub mod decimal;
pub mod digest;
pub mod dispatch;
mod error;
pub mod jcs;
pub mod json;
pub mod jwt;
pub mod lineage;
pub mod manifest;
pub mod migration;
mod portable_type;
pub mod scope_entries;
pub mod seed;
pub mod semver;
pub mod state;
pub mod temporal;
pub mod token;
pub mod types;
pub mod value;
pub mod wire;

#[cfg(all(target_arch = "wasm32", feature = "js"))]
pub mod wasm;

pub use error::{Error, Result};

/// The protocol version this crate implements.
pub const PROTOCOL_VERSION: u32 = 3;

/// This crate's version (the one version source for the crate and its JS package).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
