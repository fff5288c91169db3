//! The gateway's settings, read from the Worker's environment (`wrangler.toml` `[vars]` and
//! secrets) as strings and checked once: a setting that is missing or malformed is a
//! [`ConfigError`] and every request is answered with the opaque 503 until it is fixed.

use synchro_protocol::jwt::{jwks, Verifier, DEFAULT_MAX_TOKEN_LIFETIME_SECS};
use synchro_protocol::wire::cors::CorsOrigins;

/// Default largest accepted request body, in bytes (the server's default too).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1_048_576;

/// Default time the edge cache keeps a seed file asked for by name alone (no `?v=`), in
/// seconds.
pub const DEFAULT_SEED_CACHE_SECS: u64 = 60;

/// Names of the environment bindings.
pub mod names {
    /// `[vars]`: the origin's base URL (`https://sync.example.com`), no trailing path.
    pub const ORIGIN_URL: &str = "ORIGIN_URL";
    /// Secret: the HS256 shared secret, the server's `--jwt-secret` (optional with
    /// `JWKS_URL`).
    pub const JWT_SECRET: &str = "JWT_SECRET";
    /// `[vars]`: the identity provider's JSON Web Key Set URL, the server's `--jwks-url`.
    pub const JWKS_URL: &str = "JWKS_URL";
    /// `[vars]`: the required `iss`, the server's `--jwt-issuer` (required with `JWKS_URL`).
    pub const JWT_ISSUER: &str = "JWT_ISSUER";
    /// `[vars]`: the audience `aud` must name, the server's `--jwt-audience`.
    pub const JWT_AUDIENCE: &str = "JWT_AUDIENCE";
    /// `[vars]`: comma-separated browser origins allowed to call the gateway (`*` for any),
    /// the server's `--cors-origin`.
    pub const CORS_ORIGINS: &str = "CORS_ORIGINS";
    /// `[vars]`: largest accepted request body in bytes (default 1048576).
    pub const MAX_BODY_BYTES: &str = "MAX_BODY_BYTES";
    /// `[vars]`: longest accepted remaining token lifetime in seconds (default 30 days; the
    /// server's `--max-token-lifetime-secs`).
    pub const MAX_TOKEN_LIFETIME_SECS: &str = "MAX_TOKEN_LIFETIME_SECS";
    /// `[vars]`: `true` when `GET /seeds/{name}` needs no bearer token (the server's
    /// `--public-seeds`; default `false`).
    pub const PUBLIC_SEEDS: &str = "PUBLIC_SEEDS";
    /// `[vars]`: how long the edge cache keeps a seed file asked for without `?v=`, in
    /// seconds (default 60); one asked for by its SHA-256 (`?v=`) is kept for a year.
    pub const SEED_CACHE_SECS: &str = "SEED_CACHE_SECS";
}

