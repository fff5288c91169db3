//! A database for a server run elsewhere (`scripts/test-container.sh` runs the container
//! against it): a throwaway PostgreSQL with synchro installed, the role logins and the
//! `app.docs` fixture (two scopes per row). Prints `SYNCHRO_ADAPTER_URL=...`,
//! `SYNCHRO_WORKER_URL=...`, `SYNCHRO_JWT_SECRET=...` and last `SYNCHRO_TOKEN=...` (a token
//! for the fixture's user alice), then keeps the cluster until its standard input closes.

use std::io::Read;

use synchro_server::auth::mint;
use synchro_testkit::pg::{docs_with_owner_and_team, Env};

const SECRET: &str = "container-test-secret-0123456789ab";

#[tokio::main]
async fn main() {
    let env = Env::installed().await;
    docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], 'red', 'seed ' || g
           FROM generate_series(1, 20) g",
    )
    .await;
    println!(
        "SYNCHRO_ADAPTER_URL={}",
        env.cluster.url("synchro_dev_adapter", "app")
    );
    println!(
        "SYNCHRO_WORKER_URL={}",
        env.cluster.url("synchro_dev_worker", "app")
    );
    println!("SYNCHRO_JWT_SECRET={SECRET}");
    println!("SYNCHRO_TOKEN={}", mint(SECRET.as_bytes(), "alice", 3600));
    // Keep the cluster until the caller closes our standard input.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await;
}
