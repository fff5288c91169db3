//! Bearer JWT authentication (HS256 with a configured secret) through the shared verifier
//! [`synchro_protocol::jwt`] (the edge gateway runs the same one). The `sub` claim is the
//! canonical user id; `exp` is required, `nbf` is honoured when present, and a token may not
//! live longer than the configured maximum from now. Failures carry no token or claim in
//! any message. Minting (development and tests) stays on `jsonwebtoken`, so tests check the
//! verifier against an independent encoder.

use axum::http::HeaderMap;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use synchro_protocol::jwt::Hs256;

pub use synchro_protocol::jwt::{
    valid_user_id, DEFAULT_MAX_TOKEN_LIFETIME_SECS, MAX_USER_ID_BYTES,
};

/// Verifies `Authorization: Bearer <jwt>` headers with [`synchro_protocol::jwt`], the
/// verifier the edge gateway runs too.
#[derive(Clone)]
pub struct Authenticator {
    verifier: Hs256,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Authenticator {
    /// An HS256 verifier for `secret` (at least 16 bytes), with the default lifetime bound.
    pub fn hs256(secret: &[u8]) -> anyhow::Result<Authenticator> {
        Authenticator::hs256_with_max_lifetime(secret, DEFAULT_MAX_TOKEN_LIFETIME_SECS)
    }

    /// An HS256 verifier accepting tokens whose `exp` is at most `max_lifetime_secs` from now.
    pub fn hs256_with_max_lifetime(
        secret: &[u8],
        max_lifetime_secs: u64,
    ) -> anyhow::Result<Authenticator> {
        Ok(Authenticator {
            verifier: Hs256::new(secret, max_lifetime_secs)?,
        })
    }

    /// The canonical user id of the request's one valid bearer token, or `None` (no
    /// header, two `Authorization` headers, a bad token, or an unusable `sub`).
    pub fn user_id(&self, headers: &HeaderMap) -> Option<String> {
        let mut values = headers.get_all("authorization").iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return None;
        };
        self.user_id_of(value.to_str().ok())
    }

    /// The canonical user id of one `Authorization` header value, or `None`.
    pub fn user_id_of(&self, authorization: Option<&str>) -> Option<String> {
        self.verifier.user_id(authorization, now_secs())
    }

    /// [`Authenticator::user_id`] with the token's `exp` (Unix seconds).
    pub fn verify(&self, headers: &HeaderMap) -> Option<(String, u64)> {
        let mut values = headers.get_all("authorization").iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return None;
        };
        self.verifier.verify(value.to_str().ok(), now_secs())
    }
}

/// Mints an HS256 token for `user_id` valid for `ttl_secs` (development and tests).
pub fn mint(secret: &[u8], user_id: &str, ttl_secs: u64) -> String {
    mint_claims(
        secret,
        &serde_json::json!({"sub": user_id, "exp": now_secs() + ttl_secs}),
    )
}

/// Mints an HS256 token with exactly these claims (tests of refused tokens).
pub fn mint_claims(secret: &[u8], claims: &serde_json::Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret).expect("an HS256 key accepts any secret"),
    )
    .expect("HS256 encoding of a small claim set cannot fail")
}

/// Derives a purpose-specific 32-byte key from a root secret:
/// `HMAC-SHA-256(secret, "synchro:v3:key:" || purpose)`.
pub fn derive_key(secret: &[u8], purpose: &str) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(b"synchro:v3:key:");
    m.update(purpose.as_bytes());
    m.finalize().into_bytes().into()
}
