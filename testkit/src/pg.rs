//! A fresh throwaway cluster per test, with synchro installed and one login per role; the
//! server binary; the `app.docs` fixtures the server and whole-stack tests share.
#![allow(dead_code)]

use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::value::TypedValue;
use synchro_server::dev::{ensure_login, DEV_LOGINS};
use synchro_server::pg_harness::TempCluster;
use synchro_server::publish::load_lineage;
use synchro_server::{connect_db, install};
use tokio_postgres::Client;

pub struct Env {
    pub cluster: TempCluster,
    pub admin: Client,
}

impl Env {
    /// A cluster with a database `app`, synchro installed, dev logins and an application
    /// owner role that synchro_owner may act for.
    pub async fn installed() -> Env {
        let cluster = TempCluster::start().expect("throwaway PostgreSQL");
        let boot = connect_db(&cluster.admin_url()).await.unwrap();
        boot.batch_execute("CREATE DATABASE app").await.unwrap();
        let mut admin = connect_db(&cluster.url("postgres", "app")).await.unwrap();
        install::install(&mut admin).await.unwrap();
        for (login, group) in DEV_LOGINS {
            ensure_login(&admin, login, group).await.unwrap();
        }
        admin
            .batch_execute(
                "CREATE ROLE nobody LOGIN;
                 CREATE ROLE synchro_dev_worker LOGIN REPLICATION NOINHERIT; GRANT synchro_worker TO synchro_dev_worker;
                 CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
                 CREATE SCHEMA app AUTHORIZATION app_owner;",
            )
            .await
            .unwrap();
        Env { cluster, admin }
    }

    pub async fn login(&self, user: &str) -> Client {
        connect_db(&self.cluster.url(user, "app")).await.unwrap()
    }

    /// Runs SQL as the application owner (tables it creates are owned by app_owner).
    pub async fn as_app_owner(&self, sql: &str) {
        self.admin
            .batch_execute(&format!("SET ROLE app_owner; {sql}; RESET ROLE;"))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", install::describe(&e)));
    }
}

/// The SQLSTATE of a failed statement, or "ok".
pub async fn sqlstate(db: &Client, sql: &str) -> String {
    match db.batch_execute(sql).await {
        Ok(()) => "ok".into(),
        Err(e) => e
            .as_db_error()
            .map(|d| d.code().code().to_owned())
            .unwrap_or_else(|| e.to_string()),
    }
}

/// The scope digest of `user:{owner}` for a table `app.docs (id bigint, owner text, title
/// text)`, recomputed from a direct query of the source table, with the versions
/// the projection assigned.
pub async fn docs_digest_from_source(env: &Env, owner: &str) -> String {
    let db = env.login("synchro_dev_operator").await;
    let manifest = load_lineage(&db).await.unwrap().current().unwrap().clone();
    let table = manifest
        .tables
        .iter()
        .find(|t| t.name == "docs")
        .expect("the docs table");
    let field = |name: &str| {
        table
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .field_id
            .clone()
    };
    let rows = env
        .admin
        .query(
            "SELECT d.id, d.owner, d.title, p.server_version FROM app.docs d
               JOIN synchro.projection_rows p ON p.pk = '\"' || d.id || '\"' WHERE d.owner = $1",
            &[&owner],
        )
        .await
        .unwrap();
    let mut entries = Vec::new();
    for r in rows {
        let id: i64 = r.get(0);
        let title: Option<String> = r.get(2);
        let row = Json::Object(vec![
            (field("id"), Json::String(id.to_string())),
            (field("owner"), Json::String(r.get(1))),
            (field("title"), title.map_or(Json::Null, Json::String)),
        ]);
        let pk = Json::String(id.to_string());
        let d = row_digest(&manifest, &table.table_id, &pk, &row, r.get(3)).unwrap();
        let key = TypedValue::from_wire(&table.primary_key().spec, &pk).unwrap();
        entries.push((RowIdentity::new(table, &key).unwrap(), d.digest));
    }
    hex::encode(
        scope_digest(
            &manifest.schema_hash(),
            &format!("user:{owner}"),
            &mut entries,
            false,
        )
        .unwrap()
        .digest,
    )
}

