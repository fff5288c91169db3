//! A whole stack for the browser's live-session test (`client-wasm/tests/live_browser.rs`):
//! a throwaway PostgreSQL with the `app.docs` fixture (two scopes per row), the server
//! program (`synchro-server-under-test`, next to this example's directory) on a free port.
//! Prints `SYNCHRO_LIVE_URL=...` and `SYNCHRO_LIVE_TOKEN=...` (a token for the fixture's
//! user), then serves until its standard input closes. `scripts/test-live-browser.sh` runs
//! it.

use std::io::Read;

use synchro_server::auth::mint;
use synchro_testkit::pg::{
    docs_with_owner_and_team, free_port, start_server_binary_with, wait_ready, Env,
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
}