/// Why the settings cannot be used. Names the setting, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required setting is not bound.
    #[error("the setting {0} is missing")]
    Missing(&'static str),
    /// `ORIGIN_URL` is not an `http://` or `https://` URL without path, query or fragment.
    #[error("ORIGIN_URL must be an http:// or https:// base URL without a path")]
    OriginUrl,
    /// A numeric setting is not a positive integer.
    #[error("the setting {0} must be a positive integer")]
    NotPositive(&'static str),
    /// A switch is neither `true` nor `false`.
    #[error("the setting {0} must be true or false")]
    NotBoolean(&'static str),
    /// The JWT secret or lifetime cannot make a verifier.
    #[error("{0}")]
    Key(#[from] synchro_protocol::jwt::KeyError),
    /// Neither `JWT_SECRET` nor `JWKS_URL` is set.
    #[error("the setting JWT_SECRET or JWKS_URL (or both) is needed to verify bearer tokens")]
    NoKey,
    /// `JWKS_URL` is not an https:// URL (http:// only to localhost).
    #[error("JWKS_URL must be an https:// URL (http:// only to localhost)")]
    JwksUrl,
    /// `JWKS_URL` is set without `JWT_ISSUER`.
    #[error(
        "JWKS_URL needs JWT_ISSUER: a provider's keys may sign tokens of other applications too"
    )]
    NoIssuer,
    /// `CORS_ORIGINS` lists something that is not an origin.
    #[error("CORS_ORIGINS: {0}")]
    Cors(String),
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The origin's base URL without a trailing slash.
    pub origin: String,
    /// The bearer token verifier (without the key set, which is fetched: `JWKS_URL`).
    pub verifier: Verifier,
    /// The identity provider's key set URL.
    pub jwks_url: Option<String>,
    /// The browser origins allowed to call the gateway.
    pub cors: CorsOrigins,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Whether seed files are served without a bearer token.
    pub public_seeds: bool,
    /// Seconds the edge cache keeps a seed file asked for without `?v=`.
    pub seed_cache_secs: u64,
}

impl Config {
    /// Reads the settings through `get` (a binding's string value, `None` when unbound).
    pub fn from_env(get: impl Fn(&'static str) -> Option<String>) -> Result<Config, ConfigError> {
        let origin = get(names::ORIGIN_URL).ok_or(ConfigError::Missing(names::ORIGIN_URL))?;
        let origin = origin_base(&origin)?;
        let max_body_bytes = positive(&get, names::MAX_BODY_BYTES)?
            .map_or(Ok(DEFAULT_MAX_BODY_BYTES), usize::try_from)
            .map_err(|_| ConfigError::NotPositive(names::MAX_BODY_BYTES))?;
        let lifetime = positive(&get, names::MAX_TOKEN_LIFETIME_SECS)?
            .unwrap_or(DEFAULT_MAX_TOKEN_LIFETIME_SECS);
        let public_seeds = match get(names::PUBLIC_SEEDS).as_deref().map(str::trim) {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(ConfigError::NotBoolean(names::PUBLIC_SEEDS)),
        };
        let seed_cache_secs =
            positive(&get, names::SEED_CACHE_SECS)?.unwrap_or(DEFAULT_SEED_CACHE_SECS);
        let mut verifier = Verifier::new(lifetime)?;
        let secret = get(names::JWT_SECRET);
        if let Some(secret) = &secret {
            verifier = verifier.with_secret(secret.as_bytes())?;
        }
        if let Some(issuer) = get(names::JWT_ISSUER) {
            verifier = verifier.with_issuer(issuer.trim())?;
        }
        if let Some(audience) = get(names::JWT_AUDIENCE) {
            verifier = verifier.with_audience(audience.trim())?;
        }
        let jwks_url = get(names::JWKS_URL).map(|u| u.trim().to_owned());
        match &jwks_url {
            None if secret.is_none() => return Err(ConfigError::NoKey),
            Some(url) if !jwks::acceptable_url(url) => return Err(ConfigError::JwksUrl),
            Some(_) if !verifier.checks_issuer() => return Err(ConfigError::NoIssuer),
            _ => {}
        }
        let cors = get(names::CORS_ORIGINS).unwrap_or_default();
        let cors = CorsOrigins::parse(cors.split(',').map(str::trim).filter(|o| !o.is_empty()))
            .map_err(ConfigError::Cors)?;
        Ok(Config {
            origin,
            verifier,
            jwks_url,
            cors,
            max_body_bytes,
            public_seeds,
            seed_cache_secs,
        })
    }
}

fn positive(
    get: &impl Fn(&'static str) -> Option<String>,
    name: &'static str,
) -> Result<Option<u64>, ConfigError> {
    match get(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ConfigError::NotPositive(name)),
        },
    }
}

/// `url` as a base URL without a trailing slash: scheme http or https, a host, no path
/// beyond `/`, no query, fragment or credentials.
fn origin_base(url: &str) -> Result<String, ConfigError> {
    let url = url.trim();
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or(ConfigError::OriginUrl)?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty()
        || authority
            .chars()
            .any(|c| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::OriginUrl);
    }
    Ok(url.strip_suffix('/').unwrap_or(url).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&'static str, &str)]) -> Result<Config, ConfigError> {
        let vars: HashMap<&str, String> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        Config::from_env(|name| vars.get(name).cloned())
    }

    const SECRET: (&str, &str) = ("JWT_SECRET", "0123456789abcdef0123");

    #[test]
    fn reads_the_settings_with_defaults() {
        let c = read(&[("ORIGIN_URL", "http://127.0.0.1:8787/"), SECRET]).unwrap();
        assert_eq!(c.origin, "http://127.0.0.1:8787");
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert!(!c.public_seeds);
        assert_eq!(c.seed_cache_secs, DEFAULT_SEED_CACHE_SECS);
        let c = read(&[
            ("ORIGIN_URL", "https://sync.example.com"),
            SECRET,
            ("MAX_BODY_BYTES", "4096"),
            ("MAX_TOKEN_LIFETIME_SECS", "600"),
            ("PUBLIC_SEEDS", "true"),
            ("SEED_CACHE_SECS", "300"),
        ])
        .unwrap();
        assert_eq!(c.max_body_bytes, 4096);
        assert!(c.public_seeds);
        assert_eq!(c.seed_cache_secs, 300);
        let c = read(&[
            ("ORIGIN_URL", "http://o"),
            SECRET,
            ("PUBLIC_SEEDS", "false"),
        ])
        .unwrap();
        assert!(!c.public_seeds);
    }

    #[test]
    fn refuses_bad_settings_naming_them() {
        assert_eq!(
            read(&[SECRET]).unwrap_err(),
            ConfigError::Missing("ORIGIN_URL")
        );
        assert_eq!(
            read(&[("ORIGIN_URL", "http://o")]).unwrap_err(),
            ConfigError::NoKey
        );
        assert_eq!(
            read(&[
                ("ORIGIN_URL", "http://o"),
                ("JWKS_URL", "https://idp.example.com/jwks")
            ])
            .unwrap_err(),
            ConfigError::NoIssuer
        );
        assert_eq!(
            read(&[
                ("ORIGIN_URL", "http://o"),
                ("JWKS_URL", "http://idp.example.com/jwks"),
                ("JWT_ISSUER", "https://idp.example.com/")
            ])
            .unwrap_err(),
            ConfigError::JwksUrl
        );
        let c = read(&[
            ("ORIGIN_URL", "http://o"),
            ("JWKS_URL", "https://idp.example.com/jwks"),
            ("JWT_ISSUER", "https://idp.example.com/"),
            ("JWT_AUDIENCE", "sync"),
            (
                "CORS_ORIGINS",
                "http://localhost:5173, https://app.example.com",
            ),
        ])
        .unwrap();
        assert_eq!(c.jwks_url.as_deref(), Some("https://idp.example.com/jwks"));
        assert!(c.cors.allows("https://app.example.com") && !c.cors.allows("https://evil.example"));
        assert!(matches!(
            read(&[
                SECRET,
                ("ORIGIN_URL", "http://o"),
                ("CORS_ORIGINS", "localhost:5173")
            ])
            .unwrap_err(),
            ConfigError::Cors(_)
        ));
        for bad in [
            "ftp://o",
            "http://",
            "http://o/sync",
            "http://o?x",
            "http://u@o",
        ] {
            assert_eq!(
                read(&[("ORIGIN_URL", bad), SECRET]).unwrap_err(),
                ConfigError::OriginUrl,
                "{bad}"
            );
        }
        assert_eq!(
            read(&[("ORIGIN_URL", "http://o"), SECRET, ("MAX_BODY_BYTES", "0")]).unwrap_err(),
            ConfigError::NotPositive("MAX_BODY_BYTES")
        );
        for bad in ["yes", "1", "TRUE", ""] {
            assert_eq!(
                read(&[("ORIGIN_URL", "http://o"), SECRET, ("PUBLIC_SEEDS", bad)]).unwrap_err(),
                ConfigError::NotBoolean("PUBLIC_SEEDS"),
                "{bad:?}"
            );
        }
        assert_eq!(
            read(&[("ORIGIN_URL", "http://o"), SECRET, ("SEED_CACHE_SECS", "0")]).unwrap_err(),
            ConfigError::NotPositive("SEED_CACHE_SECS")
        );
        assert!(matches!(
            read(&[("ORIGIN_URL", "http://o"), ("JWT_SECRET", "short")]).unwrap_err(),
            ConfigError::Key(_)
        ));
    }
}
