//! Dependency relations and impact functions: a change to a capture_dependency row (a
//! project's team) moves every dependent synced row (its tasks) between scopes, in the same
//! materialization transaction; a bad impact function blocks capture instead of being
//! treated as "nothing affected".

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::Env;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};

struct Setup {
    env: Env,
    worker: Worker,
    tasks_table: String,
}

async fn setup() -> Setup {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.projects (id text PRIMARY KEY, team text);
         CREATE TABLE app.tasks (id bigint PRIMARY KEY, project_id text NOT NULL, title text);
         INSERT INTO app.projects VALUES ('p0', 'gold');
         INSERT INTO app.tasks VALUES (0, 'p0', 'existed before capture')",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    register(
        &op,
        &RegisterRequest {
            kind: "capture_dependency".into(),
            ..RegisterRequest::synced("app", "projects", "single_scope")
        },
    )
    .await
    .unwrap();
    let tasks = register(&op, &RegisterRequest::synced("app", "tasks", "multi_scope"))
        .await
        .unwrap();
    let tasks_table = tasks["table_id"].as_str().unwrap().to_owned();
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.task_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'team:' || p.team FROM synchro_projection.\"app.tasks\" t
             JOIN synchro_projection.\"app.projects\" p ON p.id = t.project_id
            WHERE t.id = p_id AND p.team IS NOT NULL;
         END;
         REVOKE EXECUTE ON FUNCTION rules.task_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.task_scopes(bigint) TO synchro_worker;
         CREATE FUNCTION rules.project_impact(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{tasks_table}', 'int64', t.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"app.tasks\" t
            WHERE t.project_id IN (p_old ->> 'id', p_new ->> 'id');
         END;
         REVOKE EXECUTE ON FUNCTION rules.project_impact(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.project_impact(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('app', 'tasks', 'app', 'projects',
                                                         'rules.project_impact(jsonb,jsonb)', 50);
         SELECT synchro.synchro_register_membership_function('app', 'tasks', 'rules.task_scopes(bigint)');"
    ))
    .await
    .unwrap();
    let worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    Setup {
        env,
        worker,
        tasks_table,
    }
}

/// Steps until caught up or blocked (waiting for a dropped leader's lock to go).
async fn drain(worker: &mut Worker) -> StepOutcome {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(0) => return StepOutcome::Applied(0),
            StepOutcome::Applied(_) => {}
            StepOutcome::NotLeader if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

/// scope -> task keys, from the edges.
async fn edges(env: &Env) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in env
        .admin
        .query("SELECT scope_id, pk FROM synchro.membership_edges", &[])
        .await
        .unwrap()
    {
        out.entry(r.get(0)).or_default().insert(r.get(1));
    }
    out
}

/// What the membership rule says from the source tables directly.
async fn expected(env: &Env) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in env
        .admin
        .query(
            "SELECT 'team:' || p.team, '\"' || t.id || '\"' FROM app.tasks t JOIN app.projects p ON p.id = t.project_id
              WHERE p.team IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
    {
        out.entry(r.get(0)).or_default().insert(r.get(1));
    }
    out
}

