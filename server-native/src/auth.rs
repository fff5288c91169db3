//! Bearer JWT authentication through the shared verifier [`synchro_protocol::jwt`] (the
//! edge gateway runs the same one): an HS256 secret, an identity provider's key set
//! (`--jwks-url`: RS256, ES256, EdDSA), or both. The `sub` claim is the canonical user id;
//! `exp` is required, `nbf` is honoured when present, a token may not live longer than the
//! configured maximum from now, and `iss`/`aud` must match when configured. Failures carry no
//! token or claim in any message; the rule a token broke is logged at debug level. Minting
//! (development and tests) stays on `jsonwebtoken`, so tests check the verifier against an
//! independent encoder.
//!
//! The key set is fetched by a background task at start and every
//! [`jwks::REFRESH_SECS`] (every [`jwks::MIN_REFETCH_SECS`] while it fails), and again when a
//! token names a `kid` the set does not hold, at most once per `--jwks-refetch-secs`: a
//! rotated-in key is accepted within that bound, and made-up `kid`s cost the provider at most
//! one request per interval. A failed fetch keeps the keys already held.

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use synchro_protocol::jwt::jwks::{self, KeySet};
use synchro_protocol::jwt::{Refusal, Verifier};

pub use synchro_protocol::jwt::{
    valid_user_id, DEFAULT_MAX_TOKEN_LIFETIME_SECS, MAX_USER_ID_BYTES,
};

/// Verifies `Authorization: Bearer <jwt>` headers with [`synchro_protocol::jwt`], the
/// verifier the edge gateway runs too.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    /// The verifier with the key set last fetched.
    current: RwLock<Verifier>,
    jwks: Option<KeySource>,
}

