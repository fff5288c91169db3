//! An identity provider's JSON Web Key Set (RFC 7517) as a [`KeySet`]: the public keys a
//! [`super::Verifier`] checks RS256, ES256 and EdDSA tokens with.
//!
//! Fetching the set is the caller's (the server and the edge each have their own HTTP
//! client); what they share is here: parsing, the refresh policy ([`REFRESH_SECS`],
//! [`MIN_REFETCH_SECS`]) and the bounds ([`MAX_JWKS_BYTES`], [`MAX_KEYS`]).
//!
//! Keys this verifier cannot use are skipped, not refused (providers list encryption keys
//! and other curves beside their signing keys): a key whose `use` is not `sig`, whose `kty`
//! or `crv` is not RSA, P-256 or Ed25519, whose `alg` is not RS256, ES256 or EdDSA, an RSA
//! modulus under 2048 or over 8192 bits, or a point not on its curve. A set with no usable key
//! at all is refused ([`JwksError::NoUsableKey`]): a configuration error, not a key rotation.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::Refusal;
use crate::json::Json;

/// How often a key set is fetched again while in use, in seconds (10 minutes): rotated
/// keys are picked up without a restart.
pub const REFRESH_SECS: u64 = 600;

/// Shortest time between two fetches caused by tokens naming an unknown `kid`, in seconds:
/// a new key is picked up within this bound, and a flood of made-up `kid`s costs the
/// provider at most one request per interval.
pub const MIN_REFETCH_SECS: u64 = 30;

/// Largest accepted key set document, in bytes.
pub const MAX_JWKS_BYTES: usize = 256 * 1024;

/// Most keys kept from one set.
pub const MAX_KEYS: usize = 64;

/// Time allowed for one fetch of the key set, in seconds.
pub const FETCH_TIMEOUT_SECS: u64 = 10;

/// A signature algorithm a key set can verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl Alg {
    /// The algorithm of a JWS `alg` value.
    pub fn parse(alg: &str) -> Option<Alg> {
        match alg {
            "RS256" => Some(Alg::Rs256),
            "ES256" => Some(Alg::Es256),
            "EdDSA" => Some(Alg::EdDsa),
            _ => None,
        }
    }
}

enum PublicKey {
    Rsa(Box<rsa::PublicKey>),
    P256(p256::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl PublicKey {
    fn alg(&self) -> Alg {
        match self {
            PublicKey::Rsa(_) => Alg::Rs256,
            PublicKey::P256(_) => Alg::Es256,
            PublicKey::Ed25519(_) => Alg::EdDsa,
        }
    }

    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        match self {
            PublicKey::Rsa(key) => {
                use rsa::sha2::{Digest, Sha256};
                key.verify(
                    rsa::Pkcs1v15Sign::new::<Sha256>(),
                    &Sha256::digest(message),
                    signature,
                )
                .is_ok()
            }
            PublicKey::P256(key) => {
                use p256::ecdsa::signature::Verifier;
                p256::ecdsa::Signature::from_slice(signature)
                    .is_ok_and(|sig| key.verify(message, &sig).is_ok())
            }
            PublicKey::Ed25519(key) => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|sig| key.verify_strict(message, &sig).is_ok()),
        }
    }
}

struct Key {
    kid: Option<String>,
    key: PublicKey,
}

/// The usable signing keys of one JSON Web Key Set.
pub struct KeySet {
    keys: Vec<Key>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeySet")
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// Why a key set document cannot be used. Names the rule, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// Larger than [`MAX_JWKS_BYTES`].
    #[error("the key set is larger than 256 KiB")]
    TooLarge,
    /// Not a JSON object with a `keys` array.
    #[error("the key set is not a JSON object with a keys array")]
    NotAKeySet,
    /// No key of the set is an RS256, ES256 or EdDSA signing key this verifier can use.
    #[error("the key set has no usable RS256, ES256 or EdDSA signing key")]
    NoUsableKey,
}

