//! Bearer JWT verification: the one verifier of the server and the edge gateway (they must
//! accept and refuse the same tokens), pure (the caller passes the current time in, and
//! fetches a JSON Web Key Set itself: [`jwks`]).
//!
//! Two kinds of keys, alone or together: an HS256 shared secret, and (feature `jwks`) the
//! public keys of an identity provider's JWKS (RS256, ES256, EdDSA with Ed25519). A token is
//! accepted when all of these hold, and refused otherwise with a [`Refusal`] that names the
//! rule, never a value (a refusal is always 401 `unauthorized` on the wire):
//!
//! - the `Authorization` value is `Bearer ` then a compact JWS (surrounding whitespace of the
//!   token trimmed): three base64url parts without padding;
//! - the header is a JSON object whose `alg` is `HS256` (verified only with the secret) or
//!   `RS256`, `ES256`, `EdDSA` (verified only with a key of the set whose type fits: no
//!   algorithm confusion); it has no `crit` and no `b64` other than `true`; a `kid` selects
//!   the key (without one, every key of the set fitting `alg` is tried);
//! - the signature verifies (HMAC compared in constant time);
//! - the claims are a JSON object (strict: duplicate member names refused) with `exp` a
//!   nonnegative integer, `sub` a string, `nbf` absent, null or a nonnegative integer;
//! - `exp >= now - LEEWAY`, `nbf <= now + LEEWAY`, and `exp <= now + max_lifetime + LEEWAY`
//!   (a token may not live longer than the configured maximum);
//! - `iss` equals the configured issuer, when one is configured;
//! - `aud` is absent or null when no audience is configured (a token meant for someone
//!   else is not taken), and names the configured audience (a string, or an array holding
//!   it) when one is;
//! - `sub` is a usable canonical user id ([`valid_user_id`]).

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};

use crate::json::Json;

#[cfg(feature = "jwks")]
pub mod jwks;

/// Longest accepted user id (`sub`), in bytes: its default scope `user:{sub}` must fit the
/// protocol's bound on an ID ([`crate::wire::MAX_ID_BYTES`], 256), or that user could never
/// rebuild or pull it.
pub const MAX_USER_ID_BYTES: usize = crate::wire::MAX_ID_BYTES - "user:".len();

/// Clock skew tolerated for `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// Default bound on a token's remaining lifetime (`exp` at most this far from now): 30 days.
pub const DEFAULT_MAX_TOKEN_LIFETIME_SECS: u64 = 30 * 24 * 3600;

/// Shortest accepted shared secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Whether `sub` can be a canonical user id: 1..=251 bytes, not blank, no control
/// characters (NUL among them: PostgreSQL text cannot hold it).
pub fn valid_user_id(sub: &str) -> bool {
    !sub.trim().is_empty() && sub.len() <= MAX_USER_ID_BYTES && !sub.chars().any(char::is_control)
}

/// Why a verifier could not be made (never why a token was refused: that is a [`Refusal`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error("the JWT secret must be at least 16 bytes")]
    SecretTooShort,
    /// The maximum token lifetime is zero.
    #[error("the maximum token lifetime must be positive")]
    ZeroLifetime,
    /// An issuer or audience setting is empty or has control characters.
    #[error("the JWT {0} must be a nonempty string without control characters")]
    BadClaimSetting(&'static str),
}

/// Why one token was refused: the rule it broke, never a value from it. Operators see it in
/// debug logs; clients only ever see 401 `unauthorized`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No `Authorization` value, or not `Bearer ` and a compact JWS with JSON parts.
    Malformed,
    /// The header's `alg` is not one this verifier has a key for, or it carries `crit` or
    /// `b64: false`.
    Algorithm,
    /// The `kid` names no key of the set (the caller may refresh the set, then retry).
    UnknownKey,
    /// The signature does not verify.
    Signature,
    /// `exp` or `sub` is missing or of the wrong type, or `nbf` is not an integer.
    Claims,
    /// `exp` is in the past (beyond the leeway).
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    NotYetValid,
    /// `exp` is further away than the configured maximum lifetime.
    TooLongLived,
    /// `iss` is not the configured issuer.
    Issuer,
    /// `aud` does not name the configured audience (or is present when none is configured).
    Audience,
    /// `sub` cannot be a canonical user id.
    Subject,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Malformed => "not a bearer JWT",
            Refusal::Algorithm => "its alg is not one a configured key accepts",
            Refusal::UnknownKey => "its kid names no key of the key set",
            Refusal::Signature => "its signature does not verify",
            Refusal::Claims => "exp, sub or nbf is missing or of the wrong type",
            Refusal::Expired => "it has expired",
            Refusal::NotYetValid => "it is not valid yet (nbf)",
            Refusal::TooLongLived => "exp is beyond the maximum token lifetime",
            Refusal::Issuer => "iss is not the configured issuer",
            Refusal::Audience => {
                "aud does not name the configured audience (or no audience is configured)"
            }
            Refusal::Subject => "sub cannot be a user id",
        })
    }
}

