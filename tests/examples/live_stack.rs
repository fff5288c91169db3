//! A whole stack for the browser's live-session test (`client-wasm/tests/live_browser.rs`):
//! a throwaway PostgreSQL with the `app.docs` fixture (two scopes per row), the server
//! program (`synchro-server-under-test`, next to this example's directory) on a free port.
//! Prints `SYNCHRO_LIVE_URL=...` and `SYNCHRO_LIVE_TOKEN=...` (a token for the fixture's
//! user), then serves until its standard input closes. It also holds `app.source_types` (the
//! source-type vectors' columns, row 1 written in SQL): when its input closes it checks that
//! the row the browser pushed (3) holds exactly what SQL stored in row 1, and exits 1 if not.
//! `scripts/test-live-browser.sh` runs it.

use std::io::Read;

use synchro_server::auth::mint;
use synchro_testkit::pg::{
    docs_with_owner_and_team, free_port, source_types_fixture, source_types_same,
    start_server_binary_with, wait_ready, Env,
};

const SECRET: &str = "live-browser-secret-0123456789abc";

#[tokio::main]
async fn main() {
    let env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], 'red', 'seed ' || g
           FROM generate_series(1, 20) g",
    )
    .await;
    let cases = source_types_fixture(&env).await;
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("synchro-server-under-test");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = start_server_binary_with(bin.to_str().unwrap(), &env, port, SECRET, &[]);
    wait_ready(&reqwest::Client::new(), &base).await;
    println!("SYNCHRO_LIVE_URL={base}");
    println!(
        "SYNCHRO_LIVE_TOKEN={}",
        mint(SECRET.as_bytes(), "alice", 3600)
    );
    // Serve until the caller closes our standard input.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await;
    let pushed: bool = env
        .admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM app.source_types WHERE id = 3)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let differing: Vec<&str> = if pushed {
        let same = source_types_same(&env, cases.len(), 3, 1).await;
        cases
            .iter()
            .zip(same)
            .filter(|(_, same)| !same)
            .map(|(c, _)| c["name"].as_str().unwrap())
            .collect()
    } else {
        vec!["(row 3 was never pushed)"]
    };
    if !differing.is_empty() {
        eprintln!(
            "live_stack: the browser's pushed row differs from what SQL stored: {differing:?}"
        );
        std::process::exit(1);
    }
}
