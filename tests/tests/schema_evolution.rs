//! Schema evolution driven by real DDL, through the operator's commands, with two clients at
//! once — one that last synced on the old manifest (the old app version) and one that
//! follows the new one — both holding queued offline writes: an added all-NULL column is
//! Class 2 (`replace`, nothing downloaded again), an added column with values is Class 3
//! (only the scopes whose rows gained values rebuild), an `ALTER TABLE` nobody reconfigured
//! blocks capture (503 `capture_blocked`, readiness fails) until the operator reconfigures,
//! and a retired field is Class 4 (the old client `unsupported`).

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{free_port, start_server, wait_ready, Env, Server};
use synchro_client::engine::{Client, Response, SchemaActionKind, Transport, TransportError};
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, Operation};
use synchro_client::storage::Storage;
use synchro_protocol::json::Json;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::auth::mint;
use synchro_server::publish::{publish, PublishOutcome};
use synchro_server::registry::{reconfigure, ReconfigurePlan, ReconfigureRequest};

const SECRET: &str = "schema-evolution-secret-0123456789";

/// The real HTTP transport, recording the scope of every rebuild it starts and every
/// request it sends with its status.
struct Recorder {
    inner: HttpTransport,
    rebuilds: Rebuilds,
    log: Log,
}

impl Transport for Recorder {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        if path == "/sync/rebuild" {
            let req = Json::parse(&body).unwrap();
            if req.get("continuation").is_none() {
                let scope = req.get("scope_id").and_then(Json::as_str).unwrap();
                self.rebuilds.borrow_mut().push(scope.to_owned());
            }
        }
        let r = self.inner.post(path, body.clone()).await?;
        self.log
            .borrow_mut()
            .push((path.to_owned(), body, r.status));
        Ok(r)
    }
}

struct Stack {
    env: Env,
    base: String,
    /// The server's port (names its kept log, see `server_log_tail`).
    port: u16,
    _server: Server,
    /// The edge gateway in front of the server when the run goes through it.
    _edge: Option<synchro_testkit::edge::Edge>,
    dir: std::path::PathBuf,
}

type Docs = Vec<(i64, String, String, Option<String>)>;

/// The scopes of the rebuilds a client started.
type Rebuilds = Rc<RefCell<Vec<String>>>;

/// Requests a client sent: path, body, status.
type Log = Rc<RefCell<Vec<(String, String, u16)>>>;