impl KeySet {
    /// Parses a JWKS document (the body of the provider's `jwks_uri`).
    pub fn parse(document: &[u8]) -> Result<KeySet, JwksError> {
        if document.len() > MAX_JWKS_BYTES {
            return Err(JwksError::TooLarge);
        }
        let text = std::str::from_utf8(document).map_err(|_| JwksError::NotAKeySet)?;
        let json = Json::parse(text).map_err(|_| JwksError::NotAKeySet)?;
        let Some(Json::Array(entries)) = json.get("keys") else {
            return Err(JwksError::NotAKeySet);
        };
        let keys: Vec<Key> = entries.iter().filter_map(key).take(MAX_KEYS).collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey);
        }
        Ok(KeySet { keys })
    }

    /// How many usable keys the set holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set holds no key (never, for a parsed set).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Verifies `signature` over `message` with the key `kid` names (every key fitting
    /// `alg` when there is no `kid`).
    pub(super) fn verify(
        &self,
        alg: Alg,
        kid: Option<&str>,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), Refusal> {
        let mut candidates = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
            .peekable();
        if candidates.peek().is_none() {
            return Err(Refusal::UnknownKey);
        }
        let mut fitting = candidates.filter(|k| k.key.alg() == alg).peekable();
        if fitting.peek().is_none() {
            return Err(Refusal::Algorithm);
        }
        if fitting.any(|k| k.key.verifies(message, signature)) {
            Ok(())
        } else {
            Err(Refusal::Signature)
        }
    }
}

/// One usable key of a set, or `None` (skipped).
fn key(jwk: &Json) -> Option<Key> {
    let text = |name: &str| jwk.get(name).and_then(Json::as_str);
    let bytes = |name: &str| text(name).and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
    if text("use").is_some_and(|u| u != "sig")
        || jwk.get("use").is_some_and(|u| u.as_str().is_none())
    {
        return None;
    }
    if let Some(ops) = jwk.get("key_ops") {
        let Json::Array(ops) = ops else { return None };
        if !ops.iter().any(|op| op.as_str() == Some("verify")) {
            return None;
        }
    }
    let key = match (text("kty")?, text("crv")) {
        ("RSA", _) => {
            let n = rsa::BoxedUint::from_be_slice_vartime(&bytes("n")?);
            let e = rsa::BoxedUint::from_be_slice_vartime(&bytes("e")?);
            PublicKey::Rsa(Box::new(
                rsa::PublicKey::new_with_size_limits(n, e, 2048..=8192).ok()?,
            ))
        }
        ("EC", Some("P-256")) => {
            let (x, y) = (bytes("x")?, bytes("y")?);
            if x.len() != 32 || y.len() != 32 {
                return None;
            }
            let mut point = vec![4u8];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            PublicKey::P256(p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).ok()?)
        }
        ("OKP", Some("Ed25519")) => {
            let x: [u8; 32] = bytes("x")?.try_into().ok()?;
            PublicKey::Ed25519(ed25519_dalek::VerifyingKey::from_bytes(&x).ok()?)
        }
        _ => return None,
    };
    if let Some(alg) = jwk.get("alg") {
        if Alg::parse(alg.as_str()?) != Some(key.alg()) {
            return None;
        }
    }
    let kid = match jwk.get("kid") {
        None | Some(Json::Null) => None,
        Some(kid) => Some(kid.as_str()?.to_owned()),
    };
    Some(Key { kid, key })
}

/// Whether an `Authorization` value's token names a key-set algorithm in its header (so a
/// refusal for an unknown key is worth fetching the set again); anything else is refused
/// without a fetch.
pub fn wants_key_set(authorization: Option<&str>) -> bool {
    authorization
        .and_then(|a| a.strip_prefix("Bearer "))
        .and_then(|t| t.trim().split('.').next())
        .and_then(|h| URL_SAFE_NO_PAD.decode(h).ok())
        .and_then(|h| Json::parse(std::str::from_utf8(&h).ok()?).ok())
        .and_then(|h| Alg::parse(h.get("alg")?.as_str()?))
        .is_some()
}

/// Whether `url` may serve a key set: `https://`, or `http://` to this machine only
/// (`localhost`, `127.0.0.1`, `[::1]`; development and tests), with no credentials.
pub fn acceptable_url(url: &str) -> bool {
    let url = url.trim();
    let (rest, secure) = match url.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => match url.strip_prefix("http://") {
            Some(rest) => (rest, false),
            None => return false,
        },
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') || url.chars().any(char::is_whitespace) {
        return false;
    }
    if secure {
        return true;
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}
