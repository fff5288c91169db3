//! Issue 39: the whole flow where most users keep their data, a managed PostgreSQL service.
//! The cluster takes TCP connections only over TLS (`hostssl`), and its superuser does only
//! what a provider does: it creates the database owner (CREATEROLE, REPLICATION) and its
//! database. Everything else runs as that owner and the logins it makes, over `verify-full`
//! TLS, with the real server binary: install, register, publish, capture, serve, a native
//! client syncs, a push applies, a reconfiguration (a new column) reaches the client. CI runs
//! it on every PostgreSQL version of scripts/test-pg-versions.sh.
//!
//! One step differs by version: PostgreSQL 16 on lets a CREATEROLE login with REPLICATION give
//! a login REPLICATION; on 15 only a superuser can, so there the superuser grants it to the
//! worker login, standing in for the provider's own way (Amazon RDS: `GRANT rds_replication`).

mod common;

use common::{free_port, local_doc_titles, wait_ready};
use synchro_client::engine::Client;
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, Operation};
use synchro_client::storage::Storage;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::auth::mint;
use synchro_server::connect_db;
use synchro_server::pg_harness::TempCluster;
use synchro_testkit::certs::{scratch_dir, Authority};
use synchro_testkit::pg::Server;

const SECRET: &str = "managed-service-test-secret-0123456789";
const BIN: &str = env!("CARGO_BIN_EXE_synchro-server-under-test");