/// A token verifier: its keys and the claim rules.
#[derive(Clone)]
pub struct Verifier {
    mac: Option<Hmac<sha2::Sha256>>,
    #[cfg(feature = "jwks")]
    keys: Option<std::sync::Arc<jwks::KeySet>>,
    issuer: Option<String>,
    audience: Option<String>,
    max_lifetime_secs: u64,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Verifier");
        d.field("hs256", &self.mac.is_some());
        #[cfg(feature = "jwks")]
        d.field("keys", &self.keys.as_ref().map_or(0, |k| k.len()));
        d.field("max_lifetime_secs", &self.max_lifetime_secs)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier without keys (it refuses every token until a secret or a key set is
    /// given) accepting tokens whose `exp` is at most `max_lifetime_secs` from now.
    pub fn new(max_lifetime_secs: u64) -> Result<Verifier, KeyError> {
        if max_lifetime_secs == 0 {
            return Err(KeyError::ZeroLifetime);
        }
        Ok(Verifier {
            mac: None,
            #[cfg(feature = "jwks")]
            keys: None,
            issuer: None,
            audience: None,
            max_lifetime_secs,
        })
    }

    /// An HS256 verifier for `secret` (at least [`MIN_SECRET_BYTES`]).
    pub fn hs256(secret: &[u8], max_lifetime_secs: u64) -> Result<Verifier, KeyError> {
        Verifier::new(max_lifetime_secs)?.with_secret(secret)
    }

    /// This verifier also accepting HS256 tokens signed with `secret`.
    pub fn with_secret(mut self, secret: &[u8]) -> Result<Verifier, KeyError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(KeyError::SecretTooShort);
        }
        self.mac = Some(Hmac::new_from_slice(secret).expect("HMAC takes any key length"));
        Ok(self)
    }

    /// This verifier requiring `iss` to equal `issuer`.
    pub fn with_issuer(mut self, issuer: &str) -> Result<Verifier, KeyError> {
        self.issuer = Some(claim_setting(issuer, "issuer")?);
        Ok(self)
    }

    /// This verifier requiring `aud` to name `audience`.
    pub fn with_audience(mut self, audience: &str) -> Result<Verifier, KeyError> {
        self.audience = Some(claim_setting(audience, "audience")?);
        Ok(self)
    }

    /// This verifier with `keys` as its key set (replacing any earlier one).
    #[cfg(feature = "jwks")]
    pub fn with_keys(&self, keys: std::sync::Arc<jwks::KeySet>) -> Verifier {
        Verifier {
            keys: Some(keys),
            ..self.clone()
        }
    }

    /// Whether an issuer is required.
    pub fn checks_issuer(&self) -> bool {
        self.issuer.is_some()
    }

    /// The canonical user id of one `Authorization` header value at `now_secs` (Unix
    /// seconds), or `None` for any refusal.
    pub fn user_id(&self, authorization: Option<&str>, now_secs: u64) -> Option<String> {
        self.check(authorization, now_secs).ok().map(|(sub, _)| sub)
    }

    /// [`Verifier::user_id`] with the token's `exp` (Unix seconds): what a long-lived
    /// response (an events stream) must not outlive.
    pub fn verify(&self, authorization: Option<&str>, now_secs: u64) -> Option<(String, u64)> {
        self.check(authorization, now_secs).ok()
    }

    /// [`Verifier::verify`] saying why a token is refused.
    pub fn check(
        &self,
        authorization: Option<&str>,
        now_secs: u64,
    ) -> Result<(String, u64), Refusal> {
        let token = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .ok_or(Refusal::Malformed)?
            .trim();
        let (message, signature) = token.rsplit_once('.').ok_or(Refusal::Malformed)?;
        let (header, payload) = message.rsplit_once('.').ok_or(Refusal::Malformed)?;
        let header = part_json(header).ok_or(Refusal::Malformed)?;
        if header.get("crit").is_some() || header.get("b64").is_some_and(|b| *b != Json::Bool(true))
        {
            return Err(Refusal::Algorithm);
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| Refusal::Malformed)?;
        let alg = header
            .get("alg")
            .and_then(Json::as_str)
            .ok_or(Refusal::Algorithm)?;
        if alg == "HS256" {
            let mut mac = self.mac.clone().ok_or(Refusal::Algorithm)?;
            mac.update(message.as_bytes());
            mac.verify_slice(&signature)
                .map_err(|_| Refusal::Signature)?;
        } else {
            self.verify_with_key_set(&header, alg, message.as_bytes(), &signature)?;
        }
        let claims = part_json(payload).ok_or(Refusal::Malformed)?;
        self.check_claims(&claims, now_secs)
    }

    #[cfg(feature = "jwks")]
    fn verify_with_key_set(
        &self,
        header: &Json,
        alg: &str,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), Refusal> {
        let keys = self.keys.as_ref().ok_or(Refusal::Algorithm)?;
        let alg = jwks::Alg::parse(alg).ok_or(Refusal::Algorithm)?;
        let kid = match header.get("kid") {
            None | Some(Json::Null) => None,
            Some(Json::String(kid)) => Some(kid.as_str()),
            Some(_) => return Err(Refusal::Malformed),
        };
        keys.verify(alg, kid, message, signature)
    }

    #[cfg(not(feature = "jwks"))]
    fn verify_with_key_set(
        &self,
        _header: &Json,
        _alg: &str,
        _message: &[u8],
        _signature: &[u8],
    ) -> Result<(), Refusal> {
        Err(Refusal::Algorithm)
    }

    fn check_claims(&self, claims: &Json, now_secs: u64) -> Result<(String, u64), Refusal> {
        let exp = claims.get("exp").and_then(integer).ok_or(Refusal::Claims)?;
        let sub = claims
            .get("sub")
            .and_then(Json::as_str)
            .ok_or(Refusal::Claims)?;
        let nbf = match claims.get("nbf") {
            None | Some(Json::Null) => None,
            Some(v) => Some(integer(v).ok_or(Refusal::Claims)?),
        };
        if exp < now_secs.saturating_sub(LEEWAY_SECS) {
            return Err(Refusal::Expired);
        }
        if nbf.is_some_and(|nbf| nbf > now_secs.saturating_add(LEEWAY_SECS)) {
            return Err(Refusal::NotYetValid);
        }
        if exp
            > now_secs
                .saturating_add(self.max_lifetime_secs)
                .saturating_add(LEEWAY_SECS)
        {
            return Err(Refusal::TooLongLived);
        }
        if let Some(issuer) = &self.issuer {
            if claims.get("iss").and_then(Json::as_str) != Some(issuer.as_str()) {
                return Err(Refusal::Issuer);
            }
        }
        let aud = claims.get("aud").filter(|a| **a != Json::Null);
        let audience_ok = match (&self.audience, aud) {
            (None, None) => true,
            (None, Some(_)) | (Some(_), None) => false,
            (Some(want), Some(Json::String(a))) => a == want,
            (Some(want), Some(Json::Array(items))) => {
                items.iter().any(|a| a.as_str() == Some(want.as_str()))
            }
            (Some(_), Some(_)) => false,
        };
        if !audience_ok {
            return Err(Refusal::Audience);
        }
        if !valid_user_id(sub) {
            return Err(Refusal::Subject);
        }
        Ok((sub.to_owned(), exp))
    }
}

