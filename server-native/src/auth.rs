//! Bearer JWT authentication (HS256 with a configured secret). The `sub` claim is the
//! canonical user id; `exp` is required, `nbf` is honoured when present, and a token may not
//! live longer than the configured maximum from now. Failures carry no token or claim in
//! any message.

use axum::http::HeaderMap;
use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Longest accepted user id (`sub`), in bytes (the same bound as a client id).
pub const MAX_USER_ID_BYTES: usize = 256;

/// Default bound on a token's remaining lifetime (`exp` at most this far from now): 30 days.
pub const DEFAULT_MAX_TOKEN_LIFETIME_SECS: u64 = 30 * 24 * 3600;

/// Clock skew tolerated for `exp` and `nbf`, in seconds.
const LEEWAY_SECS: u64 = 30;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
}

/// Verifies `Authorization: Bearer <jwt>` headers.
#[derive(Clone)]
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
    max_lifetime_secs: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether `sub` can be a canonical user id: 1..=256 bytes, not blank, no control
/// characters (NUL among them: PostgreSQL text cannot hold it).
pub fn valid_user_id(sub: &str) -> bool {
    !sub.trim().is_empty() && sub.len() <= MAX_USER_ID_BYTES && !sub.chars().any(char::is_control)
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
        if secret.len() < 16 {
            anyhow::bail!("the JWT secret must be at least 16 bytes");
        }
        if max_lifetime_secs == 0 {
            anyhow::bail!("the maximum token lifetime must be positive");
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECS;
        Ok(Authenticator {
            key: DecodingKey::from_secret(secret)
                .map_err(|_| anyhow::anyhow!("unusable JWT secret"))?,
            validation,
            max_lifetime_secs,
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
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        let claims = decode::<Claims>(token, &self.key, &self.validation)
            .ok()?
            .claims;
        if claims.exp > now_secs().saturating_add(self.max_lifetime_secs + LEEWAY_SECS) {
            return None;
        }
        valid_user_id(&claims.sub).then_some(claims.sub)
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
