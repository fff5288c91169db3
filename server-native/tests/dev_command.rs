//! `synchro-server dev` end to end: throwaway PostgreSQL, install, demo schema, serving, a
//! printed development token that works, the printed seed export command that works and its
//! seed served, and a clean stop on SIGINT.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn dev_serves_the_demo_schema_and_stops_cleanly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let seeds = std::env::temp_dir().join(format!("synchro-dev-seeds-{port}"));
    let _ = std::fs::remove_dir_all(&seeds);
    let mut child = Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(["dev", "--fresh", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--seed-dir")
        .arg(&seeds)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Whatever happens, stop the server (and with it its throwaway cluster).
    struct Interrupt(u32);
    impl Drop for Interrupt {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-INT", &self.0.to_string()])
                .status();
        }
    }
    let _guard = Interrupt(child.id());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut token = None;
    let mut saw_token_label = false;
    while token.is_none() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            if saw_token_label {
                token = Some(line.trim().to_owned());
            }
            saw_token_label = line.contains("development token");
        }
    }
    let token = token.expect("dev printed a development token");
    let mut export = None;
    while export.is_none() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            if let Some(command) = line.trim().strip_prefix("export a seed: ") {
                export = Some(command.to_owned());
            }
        }
    }
    let export = export.expect("dev printed how to export a seed");
    let body = r#"{"protocol_version":3,"client_id":"c1","schema":{"version":0,"hash":""}}"#;
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/sync/connect"))
        .header("authorization", format!("Bearer {token}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["schema"]["action"], "replace");
    let tables: Vec<&str> = v["schema_definition"]["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["composition"].as_str().unwrap())
        .collect();
    assert_eq!(tables.len(), 3, "projects, notes and the board's tasks");
    assert!(tables.contains(&"multi_scope") && tables.contains(&"single_scope"));

    // The printed seed export, run as printed (DATABASE_URL='...' synchro-server seed export
    // ...), writes into the --seed-dir, which dev serves behind the token.
    let (url, rest) = export
        .strip_prefix("DATABASE_URL='")
        .and_then(|r| r.split_once("' synchro-server "))
        .expect("the printed export command");
    let out = Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(rest.split_whitespace())
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let evidence: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(evidence["scopes"][0]["scope_id"], "board:demo");
    let seed_url = format!("http://127.0.0.1:{port}/seeds/board.seed.sqlite");
    let http = reqwest::Client::new();
    let served = http
        .get(&seed_url)
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status().as_u16(), 200);
    use sha2::Digest as _;
    let bytes = served.bytes().await.unwrap();
    assert_eq!(
        evidence["sha256"],
        serde_json::json!(hex::encode(sha2::Sha256::digest(&bytes)))
    );
    assert_eq!(
        http.get(&seed_url).send().await.unwrap().status().as_u16(),
        401
    );
    let _ = std::fs::remove_dir_all(&seeds);

    // SIGINT: graceful shutdown, which also stops and deletes the throwaway cluster.
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "dev exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "dev did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `synchro-server dev` against `database_url` until it prints its token; returns the
/// child and the token.
fn start_dev(database_url: &str, port: u16) -> (std::process::Child, String) {
    let mut dev = Command::new(env!("CARGO_BIN_EXE_synchro-server"));
    dev.args(["dev", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", database_url);
    start(dev)
}

/// Runs `dev` until it prints its token; returns the child and the token.
fn start(mut dev: Command) -> (std::process::Child, String) {
    let mut child = dev
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut saw_token_label = false;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            if saw_token_label {
                return (child, line.trim().to_owned());
            }
            saw_token_label = line.contains("development token");
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("dev exited early with {status}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("dev printed no development token");
}

/// Issue 33.2: dev keeps its PostgreSQL cluster in --data-dir, so a restart (after a clean
/// stop, and after kill -9, which leaves that cluster running) serves the same manifest and
/// knows the same clients: a browser database continues (schema action `none`, the same
/// client generation, its rows); `--fresh` starts from nothing.
#[tokio::test]
async fn dev_keeps_its_database_in_the_data_dir_across_restarts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("synchro-dev-data-{port}"));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = |extra: &[&str]| {
        let mut dev = Command::new(env!("CARGO_BIN_EXE_synchro-server"));
        dev.args(["dev", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env_remove("DATABASE_URL");
        dev
    };
    let connect = |token: String, body: serde_json::Value| async move {
        let resp = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/sync/connect"))
            .header("authorization", format!("Bearer {token}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };
    let data_dir = dir.to_str().unwrap().to_owned();
    let (child, token) = start(dev(&["--data-dir", &data_dir]));
    let first = connect(
        token.clone(),
        serde_json::json!({"protocol_version": 3, "client_id": "c1", "schema": {"version": 0, "hash": ""}}),
    )
    .await;
    assert_eq!(first["schema"]["action"], "replace", "{first}");
    let schema =
        serde_json::json!({"version": first["schema"]["version"], "hash": first["schema"]["hash"]});
    let again = serde_json::json!({"protocol_version": 3, "client_id": "c1",
        "client_generation": first["client_generation"], "schema": schema});
    // Every demo table has a rule: a note written by any user is applied (it used to be
    // forbidden: app.notes had no rule, so no scope).
    let notes = first["schema_definition"]["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "notes")
        .unwrap()
        .clone();
    let field = |name: &str| synchro_testkit::pg::field_id(&notes, name);
    // (once ready: a first rule serves once the worker has staged it)
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("http://127.0.0.1:{port}/ready"))
        .await
        .map_or(true, |r| r.status().as_u16() != 200)
    {
        assert!(Instant::now() < deadline, "dev never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pushed = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/sync/push"))
        .header("authorization", format!("Bearer {token}"))
        .json(
            &serde_json::json!({"protocol_version": 3, "client_id": "c1",
            "client_generation": first["client_generation"], "schema": schema, "batch_id": "b1",
            "mutations": [{"mutation_id": "n1", "table_id": notes["table_id"], "pk": "1",
                "operation": "insert", "base_version": null, "client_version": 1, "local_order": 1,
                "columns": [{"field_id": field("project_id"), "value": "p1"},
                            {"field_id": field("body"), "value": "kept"}],
                "authored_schema": schema}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(pushed.status().as_u16(), 200);
    let pushed: serde_json::Value = pushed.json().await.unwrap();
    assert_eq!(pushed["outcomes"][0]["status"], "applied", "{pushed}");
    // A second dev on the same directory is refused (it must not take this one's cluster for
    // one a killed run left behind, and stop it).
    let second = dev(&["--data-dir", &data_dir])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another synchro-server dev is using"),
        "{second:?}"
    );
    let still = reqwest::get(format!("http://127.0.0.1:{port}/ready"))
        .await
        .unwrap();
    assert_eq!(still.status().as_u16(), 200, "the first one still serves");
    // A clean stop, then kill -9 (the cluster outlives it), each followed by a restart.
    interrupt(child);
    let (child, token) = start(dev(&["--data-dir", &data_dir]));
    let after = connect(token.clone(), again.clone()).await;
    assert_eq!(after["schema"]["action"], "none", "{after}");
    assert_eq!(after["client_generation"], first["client_generation"]);
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
    let (child, token) = start(dev(&["--data-dir", &data_dir]));
    let after = connect(token.clone(), again.clone()).await;
    assert_eq!(after["schema"]["action"], "none", "{after}");
    assert_eq!(after["client_generation"], first["client_generation"]);
    interrupt(child);
    assert!(
        dir.join("data").join("PG_VERSION").exists(),
        "the cluster stays in the data directory"
    );
    // --fresh: a new database, which knows neither the client nor its schema lineage.
    let (child, token) = start(dev(&["--fresh"]));
    let fresh = connect(token, again).await;
    assert_ne!(fresh["schema"]["action"], "none", "{fresh}");
    interrupt(child);
    let _ = std::fs::remove_dir_all(&dir);
}

fn interrupt(mut child: std::process::Child) {
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "dev exited with {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dev did not stop");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 12.8: start-up (a first and a second start on the same database) and steady state
/// (sync requests, captured writes, idle capture) emit no NOTICE, WARNING or ERROR into
/// PostgreSQL's log, even with the log taking every NOTICE. Issue 15.1: once capture runs,
/// steady state starts no logical decoding session (the SQL peek interface logged "starting
/// logical decoding for slot" twice per poll, every 25 ms; the replication stream logs it
/// once when it opens).
#[tokio::test]
async fn dev_start_and_steady_state_leave_the_postgres_log_quiet() {
    let cluster =
        synchro_server::pg_harness::TempCluster::start_with(&["log_min_messages=notice"]).unwrap();
    let admin = synchro_server::connect_db(&cluster.admin_url())
        .await
        .unwrap();
    admin.batch_execute("CREATE DATABASE quiet").await.unwrap();
    let url = cluster.url("postgres", "quiet");
    let http = reqwest::Client::new();
    // What PostgreSQL logged while dev started and served (a stop may cut a connection in
    // the middle of a query, which PostgreSQL logs; stopping is not what this checks).
    let mut running = String::new();
    let mut steady = String::new();
    let mut stopped_at = 0;
    for round in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (child, token) = start_dev(&url, port);
        let base = format!("http://127.0.0.1:{port}");
        let post = |path: &str, body: serde_json::Value| {
            http.post(format!("{base}{path}"))
                .header("authorization", format!("Bearer {token}"))
                .body(body.to_string())
                .send()
        };
        let client = format!("c{round}");
        let v: serde_json::Value = post(
            "/sync/connect",
            serde_json::json!({"protocol_version": 3, "client_id": client, "schema": {"version": 0, "hash": ""}}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let schema =
            serde_json::json!({"version": v["schema"]["version"], "hash": v["schema"]["hash"]});
        let db = synchro_server::connect_db(&url).await.unwrap();
        db.batch_execute(&format!(
            "INSERT INTO app.projects (id, name) VALUES ('p{round}', 'quiet')"
        ))
        .await
        .unwrap();
        // Idle capture steps and pulls for a while; steady state from the third on.
        let mut steady_from = 0;
        for i in 0..10 {
            if i == 2 {
                steady_from = cluster.server_log().unwrap().len();
            }
            let r = post(
                "/sync/pull",
                serde_json::json!({"protocol_version": 3, "client_id": client,
                    "client_generation": v["client_generation"], "schema": schema,
                    "scope_cursors": {}, "limit": 100}),
            )
            .await
            .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = cluster.server_log().unwrap();
        running.push_str(&log[stopped_at..]);
        steady.push_str(&log[steady_from..]);
        interrupt(child);
        stopped_at = cluster.server_log().unwrap().len();
    }
    let decoding: Vec<&str> = steady
        .lines()
        .filter(|l| l.contains("logical decoding"))
        .collect();
    assert!(
        decoding.is_empty(),
        "steady state started {} logical decoding sessions, e.g.:\n{}",
        decoding.len(),
        decoding
            .iter()
            .take(5)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        running.contains("starting logical decoding for slot"),
        "the log records the stream's decoding session (so the check above could see one)"
    );
    let log = running;
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["NOTICE:", "WARNING:", "ERROR:", "FATAL:", "PANIC:"]
                .iter()
                .any(|level| l.contains(level))
        })
        .collect();
    assert!(
        noisy.is_empty(),
        "PostgreSQL logged {} lines, e.g.:\n{}",
        noisy.len(),
        noisy
            .iter()
            .take(20)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Issue 39: `dev --database-url` as a managed service's database owner (CREATEROLE and
/// REPLICATION, no superuser), started twice on the same database: its logins get a password
/// of the run and sessions of their own, and it serves. PostgreSQL 15 lets no such login give
/// the worker's login REPLICATION: there dev stops at once, saying what to do instead.
#[tokio::test]
async fn dev_runs_as_a_database_owner_that_is_no_superuser() {
    let cluster = synchro_server::pg_harness::TempCluster::start().unwrap();
    let admin = synchro_server::connect_db(&cluster.admin_url())
        .await
        .unwrap();
    for sql in [
        "CREATE ROLE dbowner LOGIN CREATEROLE REPLICATION PASSWORD 'pw'",
        "CREATE DATABASE owned OWNER dbowner",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    let url = format!("postgres://dbowner:pw@127.0.0.1:{}/owned", cluster.port());
    if version < 160_000 {
        let out = Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .args(["dev", "--listen", "127.0.0.1:0"])
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("REPLICATION") && stderr.contains("rds_replication"),
            "{stderr}"
        );
        return;
    }
    for run in 1..=2 {
        let port = synchro_testkit::pg::free_port();
        let (child, token) = start_dev(&url, port);
        synchro_testkit::pg::wait_ready(
            &reqwest::Client::new(),
            &format!("http://127.0.0.1:{port}"),
        )
        .await;
        let connect = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/sync/connect"))
            .header("authorization", format!("Bearer {token}"))
            .body(format!(
                r#"{{"protocol_version":3,"client_id":"c{run}","schema":{{"version":0,"hash":""}}}}"#
            ))
            .send()
            .await
            .unwrap();
        let status = connect.status().as_u16();
        let v: serde_json::Value = connect.json().await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["schema_definition"]["tables"].as_array().unwrap().len(),
            3,
            "{v}"
        );
        // Each role has its own sessions: the owner login runs none of the serving.
        let logins: Vec<String> = admin
            .query(
                "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE datname = 'owned' ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            logins.iter().any(|l| l == "synchro_dev_adapter")
                && logins.iter().any(|l| l == "synchro_dev_worker"),
            "{logins:?}"
        );
        interrupt(child);
    }
}
