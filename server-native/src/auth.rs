//! Bearer JWT authentication (HS256 with a configured secret). The `sub` claim is the
//! canonical user id; `exp` is required. Failures carry no token or claim in any message.

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

/// Verifies `Authorization: Bearer <jwt>` values.
#[derive(Clone)]
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
}

impl Authenticator {
    /// An HS256 verifier for `secret` (at least 16 bytes).
    pub fn hs256(secret: &[u8]) -> anyhow::Result<Authenticator> {
        if secret.len() < 16 {
            anyhow::bail!("the JWT secret must be at least 16 bytes");
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 30;
        Ok(Authenticator {
            key: DecodingKey::from_secret(secret)
                .map_err(|_| anyhow::anyhow!("unusable JWT secret"))?,
            validation,
        })
    }

    /// The canonical user id of a valid bearer header value, or `None`.
    pub fn user_id(&self, authorization: Option<&str>) -> Option<String> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        let data = decode::<Claims>(token, &self.key, &self.validation).ok()?;
        (!data.claims.sub.is_empty()).then_some(data.claims.sub)
    }
}

/// Mints an HS256 token for `user_id` valid for `ttl_secs` (development and tests).
pub fn mint(secret: &[u8], user_id: &str, ttl_secs: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    encode(
        &Header::new(Algorithm::HS256),
        &Claims {
            sub: user_id.to_owned(),
            exp: now + ttl_secs,
        },
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
