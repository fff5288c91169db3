//! Log filtering. Some dependencies log statement parameters at debug level (tokio-postgres
//! prints every bound value), which would put user ids, keys and row values into logs, so
//! they are capped at `warn` whatever the operator asks for.

use tracing_subscriber::EnvFilter;

/// Targets never logged below `warn`: they print bound parameters or request contents.
pub const PARAMETER_LOGGING_TARGETS: &[&str] = &["tokio_postgres", "hyper", "reqwest"];

/// The server's filter: `requested` (e.g. `info`, `debug`, from SYNCHRO_LOG) with the
/// parameter-logging targets capped.
pub fn filter(requested: &str) -> EnvFilter {
    let mut f = EnvFilter::try_new(requested).unwrap_or_else(|_| EnvFilter::new("info"));
    for target in PARAMETER_LOGGING_TARGETS {
        f = f.add_directive(format!("{target}=warn").parse().expect("valid directive"));
    }
    f
}
