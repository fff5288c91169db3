//! Log filtering. Dependencies log what they handle: tokio-postgres prints every bound
//! parameter at debug level and every server NOTICE (with whatever text an application
//! trigger raised, row values included) at info level; the HTTP stack logs request details.
//! So whatever the operator asks for (`SYNCHRO_LOG`), only synchro's own targets log below
//! `warn`; every other target is capped at `warn`.

use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Targets that may log below `warn`: synchro's own crates, which never log row values,
/// keys, identities, tokens or secrets.
pub const OWN_TARGETS: &[&str] = &["synchro_server", "synchro_protocol", "synchro_client"];

/// Whether an event of `target` at `level` may be logged at all.
pub fn allowed(target: &str, level: &Level) -> bool {
    *level <= Level::WARN
        || OWN_TARGETS.iter().any(|own| {
            target == *own
                || target
                    .strip_prefix(own)
                    .is_some_and(|rest| rest.starts_with("::"))
        })
}

/// The operator's filter: `requested` (e.g. `info`, `debug`, from SYNCHRO_LOG; `info` when
/// it does not parse). [`init`] adds the cap of [`allowed`] on top.
pub fn filter(requested: &str) -> EnvFilter {
    EnvFilter::try_new(requested).unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Installs the global subscriber: `requested` levels, the dependency cap, to `writer`;
/// ANSI colour only when `ansi` (the CLI passes whether stderr is a terminal, so a file or a
/// container log gets plain text).
pub fn init<W>(requested: &str, writer: W, ansi: bool)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let cap = tracing_subscriber::filter::filter_fn(|m| allowed(m.target(), m.level()));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(ansi)
                .with_filter(filter(requested))
                .with_filter(cap),
        )
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_synchro_targets_log_below_warn() {
        for level in [Level::INFO, Level::DEBUG, Level::TRACE] {
            assert!(allowed("synchro_server::pull", &level));
            assert!(allowed("synchro_server", &level));
            for dependency in [
                "tokio_postgres::connection",
                "tokio_postgres::query",
                "postgres_protocol",
                "hyper::proto::h1::io",
                "axum::rejection",
                "synchro_serverx",
            ] {
                assert!(!allowed(dependency, &level), "{dependency} at {level}");
            }
        }
        assert!(allowed("tokio_postgres::connection", &Level::WARN));
        assert!(allowed("hyper", &Level::ERROR));
    }
}
