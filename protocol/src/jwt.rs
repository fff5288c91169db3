//! Bearer JWT verification, HS256 with a shared secret: the one verifier of the server and
//! the edge gateway (they must accept and refuse the same tokens), pure (the caller passes
//! the current time in).
//!
//! A token is accepted when all of these hold, and refused otherwise without saying why
//! (a refusal is always 401 `unauthorized`, and nothing about the token is logged):
//!
//! - the `Authorization` value is `Bearer ` then a compact JWS (surrounding whitespace of the
//!   token trimmed): three base64url parts without padding;
//! - the header is a JSON object whose `alg` is `HS256`; it has no `crit` and no `b64`
//!   other than `true` (any other header member is ignored);
//! - the signature is HMAC-SHA-256 of `header.payload` under the secret (compared in
//!   constant time);
//! - the claims are a JSON object (strict: duplicate member names refused) with `exp` a
//!   nonnegative integer, `sub` a string, `nbf` absent, null or a nonnegative integer, and no
//!   `aud` (an audience this verifier cannot check); other claims are ignored;
//! - `exp >= now - LEEWAY`, `nbf <= now + LEEWAY`, and `exp <= now + max_lifetime + LEEWAY`
//!   (a token may not live longer than the configured maximum);
//! - `sub` is a usable canonical user id ([`valid_user_id`]).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};

use crate::json::Json;

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

/// Why a verifier could not be made (never why a token was refused: that is not said).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error("the JWT secret must be at least 16 bytes")]
    SecretTooShort,
    /// The maximum token lifetime is zero.
    #[error("the maximum token lifetime must be positive")]
    ZeroLifetime,
}

/// An HS256 verifier for one secret.
#[derive(Clone)]
pub struct Hs256 {
    mac: Hmac<sha2::Sha256>,
    max_lifetime_secs: u64,
}

impl std::fmt::Debug for Hs256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hs256")
            .field("max_lifetime_secs", &self.max_lifetime_secs)
            .finish_non_exhaustive()
    }
}

impl Hs256 {
    /// A verifier for `secret` accepting tokens whose `exp` is at most `max_lifetime_secs`
    /// from now.
    pub fn new(secret: &[u8], max_lifetime_secs: u64) -> Result<Hs256, KeyError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(KeyError::SecretTooShort);
        }
        if max_lifetime_secs == 0 {
            return Err(KeyError::ZeroLifetime);
        }
        Ok(Hs256 {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes any key length"),
            max_lifetime_secs,
        })
    }

    /// The canonical user id of one `Authorization` header value at `now_secs` (Unix
    /// seconds), or `None` for any refusal.
    pub fn user_id(&self, authorization: Option<&str>, now_secs: u64) -> Option<String> {
        self.verify(authorization, now_secs).map(|(sub, _)| sub)
    }

    /// [`Hs256::user_id`] with the token's `exp` (Unix seconds): what a long-lived
    /// response (an events stream) must not outlive.
    pub fn verify(&self, authorization: Option<&str>, now_secs: u64) -> Option<(String, u64)> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        let (message, signature) = token.rsplit_once('.')?;
        let (header, payload) = message.rsplit_once('.')?;
        let header = part_json(header)?;
        if header.get("alg").and_then(Json::as_str) != Some("HS256")
            || header.get("crit").is_some()
            || header.get("b64").is_some_and(|b| *b != Json::Bool(true))
        {
            return None;
        }
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        let mut mac = self.mac.clone();
        mac.update(message.as_bytes());
        mac.verify_slice(&signature).ok()?;
        let claims = part_json(payload)?;
        let exp = claims.get("exp").and_then(integer)?;
        let sub = claims.get("sub").and_then(Json::as_str)?;
        let nbf = match claims.get("nbf") {
            None | Some(Json::Null) => None,
            Some(v) => Some(integer(v)?),
        };
        if claims.get("aud").is_some_and(|a| *a != Json::Null) {
            return None;
        }
        let fresh = exp >= now_secs.saturating_sub(LEEWAY_SECS)
            && nbf.is_none_or(|nbf| nbf <= now_secs.saturating_add(LEEWAY_SECS))
            && exp
                <= now_secs
                    .saturating_add(self.max_lifetime_secs)
                    .saturating_add(LEEWAY_SECS);
        (fresh && valid_user_id(sub)).then(|| (sub.to_owned(), exp))
    }
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

    fn verifier() -> Hs256 {
        Hs256::new(SECRET, DEFAULT_MAX_TOKEN_LIFETIME_SECS).unwrap()
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
    fn refuses_unusable_keys() {
        assert_eq!(
            Hs256::new(b"short", 60).unwrap_err(),
            KeyError::SecretTooShort
        );
        assert_eq!(Hs256::new(SECRET, 0).unwrap_err(), KeyError::ZeroLifetime);
    }
}