/// `synchro-server <args>` with `DATABASE_URL` = `url`: exit code and the JSON it printed.
fn cli(url: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", url)
        .env("SYNCHRO_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0,
        "{args:?} exited {code}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, json)
}

/// `synchro-server health` (exits 1 until ready): its JSON.
fn health(url: &str) -> serde_json::Value {
    let out = std::process::Command::new(BIN)
        .arg("health")
        .env("DATABASE_URL", url)
        .env("SYNCHRO_LOG", "error")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn a_database_owner_without_a_superuser_runs_the_whole_flow_over_tls_only() {
    let dir = scratch_dir("managed");
    let ca = Authority::new("managed service CA");
    let (cert, key) = ca.issue("localhost", &["localhost"]);
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    let mut cluster = TempCluster::start().unwrap();
    cluster
        .require_tls(
            &cert,
            &key,
            &ca.pem,
            &[
                "hostssl all all 127.0.0.1/32 scram-sha-256",
                "hostssl replication all 127.0.0.1/32 scram-sha-256",
            ],
        )
        .unwrap();
    // The provider's part, and the superuser's only one.
    let provider = connect_db(&cluster.admin_url()).await.unwrap();
    provider
        .batch_execute("CREATE ROLE dbowner LOGIN CREATEROLE REPLICATION PASSWORD 'pw'")
        .await
        .unwrap();
    provider
        .batch_execute("CREATE DATABASE app OWNER dbowner")
        .await
        .unwrap();
    let url = |user: &str| {
        format!(
            "postgres://{user}:pw@localhost:{}/app?sslmode=verify-full&sslrootcert={}",
            cluster.port(),
            dir.join("ca.pem").display()
        )
    };

    // Install as the owner; then the owner makes the logins and the application's schema.
    let (_, installed) = cli(&url("dbowner"), &["install"]);
    assert_eq!(installed["applied"], serde_json::json!([1]));
    let owner = connect_db(&url("dbowner")).await.unwrap();
    let major: i32 = owner
        .query_one(
            "SELECT current_setting('server_version_num')::int / 10000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let worker_replication = if major >= 16 { "REPLICATION" } else { "" };
    owner
        .batch_execute(&format!(
            "CREATE ROLE app_operator LOGIN PASSWORD 'pw'; GRANT synchro_operator TO app_operator;
             CREATE ROLE app_adapter LOGIN PASSWORD 'pw'; GRANT synchro_adapter TO app_adapter;
             CREATE ROLE app_monitor LOGIN PASSWORD 'pw'; GRANT synchro_monitor TO app_monitor;
             CREATE ROLE app_worker LOGIN NOINHERIT {worker_replication} PASSWORD 'pw';
             GRANT synchro_worker TO app_worker;
             GRANT CREATE ON DATABASE app TO app_operator;
             CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO dbowner; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, title text);
             INSERT INTO app.docs VALUES (1, 'alice', 'one'), (2, 'alice', 'two'), (3, 'bob', 'three');
             RESET ROLE;"
        ))
        .await
        .unwrap();
    if major < 16 {
        provider
            .batch_execute("ALTER ROLE app_worker REPLICATION")
            .await
            .unwrap();
    }

    // Register, with a membership rule, and publish, as the operator login.
    cli(
        &url("app_operator"),
        &[
            "registry",
            "register",
            "--schema",
            "app",
            "--relation",
            "docs",
            "--composition",
            "multi_scope",
        ],
    );
    let operator = connect_db(&url("app_operator")).await.unwrap();
    operator
        .batch_execute(
            "CREATE SCHEMA rules;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;
             CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC
               SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id;
             END;
             REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
             SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');",
        )
        .await
        .unwrap();
    cli(&url("app_operator"), &["publish"]);

    // Serve, capture in the same process, both over verify-full TLS.
    let port = free_port();
    let _server = Server::from(
        std::process::Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", url("app_adapter"))
            .env("SYNCHRO_WORKER_DATABASE_URL", url("app_worker"))
            .env("SYNCHRO_JWT_SECRET", SECRET)
            .env("SYNCHRO_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let health = health(&url("app_monitor"));
        if health["ready"] == true {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ready: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    wait_ready(&reqwest::Client::new(), &base).await;

    // Every session of the server and its worker, the replication stream included, is
    // encrypted.
    let sessions: Vec<(String, bool)> = provider
        .query(
            "SELECT a.usename::text, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename IN ('app_adapter', 'app_worker') ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        sessions.iter().any(|(u, _)| u == "app_worker") && sessions.iter().all(|(_, ssl)| *ssl),
        "{sessions:?}"
    );

    // A client syncs alice's rows, and a write of hers is pushed and applied.
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let mut n = 0u8;
    let mut alice = Client::open(
        Storage::open_in_memory().unwrap(),
        HttpTransport::new(base.clone(), move || token.clone()),
        move || {
            n = n.wrapping_add(1);
            [n; 16]
        },
    )
    .unwrap();
    alice.sync_once().await.unwrap();
    assert_eq!(
        local_doc_titles(&alice),
        vec![(1, Some("one".into())), (2, Some("two".into()))]
    );
    let manifest = alice.manifest().unwrap().clone();
    let docs = manifest.tables.iter().find(|t| t.name == "docs").unwrap();
    let title = docs.fields.iter().find(|f| f.name == "title").unwrap();
    alice
        .write(&LocalWrite {
            table_id: &docs.table_id,
            operation: Operation::Update,
            pk: &TypedValue::from_scalar(Scalar::Int64(2)).unwrap(),
            columns: &[(
                title.field_id.clone(),
                TypedValue::from_scalar(Scalar::String("edited offline".into())).unwrap(),
            )],
        })
        .unwrap();
    alice.sync_once().await.unwrap();
    let source: Option<String> = owner
        .query_one("SELECT title FROM app.docs WHERE id = 2", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(source.as_deref(), Some("edited offline"));

    // A reconfiguration: the application adds a column; the operator reconfigures and
    // publishes; the client takes the new schema and the column's values.
    owner
        .batch_execute(
            "SET ROLE app_owner; ALTER TABLE app.docs ADD COLUMN note text;
             UPDATE app.docs SET note = 'noted' WHERE id = 1; RESET ROLE;",
        )
        .await
        .unwrap();
    cli(
        &url("app_operator"),
        &[
            "registry",
            "reconfigure",
            "--schema",
            "app",
            "--relation",
            "docs",
        ],
    );
    cli(&url("app_operator"), &["publish"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        alice.sync_once().await.unwrap();
        let note: Option<String> = alice
            .storage()
            .connection()
            .query_row("SELECT note FROM docs WHERE id = 1", [], |r| r.get(0))
            .ok()
            .flatten();
        if note.as_deref() == Some("noted") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new column never arrived (schema version {})",
            alice.manifest().unwrap().schema_version
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(alice.manifest().unwrap().schema_version > manifest.schema_version);
    let _ = std::fs::remove_dir_all(&dir);
}
