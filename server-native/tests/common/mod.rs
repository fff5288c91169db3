//! The server tests' helpers (synchro-testkit's `pg`), with this package's server binary.
#![allow(dead_code, unused_imports)]
pub use synchro_testkit::pg::*;

/// Starts this package's `synchro-server` binary on `port` against `env`'s cluster.
pub fn start_server(env: &Env, port: u16, secret: &str) -> Server {
    synchro_testkit::pg::start_server_binary(
        env!("CARGO_BIN_EXE_synchro-server"),
        env,
        port,
        secret,
    )
}

/// `app.docs` seeded by `seed`, served by this package's binary, ready.
pub async fn docs_server(seed: &str, secret: &str) -> DocsServer {
    DocsServer::start(env!("CARGO_BIN_EXE_synchro-server"), seed, secret).await
}
