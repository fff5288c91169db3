//! How an application configures a [`Client`](super::Client) when it opens one: the runtime
//! version the client presents as `client_version` on every connect, which the server
//! compares with its `--min-client-version` floor (spec 001 "SemVer 2.0 precedence"). The
//! version is this crate's unless the application sets its own; either way it must be a
//! SemVer 2.0.0 version, checked when the client is opened, before anything is written.

use synchro_protocol::semver::Version;

use crate::error::ClientError;

/// The version a client presents when the application sets none: this crate's
/// (`CARGO_PKG_VERSION`).
pub const DEFAULT_CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Settings for [`Client::open_with`](super::Client::open_with).
///
/// ```
/// use synchro_client::engine::ClientConfig;
/// let config = ClientConfig::new().with_client_version("2.4.0-beta.1");
/// assert_eq!(config.client_version(), "2.4.0-beta.1");
/// assert_eq!(ClientConfig::new().client_version(), env!("CARGO_PKG_VERSION"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientConfig {
    client_version: Option<String>,
    rebase_conflicts: bool,
}

impl ClientConfig {
    /// The defaults: the crate's own version.
    pub fn new() -> ClientConfig {
        ClientConfig::default()
    }

    /// Presents `version` (the application's release, say) instead of the crate's version
    /// as `client_version` on connect. It must be SemVer 2.0.0 exactly (no leading `v`, no
    /// whitespace); [`ClientConfig::validate`] and opening the client check it.
    pub fn with_client_version(mut self, version: impl Into<String>) -> ClientConfig {
        self.client_version = Some(version.into());
        self
    }

    /// The opt-in conflict policy: an update that conflicts is written again on the
    /// server's current row when the fields it wrote are ones the server did not change
    /// since the row it was made on (a new mutation, so the server still decides); otherwise,
    /// and by default, the server's row stands and the write is a conflict.
    pub fn with_conflict_rebase(mut self, rebase: bool) -> ClientConfig {
        self.rebase_conflicts = rebase;
        self
    }

    /// Whether conflicts of disjoint updates are rebased ([`ClientConfig::with_conflict_rebase`]).
    pub fn rebases_conflicts(&self) -> bool {
        self.rebase_conflicts
    }

    /// The version the client presents (checked or not).
    pub fn client_version(&self) -> &str {
        self.client_version
            .as_deref()
            .unwrap_or(DEFAULT_CLIENT_VERSION)
    }

    /// Checks the settings: the version must be SemVer 2.0.0, otherwise
    /// [`ClientError::InvalidClientVersion`].
    pub fn validate(&self) -> Result<(), ClientError> {
        Version::parse(self.client_version())
            .map(|_| ())
            .map_err(|e| ClientError::InvalidClientVersion {
                reason: match e {
                    synchro_protocol::Error::InvalidSemver { reason } => reason,
                    _ => "not a SemVer 2.0.0 version",
                },
            })
    }
}

/// Whether a server's refusal of `refused` still holds for a client presenting `current`:
/// only a version of higher SemVer precedence (an upgraded application) connects again. A
/// recorded value that does not parse holds only for that exact string.
pub(super) fn still_refused(current: &str, refused: &str) -> bool {
    synchro_protocol::semver::compare(current, refused).map_or(current == refused, |o| o.is_le())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_default_is_the_crate_version_and_valid() {
        let c = ClientConfig::new();
        assert_eq!(c.client_version(), env!("CARGO_PKG_VERSION"));
        c.validate().unwrap();
    }

    #[test]
    fn malformed_versions_are_refused_with_a_typed_error() {
        for bad in [
            "v1.2.3", "1.2", "1.2.3 ", "01.2.3", "1.2.3-", "1.2.3-01", "", "1.2.3+é",
        ] {
            let e = ClientConfig::new()
                .with_client_version(bad)
                .validate()
                .unwrap_err();
            assert!(
                matches!(e, ClientError::InvalidClientVersion { .. }),
                "{bad:?}: {e:?}"
            );
            assert_eq!((e.code(), e.retryable()), ("invalid_client_version", false));
        }
        for good in ["0.0.0", "1.2.3-rc.1+build.5", "10.20.30"] {
            ClientConfig::new()
                .with_client_version(good)
                .validate()
                .unwrap();
        }
    }

    #[test]
    fn only_a_higher_precedence_lifts_a_refusal() {
        assert!(still_refused("1.4.0", "1.4.0"));
        assert!(still_refused("1.4.0+other-build", "1.4.0"));
        assert!(still_refused("1.3.9", "1.4.0"));
        assert!(still_refused("1.4.1-rc.1", "1.4.1"));
        assert!(!still_refused("1.4.1", "1.4.0"));
        assert!(!still_refused("2.0.0", "1.4.0"));
        // A recorded value that does not parse (it was checked when written) never locks a
        // valid version out.
        assert!(!still_refused("1.4.0", "garbage"));
    }
}