/// A `synchro-server serve` process (HTTP and capture in one); killed (SIGKILL) when dropped.
/// In a container run ([`container_image`]) the process is the engine's `run` and the second
/// field names the container, which is killed first.
pub struct Server(pub std::process::Child, Option<String>);

impl From<std::process::Child> for Server {
    fn from(child: std::process::Child) -> Server {
        Server(child, None)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(name) = &self.1 {
            // Killing the engine's client would leave the container running.
            let engine = container_engine();
            let quiet = || {
                let mut c = std::process::Command::new(&engine);
                c.stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                c
            };
            let _ = quiet().args(["kill", "--signal", "KILL", name]).status();
            let _ = self.0.wait();
            let _ = quiet().args(["rm", "--force", name]).status();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server image the tests run instead of the server binary:
/// `SYNCHRO_TEST_SERVER_IMAGE` (set by `scripts/test-container.sh`), else none. The
/// container runs on the host network and is configured only by environment variables.
pub fn container_image() -> Option<String> {
    std::env::var("SYNCHRO_TEST_SERVER_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
}

/// The container engine of a container run: `SYNCHRO_TEST_CONTAINER_ENGINE`, else `podman`
/// (its configuration, such as `CONTAINERS_CONF`, comes from the environment).
pub fn container_engine() -> String {
    std::env::var("SYNCHRO_TEST_CONTAINER_ENGINE").unwrap_or_else(|_| "podman".into())
}

/// The arguments of `serve` (HTTP and capture in one) on 127.0.0.1:`port` against `env`'s
/// cluster, as the adapter and the worker logins; callers add flags, environment and output.
pub fn serve_args(env: &Env, port: u16, secret: &str) -> Vec<String> {
    vec![
        "serve".into(),
        "--database-url".into(),
        env.cluster.url("synchro_dev_adapter", "app"),
        "--worker-url".into(),
        env.cluster.url("synchro_dev_worker", "app"),
        "--jwt-secret".into(),
        secret.into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ]
}

/// Starts the server binary `bin` ([`serve_args`]) quietly. A test package passes its own
/// `env!("CARGO_BIN_EXE_...")`.
pub fn start_server_binary(bin: &str, env: &Env, port: u16, secret: &str) -> Server {
    start_server_binary_with(bin, env, port, secret, &[])
}

/// [`start_server_binary`] with `extra` flags after [`serve_args`] (such as
/// `["--min-client-version", "2.0.0"]`).
pub fn start_server_binary_with(
    bin: &str,
    env: &Env,
    port: u16,
    secret: &str,
    extra: &[String],
) -> Server {
    let image = container_image();
    let mut name = None;
    let mut command = match &image {
        None => {
            let mut command = std::process::Command::new(bin);
            command.args(serve_args(env, port, secret));
            command
        }
        Some(image) => {
            // The same server as `serve_args`, configured the way the image documents:
            // environment variables, passed by name so their values stay off command lines.
            let n = format!("synchro-test-{}-{port}", std::process::id());
            let mut command = std::process::Command::new(container_engine());
            command
                .args(["run", "--rm", "--network", "host", "--name", &n])
                .args(["-e", "DATABASE_URL", "-e", "SYNCHRO_WORKER_DATABASE_URL"])
                .args(["-e", "SYNCHRO_JWT_SECRET", "-e", "SYNCHRO_LISTEN"])
                .args(["-e", "SYNCHRO_LOG", image, "serve"])
                .env(
                    "DATABASE_URL",
                    env.cluster.url("synchro_dev_adapter", "app"),
                )
                .env(
                    "SYNCHRO_WORKER_DATABASE_URL",
                    env.cluster.url("synchro_dev_worker", "app"),
                )
                .env("SYNCHRO_JWT_SECRET", secret)
                .env("SYNCHRO_LISTEN", format!("127.0.0.1:{port}"));
            name = Some(n);
            command
        }
    };
    command
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    // To diagnose a failing test: `SYNCHRO_TEST_SERVER_LOGS=<dir>` keeps each server's log
    // (at `SYNCHRO_TEST_SERVER_LOG_LEVEL`, default `debug`) in `<dir>/server-<port>.log`.
    match std::env::var_os("SYNCHRO_TEST_SERVER_LOGS") {
        Some(dir) => {
            std::fs::create_dir_all(&dir).expect("the server log directory");
            let path = std::path::Path::new(&dir).join(format!("server-{port}.log"));
            let file = std::fs::File::create(&path).expect("the server log file");
            let level =
                std::env::var("SYNCHRO_TEST_SERVER_LOG_LEVEL").unwrap_or_else(|_| "debug".into());
            command.env("SYNCHRO_LOG", level).stderr(file);
        }
        None => {
            command
                .env("SYNCHRO_LOG", "error")
                .stderr(std::process::Stdio::null());
        }
    }
    Server(command.spawn().unwrap(), name)
}

/// The last `lines` lines of the log [`start_server_binary_with`] kept for the server on
/// `port` (empty unless `SYNCHRO_TEST_SERVER_LOGS` is set), for a failing test's message.
pub fn server_log_tail(port: u16, lines: usize) -> String {
    let Some(dir) = std::env::var_os("SYNCHRO_TEST_SERVER_LOGS") else {
        return String::new();
    };
    let path = std::path::Path::new(&dir).join(format!("server-{port}.log"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A cluster with `app.docs` ([`docs_with_owner_and_team`], rows from `seed`) and the server
/// binary `bin` serving it, ready.
pub struct DocsServer {
    /// The cluster.
    pub env: Env,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// A client for it.
    pub http: reqwest::Client,
    /// The server process (killed when dropped).
    pub server: Server,
}

impl DocsServer {
    /// Sets up the cluster, starts `bin` and waits until it is ready.
    pub async fn start(bin: &str, seed: &str, secret: &str) -> DocsServer {
        let env = Env::installed().await;
        docs_with_owner_and_team(&env, seed).await;
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = start_server_binary(bin, &env, port, secret);
        let http = reqwest::Client::new();
        wait_ready(&http, &base).await;
        DocsServer {
            env,
            base,
            http,
            server,
        }
    }
}

/// Waits (up to 60 s) until `GET /ready` answers 200.
pub async fn wait_ready(http: &reqwest::Client, base: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/ready")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never became ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A free local TCP port, never one this process handed out before: the tests of one
/// binary run in parallel, and the kernel can give a port just released to the next caller
/// before the first one's server has bound it.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Registers `app.<table>` (already created) as multi_scope with a membership rule: `rule`
/// is run as the operator after the `rules` schema exists (it creates the function, grants
/// it to synchro_worker and registers it), then the manifest is published.
pub async fn register_with_rule(env: &Env, table: &str, rule: &str) {
    register_request_with_rule(
        env,
        &synchro_server::registry::RegisterRequest::synced("app", table, "multi_scope"),
        rule,
    )
    .await;
}

/// [`register_with_rule`] with the registration `request` (of a relation of schema `app`).
pub async fn register_request_with_rule(
    env: &Env,
    request: &synchro_server::registry::RegisterRequest,
    rule: &str,
) {
    let mut op = env.login("synchro_dev_operator").await;
    synchro_server::registry::register(&op, request)
        .await
        .unwrap();
    env.admin
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    op.batch_execute(rule).await.unwrap();
    synchro_server::publish::publish(&mut op).await.unwrap();
}

/// `app.docs (id, owner, team, title)` with the rows `seed` inserts, in two scopes per row
/// (`user:<owner>` and `team:<team>`); alice also has `team:red`.
pub async fn docs_with_owner_and_team(env: &Env, seed: &str) {
    env.as_app_owner(&format!(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text NOT NULL, title text);
         {seed}"
    ))
    .await;
    register_with_rule(
        env,
        "docs",
        "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id
           UNION ALL SELECT 'team:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id;
         END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');
         SELECT synchro.synchro_grant_user_scope('alice', 'team:red');",
    )
    .await;
}

/// The field ID of the field `name` of `table`, a table of a manifest as JSON (a connect's
/// `schema_definition.tables[i]`).
pub fn field_id(table: &serde_json::Value, name: &str) -> serde_json::Value {
    table["fields"]
        .as_array()
        .expect("a table's fields")
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no field {name}"))["field_id"]
        .clone()
}

/// The cases of `vectors/source-types-v1.json`: PostgreSQL column types of application
/// schemas, each with a value written in SQL and its portable type and wire value.
pub fn source_type_vectors() -> serde_json::Value {
    serde_json::from_str(include_str!("../../vectors/source-types-v1.json"))
        .expect("vectors/source-types-v1.json")
}

/// The vectors' SQL values as a row `(id, owner, c0, c1, ...)` of `app.source_types`.
pub fn source_types_row(cases: &[serde_json::Value], id: i32, owner: &str) -> String {
    let values: Vec<String> = cases
        .iter()
        .map(|c| {
            format!(
                "'{}'::{}",
                c["value"].as_str().unwrap().replace('\'', "''"),
                c["column"].as_str().unwrap()
            )
        })
        .collect();
    format!("({id}, '{owner}', {})", values.join(", "))
}

/// `app.source_types (id integer, owner text, c0 ... cN)`: one column per case of the
/// source-type vectors (their types, domains and the citext extension made first), row 1
/// (alice's) written in SQL, registered in the scope `user:<owner>` and published. Returns
/// the cases (column `c<i>` is case `i`).
pub async fn source_types_fixture(env: &Env) -> Vec<serde_json::Value> {
    let cases = source_type_vectors()["cases"].as_array().unwrap().clone();
    for c in &cases {
        if let Some(setup) = c["setup"].as_str() {
            env.admin.batch_execute(setup).await.unwrap();
        }
    }
    let columns: Vec<String> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| format!("c{i} {}", c["column"].as_str().unwrap()))
        .collect();
    env.as_app_owner(&format!(
        "CREATE TABLE app.source_types (id integer PRIMARY KEY, owner text NOT NULL, {});
         INSERT INTO app.source_types VALUES {}",
        columns.join(", "),
        source_types_row(&cases, 1, "alice")
    ))
    .await;
    register_with_rule(env, "source_types", &owner_rule("source_types", "integer")).await;
    cases
}

/// The membership rule [`register_with_rule`] takes for a table `app.<table>` with an `id`
/// key of SQL type `key_type` and an `owner` column: each row in the scope `user:<owner>`.
pub fn owner_rule(table: &str, key_type: &str) -> String {
    format!(
        "CREATE FUNCTION rules.{table}_scopes(p_id {key_type}) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'user:' || owner FROM synchro_projection.\"app.{table}\" WHERE id::text = p_id::text;
         END;
         REVOKE EXECUTE ON FUNCTION rules.{table}_scopes({key_type}) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.{table}_scopes({key_type}) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', '{table}', 'rules.{table}_scopes({key_type})');"
    )
}

/// For each column `c<i>` of `app.source_types`, whether row `a` holds exactly what row `b`
/// holds (compared as PostgreSQL's text output).
pub async fn source_types_same(env: &Env, cases: usize, a: i32, b: i32) -> Vec<bool> {
    env.admin
        .query_one(
            &format!(
                "SELECT ARRAY[{}] FROM app.source_types a JOIN app.source_types b ON b.id = $2 WHERE a.id = $1",
                (0..cases)
                    .map(|i| format!("a.c{i}::text IS NOT DISTINCT FROM b.c{i}::text"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            &[&a, &b],
        )
        .await
        .unwrap()
        .get(0)
}
