//! Controlled reconfiguration against real PostgreSQL, as a hostile or careless operator
//! would use it: every refusal is typed and leaves no generation or manifest behind, and an
//! activation interrupted between its commit and the slot advance (kill -9) is applied
//! exactly once.

mod common;

use common::Env;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{reconfigure, ReconfigureRequest, RegistrationError};

async fn drain(worker: &mut Worker) {
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(0) => return,
            StepOutcome::Applied(_) => {}
            other => panic!("{other:?}"),
        }
    }
}

async fn docs(env: &Env) {
    common::docs_with_owner_and_team(
        env,
        "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], 'red', 'seed ' || g
           FROM generate_series(1, 20) g",
    )
    .await;
}

/// (registry generations, manifests): what a refused reconfiguration must not change.
async fn counts(env: &Env) -> (i64, i64) {
    let r = env
        .admin
        .query_one(
            "SELECT (SELECT count(*) FROM synchro.registry_generations), (SELECT count(*) FROM synchro.manifests)",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

fn request(relation: &str) -> ReconfigureRequest {
    ReconfigureRequest {
        schema: "app".into(),
        relation: relation.into(),
        ..Default::default()
    }
}

/// The reason of an `invalid_registration`, or the SQLSTATE in a database failure.
fn refusal(e: RegistrationError) -> String {
    match &e {
        RegistrationError::Invalid(..) => e.reason().unwrap().to_owned(),
        RegistrationError::Database(text) => text
            .rsplit("SQLSTATE ")
            .next()
            .unwrap()
            .trim_end_matches(')')
            .to_owned(),
    }
}

async fn refuse(op: &mut tokio_postgres::Client, r: ReconfigureRequest) -> String {
    refusal(reconfigure(op, &r, true).await.unwrap_err())
}

#[tokio::test]
async fn reconfiguration_refusals_are_typed_and_leave_nothing_behind() {
    let env = Env::installed().await;
    docs(&env).await;
    let mut op = env.login("synchro_dev_operator").await;
    // While the relation's bootstrap copy is pending, nothing can be reconfigured.
    assert_eq!(refuse(&mut op, request("docs")).await, "55006");
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    let before = counts(&env).await;

    assert_eq!(
        refuse(&mut op, request("nope")).await,
        "ambiguous_physical_relation"
    );
    let mut key = request("docs");
    key.retire = vec!["id".into()];
    assert_eq!(refuse(&mut op, key).await, "22023");
    let mut unknown = request("docs");
    unknown.retire = vec!["no_such_column".into()];
    assert_eq!(refuse(&mut op, unknown).await, "22023");
    let mut missing = request("docs");
    missing.server_only = Some(vec!["no_such_column".into()]);
    assert_eq!(refuse(&mut op, missing).await, "22023");
    let mut synced = request("docs");
    synced.server_only = Some(vec!["title".into()]);
    assert_eq!(refuse(&mut op, synced).await, "22023", "retire it first");

    // A column without a portable type: refused, unless it is declared server-only.
    env.as_app_owner("ALTER TABLE app.docs ADD COLUMN spot point")
        .await;
    assert_eq!(
        refuse(&mut op, request("docs")).await,
        "unsupported_column_type"
    );
    let mut server_only = request("docs");
    server_only.server_only = Some(vec!["spot".into()]);
    let plan = reconfigure(&mut op, &server_only, false).await.unwrap();
    assert_eq!(plan.to_json()["class"], "class_1", "{}", plan.to_json());

    // Another portable type in place, and a column dropped without retiring it.
    env.as_app_owner("ALTER TABLE app.docs ALTER COLUMN title TYPE integer USING length(title)")
        .await;
    let e = reconfigure(&mut op, &server_only, true).await.unwrap_err();
    let RegistrationError::Invalid(body, ..) = &e else {
        panic!("{e:?}")
    };
    // A column refusal (spec 000's closed list has no reason for it) is invalid_column,
    // naming the column, its new type and the already assigned IDs.
    assert_eq!(body["error"]["code"], "invalid_column", "{body}");
    assert_eq!(body["error"]["reason"], "unsupported_column_type");
    assert_eq!(
        (&body["error"]["column"], &body["error"]["type"]),
        (&serde_json::json!("title"), &serde_json::json!("integer")),
        "{body}"
    );
    assert!(body["error"]["field_id"]
        .as_str()
        .unwrap()
        .starts_with("fld_"));
    assert!(body["error"]["relation_id"]
        .as_str()
        .unwrap()
        .starts_with("rel_"));
    env.as_app_owner("ALTER TABLE app.docs DROP COLUMN title")
        .await;
    let e = reconfigure(&mut op, &server_only, true).await.unwrap_err();
    assert_eq!(e.reason(), Some("missing_field"));
    let RegistrationError::Invalid(body, ..) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (&body["error"]["code"], &body["error"]["column"]),
        (
            &serde_json::json!("invalid_column"),
            &serde_json::json!("title")
        ),
        "{body}"
    );
    // A physical identity change cannot be reconfigured in place.
    env.as_app_owner("ALTER TABLE app.docs REPLICA IDENTITY FULL")
        .await;
    let e = reconfigure(&mut op, &server_only, true).await.unwrap_err();
    assert_eq!(refusal(e), "55000");

    assert_eq!(counts(&env).await, before, "nothing recorded");
    let pending: i64 = env
        .admin
        .query_one("SELECT count(*) FROM synchro.pending_fields", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending, 0);
}

#[tokio::test]
async fn an_activation_interrupted_before_the_slot_advance_is_applied_once() {
    let env = Env::installed().await;
    docs(&env).await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;

    env.as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    let mut op = env.login("synchro_dev_operator").await;
    // The plan shows the field ID the reconfiguration then assigns.
    let added = |plan: &synchro_server::registry::ReconfigurePlan| {
        plan.to_json()["registry"]["added"][0]["field_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let planned = added(&reconfigure(&mut op, &request("docs"), false).await.unwrap());
    assert_eq!(
        added(&reconfigure(&mut op, &request("docs"), true).await.unwrap()),
        planned
    );
    env.admin
        .batch_execute("UPDATE app.docs SET note = 'after' WHERE id = 2")
        .await
        .unwrap();
    // The worker commits the activation and dies before it advances the slot.
    assert_eq!(
        worker
            .step(Failpoint::AfterCommitBeforeAdvance)
            .await
            .unwrap(),
        StepOutcome::Applied(1)
    );
    drop(worker);
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;

    let r = env
        .admin
        .query_one(
            "SELECT (SELECT count(*) FROM synchro.registry_generations WHERE change = 'reconfiguration' AND state = 'active'),
                    (SELECT count(*) FROM synchro.projection_rows p JOIN synchro.relations r USING (relation_id)
                      WHERE r.physical_relation = 'docs'),
                    (SELECT count(*) FROM synchro.projection_rows WHERE row_json::jsonb ? (
                         SELECT f.field_id FROM synchro.fields f WHERE f.column_name = 'note')),
                    (SELECT count(*) FROM synchro.scope_effects WHERE pk = '\"2\"'),
                    (SELECT count(*) FROM synchro.membership_edges WHERE pk = '\"2\"')",
            &[],
        )
        .await
        .unwrap();
    let (active, rows, with_note, effects, edges): (i64, i64, i64, i64, i64) =
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
    assert_eq!((active, rows, with_note), (1, 20, 20));
    // Row 2: its bootstrap insert and the one update after the boundary, once per scope.
    assert_eq!(effects, 2 * edges, "no effect applied twice");
    let note: Option<String> = env
        .admin
        .query_one(
            "SELECT row_json::jsonb ->> (SELECT field_id FROM synchro.fields WHERE column_name = 'note')
               FROM synchro.projection_rows WHERE pk = '\"2\"'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(note.as_deref(), Some("after"));
}

#[tokio::test]
async fn lifecycle_fields_are_declared_server_owned_and_kept_across_reconfigurations() {
    use synchro_server::registry::{register, RegisterRequest};
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.notes (id bigint PRIMARY KEY, body text, label text,
                                 created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz)",
    )
    .await;
    let mut op = env.login("synchro_dev_operator").await;
    let lifecycle = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let notes = |l| RegisterRequest {
        lifecycle: l,
        ..RegisterRequest::synced("app", "notes", "single_scope")
    };
    // Not a timestamptz column, an unknown member, the key: refused, nothing recorded.
    for bad in [
        lifecycle(&[("created_at", "label")]),
        lifecycle(&[("born_at", "created_at")]),
        lifecycle(&[("created_at", "id")]),
        lifecycle(&[("created_at", "created_at"), ("updated_at", "created_at")]),
    ] {
        let e = register(&op, &notes(bad)).await.unwrap_err();
        assert!(format!("{e}").contains("22023"), "{e}");
    }
    register(
        &op,
        &notes(lifecycle(&[
            ("created_at", "created_at"),
            ("updated_at", "updated_at"),
        ])),
    )
    .await
    .unwrap();
    synchro_server::publish::publish(&mut op).await.unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    let manifest = synchro_server::publish::load_lineage(&op)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let table = &manifest.tables[0];
    let id_of = |name: &str| {
        table
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        table.lifecycle.created_at.as_deref(),
        Some(id_of("created_at").field_id.as_str())
    );
    assert_eq!(
        table.lifecycle.updated_at.as_deref(),
        Some(id_of("updated_at").field_id.as_str())
    );
    assert!(!id_of("created_at").writable && !id_of("updated_at").writable);
    assert!(id_of("body").writable);

    // An added column keeps the declaration (Class 2); declaring one more is Class 4.
    env.as_app_owner("ALTER TABLE app.notes ADD COLUMN deleted_at timestamptz")
        .await;
    let keep = ReconfigureRequest {
        schema: "app".into(),
        relation: "notes".into(),
        ..Default::default()
    };
    let plan = reconfigure(&mut op, &keep, false).await.unwrap().to_json();
    assert_eq!(plan["class"], "class_2", "{plan}");
    assert_eq!(plan["registry"]["lifecycle_changed"], false);
    let declare = ReconfigureRequest {
        lifecycle: Some(lifecycle(&[
            ("created_at", "created_at"),
            ("updated_at", "updated_at"),
            ("deleted_at", "deleted_at"),
        ])),
        ..keep.clone()
    };
    let plan = reconfigure(&mut op, &declare, false)
        .await
        .unwrap()
        .to_json();
    assert_eq!(plan["class"], "class_4", "{plan}");
    assert_eq!(plan["registry"]["lifecycle_changed"], true);
}

#[tokio::test]
async fn a_dropped_and_recreated_table_recovers_by_retirement_and_a_new_registration() {
    use synchro_server::registry::{register, retire, RegisterRequest};
    let env = Env::installed().await;
    docs(&env).await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    let old_id: String = env
        .admin
        .query_one("SELECT table_id FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);

    env.as_app_owner(
        "DROP TABLE app.docs CASCADE;
         CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text NOT NULL, title text);
         INSERT INTO app.docs VALUES (1, 'alice', 'red', 'again'), (2, 'bob', 'blue', 'again')",
    )
    .await;
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("registered_relation_drift".into())
    );
    let detail: String = env
        .admin
        .query_one("SELECT blocked_detail FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "relation_dropped");
    let mut op = env.login("synchro_dev_operator").await;
    // It cannot be reconfigured or reset in place.
    let e = reconfigure(&mut op, &request("docs"), true)
        .await
        .unwrap_err();
    assert_eq!(refusal(e), "55000");

    let (_, outcome) = retire(&mut op, "app", "docs").await.unwrap();
    assert!(format!("{outcome:?}").contains("class_4"), "{outcome:?}");
    drain(&mut worker).await;
    let left: i64 = env
        .admin
        .query_one(
            "SELECT (SELECT count(*) FROM synchro.relations) + (SELECT count(*) FROM synchro.projection_rows)
                    + (SELECT count(*) FROM synchro.membership_edges)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        left, 0,
        "the retired relation is gone with its rows and edges"
    );

    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    op.batch_execute(
        "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')",
    )
    .await
    .unwrap();
    synchro_server::publish::publish(&mut op).await.unwrap();
    drain(&mut worker).await;
    let r = env
        .admin
        .query_one(
            "SELECT table_id, (SELECT count(*) FROM synchro.projection_rows) FROM synchro.relations",
            &[],
        )
        .await
        .unwrap();
    let (new_id, rows): (String, i64) = (r.get(0), r.get(1));
    assert_ne!(new_id, old_id, "a new table ID");
    assert_eq!(rows, 2);
}

#[tokio::test]
async fn a_publish_while_a_reconfiguration_is_staged_builds_on_its_shape() {
    let env = Env::installed().await;
    docs(&env).await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    env.as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    let mut op = env.login("synchro_dev_operator").await;
    let plan = reconfigure(&mut op, &request("docs"), true).await.unwrap();
    assert_eq!(plan.to_json()["class"], "class_2");
    // Capture has not reached the stage yet; another change is published meanwhile.
    synchro_server::registry::declare_index(
        &op,
        "app",
        "docs",
        "docs_by_team",
        &["team".into()],
        false,
    )
    .await
    .unwrap();
    let outcome = synchro_server::publish::publish(&mut op).await.unwrap();
    assert!(
        format!("{outcome:?}").contains("class_2"),
        "the staged field is kept, not removed: {outcome:?}"
    );
    drain(&mut worker).await;
    let lineage = synchro_server::publish::load_serving_lineage(&op)
        .await
        .unwrap();
    let current = lineage.current().unwrap();
    assert_eq!(current.schema_version, 3);
    assert!(current.tables[0].fields.iter().any(|f| f.name == "note"));
    assert_eq!(current.tables[0].indexes.len(), 1);
}

/// A fresh connection's value of a setting (new sessions read the reloaded configuration).
async fn setting(env: &Env, name: &str) -> String {
    env.login("postgres")
        .await
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn alter_system(env: &Env, sql: &str, name: &str, want: &str) {
    env.admin.batch_execute(sql).await.unwrap();
    env.admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    for _ in 0..500 {
        if setting(env, name).await == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{name} never became {want}");
}

/// Logical decoding hands out a transaction once its commit record is flushed, which is
/// before the committing backend leaves the process array: for a moment its writes are not
/// visible to the worker's queries. Held there by a synchronous-replication wait (for a
/// standby that does not exist), the stage transaction is decoded while its generation is
/// not visible yet; the activation must wait for it, not skip it (a skipped activation left
/// the generation 'staged' forever).
#[tokio::test]
async fn a_stage_decoded_before_its_commit_is_visible_is_still_activated() {
    let env = Env::installed().await;
    // Only the stage's session waits for the standby: every other session commits locally.
    env.admin
        .batch_execute("SET synchronous_commit = local")
        .await
        .unwrap();
    alter_system(
        &env,
        "ALTER SYSTEM SET synchronous_commit = local",
        "synchronous_commit",
        "local",
    )
    .await;
    docs(&env).await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let mut worker = Worker::connect(&url).await.unwrap();
    drain(&mut worker).await;
    env.as_app_owner("ALTER TABLE app.docs ADD COLUMN note text")
        .await;
    alter_system(
        &env,
        "ALTER SYSTEM SET synchronous_standby_names = 'synchro_test_absent_standby'",
        "synchronous_standby_names",
        "synchro_test_absent_standby",
    )
    .await;

    let mut op = env.login("synchro_dev_operator").await;
    op.batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    let stage = tokio::spawn(async move {
        reconfigure(&mut op, &request("docs"), true).await.unwrap();
    });
    // The stage's commit is flushed and waits for the standby, not yet visible.
    let mut waiting = false;
    for _ in 0..1000 {
        waiting = env
            .admin
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .await
            .unwrap()
            .is_some();
        if waiting {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(waiting, "the stage's commit never waited for the standby");
    let visible: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.registry_generations WHERE change = 'reconfiguration'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(visible, 0, "the stage is not visible yet");

    // The wait ends (the standby requirement goes) while the worker steps.
    let release = {
        let admin = env.login("postgres").await;
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            admin
                .batch_execute("SET synchronous_commit = local")
                .await
                .unwrap();
            admin
                .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
                .await
                .unwrap();
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
        })
    };
    drain(&mut worker).await;
    release.await.unwrap();
    stage.await.unwrap();
    drain(&mut worker).await;
    let state: String = env
        .admin
        .query_one(
            "SELECT state FROM synchro.registry_generations WHERE change = 'reconfiguration'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "active");
}

#[tokio::test]
async fn a_table_recreated_with_other_column_types_registers_again_after_its_retirement() {
    use synchro_server::registry::{register, retire, RegisterRequest};
    let env = Env::installed().await;
    docs(&env).await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;
    // The old rule reads the old projection view; it stays (the operator replaces it later).
    env.as_app_owner(
        "DROP TABLE app.docs CASCADE;
         CREATE TABLE app.docs (id text PRIMARY KEY, owner text NOT NULL, team integer, title text);
         INSERT INTO app.docs VALUES ('a', 'alice', 1, 'again'), ('b', 'bob', NULL, 'again')",
    )
    .await;
    let mut op = env.login("synchro_dev_operator").await;
    retire(&mut op, "app", "docs").await.unwrap();
    drain(&mut worker).await;
    // The view of the retired relation had `id bigint` and `team text`: the new one has other
    // types, so it cannot be a replacement of the old view.
    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.doc_scopes_v2(p_id text) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes_v2(text) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes_v2(text) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes_v2(text)');",
    )
    .await
    .unwrap();
    synchro_server::publish::publish(&mut op).await.unwrap();
    drain(&mut worker).await;
    let edges: Vec<(String, String)> = env
        .admin
        .query(
            "SELECT scope_id, pk FROM synchro.membership_edges ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        edges,
        [
            ("user:alice".to_owned(), "\"a\"".to_owned()),
            ("user:bob".to_owned(), "\"b\"".to_owned())
        ]
    );
    // The new view has the new types; the old rule still reads the retired one (no rows).
    let types: Vec<String> = env
        .admin
        .query(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
              WHERE a.attrelid = 'synchro_projection.\"app.docs\"'::regclass AND a.attnum > 0
              ORDER BY a.attnum",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        types,
        ["text", "text", "integer", "text"],
        "the new table's own types"
    );
    let old_rule_rows: i64 = env
        .admin
        .query_one("SELECT count(*) FROM rules.doc_scopes(1)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(old_rule_rows, 0);
}

/// Until every relation is active and no generation is in flight (30 s at most; then the
/// state that did not settle, for the failure message).
async fn settled(env: &Env) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = env
            .admin
            .query_one(
                "SELECT (SELECT count(*) FROM synchro.relation_capture WHERE status <> 'active')
                      + (SELECT count(*) FROM synchro.registry_generations WHERE state IN ('pending', 'staged'))
                      + (SELECT count(*) FROM synchro.membership_functions WHERE NOT live),
                        jsonb_build_object(
                          'capture', (SELECT jsonb_agg(jsonb_build_object('status', status)) FROM synchro.relation_capture),
                          'generations', (SELECT jsonb_agg(jsonb_build_object('change', change, 'state', state))
                                            FROM synchro.registry_generations),
                          'blocked', (SELECT blocked_reason || '/' || blocked_detail FROM synchro.capture_state))::text",
                &[],
            )
            .await
            .unwrap();
        if r.get::<_, i64>(0) == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {}",
            r.get::<_, String>(1)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_table_recreated_retired_and_registered_again_while_the_worker_runs() {
    use synchro_server::registry::{register, retire, RegisterRequest};
    let env = Env::installed().await;
    docs(&env).await;
    let url = env.cluster.url("synchro_dev_worker", "app");
    let worker = tokio::spawn(synchro_server::capture::run_forever(
        url,
        std::time::Duration::from_millis(5),
    ));
    let mut op = env.login("synchro_dev_operator").await;
    synchro_server::publish::publish(&mut op).await.unwrap();
    // The worker's drift check may read the catalog between the drop and the retirement
    // and record its block just after the retirement committed (which then had nothing to
    // lift); and the same name names two relations until the retirement is activated.
    // Each round at another offset from the worker's steps.
    for round in 0..4u64 {
        settled(&env).await;
        env.as_app_owner(
            "DROP TABLE app.docs CASCADE;
             CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text NOT NULL, title text);
             INSERT INTO app.docs SELECT g, 'alice', 'red', 'x' FROM generate_series(1, 5000) g",
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(7 * round)).await;
        retire(&mut op, "app", "docs").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(3 * round)).await;
        register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
            .await
            .unwrap();
        op.batch_execute(
            "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')",
        )
        .await
        .unwrap();
        synchro_server::publish::publish(&mut op).await.unwrap();
    }
    settled(&env).await;
    worker.abort();
    // One relation, the last registered, with its rule live over every row.
    let r = env
        .admin
        .query_one(
            "SELECT (SELECT count(*) FROM synchro.relations),
                    (SELECT count(*) FROM synchro.projection_rows),
                    (SELECT count(DISTINCT pk) FROM synchro.membership_edges)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)),
        (1, 5000, 5000)
    );
    // The retired relations' key indexes went with the registrations after them; the last
    // retired one's (activated after the last registration, or before) goes with the next.
    let partial = || async {
        env.admin
            .query_one(
                "SELECT count(*) FROM pg_index WHERE indrelid = 'synchro.projection_rows'::regclass
                    AND indpred IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert!((1..=2).contains(&partial().await));
    env.admin
        .batch_execute("SELECT synchro.synchro_drop_orphaned_projection_indexes()")
        .await
        .unwrap();
    assert_eq!(partial().await, 1);
    let live_key_index: bool = env
        .admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_class c, synchro.relations r
                             WHERE c.relname = 'projection_key_' || md5(r.relation_id))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(live_key_index, "the live relation's key index stays");
}