impl Stack {
    async fn start(name: &str) -> Stack {
        let env = Env::installed().await;
        common::docs_with_owner_and_team(
            &env,
            "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], (ARRAY['red', 'blue', 'green'])[1 + g % 3], 'seed ' || g
               FROM generate_series(1, 60) g",
        )
        .await;
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let server = start_server(&env, port, SECRET);
        wait_ready(&reqwest::Client::new(), &base).await;
        let (base, edge) = common::client_base(&base, SECRET).await;
        let dir = std::env::temp_dir().join(format!(
            "synchro-schema-evolution-{name}-{}-{port}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Stack {
            env,
            base,
            port,
            _server: server,
            _edge: edge,
            dir,
        }
    }

    /// Alice's client over its own database file, with its rebuilds and request log.
    async fn client(&self, file: &str) -> (Client<Recorder>, Rebuilds, Log) {
        let storage = Storage::open(self.dir.join(file)).unwrap();
        let token = mint(SECRET.as_bytes(), "alice", 3600);
        let rebuilds: Rebuilds = Rc::default();
        let log: Log = Rc::default();
        let transport = Recorder {
            inner: HttpTransport::new(self.base.clone(), move || token.clone()),
            rebuilds: rebuilds.clone(),
            log: log.clone(),
        };
        let seed = file
            .bytes()
            .fold(0u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
        let mut n = 0u8;
        let client = Client::open(storage, transport, move || {
            n = n.wrapping_add(1);
            let mut r = [seed; 16];
            r[15] = n;
            r[14] = n.wrapping_mul(7);
            r
        })
        .unwrap();
        (client, rebuilds, log)
    }

    /// Alice's view of the source: her docs and team red's.
    async fn source(&self, column: &str) -> Docs {
        self.env
            .admin
            .query(
                &format!(
                    "SELECT id, owner, team, {column}::text FROM app.docs
                      WHERE owner = 'alice' OR team = 'red' ORDER BY id"
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    /// The old and the new app's clients (alice's, over their own files), both synced on
    /// the current manifest, with their rebuild records.
    async fn two_synced_clients(&self) -> (Client<Recorder>, Rebuilds, Client<Recorder>, Rebuilds) {
        let (mut old, old_rebuilds, _) = self.client("old.db").await;
        let (mut new, new_rebuilds, _) = self.client("new.db").await;
        old.sync_once().await.unwrap();
        new.sync_once().await.unwrap();
        (old, old_rebuilds, new, new_rebuilds)
    }

    async fn operator(&self) -> tokio_postgres::Client {
        self.env.login("synchro_dev_operator").await
    }

    async fn reconfigure(&self, request: ReconfigureRequest, apply: bool) -> ReconfigurePlan {
        let mut op = self.operator().await;
        reconfigure(&mut op, &request, apply).await.unwrap()
    }

    /// Waits until the server serves the given manifest version (capture activated it).
    async fn served(&self, version: u64) {
        // (Generous: under CI load eight stacks share two cores.)
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let lineage = synchro_server::publish::load_serving_lineage(&self.env.admin)
                .await
                .unwrap();
            if lineage.current().map(|m| m.schema_version) == Some(version) {
                return;
            }
            if Instant::now() >= deadline {
                let state: String = self
                    .env
                    .admin
                    .query_one(
                        "SELECT (SELECT coalesce(jsonb_agg(to_jsonb(g) - 'relation_id'), '[]')
                                   FROM synchro.registry_generations g)::text
                                || ' ' || (SELECT to_jsonb(c)::text FROM synchro.capture_state c)
                                || ' ' || (SELECT coalesce(jsonb_agg(to_jsonb(r) - 'relation_id'), '[]')
                                             FROM synchro.relation_capture r)::text",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                let log = synchro_testkit::pg::server_log_tail(self.port, 60);
                panic!("version {version} never served: {state}\nserver log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let token = mint(SECRET.as_bytes(), "alice", 3600);
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (
            status,
            serde_json::from_str(&r.text().await.unwrap()).unwrap(),
        )
    }

    async fn ready(&self) -> u16 {
        reqwest::get(format!("{}/ready", self.base))
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// Waits until capture is blocked; returns the report's `blocked`.
    async fn blocked(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = self.report().await;
            if !report["blocked"].is_null() {
                return report["blocked"].clone();
            }
            assert!(Instant::now() < deadline, "capture never blocked");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `/ready` answers 200.
    async fn ready_again(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ready().await != 200 {
            assert!(Instant::now() < deadline, "readiness never recovered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn report(&self) -> serde_json::Value {
        let text: String = self
            .operator()
            .await
            .query_one("SELECT synchro.synchro_capture_report()::text", &[])
            .await
            .unwrap()
            .get(0);
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn local<T: Transport>(c: &Client<T>, column: &str) -> Docs {
    let conn = c.storage().connection();
    let mut q = conn
        .prepare(&format!(
            "SELECT id, owner, team, CAST({column} AS TEXT) FROM docs ORDER BY id"
        ))
        .unwrap();
    let rows = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    rows
}

/// The docs table's ID and the ID of one of its fields, in the client's schema.
fn field<T: Transport>(c: &Client<T>, name: &str) -> (String, String) {
    let docs = c
        .manifest()
        .unwrap()
        .tables
        .iter()
        .find(|t| t.name == "docs")
        .unwrap();
    let f = docs.fields.iter().find(|f| f.name == name).unwrap();
    (docs.table_id.clone(), f.field_id.clone())
}

/// Queues an offline update of one text field of a doc; returns the mutation ID.
fn queue_update<T: Transport>(c: &mut Client<T>, id: i64, name: &str, value: &str) -> String {
    let (table_id, field_id) = field(c, name);
    let pk = TypedValue::from_scalar(Scalar::Int64(id)).unwrap();
    c.write(&LocalWrite {
        table_id: &table_id,
        operation: Operation::Update,
        pk: &pk,
        columns: &[(
            field_id,
            TypedValue::from_scalar(Scalar::String(value.into())).unwrap(),
        )],
    })
    .unwrap()
}

fn mutation_state<T: Transport>(c: &Client<T>, id: &str) -> (String, u64) {
    let m = c
        .storage()
        .mutations()
        .unwrap()
        .into_iter()
        .find(|m| m.mutation.mutation_id == id)
        .unwrap();
    (
        m.state.as_str().to_owned(),
        m.mutation.authored_schema.version,
    )
}

/// Syncs until the client holds alice's view of the source in `column`, every terminal
/// checksum verified against the client's own rows on each round.
async fn converge<T: Transport>(s: &Stack, c: &mut Client<T>, column: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = c.sync_once().await.unwrap();
        assert_eq!(
            report.verified,
            BTreeSet::from(["team:red".to_owned(), "user:alice".to_owned()])
        );
        // Decimals: the source prints its scale, the client the canonical form.
        let source = if column == "amount" {
            s.source("trim_scale(amount)").await
        } else {
            s.source(column).await
        };
        if local(c, column) == source {
            return;
        }
        assert!(Instant::now() < deadline, "the client never converged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn published(plan: &ReconfigurePlan) -> (u64, String) {
    match &plan.publish {
        PublishOutcome::Published { version, class, .. } => (*version, class.clone()),
        other => panic!("nothing published: {other:?}"),
    }
}

#[tokio::test]
async fn an_added_all_null_column_is_class_2_replace_for_old_and_new_clients() {
    let s = Stack::start("class2").await;
    let (mut old, old_rebuilds, mut new, new_rebuilds) = s.two_synced_clients().await;
    // Both hold queued offline writes authored under v1.
    let old_write = queue_update(&mut old, 3, "title", "old app, offline");
    let new_write = queue_update(&mut new, 9, "title", "new app, offline");

    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    let request = ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        ..Default::default()
    };
    // The dry run changes nothing and says what would happen.
    let plan = s.reconfigure(request.clone(), false).await;
    let json = plan.to_json();
    assert_eq!(json["class"], "class_2", "{json}");
    assert_eq!(json["affected_scopes"], 0);
    assert_eq!(json["registry"]["added"][0]["column"], "note");
    assert_eq!(json["registry"]["added"][0]["has_values"], false);
    assert_eq!(json["clients_by_manifest"]["1"]["replace"], 2, "{json}");
    let lineage = synchro_server::publish::load_lineage(&s.env.admin)
        .await
        .unwrap();
    assert_eq!(
        lineage.current().unwrap().schema_version,
        1,
        "a plan publishes nothing"
    );

    let applied = s.reconfigure(request, true).await;
    assert_eq!(published(&applied), (2, "class_2".to_owned()));
    s.served(2).await;
    // A write after the boundary carries the new column.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET note = 'after' WHERE id = 2")
        .await
        .unwrap();

    // The new app syncs first and writes under v2; the old one stays offline meanwhile.
    let report = new.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::Replace);
    assert!(
        new_rebuilds.borrow().len() <= 2,
        "only the first sync rebuilt"
    );
    let new_rebuilds_before = new_rebuilds.borrow().len();
    let v2_write = queue_update(&mut new, 15, "note", "new app, v2");
    converge(&s, &mut new, "note").await;
    assert_eq!(
        new_rebuilds.borrow().len(),
        new_rebuilds_before,
        "nothing rebuilt"
    );

    let old_rebuilds_before = old_rebuilds.borrow().len();
    let report = old.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::Replace);
    converge(&s, &mut old, "note").await;
    converge(&s, &mut old, "title").await;
    assert_eq!(
        old_rebuilds.borrow().len(),
        old_rebuilds_before,
        "nothing rebuilt"
    );
    assert_eq!(mutation_state(&old, &old_write), ("applied".into(), 1));
    assert_eq!(mutation_state(&new, &new_write), ("applied".into(), 1));
    assert_eq!(mutation_state(&new, &v2_write), ("applied".into(), 2));
    converge(&s, &mut new, "title").await;
}

/// A live session pushes between connects: a write queued after a publish it has not
/// connected for is refused under the client's own (current to it) schema. The push must
/// end with the 422 so that the round connects; it once resealed and resent the batch
/// forever, a new batch per 422, never connecting.
#[tokio::test]
async fn a_push_refused_under_the_clients_own_schema_ends_so_that_the_round_connects() {
    let s = Stack::start("push-between-connects").await;
    let (mut old, _, log) = s.client("old.db").await;
    let (mut new, _, _) = s.client("new.db").await;
    old.sync_once().await.unwrap();
    new.sync_once().await.unwrap();
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    let request = ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        ..Default::default()
    };
    assert_eq!(
        published(&s.reconfigure(request, true).await),
        (2, "class_2".to_owned())
    );
    s.served(2).await;
    // Both hold a write queued under version 1, after the publish.
    let old_write = queue_update(&mut old, 3, "title", "old app, queued");
    let new_write = queue_update(&mut new, 9, "title", "new app, queued");
    let pushes = |log: &Log| {
        log.borrow()
            .iter()
            .filter(|(p, _, _)| p == "/sync/push")
            .count()
    };
    let e = tokio::time::timeout(Duration::from_secs(20), old.push())
        .await
        .expect("the push ends")
        .unwrap_err();
    assert_eq!(e.code(), "schema_mismatch", "{e:?}");
    assert_eq!(pushes(&log), 1, "one request, refused; nothing resent");
    assert_eq!(mutation_state(&old, &old_write), ("pending".into(), 1));
    // The round that follows connects (replace) and the write is applied, as is the
    // other client's.
    assert_eq!(
        old.sync_once().await.unwrap().action,
        SchemaActionKind::Replace
    );
    assert_eq!(
        new.sync_once().await.unwrap().action,
        SchemaActionKind::Replace
    );
    assert_eq!(mutation_state(&old, &old_write), ("applied".into(), 1));
    assert_eq!(mutation_state(&new, &new_write), ("applied".into(), 1));
    converge(&s, &mut old, "title").await;
    converge(&s, &mut new, "title").await;
}

#[tokio::test]
async fn an_added_column_with_values_is_class_3_and_rebuilds_only_the_affected_scopes() {
    let s = Stack::start("class3").await;
    let (mut old, _, mut new, new_rebuilds) = s.two_synced_clients().await;
    let old_write = queue_update(&mut old, 3, "title", "old app, offline");
    let new_write = queue_update(&mut new, 27, "title", "new app, offline");

    // The application's migration and the SQL entry point in one transaction: values only
    // for green docs, so of alice's scopes only user:alice gains values (team:red none).
    s.env
        .admin
        .batch_execute(
            "BEGIN;
             ALTER TABLE app.docs ADD COLUMN priority integer;
             UPDATE app.docs SET priority = id WHERE team = 'green';
             SELECT synchro.synchro_reconfigure_relation('app', 'docs');
             COMMIT;",
        )
        .await
        .unwrap();
    let mut op = s.operator().await;
    let outcome = publish(&mut op).await.unwrap();
    assert!(
        matches!(&outcome, PublishOutcome::Published { version: 2, class, .. } if class == "class_3"),
        "{outcome:?}"
    );
    s.served(2).await;

    new_rebuilds.borrow_mut().clear();
    let report = new.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    assert_eq!(report.affected, BTreeSet::from(["user:alice".to_owned()]));
    assert_eq!(*new_rebuilds.borrow(), vec!["user:alice".to_owned()]);
    converge(&s, &mut new, "priority").await;
    let report = old.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    assert_eq!(report.affected, BTreeSet::from(["user:alice".to_owned()]));
    converge(&s, &mut old, "priority").await;
    converge(&s, &mut old, "title").await;
    assert_eq!(mutation_state(&old, &old_write), ("applied".into(), 1));
    assert_eq!(mutation_state(&new, &new_write), ("applied".into(), 1));
}

#[tokio::test]
async fn alter_table_without_reconfiguration_blocks_until_the_operator_reconfigures() {
    let s = Stack::start("drift").await;
    let (mut old, _, log) = s.client("old.db").await;
    old.sync_once().await.unwrap();
    let old_write = queue_update(&mut old, 3, "title", "queued while blocked");

    // DDL nobody reconfigured, then a write under the new shape: capture blocks there.
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET note = 'unseen', title = 'moved on' WHERE id = 5")
        .await
        .unwrap();
    let blocked = s.blocked().await;
    assert_eq!(blocked["reason"], "registered_relation_drift");
    assert_eq!(blocked["detail"], "column_added");
    assert_eq!(blocked["ordinal"], 1);
    assert!(blocked["lsn"].as_str().unwrap().contains('/'));
    assert!(s.report().await["retained_wal_bytes"].as_i64().unwrap() > 0);
    assert_eq!(s.ready().await, 503);

    // Push and pull answer 503 capture_blocked, retryable; the client keeps its write.
    let last_pull = log
        .borrow()
        .iter()
        .rev()
        .find(|(path, _, _)| path == "/sync/pull")
        .map(|(_, body, _)| body.clone())
        .unwrap();
    let e = old.sync_once().await.unwrap_err();
    assert!(e.retryable(), "{e:?}");
    assert_eq!(e.code(), "temporary_unavailable");
    assert_eq!(log.borrow().last().unwrap().0, "/sync/push");
    assert_eq!(log.borrow().last().unwrap().2, 503);
    assert_eq!(mutation_state(&old, &old_write).0, "pending");
    for (path, body) in [("/sync/pull", last_pull.as_str())] {
        let (status, answer) = s.post(path, body).await;
        assert_eq!(status, 503, "{answer}");
        assert_eq!(answer["error"]["reason"], "capture_blocked", "{answer}");
        assert_eq!(answer["error"]["retryable"], true);
    }

    // The operator takes the new shape: capture resumes at the boundary, nothing is lost.
    let plan = s
        .reconfigure(
            ReconfigureRequest {
                schema: "app".into(),
                relation: "docs".into(),
                ..Default::default()
            },
            true,
        )
        .await;
    // The column already holds a value: Class 3.
    assert_eq!(published(&plan), (2, "class_3".to_owned()));
    assert!(s.report().await["blocked"].is_null());
    s.served(2).await;
    converge(&s, &mut old, "note").await;
    converge(&s, &mut old, "title").await;
    assert_eq!(mutation_state(&old, &old_write).0, "applied");
    s.ready_again().await;
}

#[tokio::test]
async fn a_retired_field_is_class_4_old_intent_terminal_new_intent_applied() {
    let s = Stack::start("class4").await;
    let request = |retire: &[&str]| ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        retire: retire.iter().map(|c| (*c).to_owned()).collect(),
        ..Default::default()
    };
    // Expand: the new app's field, Class 2.
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN summary text")
        .await;
    assert_eq!(
        published(&s.reconfigure(request(&[]), true).await),
        (2, "class_2".to_owned())
    );
    s.served(2).await;
    let (mut old, _, mut new, _) = s.two_synced_clients().await;
    // The old app writes the field about to be retired, the new app the new one.
    let old_write = queue_update(&mut old, 3, "title", "old app, offline");
    let new_write = queue_update(&mut new, 9, "summary", "new app, offline");

    // Contract: retiring title is Class 4 for both installed clients.
    let plan = s.reconfigure(request(&["title"]), false).await.to_json();
    assert_eq!(plan["class"], "class_4", "{plan}");
    assert_eq!(plan["registry"]["retired"].as_array().unwrap().len(), 1);
    assert_eq!(plan["clients_by_manifest"]["2"]["unsupported"], 2, "{plan}");
    assert_eq!(
        published(&s.reconfigure(request(&["title"]), true).await),
        (3, "class_4".to_owned())
    );
    s.served(3).await;
    // The retired column is server-only now: writing it, then dropping it, blocks nothing.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET title = 'server side' WHERE id = 4")
        .await
        .unwrap();

    // The new app: unsupported, then the explicit reset; its intent is applied.
    let e = new.sync_once().await.unwrap_err();
    assert_eq!((e.code(), e.retryable()), ("upgrade_required", false));
    new.request_schema_reset().unwrap();
    let report = new.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    assert_eq!(mutation_state(&new, &new_write), ("applied".into(), 2));
    converge(&s, &mut new, "summary").await;

    // The old app: unsupported, its queue and rows kept until it upgrades; then its intent
    // on the retired field is terminal schema_incompatible and nothing of it is written.
    let before = local(&old, "title");
    let e = old.sync_once().await.unwrap_err();
    assert_eq!(e.code(), "upgrade_required");
    assert_eq!(local(&old, "title"), before);
    assert_eq!(mutation_state(&old, &old_write).0, "pending");
    old.request_schema_reset().unwrap();
    let report = old.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    assert_eq!(mutation_state(&old, &old_write).0, "rejected_terminal");
    let outcome = old.storage().outcome(&old_write).unwrap().unwrap();
    assert!(outcome.contains("schema_incompatible"), "{outcome}");
    let title: Option<String> = s
        .env
        .admin
        .query_one("SELECT title FROM app.docs WHERE id = 3", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(title.as_deref(), Some("seed 3"));
    converge(&s, &mut old, "summary").await;

    s.env
        .as_app_owner("ALTER TABLE app.docs DROP COLUMN title")
        .await;
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET summary = 'after the drop' WHERE id = 4")
        .await
        .unwrap();
    converge(&s, &mut old, "summary").await;
    assert!(s.report().await["blocked"].is_null());
}

#[tokio::test]
async fn a_rename_by_expand_migrate_contract_with_the_advisor() {
    let s = Stack::start("rename").await;
    let docs = |retire: &[&str]| ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        retire: retire.iter().map(|c| (*c).to_owned()).collect(),
        ..Default::default()
    };
    let (mut old, _, mut new, _) = s.two_synced_clients().await;
    let old_write = queue_update(&mut old, 3, "title", "old app, offline");

    // Expand: the new name as a new field (all NULL: Class 2).
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN headline text")
        .await;
    assert_eq!(
        published(&s.reconfigure(docs(&[]), true).await),
        (2, "class_2".to_owned())
    );
    s.served(2).await;
    // Migrate: the server dual-writes the old field into the new one and backfills.
    s.env
        .as_app_owner(
            "CREATE FUNCTION app.docs_dual_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN NEW.headline := NEW.title; RETURN NEW; END $$;
             CREATE TRIGGER docs_dual_write BEFORE INSERT OR UPDATE OF title ON app.docs
                 FOR EACH ROW EXECUTE FUNCTION app.docs_dual_write();
             UPDATE app.docs SET headline = title;",
        )
        .await;
    // The new app moves to v2 and writes the new field.
    converge(&s, &mut new, "headline").await;
    let new_write = queue_update(&mut new, 9, "headline", "new app");
    new.sync_once().await.unwrap();
    assert_eq!(mutation_state(&new, &new_write).0, "applied");

    // Contract is not safe while the old app is active on v1.
    let op = s.operator().await;
    let report = contract_check(&op).await;
    assert_eq!(report["served_version"], 2);
    assert_eq!(report["manifests"][0]["active_clients"], 1, "{report}");
    assert_eq!(report["manifests"][1]["active_clients"], 1, "{report}");
    assert!(!report["manifests"][1]["last_push_authored_at"].is_null());
    let contract = &report["safe_to_contract"];
    assert_eq!(contract["safe"], false, "{report}");
    assert_eq!(
        contract["blocking"],
        serde_json::json!([{"reason": "active_clients_on_older_manifest", "schema_version": 1, "count": 1}])
    );
    // The plan of the retirement says the same before anything changes.
    let plan = s.reconfigure(docs(&["title"]), false).await.to_json();
    assert_eq!(plan["safe_to_contract"]["safe"], false);

    // The old app is gone (its generation idle past client_ttl_days, 30): safe.
    s.env
        .admin
        .batch_execute(
            "UPDATE synchro.clients SET generation_started_at = now() - interval '31 days',
                    last_acknowledged_at = NULL WHERE schema_version = 1",
        )
        .await
        .unwrap();
    let report = contract_check(&op).await;
    assert_eq!(report["safe_to_contract"]["safe"], true, "{report}");

    // Contract: retire the old field. The new app resets and keeps going; while it has not,
    // the advisor counts it as held at upgrade_required.
    assert_eq!(
        published(&s.reconfigure(docs(&["title"]), true).await),
        (3, "class_4".to_owned())
    );
    s.served(3).await;
    assert_eq!(
        new.sync_once().await.unwrap_err().code(),
        "upgrade_required"
    );
    let report = rollout_only(&op).await;
    assert_eq!(
        report["held_at_upgrade_required"]["unsupported"], 1,
        "{report}"
    );
    new.request_schema_reset().unwrap();
    assert_eq!(
        new.sync_once().await.unwrap().action,
        SchemaActionKind::RebuildLocal
    );
    converge(&s, &mut new, "headline").await;
    let report = rollout_only(&op).await;
    assert_eq!(
        report["held_at_upgrade_required"]["unsupported"], 0,
        "{report}"
    );
    drop((old, old_write));
}

async fn rollout_only(op: &tokio_postgres::Client) -> serde_json::Value {
    synchro_server::registry::rollout(op, None).await.unwrap()
}

/// The rollout report with the contract check for retiring docs.title.
async fn contract_check(op: &tokio_postgres::Client) -> serde_json::Value {
    let columns = ["title".to_owned()];
    synchro_server::registry::rollout(op, Some(("app", "docs", &columns[..])))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_required_column_a_widened_decimal_and_a_local_index() {
    let s = Stack::start("more").await;
    let docs = ReconfigureRequest {
        schema: "app".into(),
        relation: "docs".into(),
        ..Default::default()
    };
    let (mut old, _, mut new, new_rebuilds) = s.two_synced_clients().await;
    let old_write = queue_update(&mut old, 3, "title", "old app, offline");
    let new_write = queue_update(&mut new, 4, "title", "new app, offline");

    // A required column: every row has a value, so every scope holding rows rebuilds.
    s.env
        .as_app_owner("ALTER TABLE app.docs ADD COLUMN amount numeric(6,2) NOT NULL DEFAULT 1.5")
        .await;
    let plan = s.reconfigure(docs.clone(), true).await;
    assert_eq!(published(&plan), (2, "class_3".to_owned()));
    assert_eq!(plan.to_json()["registry"]["added"][0]["nullable"], false);
    s.served(2).await;
    new_rebuilds.borrow_mut().clear();
    let report = new.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    assert_eq!(
        report.affected,
        BTreeSet::from(["team:red".to_owned(), "user:alice".to_owned()])
    );
    converge(&s, &mut new, "amount").await;

    // Widening the decimal is Class 2: replace, nothing rebuilt.
    s.env
        .as_app_owner("ALTER TABLE app.docs ALTER COLUMN amount TYPE numeric(9,3)")
        .await;
    let plan = s.reconfigure(docs.clone(), false).await.to_json();
    assert_eq!(
        plan["registry"]["changed"][0]["change"], "decimal_widened",
        "{plan}"
    );
    assert_eq!(
        published(&s.reconfigure(docs.clone(), true).await),
        (3, "class_2".to_owned())
    );
    s.served(3).await;
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET amount = 123456.789 WHERE id = 2")
        .await
        .unwrap();
    new_rebuilds.borrow_mut().clear();
    assert_eq!(
        new.sync_once().await.unwrap().action,
        SchemaActionKind::Replace
    );
    converge(&s, &mut new, "amount").await;
    assert!(
        new_rebuilds.borrow().is_empty(),
        "{:?}",
        new_rebuilds.borrow()
    );

    // A declared local index is Class 2; the client creates it.
    let mut op = s.operator().await;
    let columns = ["team".to_owned(), "title".to_owned()];
    synchro_server::registry::declare_index(&op, "app", "docs", "docs_by_team", &columns, false)
        .await
        .unwrap();
    let refused = synchro_server::registry::declare_index(
        &op,
        "app",
        "docs",
        "docs_unique_team",
        &columns,
        true,
    )
    .await;
    assert!(refused.is_err(), "no unique index on the source");
    let outcome = publish(&mut op).await.unwrap();
    assert!(
        matches!(&outcome, PublishOutcome::Published { version: 4, class, .. } if class == "class_2"),
        "{outcome:?}"
    );
    new_rebuilds.borrow_mut().clear();
    assert_eq!(
        new.sync_once().await.unwrap().action,
        SchemaActionKind::Replace
    );
    let indexed: i64 = new
        .storage()
        .connection()
        .query_row(
            "SELECT count(*) FROM pragma_index_list('docs') WHERE name = 'docs_by_team'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexed, 1);
    assert!(new_rebuilds.borrow().is_empty());

    // The old app, offline through all three changes, crosses them in one connect.
    let report = old.sync_once().await.unwrap();
    assert_eq!(report.action, SchemaActionKind::RebuildLocal);
    converge(&s, &mut old, "amount").await;
    converge(&s, &mut old, "title").await;
    assert_eq!(mutation_state(&old, &old_write), ("applied".into(), 1));
    assert_eq!(mutation_state(&new, &new_write), ("applied".into(), 1));
}

#[tokio::test]
async fn a_retired_table_is_class_4_and_comes_back_as_a_new_table() {
    let s = Stack::start("table").await;
    let (mut old, _, mut new, _) = s.two_synced_clients().await;
    let old_table = field(&old, "title").0;
    let old_write = queue_update(&mut old, 3, "title", "written under the retired contract");

    let mut op = s.operator().await;
    let (change, outcome) = synchro_server::registry::retire(&mut op, "app", "docs")
        .await
        .unwrap();
    assert_eq!(change["table_id"], old_table.as_str());
    assert!(
        matches!(&outcome, PublishOutcome::Published { version: 2, class, .. } if class == "class_4"),
        "{outcome:?}"
    );
    s.served(2).await;
    // Writes to the table no longer reach capture, and nothing blocks.
    s.env
        .admin
        .batch_execute("UPDATE app.docs SET title = 'after retirement' WHERE id = 5")
        .await
        .unwrap();

    // The new app resets: the table is gone locally.
    assert_eq!(
        new.sync_once().await.unwrap_err().code(),
        "upgrade_required"
    );
    new.request_schema_reset().unwrap();
    new.sync_once().await.unwrap();
    assert!(new.manifest().unwrap().tables.is_empty());
    // The old app keeps its rows and its intent until it upgrades; then the intent on the
    // retired table is terminal schema_incompatible and nothing of it is written.
    assert_eq!(
        old.sync_once().await.unwrap_err().code(),
        "upgrade_required"
    );
    assert_eq!(mutation_state(&old, &old_write).0, "pending");
    old.request_schema_reset().unwrap();
    old.sync_once().await.unwrap();
    assert_eq!(mutation_state(&old, &old_write).0, "rejected_terminal");
    let outcome = old.storage().outcome(&old_write).unwrap().unwrap();
    assert!(outcome.contains("schema_incompatible"), "{outcome}");
    let title: Option<String> = s
        .env
        .admin
        .query_one("SELECT title FROM app.docs WHERE id = 3", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(title.as_deref(), Some("seed 3"));
    assert!(s.report().await["blocked"].is_null());

    // Registered again, the same physical table is a new table (Class 3: it has rows).
    synchro_server::registry::register(
        &op,
        &synchro_server::registry::RegisterRequest::synced("app", "docs", "multi_scope"),
    )
    .await
    .unwrap();
    op.batch_execute(
        "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')",
    )
    .await
    .unwrap();
    let outcome = publish(&mut op).await.unwrap();
    assert!(
        matches!(&outcome, PublishOutcome::Published { version: 3, class, .. } if class == "class_3"),
        "{outcome:?}"
    );
    s.served(3).await;
    converge(&s, &mut new, "title").await;
    assert_ne!(field(&new, "title").0, old_table, "a new table ID");
    converge(&s, &mut old, "title").await;
}

#[tokio::test]
async fn a_truncate_blocks_until_a_stream_reset_rebuilds_the_scopes() {
    let s = Stack::start("reset").await;
    let (mut old, rebuilds, _) = s.client("old.db").await;
    old.sync_once().await.unwrap();
    let kept = queue_update(&mut old, 3, "title", "queued before the truncate");
    let relation_id: String = s
        .env
        .admin
        .query_one(
            "SELECT relation_id FROM synchro.relations WHERE physical_relation = 'docs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    s.env
        .as_app_owner(
            "TRUNCATE app.docs;
             INSERT INTO app.docs VALUES (1, 'alice', 'red', 'fresh'), (2, 'bob', 'red', 'fresh too')",
        )
        .await;
    let blocked = s.blocked().await;
    assert_eq!(blocked["reason"], "truncate_unsupported");
    assert_eq!(blocked["relation_id"], relation_id.as_str());
    assert_eq!(
        old.sync_once().await.unwrap_err().code(),
        "temporary_unavailable"
    );

    // The operator resets the relation's stream: a fresh copy at a new boundary, and the
    // scopes that held its rows rebuild.
    let mut op = s.operator().await;
    let (_, outcome) = synchro_server::registry::reset(&mut op, "app", "docs")
        .await
        .unwrap();
    assert!(
        matches!(outcome, PublishOutcome::Unchanged { version: 1 }),
        "{outcome:?}"
    );
    assert!(s.report().await["blocked"].is_null());
    rebuilds.borrow_mut().clear();
    converge(&s, &mut old, "title").await;
    let rebuilt: BTreeSet<String> = rebuilds.borrow().iter().cloned().collect();
    assert_eq!(
        rebuilt,
        BTreeSet::from(["team:red".to_owned(), "user:alice".to_owned()])
    );
    // The queued intent was not lost: its row is gone, so it is a conflict.
    assert_eq!(mutation_state(&old, &kept).0, "conflict");
    s.ready_again().await;
}
