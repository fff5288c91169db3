//! The gateway's settings, read from the Worker's environment (`wrangler.toml` `[vars]` and
//! secrets) as strings and checked once: a setting that is missing or malformed is a
//! [`ConfigError`] and every request is answered with the opaque 503 until it is fixed.

use synchro_protocol::jwt::{Hs256, DEFAULT_MAX_TOKEN_LIFETIME_SECS};

/// Default largest accepted request body, in bytes (the server's default too).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1_048_576;

/// Default time the edge cache keeps a seed file asked for by name alone (no `?v=`), in
/// seconds.
pub const DEFAULT_SEED_CACHE_SECS: u64 = 60;

/// Names of the environment bindings.
pub mod names {
    /// `[vars]`: the origin's base URL (`https://sync.example.com`), no trailing path.
    pub const ORIGIN_URL: &str = "ORIGIN_URL";
    /// Secret: the HS256 shared secret, the server's `--jwt-secret`.
    pub const JWT_SECRET: &str = "JWT_SECRET";
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
}

/// The checked settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The origin's base URL without a trailing slash.
    pub origin: String,
    /// The bearer token verifier.
    pub verifier: Hs256,
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
        let secret = get(names::JWT_SECRET).ok_or(ConfigError::Missing(names::JWT_SECRET))?;
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
        Ok(Config {
            origin,
            verifier: Hs256::new(secret.as_bytes(), lifetime)?,
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
            ConfigError::Missing("JWT_SECRET")
        );
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
