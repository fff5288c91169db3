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

/// `synchro-server <args>` (this package's binary) with `DATABASE_URL` set to `url`, its log
/// off: (exit code, -1 when killed; the last line of stdout that is JSON, or null).
pub fn cli_at(url: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("SYNCHRO_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

/// [`cli_at`] as `login` of `env`'s database.
pub fn cli(env: &Env, login: &str, args: &[&str]) -> (i32, serde_json::Value) {
    cli_at(&env.cluster.url(login, "app"), args)
}