async fn effects_since(env: &Env, after: i64) -> Vec<(String, String, String)> {
    env.admin
        .query(
            "SELECT scope_id, kind, pk FROM synchro.scope_effects WHERE position > $1 ORDER BY position",
            &[&after],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn watermark(env: &Env) -> i64 {
    env.admin
        .query_one(
            "SELECT coalesce(max(position), 0) FROM synchro.scope_effects",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn pending(env: &Env) -> bool {
    env.admin
        .query_one(
            "SELECT pending_function_oid IS NOT NULL FROM synchro.membership_functions",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn health(env: &Env, check: &str) -> String {
    env.admin
        .query_one("SELECT synchro.synchro_health_detail() ->> $1", &[&check])
        .await
        .unwrap()
        .get(0)
}

fn e(scope: &str, kind: &str, pk: &str) -> (String, String, String) {
    (scope.into(), kind.into(), pk.into())
}

#[tokio::test]
async fn a_dependency_change_moves_every_dependent_row_between_scopes() {
    let mut s = setup().await;
    // Declaring the dependency staged the live rule again; the worker activates it.
    assert!(pending(&s.env).await);
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert!(!pending(&s.env).await);
    assert_eq!(health(&s.env, "membership_dependencies").await, "ok");
    // Rows that existed before capture: both relations bootstrapped, membership joined.
    assert_eq!(edges(&s.env).await, expected(&s.env).await);
    assert!(edges(&s.env).await.contains_key("team:gold"));

    s.env
        .admin
        .batch_execute(
            "INSERT INTO app.projects VALUES ('p1', 'red'), ('p2', 'blue');
             INSERT INTO app.tasks VALUES (1, 'p1', 'a'), (2, 'p1', 'b'), (3, 'p2', 'c');",
        )
        .await
        .unwrap();
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(edges(&s.env).await, expected(&s.env).await);

    // Only the project changes: both of its tasks leave red and enter green.
    let w = watermark(&s.env).await;
    s.env
        .admin
        .batch_execute("UPDATE app.projects SET team = 'green' WHERE id = 'p1'")
        .await
        .unwrap();
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(
        effects_since(&s.env, w).await,
        [
            e("team:red", "delete", "\"1\""),
            e("team:green", "upsert", "\"1\""),
            e("team:red", "delete", "\"2\""),
            e("team:green", "upsert", "\"2\""),
        ]
    );
    assert_eq!(edges(&s.env).await, expected(&s.env).await);

    // Deleting the project removes its task from every scope (old state covered).
    let w = watermark(&s.env).await;
    s.env
        .admin
        .batch_execute("DELETE FROM app.projects WHERE id = 'p2'")
        .await
        .unwrap();
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(
        effects_since(&s.env, w).await,
        [e("team:blue", "delete", "\"3\"")]
    );
    // And re-creating it brings the task back.
    s.env
        .admin
        .batch_execute("INSERT INTO app.projects VALUES ('p2', 'red')")
        .await
        .unwrap();
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(edges(&s.env).await, expected(&s.env).await);
    assert_eq!(
        edges(&s.env).await["team:red"],
        BTreeSet::from(["\"3\"".to_owned()])
    );

    // A dependency and its dependents changing in one transaction: evaluated once against
    // the transaction's final state.
    s.env
        .admin
        .batch_execute(
            "UPDATE app.tasks SET project_id = 'p2' WHERE id = 1;
             UPDATE app.projects SET team = 'violet' WHERE id = 'p2';",
        )
        .await
        .unwrap();
    assert_eq!(drain(&mut s.worker).await, StepOutcome::Applied(0));
    assert_eq!(edges(&s.env).await, expected(&s.env).await);

    // Without the declared dependency, readiness fails closed.
    s.env
        .admin
        .batch_execute("DELETE FROM synchro.membership_dependencies")
        .await
        .unwrap();
    assert_eq!(health(&s.env, "membership_dependencies").await, "failed");
}

async fn confirmed(env: &Env) -> String {
    env.admin
        .query_one("SELECT confirmed_lsn::text FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_bad_impact_result_blocks_capture_without_acknowledging() {
    let Setup {
        env,
        mut worker,
        tasks_table,
    } = setup().await;
    assert_eq!(drain(&mut worker).await, StepOutcome::Applied(0));
    drop(worker);
    let op = env.login("synchro_dev_operator").await;
    // Names a row of another table: never silently ignored.
    op.batch_execute(
        "CREATE FUNCTION rules.wrong_impact(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT ROW('tbl_not_the_target', 'int64', '1')::synchro.synchro_row_ref; END;
         REVOKE EXECUTE ON FUNCTION rules.wrong_impact(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.wrong_impact(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('app', 'tasks', 'app', 'projects',
                                                         'rules.wrong_impact(jsonb,jsonb)', 50);",
    )
    .await
    .unwrap();
    let before = confirmed(&env).await;
    env.admin
        .batch_execute("UPDATE app.projects SET team = 'x' WHERE id = 'p0'")
        .await
        .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    assert_eq!(
        drain(&mut worker).await,
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    assert_eq!(confirmed(&env).await, before, "nothing acknowledged");
    assert_eq!(
        edges(&env).await["team:gold"],
        BTreeSet::from(["\"0\"".to_owned()])
    );
    drop(worker);

    // Too many rows for one event is a failure too, not a truncation.
    env.admin
        .batch_execute("UPDATE synchro.capture_state SET blocked_reason = NULL, blocked_at = NULL")
        .await
        .unwrap();
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.wide_impact(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT ROW('{tasks_table}', 'int64', g::text)::synchro.synchro_row_ref
                        FROM generate_series(1, 3) g; END;
         REVOKE EXECUTE ON FUNCTION rules.wide_impact(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.wide_impact(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('app', 'tasks', 'app', 'projects',
                                                         'rules.wide_impact(jsonb,jsonb)', 2);"
    ))
    .await
    .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    assert_eq!(
        drain(&mut worker).await,
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    assert_eq!(confirmed(&env).await, before);
    drop(worker);

    // With a correct function again, the same change applies.
    env.admin
        .batch_execute("UPDATE synchro.capture_state SET blocked_reason = NULL, blocked_at = NULL")
        .await
        .unwrap();
    op.batch_execute(
        "SELECT synchro.synchro_register_impact_function('app', 'tasks', 'app', 'projects',
                                                         'rules.project_impact(jsonb,jsonb)', 50)",
    )
    .await
    .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    assert_eq!(drain(&mut worker).await, StepOutcome::Applied(0));
    assert_eq!(edges(&env).await, expected(&env).await);
    assert!(edges(&env).await.contains_key("team:x"));
}

/// An impact function replaced in place (CREATE OR REPLACE, same signature) is not
/// evaluated until registered again: the next dependency change blocks capture with
/// `scope_evaluation_failed` / `definition_changed`, nothing is acknowledged, and
/// re-registering it lets the same change apply (it used to apply the new body silently).
#[tokio::test]
async fn an_impact_function_replaced_in_place_blocks_until_registered_again() {
    let Setup {
        env,
        mut worker,
        tasks_table,
    } = setup().await;
    assert_eq!(drain(&mut worker).await, StepOutcome::Applied(0));
    let op = env.login("synchro_dev_operator").await;
    // The same behaviour, another body: only the definition changed.
    op.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION rules.project_impact(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{tasks_table}', 'int64', t.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"app.tasks\" t
            WHERE t.project_id = p_old ->> 'id' OR t.project_id = p_new ->> 'id';
         END;"
    ))
    .await
    .unwrap();
    let before = confirmed(&env).await;
    env.admin
        .batch_execute("UPDATE app.projects SET team = 'y' WHERE id = 'p0'")
        .await
        .unwrap();
    assert_eq!(
        drain(&mut worker).await,
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    let detail: String = env
        .admin
        .query_one("SELECT blocked_detail FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "definition_changed");
    assert_eq!(confirmed(&env).await, before, "nothing acknowledged");
    op.batch_execute(
        "SELECT synchro.synchro_register_impact_function('app', 'tasks', 'app', 'projects',
                                                         'rules.project_impact(jsonb,jsonb)', 50);
         SELECT synchro.synchro_capture_unblock();",
    )
    .await
    .unwrap();
    assert_eq!(drain(&mut worker).await, StepOutcome::Applied(0));
    assert_eq!(edges(&env).await, expected(&env).await);
    assert!(edges(&env).await.contains_key("team:y"));
}

#[tokio::test]
async fn a_self_impact_re_evaluates_sibling_rows() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, grp text NOT NULL, flag boolean NOT NULL)",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let items = register(&op, &RegisterRequest::synced("app", "items", "multi_scope"))
        .await
        .unwrap();
    let table = items["table_id"].as_str().unwrap().to_owned();
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    // A row is in its group's scope while any row of the group is flagged.
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'grp:' || i.grp FROM synchro_projection.\"app.items\" i
            WHERE i.id = p_id
              AND EXISTS (SELECT 1 FROM synchro_projection.\"app.items\" s WHERE s.grp = i.grp AND s.flag);
         END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');
         CREATE FUNCTION rules.siblings(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{table}', 'int64', s.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"app.items\" s
            WHERE s.grp IN (p_old ->> 'grp', p_new ->> 'grp');
         END;
         REVOKE EXECUTE ON FUNCTION rules.siblings(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.siblings(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('app', 'items', 'app', 'items',
                                                         'rules.siblings(jsonb,jsonb)', 50);"
    ))
    .await
    .unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    for sql in [
        "INSERT INTO app.items VALUES (1, 'a', false), (2, 'a', false), (3, 'a', false), (4, 'b', false)",
        // One flag brings every sibling in.
        "UPDATE app.items SET flag = true WHERE id = 1",
        // A sibling moves to another group: it leaves a, and b is still unflagged.
        "UPDATE app.items SET grp = 'b' WHERE id = 2",
        // Flagging in b brings both b rows in; unflagging a takes a's rows out.
        "UPDATE app.items SET flag = true WHERE id = 4; UPDATE app.items SET flag = false WHERE id = 1",
        "DELETE FROM app.items WHERE id = 4",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
        assert_eq!(drain(&mut worker).await, StepOutcome::Applied(0), "{sql}");
        let mut want: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for r in env
            .admin
            .query(
                "SELECT 'grp:' || i.grp, '\"' || i.id || '\"' FROM app.items i
                  WHERE EXISTS (SELECT 1 FROM app.items s WHERE s.grp = i.grp AND s.flag)",
                &[],
            )
            .await
            .unwrap()
        {
            want.entry(r.get(0)).or_default().insert(r.get(1));
        }
        assert_eq!(edges(&env).await, want, "after {sql}");
    }
}

#[tokio::test]
async fn a_rule_reading_an_undeclared_projection_is_refused_at_registration() {
    let s = setup().await;
    s.env
        .as_app_owner("CREATE TABLE app.notes (id bigint PRIMARY KEY, project_id text NOT NULL)")
        .await;
    let op = s.env.login("synchro_dev_operator").await;
    let notes = register(&op, &RegisterRequest::synced("app", "notes", "multi_scope"))
        .await
        .unwrap();
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.note_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'team:' || p.team FROM synchro_projection.\"app.notes\" n
             JOIN synchro_projection.\"app.projects\" p ON p.id = n.project_id
            WHERE n.id = p_id AND p.team IS NOT NULL;
         END;
         CREATE FUNCTION rules.project_notes(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{}', 'int64', n.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"app.notes\" n WHERE n.project_id IN (p_old ->> 'id', p_new ->> 'id');
         END;
         REVOKE EXECUTE ON FUNCTION rules.note_scopes(bigint), rules.project_notes(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.note_scopes(bigint), rules.project_notes(jsonb, jsonb) TO synchro_worker;",
        notes["table_id"].as_str().unwrap()
    ))
    .await
    .unwrap();
    let register_rule =
        "SELECT synchro.synchro_register_membership_function('app', 'notes', 'rules.note_scopes(bigint)')";
    // It reads projects, whose changes nothing would re-evaluate it for: refused (readiness
    // used to be the only one to notice), naming the dependency to declare first.
    let err = op.batch_execute(register_rule).await.unwrap_err();
    let detail: serde_json::Value =
        serde_json::from_str(err.as_db_error().unwrap().detail().unwrap()).unwrap();
    assert_eq!(
        detail["error"]["reason"], "undeclared_dependency",
        "{detail}"
    );
    assert_eq!(detail["error"]["dependency"], "app.projects", "{detail}");
    let registered: i64 = s
        .env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.membership_functions m JOIN synchro.relations r USING (relation_id)
              WHERE r.physical_relation = 'notes'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0);
    // Declared with its impact function first, the same rule registers.
    op.batch_execute(&format!(
        "SELECT synchro.synchro_register_impact_function('app', 'notes', 'app', 'projects',
                                                         'rules.project_notes(jsonb,jsonb)', 50);
         {register_rule}"
    ))
    .await
    .unwrap();
    assert_eq!(health(&s.env, "membership_dependencies").await, "ok");
}
