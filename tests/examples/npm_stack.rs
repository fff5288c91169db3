//! A whole stack for the npm package's browser tests (`npm/test/browser.test.mjs`): a
//! throwaway PostgreSQL with the development schema and its task board (`app.projects`,
//! `app.tasks`, every row in the scope `board:demo`, which `alice` and `bob` hold; see
//! `synchro_server::dev::create_board`), and the server program
//! (`synchro-server-under-test`) on a free port. Prints `SYNCHRO_URL=...`, then answers one
//! command per line of its standard input, one line each:
//!
//! - `sql <statements>` runs them as the superuser: `ok`, or `error <message>`;
//! - `rows <select>` runs the query as the superuser: `rows <JSON array of its rows>`;
//! - `token <user> <ttl seconds>`: `token <jwt>` (a negative ttl: expired, but within the
//!   server's 30 s leeway for that much less);
//! - `publish`: publishes the registry (after a reconfiguration) and waits until the server
//!   serves it: `published <version> <class>` or `unchanged <version>`;
//! - `database <login>`: `database <connection string of that login>`;
//! - `seed`: exports `board:demo` (portable) as the seed the server serves at
//!   `/seeds/board.seed.sqlite`, and beside it `/seeds/tampered.seed.sqlite`, a copy with one
//!   title changed (its digest kept): `seed <rows>`, or `error <message>`.
//!
//! It stops its server and drops its cluster when its standard input closes.

use std::io::BufRead;
use std::time::{Duration, Instant};

use synchro_server::auth::mint_claims;
use synchro_server::publish::{load_serving_lineage, publish, PublishOutcome};
use synchro_testkit::pg::{free_port, start_server_binary_with, wait_ready, Env};

const SECRET: &str = "npm-browser-secret-0123456789abcd";

#[tokio::main]
async fn main() {
    let env = Env::installed().await;
    synchro_server::dev::create_demo_schema(&env.admin)
        .await
        .unwrap();
    let mut operator = env.login("synchro_dev_operator").await;
    synchro_server::dev::register_demo(&operator).await.unwrap();
    synchro_server::dev::create_board(&env.admin, &operator)
        .await
        .unwrap();
    publish(&mut operator).await.unwrap();
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("synchro-server-under-test");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let seeds = std::env::temp_dir().join(format!("synchro-npm-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&seeds);
    std::fs::create_dir_all(&seeds).unwrap();
    let _server = start_server_binary_with(
        bin.to_str().unwrap(),
        &env,
        port,
        SECRET,
        &["--seed-dir".to_owned(), seeds.to_str().unwrap().to_owned()],
    );
    wait_ready(&reqwest::Client::new(), &base).await;
    println!("SYNCHRO_URL={base}");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let (command, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let answer = match command {
            "sql" => match env.admin.batch_execute(rest).await {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!(
                    "error {}",
                    synchro_server::install::describe(&e).replace('\n', " ")
                ),
            },
            "rows" => match env
                .admin
                .query_one(
                    &format!("SELECT coalesce(json_agg(t), '[]')::text FROM ({rest}) t"),
                    &[],
                )
                .await
            {
                // json_agg puts a line break between elements (a raw one is never inside a
                // JSON string).
                Ok(row) => format!("rows {}", row.get::<_, String>(0).replace('\n', "")),
                Err(e) => format!(
                    "error {}",
                    synchro_server::install::describe(&e).replace('\n', " ")
                ),
            },
            "database" => format!("database {}", env.cluster.url(rest, "app")),
            "token" => {
                let (user, ttl) = rest.split_once(' ').unwrap_or((rest, "3600"));
                // A negative lifetime mints a token already past its `exp`, accepted only
                // within the server's clock-skew leeway (30 s): one that expires soon.
                let ttl: i64 = ttl.parse().unwrap_or(3600);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
                let claims = serde_json::json!({"sub": user, "exp": now + ttl});
                format!("token {}", mint_claims(SECRET.as_bytes(), &claims))
            }
            "publish" => match publish(&mut operator).await {
                Ok(PublishOutcome::Published { version, class, .. }) => {
                    served(&env, version).await;
                    format!("published {version} {class}")
                }
                Ok(PublishOutcome::Unchanged { version }) => format!("unchanged {version}"),
                Err(e) => format!("error {}", e.to_string().replace('\n', " ")),
            },
            "seed" => match export_seeds(&env, &seeds).await {
                Ok(rows) => format!("seed {rows}"),
                Err(e) => format!("error {}", e.replace('\n', " ")),
            },
            _ => "error unknown command".to_owned(),
        };
        println!("{answer}");
    }
}

/// Exports `board:demo` into `dir` (`board.seed.sqlite`) and a tampered copy of it
/// (`tampered.seed.sqlite`, with its own evidence so that the server serves it); returns the
/// seed's rows.
async fn export_seeds(env: &Env, dir: &std::path::Path) -> Result<u64, String> {
    let mut db = env.login("synchro_dev_seed").await;
    let verified = synchro_server::seed::export(&mut db, &["board:demo".to_owned()], 1000, |_| {})
        .await
        .map_err(|e| e.to_string())?;
    let out = dir.join("board.seed.sqlite");
    let evidence =
        synchro_server::seed::write_artifact(&verified, &out).map_err(|e| e.to_string())?;
    let tampered = dir.join("tampered.seed.sqlite");
    std::fs::copy(&out, &tampered).map_err(|e| e.to_string())?;
    {
        let conn = rusqlite::Connection::open(&tampered).map_err(|e| e.to_string())?;
        conn.execute(
            "UPDATE tasks SET title = 'forged' WHERE rowid = (SELECT min(rowid) FROM tasks)",
            [],
        )
        .map_err(|e| e.to_string())?;
    }
    use sha2::Digest as _;
    let bytes = std::fs::read(&tampered).map_err(|e| e.to_string())?;
    let mut forged = evidence.to_json();
    if let serde_json::Value::Object(m) = &mut forged {
        m.insert(
            "sha256".into(),
            hex::encode(sha2::Sha256::digest(&bytes)).into(),
        );
    }
    std::fs::write(
        synchro_server::seed::evidence_path(&tampered),
        forged.to_string(),
    )
    .map_err(|e| e.to_string())?;
    Ok(verified.scopes.iter().map(|s| s.scope.cardinality).sum())
}

/// Waits until capture activated `version` (the server serves it).
async fn served(env: &Env, version: u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let lineage = load_serving_lineage(&env.admin).await.unwrap();
        if lineage.current().map(|m| m.schema_version) == Some(version) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("version {version} never served");
}