/// Where the key set comes from, and when it was last asked for.
struct KeySource {
    url: String,
    client: reqwest::Client,
    /// The verifier without keys (its secret and claim rules), to which each fetched set
    /// is added.
    base: Verifier,
    min_refetch: Duration,
    /// When a fetch was last started: held across the fetch, so concurrent requests naming
    /// an unknown key wait for one fetch instead of each starting their own.
    last_attempt: tokio::sync::Mutex<Option<Instant>>,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How the server verifies bearer tokens (`serve`'s flags).
#[derive(Debug, Clone, Default)]
pub struct AuthSettings {
    /// The HS256 shared secret.
    pub secret: Option<String>,
    /// The identity provider's JWKS URL.
    pub jwks_url: Option<String>,
    /// The required `iss`.
    pub issuer: Option<String>,
    /// The required `aud`.
    pub audience: Option<String>,
    /// Longest accepted token lifetime, in seconds.
    pub max_lifetime_secs: u64,
    /// Shortest interval between two fetches caused by unknown `kid`s, in seconds.
    pub jwks_refetch_secs: u64,
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
        Ok(Authenticator::of(
            Verifier::hs256(secret, max_lifetime_secs)?,
            None,
        ))
    }

    /// The verifier `settings` describe. With a key set URL, it starts the task that keeps
    /// the set fresh (it must be called within the runtime; the task ends with the last
    /// clone of the authenticator).
    pub fn new(settings: &AuthSettings) -> anyhow::Result<Authenticator> {
        let mut verifier = Verifier::new(settings.max_lifetime_secs)?;
        if let Some(secret) = &settings.secret {
            verifier = verifier.with_secret(secret.as_bytes())?;
        }
        if let Some(issuer) = &settings.issuer {
            verifier = verifier.with_issuer(issuer)?;
        }
        if let Some(audience) = &settings.audience {
            verifier = verifier.with_audience(audience)?;
        }
        let Some(url) = &settings.jwks_url else {
            anyhow::ensure!(
                settings.secret.is_some(),
                "bearer tokens need a key: --jwt-secret (SYNCHRO_JWT_SECRET), --jwks-url (SYNCHRO_JWKS_URL) or both"
            );
            return Ok(Authenticator::of(verifier, None));
        };
        anyhow::ensure!(
            jwks::acceptable_url(url),
            "--jwks-url (SYNCHRO_JWKS_URL) must be an https:// URL (http:// only to localhost)"
        );
        anyhow::ensure!(
            verifier.checks_issuer(),
            "--jwks-url needs --jwt-issuer (SYNCHRO_JWT_ISSUER): a provider's keys may sign tokens for other applications too (one Firebase key set signs every project's), and the issuer tells yours apart"
        );
        anyhow::ensure!(
            settings.jwks_refetch_secs > 0,
            "--jwks-refetch-secs must be positive"
        );
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(jwks::FETCH_TIMEOUT_SECS))
            // A redirect may not leave https (nor localhost for a local http set): the keys
            // decide who is who, so no hop may be readable or alterable on the way.
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                if attempt.previous().len() >= 3 || !jwks::acceptable_url(attempt.url().as_str()) {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .user_agent(concat!("synchro-server/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let auth = Authenticator::of(
            verifier.clone(),
            Some(KeySource {
                url: url.trim().to_owned(),
                client,
                base: verifier,
                min_refetch: Duration::from_secs(settings.jwks_refetch_secs),
                last_attempt: tokio::sync::Mutex::new(None),
            }),
        );
        tokio::spawn(keep_fresh(Arc::downgrade(&auth.inner)));
        Ok(auth)
    }

    fn of(verifier: Verifier, jwks: Option<KeySource>) -> Authenticator {
        Authenticator {
            inner: Arc::new(Inner {
                current: RwLock::new(verifier),
                jwks,
            }),
        }
    }

    fn current(&self) -> Verifier {
        self.inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The canonical user id of the request's one valid bearer token, or `None` (no
    /// header, two `Authorization` headers, a bad token, or an unusable `sub`).
    pub async fn user_id(&self, headers: &HeaderMap) -> Option<String> {
        self.verify(headers).await.map(|(sub, _)| sub)
    }

    /// [`Authenticator::user_id`] with the token's `exp` (Unix seconds).
    pub async fn verify(&self, headers: &HeaderMap) -> Option<(String, u64)> {
        let mut values = headers.get_all("authorization").iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return None;
        };
        self.verify_value(value.to_str().ok()).await
    }

    /// [`Authenticator::verify`] for one `Authorization` header value.
    pub async fn verify_value(&self, authorization: Option<&str>) -> Option<(String, u64)> {
        let refusal = match self.current().check(authorization, now_secs()) {
            Ok(verified) => return Some(verified),
            Err(refusal) => refusal,
        };
        let refusal = match (refusal, &self.inner.jwks) {
            // A key rotated in since the last fetch (or none fetched yet): fetch again,
            // within the bound, then check once more.
            (Refusal::UnknownKey | Refusal::Algorithm, Some(source))
                if jwks::wants_key_set(authorization) =>
            {
                source.refetch(&self.inner).await;
                match self.current().check(authorization, now_secs()) {
                    Ok(verified) => return Some(verified),
                    Err(refusal) => refusal,
                }
            }
            (refusal, _) => refusal,
        };
        tracing::debug!(reason = %refusal, "bearer token refused");
        None
    }
}

impl KeySource {
    /// Fetches the set unless a fetch started less than `min_refetch` ago (then waits for
    /// that one to finish).
    async fn refetch(&self, inner: &Inner) {
        let mut last = self.last_attempt.lock().await;
        if last.is_some_and(|t| t.elapsed() < self.min_refetch) {
            return;
        }
        *last = Some(Instant::now());
        self.fetch_into(inner).await;
    }

    /// Fetches the set and installs it; a failure is logged and keeps the keys held.
    async fn fetch_into(&self, inner: &Inner) -> bool {
        match self.fetch().await {
            Ok(keys) => {
                tracing::debug!(keys = keys.len(), "key set fetched from --jwks-url");
                *inner.current.write().unwrap_or_else(|e| e.into_inner()) =
                    self.base.with_keys(Arc::new(keys));
                true
            }
            Err(e) => {
                tracing::warn!(
                    "the key set at --jwks-url could not be used ({e}); tokens signed by keys not already held are refused until it can"
                );
                false
            }
        }
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let mut response = self
            .client
            .get(&self.url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    "the request timed out".to_owned()
                } else if e.is_connect() {
                    "the connection failed".to_owned()
                } else {
                    "the request failed".to_owned()
                }
            })?;
        if !response.status().is_success() {
            return Err(format!("it answered HTTP {}", response.status().as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|_| "its body could not be read".to_owned())?
        {
            body.extend_from_slice(&chunk);
            if body.len() > jwks::MAX_JWKS_BYTES {
                return Err(jwks::JwksError::TooLarge.to_string());
            }
        }
        KeySet::parse(&body).map_err(|e| e.to_string())
    }
}

/// Fetches the key set at once and then every [`jwks::REFRESH_SECS`] (every
/// [`jwks::MIN_REFETCH_SECS`] while fetches fail), until the authenticator is dropped.
async fn keep_fresh(inner: Weak<Inner>) {
    loop {
        let ok = {
            let Some(inner) = inner.upgrade() else { return };
            let Some(source) = &inner.jwks else { return };
            let mut last = source.last_attempt.lock().await;
            *last = Some(Instant::now());
            source.fetch_into(&inner).await
        };
        let wait = if ok {
            jwks::REFRESH_SECS
        } else {
            jwks::MIN_REFETCH_SECS
        };
        tokio::time::sleep(Duration::from_secs(wait)).await;
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
