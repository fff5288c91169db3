//! A stand-in identity provider for the `--jwks-url` tests: RS256, ES256 and EdDSA signing
//! keys (`protocol/tests/keys/`, made by `openssl genpkey`, test keys only), tokens signed
//! by an independent implementation (`jsonwebtoken`), and a real HTTP endpoint serving the
//! key set (JWKS) that counts its fetches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// The `iss` of the provider's tokens.
pub const ISSUER: &str = "https://idp.example.com/";
/// The `aud` of the provider's tokens.
pub const AUDIENCE: &str = "https://sync.example.com";

/// One signing key and its `kid`.
#[derive(Clone)]
pub struct TestKey {
    /// Its algorithm.
    pub alg: Algorithm,
    /// Its key ID in the set and in token headers.
    pub kid: String,
    key: EncodingKey,
}

impl TestKey {
    fn pem(alg: Algorithm, kid: &str, pem: &str) -> TestKey {
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
            _ => EncodingKey::from_ed_pem(pem.as_bytes()),
        }
        .expect("a test key");
        TestKey {
            alg,
            kid: kid.to_owned(),
            key,
        }
    }

    /// An RSA 2048 key, `rsa-a`.
    pub fn rsa_a() -> TestKey {
        Self::pem(
            Algorithm::RS256,
            "rsa-a",
            include_str!("../../protocol/tests/keys/rsa-a.pem"),
        )
    }

    /// Another RSA 2048 key, `rsa-b`.
    pub fn rsa_b() -> TestKey {
        Self::pem(
            Algorithm::RS256,
            "rsa-b",
            include_str!("../../protocol/tests/keys/rsa-b.pem"),
        )
    }

    /// A P-256 key, `ec`.
    pub fn ec() -> TestKey {
        Self::pem(
            Algorithm::ES256,
            "ec",
            include_str!("../../protocol/tests/keys/ec.pem"),
        )
    }

    /// An Ed25519 key, `ed`.
    pub fn ed() -> TestKey {
        Self::pem(
            Algorithm::EdDSA,
            "ed",
            include_str!("../../protocol/tests/keys/ed.pem"),
        )
    }

    /// This key under another `kid` (one the set does not list).
    pub fn with_kid(&self, kid: &str) -> TestKey {
        TestKey {
            kid: kid.to_owned(),
            ..self.clone()
        }
    }

    /// Its public JWK.
    pub fn jwk(&self) -> Value {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).expect("a public JWK");
        jwk.common.key_id = Some(self.kid.clone());
        serde_json::to_value(jwk).expect("a JWK is JSON")
    }

    /// A token for `sub` valid for 10 minutes with the provider's `iss` and `aud`, `extra`
    /// claims replacing those (a `null` one stays null).
    pub fn token(&self, sub: &str, extra: Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let mut claims = json!({"sub": sub, "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE});
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                claims[k] = v;
            }
        }
        encode(&header, &claims, &self.key).expect("a signed token")
    }
}

/// A JWKS document listing `keys`.
pub fn document(keys: &[&TestKey]) -> Vec<u8> {
    let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
    serde_json::to_vec(&json!({ "keys": keys })).expect("JSON")
}

/// The provider's JWKS endpoint, serving [`Provider::document`] at [`Provider::url`].
pub struct Provider {
    /// The document served (replace it to rotate keys).
    pub document: Arc<Mutex<Vec<u8>>>,
    /// How many times it was fetched.
    pub fetches: Arc<AtomicUsize>,
    /// Its URL (`http://127.0.0.1:PORT/.well-known/jwks.json`).
    pub url: String,
}

impl Provider {
    /// Serves `initial` until the runtime ends.
    pub async fn start(initial: Vec<u8>) -> Provider {
        let document = Arc::new(Mutex::new(initial));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (d, f) = (document.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/.well-known/jwks.json",
            axum::routing::get(move || {
                let (d, f) = (d.clone(), f.clone());
                async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    let body = d.lock().expect("the document").clone();
                    ([("content-type", "application/json")], body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Provider {
            document,
            fetches,
            url: format!("http://{addr}/.well-known/jwks.json"),
        }
    }

    /// Replaces the document served.
    pub fn serve(&self, document: Vec<u8>) {
        *self.document.lock().expect("the document") = document;
    }

    /// How many times the document was fetched so far.
    pub fn fetched(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}