fn claim_setting(value: &str, what: &'static str) -> Result<String, KeyError> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(KeyError::BadClaimSetting(what));
    }
    Ok(value.to_owned())
}

/// A base64url part decoded and parsed as a JSON object.
fn part_json(part: &str) -> Option<Json> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    let json = Json::parse(std::str::from_utf8(&bytes).ok()?).ok()?;
    matches!(json, Json::Object(_)).then_some(json)
}

/// A nonnegative integer number token that fits in u64.
fn integer(v: &Json) -> Option<u64> {
    match v {
        Json::Number(t) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t.parse().ok(),
        _ => None,
    }
}

/// Mints an HS256 token with exactly these claims (tests and development; `claims` must be
/// an object).
pub fn mint(secret: &[u8], claims: &Json) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(crate::jcs::to_output_string(claims));
    let message = format!("{header}.{payload}");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(message.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{message}.{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"jwt-test-secret-0123456789";
    const NOW: u64 = 1_800_000_000;

    fn claims(text: &str) -> Json {
        Json::parse(text).unwrap()
    }

    fn verifier() -> Verifier {
        Verifier::hs256(SECRET, DEFAULT_MAX_TOKEN_LIFETIME_SECS).unwrap()
    }

    fn check(token: &str) -> Option<String> {
        verifier().user_id(Some(&format!("Bearer {token}")), NOW)
    }

    fn signed(header: &str, payload: &str) -> String {
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET).unwrap();
        mac.update(message.as_bytes());
        format!(
            "{message}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn a_sub_whose_default_scope_would_exceed_the_id_bound_is_refused() {
        let exp = NOW + 60;
        let token = |sub: &str| {
            mint(
                SECRET,
                &claims(&format!(r#"{{"sub":"{sub}","exp":{exp}}}"#)),
            )
        };
        let longest = "a".repeat(251);
        assert_eq!(check(&token(&longest)).as_deref(), Some(longest.as_str()));
        assert!(format!("user:{longest}").len() <= crate::wire::MAX_ID_BYTES);
        for len in [252, 256] {
            assert_eq!(check(&token(&"a".repeat(len))), None, "{len}");
        }
    }

    #[test]
    fn accepts_a_valid_token_and_returns_its_sub() {
        let t = mint(
            SECRET,
            &claims(&format!(r#"{{"sub":"alice","exp":{}}}"#, NOW + 60)),
        );
        assert_eq!(check(&t).as_deref(), Some("alice"));
        // Within the leeway on both sides.
        let t = mint(
            SECRET,
            &claims(&format!(
                r#"{{"sub":"a","exp":{},"nbf":{}}}"#,
                NOW - 30,
                NOW + 30
            )),
        );
        assert_eq!(check(&t).as_deref(), Some("a"));
    }

    #[test]
    fn refuses_every_bad_token() {
        let exp = NOW + 60;
        let good = mint(
            SECRET,
            &claims(&format!(r#"{{"sub":"alice","exp":{exp}}}"#)),
        );
        let cases: Vec<(&str, String)> = vec![
            (
                "expired",
                mint(
                    SECRET,
                    &claims(&format!(r#"{{"sub":"a","exp":{}}}"#, NOW - 31)),
                ),
            ),
            (
                "not yet valid",
                mint(
                    SECRET,
                    &claims(&format!(r#"{{"sub":"a","exp":{exp},"nbf":{}}}"#, NOW + 31)),
                ),
            ),
            (
                "too long lived",
                mint(
                    SECRET,
                    &claims(&format!(
                        r#"{{"sub":"a","exp":{}}}"#,
                        NOW + DEFAULT_MAX_TOKEN_LIFETIME_SECS + 31
                    )),
                ),
            ),
            ("no exp", mint(SECRET, &claims(r#"{"sub":"a"}"#))),
            (
                "no sub",
                mint(SECRET, &claims(&format!(r#"{{"exp":{exp}}}"#))),
            ),
            (
                "float exp",
                signed(
                    r#"{"alg":"HS256"}"#,
                    &format!(r#"{{"sub":"a","exp":{exp}.0}}"#),
                ),
            ),
            (
                "string exp",
                mint(SECRET, &claims(&format!(r#"{{"sub":"a","exp":"{exp}"}}"#))),
            ),
            (
                "numeric sub",
                mint(SECRET, &claims(&format!(r#"{{"sub":7,"exp":{exp}}}"#))),
            ),
            (
                "blank sub",
                mint(SECRET, &claims(&format!(r#"{{"sub":"  ","exp":{exp}}}"#))),
            ),
            (
                "control sub",
                mint(
                    SECRET,
                    &claims(&format!(r#"{{"sub":"a\u0000","exp":{exp}}}"#)),
                ),
            ),
            (
                "audience",
                mint(
                    SECRET,
                    &claims(&format!(r#"{{"sub":"a","exp":{exp},"aud":"x"}}"#)),
                ),
            ),
            (
                "other secret",
                mint(
                    b"another-secret-0123456789",
                    &claims(&format!(r#"{{"sub":"a","exp":{exp}}}"#)),
                ),
            ),
            (
                "alg none",
                signed(
                    r#"{"alg":"none"}"#,
                    &format!(r#"{{"sub":"a","exp":{exp}}}"#),
                ),
            ),
            (
                "alg HS512",
                signed(
                    r#"{"alg":"HS512"}"#,
                    &format!(r#"{{"sub":"a","exp":{exp}}}"#),
                ),
            ),
            (
                "crit",
                signed(
                    r#"{"alg":"HS256","crit":["x"]}"#,
                    &format!(r#"{{"sub":"a","exp":{exp}}}"#),
                ),
            ),
            (
                "b64 false",
                signed(
                    r#"{"alg":"HS256","b64":false}"#,
                    &format!(r#"{{"sub":"a","exp":{exp}}}"#),
                ),
            ),
            (
                "duplicate claim",
                signed(
                    r#"{"alg":"HS256"}"#,
                    &format!(r#"{{"sub":"a","sub":"b","exp":{exp}}}"#),
                ),
            ),
            ("claims not an object", signed(r#"{"alg":"HS256"}"#, "[1]")),
            ("two parts", good.rsplit_once('.').unwrap().0.to_owned()),
            ("four parts", format!("{good}.x")),
            ("padded signature", format!("{good}=")),
            ("flipped signature", {
                let (m, s) = good.rsplit_once('.').unwrap();
                let mut s = s.as_bytes().to_vec();
                s[0] = if s[0] == b'A' { b'B' } else { b'A' };
                format!("{m}.{}", String::from_utf8(s).unwrap())
            }),
        ];
        assert_eq!(check(&good).as_deref(), Some("alice"));
        for (what, token) in cases {
            assert_eq!(check(&token), None, "{what} must be refused");
        }
        let v = verifier();
        assert_eq!(v.user_id(None, NOW), None);
        assert_eq!(v.user_id(Some(&format!("bearer {good}")), NOW), None);
        assert_eq!(v.user_id(Some(&good), NOW), None);
    }

    #[test]
    fn a_configured_issuer_and_audience_are_required() {
        let exp = NOW + 60;
        let v = verifier()
            .with_issuer("https://idp.example.com/")
            .unwrap()
            .with_audience("sync")
            .unwrap();
        let check = |claims_text: String| {
            v.check(
                Some(&format!("Bearer {}", mint(SECRET, &claims(&claims_text)))),
                NOW,
            )
            .map(|(sub, _)| sub)
        };
        let iss = r#""iss":"https://idp.example.com/""#;
        assert_eq!(
            check(format!(r#"{{"sub":"a","exp":{exp},{iss},"aud":"sync"}}"#)).as_deref(),
            Ok("a")
        );
        assert_eq!(
            check(format!(
                r#"{{"sub":"a","exp":{exp},{iss},"aud":["x","sync"]}}"#
            ))
            .as_deref(),
            Ok("a")
        );
        assert_eq!(
            check(format!(r#"{{"sub":"a","exp":{exp},"aud":"sync"}}"#)),
            Err(Refusal::Issuer)
        );
        assert_eq!(
            check(format!(
                r#"{{"sub":"a","exp":{exp},"iss":"https://idp.example.com","aud":"sync"}}"#
            )),
            Err(Refusal::Issuer)
        );
        assert_eq!(
            check(format!(r#"{{"sub":"a","exp":{exp},{iss}}}"#)),
            Err(Refusal::Audience)
        );
        assert_eq!(
            check(format!(r#"{{"sub":"a","exp":{exp},{iss},"aud":"other"}}"#)),
            Err(Refusal::Audience)
        );
        assert_eq!(
            verifier().with_issuer("").unwrap_err(),
            KeyError::BadClaimSetting("issuer")
        );
        assert_eq!(
            verifier().with_audience("a\u{7}b").unwrap_err(),
            KeyError::BadClaimSetting("audience")
        );
        // Without a secret or a key set every token is refused.
        let t = format!(
            "Bearer {}",
            mint(SECRET, &claims(&format!(r#"{{"sub":"a","exp":{exp}}}"#)))
        );
        assert_eq!(
            Verifier::new(60).unwrap().check(Some(&t), NOW),
            Err(Refusal::Algorithm)
        );
    }

    #[test]
    fn refuses_unusable_keys() {
        assert_eq!(
            Verifier::hs256(b"short", 60).unwrap_err(),
            KeyError::SecretTooShort
        );
        assert_eq!(
            Verifier::hs256(SECRET, 0).unwrap_err(),
            KeyError::ZeroLifetime
        );
    }
}
