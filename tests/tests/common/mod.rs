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

/// Whether this run sends the clients through the edge gateway (`SYNCHRO_TEST_VIA_EDGE=1`,
/// set by `scripts/test-edge.sh`): the same scenarios then pass through `wrangler dev`.
pub fn via_edge() -> bool {
    std::env::var("SYNCHRO_TEST_VIA_EDGE").as_deref() == Ok("1")
}

/// The base URL clients use for the server at `origin`: `origin` itself, or with
/// [`via_edge`] the edge gateway's under `wrangler dev` in front of it (keep the returned
/// gateway alive as long as the server).
pub async fn client_base(
    origin: &str,
    secret: &str,
) -> (String, Option<synchro_testkit::edge::Edge>) {
    if !via_edge() {
        return (origin.to_owned(), None);
    }
    let edge = synchro_testkit::edge::Edge::start(origin, secret, &[]).await;
    wait_ready(&reqwest::Client::new(), &edge.base).await;
    (edge.base.clone(), Some(edge))
}

/// A native client's `docs` rows: (id, title), by id.
pub fn local_doc_titles<T: synchro_client::engine::Transport>(
    c: &synchro_client::engine::Client<T>,
) -> Vec<(i64, Option<String>)> {
    let conn = c.storage().connection();
    let mut q = conn
        .prepare("SELECT id, title FROM docs ORDER BY id")
        .unwrap();
    let rows = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows
}
