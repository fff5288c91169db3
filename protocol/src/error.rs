//! The one error type of the protocol core.
//!
//! Every failure has a stable machine code ([`Error::code`]) that other layers map to wire
//! errors, and a message that describes the problem without echoing row values, keys,
//! identities or tokens (spec 001, log redaction). Messages may name schema metadata such as
//! a field ID, because that is what a developer needs to fix a manifest.

use crate::portable_type::PortableType;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// A typed protocol error. Never carries a row value, key, identity or token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input is not well-formed JSON text.
    #[error("malformed JSON at byte {offset}: {reason}")]
    MalformedJson {
        /// Byte offset where parsing stopped.
        offset: usize,
        /// What was wrong there.
        reason: &'static str,
    },
    /// An object has the same member name twice (I-JSON forbids it).
    #[error("duplicate object member name at byte {offset}")]
    DuplicateMember {
        /// Byte offset of the second occurrence.
        offset: usize,
    },
    /// A string escape encodes a lone UTF-16 surrogate, which is not a Unicode scalar value.
    #[error("lone surrogate escape at byte {offset}")]
    LoneSurrogate {
        /// Byte offset of the escape.
        offset: usize,
    },
    /// JSON nesting is deeper than the parser allows.
    #[error("JSON nesting deeper than {limit} levels")]
    NestingTooDeep {
        /// The depth limit.
        limit: usize,
    },
    /// A JSON number lies outside the I-JSON interoperable domain (non-finite as binary64,
    /// or an integer beyond ±(2^53−1)).
    #[error("number outside the I-JSON interoperable domain: {reason}")]
    NumberOutOfDomain {
        /// Why the number is not interoperable.
        reason: &'static str,
    },
    /// A wire value has the wrong JSON kind for its portable type (a string for an int, …).
    #[error("{ty} value has the wrong JSON kind")]
    TypeMismatch {
        /// The declared portable type.
        ty: PortableType,
    },
    /// A wire value is well-formed but not in its canonical spelling.
    #[error("{ty} value is not canonical: {reason}")]
    NonCanonical {
        /// The declared portable type.
        ty: PortableType,
        /// Which canonical rule is broken.
        reason: &'static str,
    },
    /// A wire value is outside the range of its portable type.
    #[error("{ty} value is out of range")]
    OutOfRange {
        /// The declared portable type.
        ty: PortableType,
    },
    /// SQL null was given for a field that is not nullable (or for a primary key).
    #[error("null is not allowed for this field")]
    NullNotAllowed,
    /// A decimal source or wire text does not follow the decimal grammar.
    #[error("invalid decimal: {reason}")]
    InvalidDecimal {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A decimal has more integer digits than precision − scale allows.
    #[error("decimal has more integer digits than precision {precision} and scale {scale} allow")]
    PrecisionExceeded {
        /// Declared precision.
        precision: u32,
        /// Declared scale.
        scale: u32,
    },
    /// A decimal has more fractional digits than its scale allows.
    #[error("decimal has more fractional digits than scale {scale} allows")]
    ScaleExceeded {
        /// Declared scale.
        scale: u32,
    },
    /// A datetime, date or time string breaks its grammar or names no real instant.
    #[error("invalid {ty}: {reason}")]
    InvalidTemporal {
        /// datetime, date or time.
        ty: PortableType,
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A bytes value is not canonical unpadded RFC 4648 base64url.
    #[error("bytes value is not canonical unpadded base64url")]
    InvalidBytes,
    /// A field specification (type, nullability, precision, scale) is invalid.
    #[error("invalid field specification: {reason}")]
    InvalidFieldSpec {
        /// Which rule is broken.
        reason: String,
    },
    /// A schema manifest breaks a structural or semantic rule of spec 000.
    #[error("invalid manifest: {reason}")]
    InvalidManifest {
        /// Which rule is broken, naming schema metadata (never row data).
        reason: String,
    },
    /// A manifest's declared schema_hash differs from the hash of its canonical body.
    #[error("declared schema_hash does not match the canonical manifest body")]
    SchemaHashMismatch,
    /// A table ID is not in the manifest.
    #[error("table is not in the manifest")]
    UnknownTable,
    /// A row object breaks the complete-row contract (unknown, duplicate or missing field).
    #[error("invalid row: {reason}")]
    InvalidRow {
        /// Which rule is broken.
        reason: String,
    },
    /// The primary key inside the row differs from the separate primary-key value.
    #[error("row primary key differs from the separate primary-key value")]
    PrimaryKeyMismatch,
    /// A server version is empty or otherwise unusable.
    #[error("server version must be a nonempty string")]
    InvalidServerVersion,
    /// Octets are not exactly one well-formed canonical row identity.
    #[error("invalid row identity: {reason}")]
    InvalidRowIdentity {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A scope state breaks a scope-digest rule (empty scope ID, duplicate identity, …).
    #[error("invalid scope state: {reason}")]
    InvalidScope {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A digest is not exactly 32 octets written as 64 lowercase hexadecimal characters.
    #[error("digest must be 64 lowercase hexadecimal characters")]
    InvalidDigest,
    /// A checksum object does not have the exact version 3 shape.
    #[error("invalid checksum object: {reason}")]
    InvalidChecksum {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A version string is not valid SemVer 2.0.0.
    #[error("invalid SemVer 2.0.0 version: {reason}")]
    InvalidSemver {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A connect schema reference is malformed or misuses the fresh sentinel (HTTP 400).
    #[error("invalid schema reference: {reason}")]
    InvalidSchemaReference {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A manifest cannot join the lineage (wrong parent, reused version, wrong class or floor).
    #[error("invalid lineage: {reason}")]
    InvalidLineage {
        /// Which rule is broken, naming versions (never row data).
        reason: String,
    },
    /// A client state name is not one of the defined states.
    #[error("unknown client state")]
    UnknownState,
    /// A client state transition is not in the state map; nothing was changed.
    #[error("illegal client state transition from {from} to {to}")]
    IllegalTransition {
        /// The current state.
        from: &'static str,
        /// The requested state.
        to: &'static str,
    },
    /// A migration plan does not match its manifests, its hash, or its own rules.
    #[error("invalid migration plan: {reason}")]
    InvalidMigrationPlan {
        /// Which rule is broken.
        reason: String,
    },
    /// A cursor or continuation token is malformed, forged or misbound (HTTP 400
    /// `invalid_request`; the reason is for logs, never for the response).
    #[error("invalid token: {reason}")]
    InvalidToken {
        /// Which rule is broken.
        reason: &'static str,
    },
    /// A value exceeds a protocol or implementation limit.
    #[error("limit exceeded: {what}")]
    LimitExceeded {
        /// Which limit.
        what: &'static str,
    },
    /// A request envelope (such as a conformance case) is missing members or has bad ones.
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// Which rule is broken.
        reason: String,
    },
}

impl Error {
    /// The stable, machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::MalformedJson { .. } => "malformed_json",
            Error::DuplicateMember { .. } => "duplicate_member",
            Error::LoneSurrogate { .. } => "lone_surrogate",
            Error::NestingTooDeep { .. } => "nesting_too_deep",
            Error::NumberOutOfDomain { .. } => "number_out_of_domain",
            Error::TypeMismatch { .. } => "type_mismatch",
            Error::NonCanonical { .. } => "non_canonical",
            Error::OutOfRange { .. } => "out_of_range",
            Error::NullNotAllowed => "null_not_allowed",
            Error::InvalidDecimal { .. } => "invalid_decimal",
            Error::PrecisionExceeded { .. } => "precision_exceeded",
            Error::ScaleExceeded { .. } => "scale_exceeded",
            Error::InvalidTemporal { .. } => "invalid_temporal",
            Error::InvalidBytes => "invalid_bytes",
            Error::InvalidFieldSpec { .. } => "invalid_field_spec",
            Error::InvalidManifest { .. } => "invalid_manifest",
            Error::SchemaHashMismatch => "schema_hash_mismatch",
            Error::UnknownTable => "unknown_table",
            Error::InvalidRow { .. } => "invalid_row",
            Error::PrimaryKeyMismatch => "primary_key_mismatch",
            Error::InvalidServerVersion => "invalid_server_version",
            Error::InvalidRowIdentity { .. } => "invalid_row_identity",
            Error::InvalidScope { .. } => "invalid_scope",
            Error::InvalidDigest => "invalid_digest",
            Error::InvalidChecksum { .. } => "invalid_checksum",
            Error::InvalidSemver { .. } => "invalid_semver",
            Error::InvalidSchemaReference { .. } => "invalid_schema_reference",
            Error::InvalidLineage { .. } => "invalid_lineage",
            Error::UnknownState => "unknown_state",
            Error::IllegalTransition { .. } => "illegal_transition",
            Error::InvalidMigrationPlan { .. } => "invalid_migration_plan",
            Error::InvalidToken { .. } => "invalid_token",
            Error::LimitExceeded { .. } => "limit_exceeded",
            Error::InvalidRequest { .. } => "invalid_request",
        }
    }

    pub(crate) fn manifest(reason: impl Into<String>) -> Self {
        Error::InvalidManifest {
            reason: reason.into(),
        }
    }

    pub(crate) fn row(reason: impl Into<String>) -> Self {
        Error::InvalidRow {
            reason: reason.into(),
        }
    }

    pub(crate) fn lineage(reason: impl Into<String>) -> Self {
        Error::InvalidLineage {
            reason: reason.into(),
        }
    }

    pub(crate) fn request(reason: impl Into<String>) -> Self {
        Error::InvalidRequest {
            reason: reason.into(),
        }
    }
}
