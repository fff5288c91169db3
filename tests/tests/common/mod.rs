//! The shared PostgreSQL and fixture helpers (synchro-testkit's `pg`), with this package's
//! copy of the server program.
#![allow(dead_code, unused_imports)]
pub use synchro_testkit::pg::*;

/// Starts the server program (`synchro-server-under-test`) on `port` against `env`'s cluster.
pub fn start_server(env: &Env, port: u16, secret: &str) -> Server {
    synchro_testkit::pg::start_server_binary(
        env!("CARGO_BIN_EXE_synchro-server-under-test"),
        env,
        port,
        secret,
    )
}

/// [`start_server`] with `extra` flags (such as `["--min-client-version", "2.0.0"]`).
pub fn start_server_with(env: &Env, port: u16, secret: &str, extra: &[String]) -> Server {
    synchro_testkit::pg::start_server_binary_with(
        env!("CARGO_BIN_EXE_synchro-server-under-test"),
        env,
        port,
        secret,
        extra,
    )
}
