//! Membership evaluated by the capture worker against the transaction's final projected
//! state: rows enter and leave scopes, and every change becomes a per-scope effect in
//! commit order.

mod common;

use common::{sqlstate, Env};
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::registry::{register, RegisterRequest};

async fn setup() -> (Env, Worker) {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text)",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id
           UNION SELECT 'team:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id AND team IS NOT NULL;
         END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');",
    )
    .await
    .unwrap();
    let worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    (env, worker)
}

/// Steps until a step applies nothing or capture blocks (waiting up to 20 s for leadership);
/// returns that step's outcome.
/// Steps until the worker blocks (or anything but applying or waiting for the lead), for at
/// most 20 s; then the last outcome. A step that applied nothing does not end the wait: the
/// transaction a test just committed may not have reached the stream yet (seen on a loaded
/// machine, where the first step after the commit applied nothing).
async fn step_until_blocked(worker: &mut Worker) -> StepOutcome {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::NotLeader | StepOutcome::Applied(0)
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            StepOutcome::Applied(n) if n > 0 => {}
            other => return other,
        }
    }
}

async fn drain(worker: &mut Worker) {
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
}

/// `(scope, kind, pk)` effects in position order.
async fn effects(env: &Env) -> Vec<(String, String, String)> {
    env.admin
        .query(
            "SELECT scope_id, kind, pk FROM synchro.scope_effects ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn e(scope: &str, kind: &str, pk: &str) -> (String, String, String) {
    (scope.into(), kind.into(), pk.into())
}

#[tokio::test]
async fn rows_enter_move_between_and_leave_scopes() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red')")
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(
        effects(&env).await,
        [
            e("team:red", "upsert", "\"1\""),
            e("user:alice", "upsert", "\"1\"")
        ]
    );

    // Moving teams leaves red and enters blue in one transaction's effects.
    env.admin
        .batch_execute("UPDATE app.docs SET team = 'blue' WHERE id = 1")
        .await
        .unwrap();
    // (Applied before the next transaction commits: consecutive transactions the stream
    // holds at once are materialized together, from their final state.)
    drain(&mut worker).await;
    // Two changes of one row in one transaction: membership follows the final state only.
    env.admin
        .batch_execute("BEGIN; UPDATE app.docs SET owner = 'bob' WHERE id = 1; UPDATE app.docs SET owner = 'carol' WHERE id = 1; COMMIT;")
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(
        effects(&env).await[2..],
        [
            e("team:red", "delete", "\"1\""),
            e("team:blue", "upsert", "\"1\""),
            e("user:alice", "upsert", "\"1\""),
            e("user:alice", "delete", "\"1\""),
            e("team:blue", "upsert", "\"1\""),
            e("user:carol", "upsert", "\"1\""),
        ]
    );
    // Deleting leaves every scope; no edge remains.
    env.admin
        .batch_execute("DELETE FROM app.docs WHERE id = 1")
        .await
        .unwrap();
    drain(&mut worker).await;
    let all = effects(&env).await;
    assert_eq!(
        all[8..],
        [
            e("team:blue", "delete", "\"1\""),
            e("user:carol", "delete", "\"1\"")
        ]
    );
    let edges: i64 = env
        .admin
        .query_one("SELECT count(*) FROM synchro.membership_edges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(edges, 0);
}

/// Transactions materialized together follow their final state: a row that passed
/// through a scope within the batch leaves no effect there, and each row's effects carry
/// the version of its last change.
#[tokio::test]
async fn a_batch_of_transactions_yields_the_effects_of_its_final_state() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red'), (2, 'bob', NULL)")
        .await
        .unwrap();
    drain(&mut worker).await;
    let start = effects(&env).await.len();
    for sql in [
        "UPDATE app.docs SET team = 'blue' WHERE id = 1",
        "UPDATE app.docs SET team = 'green' WHERE id = 1",
        "INSERT INTO app.docs VALUES (3, 'carol', 'blue')",
        "DELETE FROM app.docs WHERE id = 3",
        "UPDATE app.docs SET owner = 'dave' WHERE id = 2",
    ] {
        env.admin.batch_execute(sql).await.unwrap();
    }
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(5)
    );
    assert_eq!(
        effects(&env).await[start..],
        [
            e("team:red", "delete", "\"1\""),
            e("team:green", "upsert", "\"1\""),
            e("user:alice", "upsert", "\"1\""),
            e("user:bob", "delete", "\"2\""),
            e("user:dave", "upsert", "\"2\""),
        ]
    );
    // Each effect is at its row's current version (the last change's).
    let stale: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM synchro.scope_effects e JOIN synchro.projection_rows p USING (relation_id, pk)
              WHERE e.kind = 'upsert' AND e.server_version <> p.server_version
                AND e.position > (SELECT min(position) FROM synchro.scope_effects WHERE scope_id = 'team:red' AND kind = 'delete')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, 0);
}

#[tokio::test]
async fn membership_functions_are_validated_and_cannot_read_live_tables() {
    let (env, _) = setup().await;
    let op = env.login("synchro_dev_operator").await;
    env.admin.batch_execute("GRANT USAGE ON SCHEMA app TO synchro_dev_operator; GRANT SELECT ON app.docs TO synchro_dev_operator").await.unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.same(a text, b text) RETURNS boolean LANGUAGE sql STABLE BEGIN ATOMIC SELECT a = b; END;
         CREATE OPERATOR rules.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = rules.same)",
    )
    .await
    .unwrap();
    for (name, body, want) in [
        ("live", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT owner FROM app.docs WHERE id = p_id; END", "undeclared_dependency"),
        ("wrong_key", "(p_id integer) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'x'; END", "invalid_scope_function"),
        ("volatile", "(p_id bigint) RETURNS SETOF text LANGUAGE sql VOLATILE BEGIN ATOMIC SELECT 'x'; END", "invalid_scope_function"),
        // A STABLE rule calling what reads the session, the clock or anything but its
        // arguments (any pg_catalog function used to pass): not deterministic.
        ("random", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'team:' || random()::text; END", "nondeterministic_function"),
        ("setting", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT current_setting('application_name'); END", "nondeterministic_function"),
        ("clock", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'day:' || now()::date::text; END", "nondeterministic_function"),
        ("xml", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT query_to_xml('SELECT 1', true, false, '')::text; END", "nondeterministic_function"),
        ("set_role", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT set_config('role', 'synchro_owner', true); END", "nondeterministic_function"),
        ("whoami", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'user:' || current_user; END", "nondeterministic_function"),
        // An operator whose function is outside pg_catalog (the dependency recorded is on
        // the operator, not on its function).
        ("operator", "(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'x' WHERE 'a' OPERATOR(rules.===) 'b'; END", "undeclared_dependency"),
    ] {
        op.batch_execute(&format!(
            "CREATE FUNCTION rules.{name}{body}; REVOKE EXECUTE ON FUNCTION rules.{name} FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION rules.{name} TO synchro_worker;"
        ))
        .await
        .unwrap();
        let err = op
            .execute("SELECT synchro.synchro_register_membership_function('app', 'docs', $1)", &[&format!("rules.{name}({})", if name == "wrong_key" { "integer" } else { "bigint" })])
            .await
            .map(|_| format!("{name} was registered"))
            .unwrap_err();
        let detail = err.as_db_error().and_then(|d| d.detail()).unwrap_or("").to_owned();
        assert!(detail.contains(want), "{name}: {detail}");
    }
    // The worker evaluates as the owner: an owner that cannot read the projection view it
    // reads is refused at registration.
    env.admin
        .batch_execute(
            "GRANT nobody TO synchro_dev_operator; GRANT USAGE, CREATE ON SCHEMA rules TO nobody",
        )
        .await
        .unwrap();
    op.batch_execute(
        "CREATE FUNCTION rules.foreign_owner(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.foreign_owner(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.foreign_owner(bigint) TO synchro_worker;
         ALTER FUNCTION rules.foreign_owner(bigint) OWNER TO nobody;",
    )
    .await
    .unwrap();
    let err = op
        .execute(
            "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.foreign_owner(bigint)')",
            &[],
        )
        .await
        .unwrap_err();
    let detail = err
        .as_db_error()
        .and_then(|d| d.detail())
        .unwrap_or("")
        .to_owned();
    assert!(detail.contains("invalid_scope_function"), "{detail}");
    assert!(
        detail.contains(r#""missing_grant": "GRANT synchro_operator TO nobody""#),
        "{detail}"
    );

    // Each refusal says what is wrong and, for a privilege, the statement that grants it.
    let refusal = |sql: String| {
        let op = &op;
        async move {
            let err = op.batch_execute(&sql).await.unwrap_err();
            let detail = err
                .as_db_error()
                .and_then(|d| d.detail())
                .unwrap()
                .to_owned();
            serde_json::from_str::<serde_json::Value>(&detail).unwrap()["error"].clone()
        }
    };
    env.admin
        .batch_execute("CREATE SCHEMA rules2 AUTHORIZATION synchro_dev_operator")
        .await
        .unwrap();
    op.batch_execute(&create_rule("scoped", "'user:' || owner", "").replace("rules.", "rules2."))
        .await
        .unwrap();
    let register_scoped = register_rule("scoped").replace("rules.", "rules2.");
    let e = refusal(register_scoped.clone()).await;
    assert_eq!(e["reason"], "invalid_scope_function", "{e}");
    assert_eq!(e["problem"], "schema_not_usable", "{e}");
    assert_eq!(
        e["missing_grant"],
        "GRANT USAGE ON SCHEMA rules2 TO synchro_owner, synchro_worker"
    );
    env.admin
        .batch_execute("GRANT USAGE ON SCHEMA rules2 TO synchro_owner")
        .await
        .unwrap();
    let e = refusal(register_scoped.clone()).await;
    assert_eq!(e["problem"], "worker_cannot_call", "{e}");
    assert_eq!(
        e["missing_grant"],
        "GRANT USAGE ON SCHEMA rules2 TO synchro_worker"
    );
    env.admin
        .batch_execute("GRANT USAGE ON SCHEMA rules2 TO synchro_worker")
        .await
        .unwrap();
    op.batch_execute("REVOKE EXECUTE ON FUNCTION rules2.scoped(bigint) FROM synchro_worker")
        .await
        .unwrap();
    let e = refusal(register_scoped.clone()).await;
    assert_eq!(e["problem"], "worker_cannot_call", "{e}");
    assert_eq!(
        e["missing_grant"],
        "GRANT EXECUTE ON FUNCTION rules2.scoped(bigint) TO synchro_worker"
    );
    op.batch_execute("GRANT EXECUTE ON FUNCTION rules2.scoped(bigint) TO synchro_worker")
        .await
        .unwrap();
    op.batch_execute(&register_scoped).await.unwrap();
    for (name, problem) in [
        ("volatile", "not_stable"),
        ("live", "reads_outside_projection_views"),
    ] {
        let e = refusal(format!(
            "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.{name}(bigint)')"
        ))
        .await;
        assert_eq!(e["problem"], problem, "{name}: {e}");
    }
    let e = refusal(
        "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.wrong_key(bigint)')"
            .into(),
    )
    .await;
    assert_eq!(
        (&e["problem"], &e["expected_arguments"]),
        (
            &serde_json::json!("not_found"),
            &serde_json::json!(["bigint"])
        ),
        "{e}"
    );

    // Projection views are readable by the operator and the worker only.
    let adapter = env.login("synchro_dev_adapter").await;
    assert_eq!(
        sqlstate(&adapter, "SELECT * FROM synchro_projection.\"app.docs\"").await,
        "42501"
    );
    assert_eq!(
        sqlstate(&op, "SELECT * FROM synchro_projection.\"app.docs\"").await,
        "ok"
    );
}

/// SQL creating `rules.<name>(bigint)`, a membership rule over app.docs that returns
/// `scope` for the row (`condition` narrows it), executable by the worker only.
fn create_rule(name: &str, scope: &str, condition: &str) -> String {
    format!(
        "CREATE FUNCTION rules.{name}(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT {scope} FROM synchro_projection.\"app.docs\" WHERE id = p_id{condition}; END;
         REVOKE EXECUTE ON FUNCTION rules.{name}(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.{name}(bigint) TO synchro_worker;"
    )
}

/// SQL registering `rules.<name>(bigint)` as app.docs' membership rule.
fn register_rule(name: &str) -> String {
    format!("SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.{name}(bigint)');")
}

/// scope -> membership generation.
async fn generations(env: &Env) -> std::collections::BTreeMap<String, i64> {
    env.admin
        .query(
            "SELECT scope_id, membership_generation FROM synchro.scope_retention",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn staged_through(env: &Env) -> Option<String> {
    env.admin
        .query_one(
            "SELECT staged_through FROM synchro.membership_functions",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// `(scope, pk)` live edges.
async fn edge_set(env: &Env) -> Vec<(String, String)> {
    env.admin
        .query(
            "SELECT scope_id, pk FROM synchro.membership_edges ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn a_changed_rule_is_staged_in_batches_then_activated_atomically() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (1, 'alice', 'red'), (2, 'bob', NULL), (3, 'alice', 'blue'),
                                         (4, 'bob', 'red'), (5, 'carol', 'green');",
        )
        .await
        .unwrap();
    drain(&mut worker).await;
    worker.set_staging_budget(std::time::Duration::ZERO);
    let generations_before = generations(&env).await;
    env.admin
        .batch_execute("UPDATE synchro.settings SET value = '2' WHERE key = 'backfill_batch_size'")
        .await
        .unwrap();
    let live_before = edge_set(&env).await;
    let effects_before = effects(&env).await.len();
    // The new rule drops team scopes.
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute(
        &(create_rule("owner_only", "'user:' || owner", "") + &register_rule("owner_only")),
    )
    .await
    .unwrap();
    // First batch: two rows staged; the live rule and its edges are untouched.
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(1)
    );
    assert_eq!(staged_through(&env).await.as_deref(), Some("\"2\""));
    assert_eq!(edge_set(&env).await, live_before);
    assert_eq!(effects(&env).await.len(), effects_before);
    // Writes during staging: to a staged row and to a row not staged yet.
    env.admin
        .batch_execute("UPDATE app.docs SET owner = 'dave' WHERE id = 1; UPDATE app.docs SET owner = 'erin' WHERE id = 4")
        .await
        .unwrap();
    // One staging batch and the writers' transaction.
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(2)
    );
    assert_eq!(staged_through(&env).await.as_deref(), Some("\"4\""));
    // The live rule (owner and team) still decides what clients see.
    assert!(edge_set(&env)
        .await
        .contains(&("team:red".into(), "\"1\"".into())));
    assert!(edge_set(&env)
        .await
        .contains(&("user:dave".into(), "\"1\"".into())));
    // Last batch: activation, in one transaction, as the new rule over the current rows.
    drain(&mut worker).await;
    assert_eq!(staged_through(&env).await, None);
    assert_eq!(
        edge_set(&env).await,
        [
            ("user:alice".to_owned(), "\"3\"".to_owned()),
            ("user:bob".to_owned(), "\"2\"".to_owned()),
            ("user:carol".to_owned(), "\"5\"".to_owned()),
            ("user:dave".to_owned(), "\"1\"".to_owned()),
            ("user:erin".to_owned(), "\"4\"".to_owned()),
        ]
    );
    let live: String = env
        .admin
        .query_one(
            "SELECT function_signature FROM synchro.membership_functions WHERE pending_function_oid IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, "rules.owner_only(bigint)");
    // Only the team scopes changed at activation: they alone get a new generation, and
    // activation's effects are exactly the removed edges (the owner changes were applied
    // under the live rule while staging ran).
    let after = generations(&env).await;
    let advanced: Vec<&String> = after
        .iter()
        .filter(|(scope, g)| **g != generations_before.get(*scope).copied().unwrap_or(1))
        .map(|(scope, _)| scope)
        .collect();
    assert_eq!(advanced, ["team:blue", "team:green", "team:red"]);
    assert!(after
        .iter()
        .all(|(s, g)| *g <= generations_before.get(s).copied().unwrap_or(1) + 1));
    let tail: Vec<_> = effects(&env)
        .await
        .into_iter()
        .skip(effects_before)
        .collect();
    assert!(tail.contains(&e("team:red", "delete", "\"4\"")), "{tail:?}");
    assert!(
        tail.contains(&e("user:erin", "upsert", "\"4\"")),
        "{tail:?}"
    );
    assert_eq!(
        tail.iter()
            .filter(|(s, k, _)| s.starts_with("team:") && k == "delete")
            .count(),
        4,
        "each team edge removed once: {tail:?}"
    );
    // Activated once: another step changes nothing.
    let n = effects(&env).await.len();
    drain(&mut worker).await;
    assert_eq!(effects(&env).await.len(), n);
}

#[tokio::test]
async fn membership_functions_run_as_their_owner_never_as_the_worker() {
    // (The rule tells its evaluating role by a privilege only the owner has: CURRENT_USER
    // is refused in a rule, which must not depend on the session.)
    let (env, mut worker) = setup().await;
    // The worker login is a member of no rule owner's role: it calls the rule's evaluator,
    // which runs as the owner (it used to SET ROLE to the owner, which needed that).
    env.admin
        .batch_execute("REVOKE synchro_dev_operator FROM synchro_dev_worker")
        .await
        .unwrap();
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute(
        "CREATE FUNCTION rules.whoami(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'user:' || owner || CASE WHEN pg_has_role('synchro_dev_operator', 'USAGE') THEN '@owner' ELSE '@other' END
                        FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.whoami(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.whoami(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.whoami(bigint)');",
    )
    .await
    .unwrap();
    drain(&mut worker).await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', NULL)")
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(
        edge_set(&env).await,
        [("user:alice@owner".to_owned(), "\"1\"".to_owned())]
    );
    let evaluator: String = env
        .admin
        .query_one(
            "SELECT evaluator_oid::regprocedure::text FROM synchro.rule_evaluators
              WHERE function_oid = 'rules.whoami(bigint)'::regprocedure",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Without EXECUTE on the evaluator, evaluation fails closed.
    op.batch_execute(&format!(
        "REVOKE EXECUTE ON FUNCTION {evaluator} FROM synchro_worker"
    ))
    .await
    .unwrap();
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (2, 'bob', NULL)")
        .await
        .unwrap();
    let outcome = step_until_blocked(&mut worker).await;
    assert_eq!(
        outcome,
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
}

/// An evaluator's name is predictable (`synchro_eval.m_<rule oid>`) and every operator may
/// create functions in `synchro_eval`: another operator who takes the name first, or an
/// owner who alters their own evaluator (another body, another result type), cannot stop
/// the rule: registering it again drops the squatter (it is not the rule owner's) and
/// replaces the evaluator, with no superuser and no DROP by hand.
#[tokio::test]
async fn an_evaluator_name_taken_or_altered_is_repaired_by_registering_again() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute(
            "CREATE ROLE squatter LOGIN; GRANT synchro_operator TO squatter;
             GRANT USAGE ON SCHEMA rules TO squatter;",
        )
        .await
        .unwrap();
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute(&create_rule("owner_only", "'user:' || owner", ""))
        .await
        .unwrap();
    let rule: u32 = env
        .admin
        .query_one("SELECT 'rules.owner_only(bigint)'::regprocedure::oid", &[])
        .await
        .unwrap()
        .get(0);
    let squatter = env.login("squatter").await;
    squatter
        .batch_execute(&format!(
            "CREATE FUNCTION synchro_eval.m_{rule}(p_key bigint) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC SELECT 'user:mallory'; END;
             CREATE FUNCTION synchro_eval.m_{rule}(p_key text) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC SELECT 'user:mallory'; END;"
        ))
        .await
        .unwrap();
    // Not the evaluator name of the rule given: refused, nothing dropped.
    assert_eq!(
        common::sqlstate(
            &op,
            &format!(
                "SELECT synchro.synchro_clear_evaluator_name('m_{}', {rule})",
                rule + 1
            )
        )
        .await,
        "22023"
    );
    op.batch_execute(&register_rule("owner_only"))
        .await
        .unwrap();
    let owners = || async {
        env.admin
            .query(
                &format!(
                    "SELECT p.oid::regprocedure::text || ' ' || pg_get_userbyid(p.proowner) FROM pg_proc p
                      WHERE p.pronamespace = 'synchro_eval'::regnamespace AND p.proname = 'm_{rule}'
                      ORDER BY 1"
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        owners().await,
        [format!(
            "synchro_eval.m_{rule}(bigint[]) synchro_dev_operator"
        )]
    );
    drain(&mut worker).await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', NULL)")
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(
        edge_set(&env).await,
        [("user:alice".to_owned(), "\"1\"".to_owned())]
    );

    // The owner alters the evaluator: capture blocks (pinned), registering again repairs it.
    for altered in [
        format!(
            "CREATE OR REPLACE FUNCTION synchro_eval.m_{rule}(p_keys bigint[])
             RETURNS TABLE (n bigint, scope text)
             LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
             BEGIN ATOMIC SELECT a.n, 'user:mallory' FROM unnest(p_keys) WITH ORDINALITY AS a(k, n); END"
        ),
        format!(
            "DROP FUNCTION synchro_eval.m_{rule}(bigint[]);
             CREATE FUNCTION synchro_eval.m_{rule}(p_keys bigint[]) RETURNS SETOF integer
             LANGUAGE sql STABLE BEGIN ATOMIC SELECT 1; END"
        ),
    ] {
        op.batch_execute(&altered).await.unwrap();
        env.admin
            .batch_execute("UPDATE app.docs SET owner = owner || 'x' WHERE id = 1")
            .await
            .unwrap();
        let outcome = step_until_blocked(&mut worker).await;
        assert!(
            matches!(outcome, StepOutcome::Blocked(_)),
            "{altered}: {outcome:?}"
        );
        op.batch_execute(&register_rule("owner_only"))
            .await
            .unwrap();
        op.batch_execute("SELECT synchro.synchro_capture_unblock()")
            .await
            .unwrap();
        drain(&mut worker).await;
        assert_eq!(
            owners().await,
            [format!(
                "synchro_eval.m_{rule}(bigint[]) synchro_dev_operator"
            )]
        );
    }
    assert_eq!(
        edge_set(&env).await,
        [("user:alicexx".to_owned(), "\"1\"".to_owned())]
    );

    // An evaluator made by hand and handed to the registration directly is checked: it may
    // only call the rule once per element of its batch (unnest, OFFSET '0'), nothing else.
    let body = |inner: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION synchro_eval.m_{rule}(p_keys bigint[])
             RETURNS TABLE (n bigint, scope text)
             LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
             BEGIN ATOMIC {inner}; END;
             SELECT synchro.synchro_register_membership_rule('app', 'docs', 'rules.owner_only(bigint)',
                 'synchro_eval.m_{rule}(bigint[])'::regprocedure);"
        )
    };
    let honest = "SELECT a.n, f.s FROM unnest(p_keys) WITH ORDINALITY AS a(k, n), \
                  LATERAL (SELECT s FROM rules.owner_only(a.k) AS s OFFSET '0') AS f";
    assert_eq!(common::sqlstate(&op, &body(honest)).await, "ok");
    for forged in [
        honest.replace("OFFSET '0'", "OFFSET '1'"),
        honest.replace("OFFSET '0'", "OFFSET 0"),
        honest.replace("SELECT a.n, f.s", "SELECT a.n, upper(f.s)"),
        honest.replace("SELECT a.n, f.s", "SELECT a.n, f.s || current_user"),
        honest.replace("SELECT a.n, f.s", "SELECT a.n, 'user:' || f.s"),
        honest.replace(
            "WITH ORDINALITY AS a(k, n)",
            "WITH ORDINALITY AS a(k, n), synchro_projection.\"app.docs\" AS d",
        ),
        honest.replace(
            "rules.owner_only(a.k)",
            "rules.owner_only((SELECT max(id) FROM synchro_projection.\"app.docs\"))",
        ),
    ] {
        let refused = op.batch_execute(&body(&forged)).await.unwrap_err();
        let detail = refused.as_db_error().and_then(|d| d.detail()).unwrap_or("");
        assert!(
            detail.contains("evaluator_altered"),
            "{forged}: {refused:?}"
        );
    }
}

/// A table retired, recreated and registered again while its retired registration waits
/// for capture has one projection: readiness compares the projections a rule reads by name, as
/// registration does, so neither registration's rule counts the other's (same) projection
/// as an undeclared dependency (readiness compared relation IDs and failed meanwhile).
#[tokio::test]
async fn a_table_registered_again_while_its_retirement_waits_reads_only_its_own_projection() {
    let (env, mut worker) = setup().await;
    drain(&mut worker).await;
    let check = || async {
        env.admin
            .query_one(
                "SELECT synchro.synchro_health_detail()->>'membership_dependencies',
                        (SELECT count(*) FROM synchro.relations WHERE physical_relation = 'docs')",
                &[],
            )
            .await
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .unwrap()
    };
    assert_eq!(check().await, ("ok".to_owned(), 1));
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute("SELECT synchro.synchro_retire_relation('app', 'docs')")
        .await
        .unwrap();
    // Published, the retirement is staged: it waits for capture to reach its boundary.
    let mut publisher = env.login("synchro_dev_operator").await;
    synchro_server::publish::publish(&mut publisher)
        .await
        .unwrap();
    // The table recreated (what a migration tool may do) and registered again.
    env.as_app_owner(
        "DROP TABLE app.docs;
         CREATE TABLE app.docs (id bigint PRIMARY KEY, owner text NOT NULL, team text)",
    )
    .await;
    register(&op, &RegisterRequest::synced("app", "docs", "multi_scope"))
        .await
        .unwrap();
    op.batch_execute(
        "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')",
    )
    .await
    .unwrap();
    // Both registrations exist until capture reaches the retirement.
    assert_eq!(check().await, ("ok".to_owned(), 2));
    drain(&mut worker).await;
    assert_eq!(check().await, ("ok".to_owned(), 1));
}

/// The health check of membership coverage and the relation IDs with uncovered rows.
async fn coverage(env: &Env) -> (String, serde_json::Value) {
    let row = env
        .admin
        .query_one(
            "SELECT synchro.synchro_health_detail()->>'membership_coverage',
                    (synchro.synchro_capture_report()->'membership_uncovered_rows')::text",
            &[],
        )
        .await
        .unwrap();
    (
        row.get(0),
        serde_json::from_str(&row.get::<_, String>(1)).unwrap(),
    )
}

/// Rows of app.docs (canonical key text) with no live edge.
async fn rows_without_edges(env: &Env) -> Vec<String> {
    env.admin
        .query(
            "SELECT p.pk FROM synchro.projection_rows p
              WHERE NOT EXISTS (SELECT 1 FROM synchro.membership_edges e
                                 WHERE e.relation_id = p.relation_id AND e.pk = p.pk)
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn a_re_registration_while_a_staging_batch_is_in_flight_never_leaves_a_row_without_edges() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute(
            "INSERT INTO app.docs SELECT i, 'user' || i, NULL FROM generate_series(1, 6) AS i;
             UPDATE synchro.settings SET value = '2' WHERE key = 'backfill_batch_size';",
        )
        .await
        .unwrap();
    drain(&mut worker).await;
    worker.set_staging_budget(std::time::Duration::ZERO);
    assert_eq!(coverage(&env).await.0, "ok");
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute(
        &(create_rule("owner_only", "'owner:' || owner", "") + &register_rule("owner_only")),
    )
    .await
    .unwrap();
    // The first batch is staged: rows 1 and 2.
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Applied(1)
    );
    assert_eq!(staged_through(&env).await.as_deref(), Some("\"2\""));
    // The operator re-registers the rule (its edit) in a transaction that commits only once
    // the worker's next batch (rows 3 and 4, staged under the state it loaded) waits on it.
    op.batch_execute(
        &(create_rule("owner_v2", "'owner:' || owner", " AND id <> 6")
            + "BEGIN;"
            + &register_rule("owner_v2")),
    )
    .await
    .unwrap();
    let commit_once_the_worker_waits = async {
        let started = std::time::Instant::now();
        loop {
            let waiting: i64 = env
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE usename = 'synchro_dev_worker' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "the worker never waited on the re-registration"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        op.batch_execute("COMMIT").await.unwrap();
    };
    let (stepped, ()) = tokio::join!(worker.step(Failpoint::None), commit_once_the_worker_waits);
    stepped.unwrap();
    // Staging restarts under the new rule and activates it over every row.
    drain(&mut worker).await;
    let live: String = env
        .admin
        .query_one(
            "SELECT function_signature FROM synchro.membership_functions WHERE pending_function_oid IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, "rules.owner_v2(bigint)");
    // Every row is where the new rule puts it: 1 to 5 with their owner, 6 in no scope.
    assert_eq!(
        edge_set(&env).await,
        (1..=5)
            .map(|i| (format!("owner:user{i}"), format!("\"{i}\"")))
            .collect::<Vec<_>>()
    );
    assert_eq!(rows_without_edges(&env).await, ["\"6\""]);
    // Row 6 is known to be in no scope: coverage holds.
    let (check, uncovered) = coverage(&env).await;
    assert_eq!(check, "ok", "{uncovered}");
    assert_eq!(uncovered, serde_json::json!({}));
    // A row whose edges are lost (as the race lost them) fails the check, named by relation,
    // once the worker counts (as it does when it starts leading).
    env.admin
        .batch_execute("DELETE FROM synchro.membership_edges WHERE pk = '\"3\"'")
        .await
        .unwrap();
    assert_eq!(
        coverage(&env).await.0,
        "ok",
        "recorded, not counted per probe"
    );
    let _worker = reconnect(&env, worker).await;
    let (check, uncovered) = coverage(&env).await;
    assert_eq!(check, "failed");
    let relation_id: String = env
        .admin
        .query_one("SELECT relation_id FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(uncovered, serde_json::json!({ relation_id: 1 }));
    let ready: bool = env
        .admin
        .query_one("SELECT synchro.synchro_readiness()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!ready);
}

/// The capture report's `blocked` object (null when not blocked).
async fn blocked(env: &Env) -> serde_json::Value {
    let text: String = env
        .admin
        .query_one(
            "SELECT (synchro.synchro_capture_report()->'blocked')::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    serde_json::from_str(&text).unwrap()
}

/// [`common::cli`] with the exit code as `Option` (none: killed by a signal).
fn cli(env: &Env, login: &str, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let (code, json) = common::cli(env, login, args);
    ((code >= 0).then_some(code), json)
}

/// Runs `synchro-server capture <args>` as the operator login, which must succeed; returns
/// its JSON output.
fn capture_cli(env: &Env, args: &[&str]) -> serde_json::Value {
    let (code, json) = cli(env, "synchro_dev_operator", &[&["capture"], args].concat());
    assert_eq!(code, Some(0), "{json}");
    json
}

/// A new worker in place of `worker` (its prepared evaluations gone), once it leads.
async fn reconnect(env: &Env, worker: Worker) -> Worker {
    drop(worker);
    loop {
        let mut next = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
            .await
            .unwrap();
        if next.step(Failpoint::None).await.ok() != Some(StepOutcome::NotLeader) {
            return next;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Registers rules.doc_scopes again (after it was replaced in place: the way out of
/// `definition_changed`; the rule is staged over every row again).
async fn reregister_rule(op: &tokio_postgres::Client) {
    op.batch_execute(
        "SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)')",
    )
    .await
    .unwrap();
}

/// Replaces rules.doc_scopes' body (its owner, the operator login, may) and registers it
/// again.
async fn replace_and_reregister_rule(op: &tokio_postgres::Client, team_expression: &str) {
    replace_rule(op, team_expression).await;
    reregister_rule(op).await;
}

/// Replaces rules.doc_scopes' body (its owner, the operator login, may).
async fn replace_rule(op: &tokio_postgres::Client, team_expression: &str) {
    op.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'user:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id
           UNION SELECT {team_expression} FROM synchro_projection.\"app.docs\" WHERE id = p_id AND team IS NOT NULL;
         END;"
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failing_live_rule_blocks_naming_its_relation_and_sqlstate_and_the_operator_unblocks_it()
{
    let (env, mut worker) = setup().await;
    let op = env.login("synchro_dev_operator").await;
    let relation_id: String = env
        .admin
        .query_one("SELECT relation_id FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);
    drain(&mut worker).await;
    // The rule divides by zero for team 'boom' (evaluated per row, at run time). Replaced in
    // place, it is not evaluated at all until registered again: a rule is pinned to the
    // definition it was registered (and staged) with, so CREATE OR REPLACE never silently
    // changes live membership (it used to apply at once, unstaged; issue 32).
    replace_rule(&op, "'team:' || (100 / (length(team) - 4))::text").await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red'), (2, 'bob', 'boom')")
        .await
        .unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    let block = blocked(&env).await;
    assert_eq!(
        (
            &block["relation_id"],
            &block["detail"],
            block.get("sqlstate")
        ),
        (
            &serde_json::json!(relation_id),
            &serde_json::json!("definition_changed"),
            None
        ),
        "{block}"
    );
    reregister_rule(&op).await;
    capture_cli(&env, &["unblock"]);
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    let block = blocked(&env).await;
    assert_eq!(block["relation_id"], relation_id.as_str(), "{block}");
    assert_eq!(block["detail"], "function_error", "{block}");
    assert_eq!(block["sqlstate"], "22012", "{block}");
    // Unblocked with the cause still there: it blocks again, the same way.
    let lifted = capture_cli(&env, &["unblock"]);
    assert_eq!(lifted["unblocked"]["sqlstate"], "22012", "{lifted}");
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    // Fixed in place, registered again and unblocked (the operator login, no superuser):
    // capture goes on.
    replace_and_reregister_rule(&op, "'team:' || team").await;
    assert_eq!(
        capture_cli(&env, &["unblock"])["unblocked"]["detail"],
        "function_error"
    );
    assert_eq!(
        capture_cli(&env, &["unblock"]),
        serde_json::json!({ "unblocked": null })
    );
    drain(&mut worker).await;
    assert_eq!(
        edge_set(&env).await,
        [
            ("team:boom".to_owned(), "\"2\"".to_owned()),
            ("team:red".to_owned(), "\"1\"".to_owned()),
            ("user:alice".to_owned(), "\"1\"".to_owned()),
            ("user:bob".to_owned(), "\"2\"".to_owned()),
        ]
    );

    // A missing grant (the worker may not use the rule's schema) names the privilege.
    env.admin
        .batch_execute("REVOKE USAGE ON SCHEMA rules FROM synchro_worker")
        .await
        .unwrap();
    let mut worker = reconnect(&env, worker).await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (3, 'carol', NULL)")
        .await
        .unwrap();
    assert_eq!(
        worker.step(Failpoint::None).await.unwrap(),
        StepOutcome::Blocked("scope_evaluation_failed".into())
    );
    let block = blocked(&env).await;
    assert_eq!(block["detail"], "insufficient_privilege", "{block}");
    assert_eq!(block["sqlstate"], "42501", "{block}");
    env.admin
        .batch_execute("GRANT USAGE ON SCHEMA rules TO synchro_worker")
        .await
        .unwrap();
    capture_cli(&env, &["unblock"]);
    drain(&mut worker).await;
    assert!(edge_set(&env)
        .await
        .contains(&("user:carol".to_owned(), "\"3\"".to_owned())));

    // A cancelled evaluation is retried, never recorded as a block.
    replace_and_reregister_rule(
        &op,
        // (A long, deterministic evaluation for team 'slow': pg_sleep is volatile, which a
        // rule may not call.)
        "'team:' || team || CASE WHEN (SELECT count(*) FROM generate_series(1, CASE WHEN team = 'slow' THEN 2000000000 ELSE 1 END)) = 0 THEN 'x' ELSE '' END",
    )
    .await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (4, 'dave', 'slow')")
        .await
        .unwrap();
    let cancel_the_evaluation = async {
        loop {
            let cancelled: i64 = env
                .admin
                .query_one(
                    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
                      WHERE usename = 'synchro_dev_worker' AND state = 'active'
                        AND query LIKE '%synchro_eval.m_%' AND now() - query_start > interval '200 milliseconds'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if cancelled > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    let (stepped, ()) = tokio::join!(worker.step(Failpoint::None), cancel_the_evaluation);
    assert!(stepped.is_err(), "a cancelled evaluation fails the step");
    assert_eq!(blocked(&env).await, serde_json::Value::Null);
    replace_and_reregister_rule(&op, "'team:' || team").await;
    let mut worker = reconnect(&env, worker).await;
    drain(&mut worker).await;
    assert!(edge_set(&env)
        .await
        .contains(&("team:slow".to_owned(), "\"4\"".to_owned())));
}

/// The report's staging entry of the one relation, and the health check.
async fn staging(env: &Env) -> (serde_json::Value, String) {
    let row = env
        .admin
        .query_one(
            "SELECT (synchro.synchro_capture_report()->'membership_staging')::text,
                    synchro.synchro_health_detail()->>'membership_staging'",
            &[],
        )
        .await
        .unwrap();
    let all: serde_json::Value = serde_json::from_str(&row.get::<_, String>(0)).unwrap();
    let one = all
        .as_object()
        .unwrap()
        .values()
        .next()
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    (one, row.get(1))
}

#[tokio::test]
async fn a_failing_staged_rule_stops_only_its_staging_and_the_operator_retries_or_skips_it() {
    let (env, mut worker) = setup().await;
    let op = env.login("synchro_dev_operator").await;
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (1, 'alice', 'red'), (2, 'bob', 'boom')")
        .await
        .unwrap();
    drain(&mut worker).await;
    let live_before = edge_set(&env).await;
    // A changed rule that divides by zero for team 'boom'.
    op.batch_execute(
        &(create_rule("v2", "'v2:' || (100 / (length(team) - 4))::text", "")
            + &register_rule("v2")),
    )
    .await
    .unwrap();
    drain(&mut worker).await;
    // Capture is not blocked; the staging says why it stopped.
    assert_eq!(blocked(&env).await, serde_json::Value::Null);
    let (entry, check) = staging(&env).await;
    assert_eq!(check, "failed");
    assert_eq!(entry["failed"], "function_error", "{entry}");
    assert_eq!(entry["sqlstate"], "22012", "{entry}");
    assert_eq!(entry["first_rule"], false, "{entry}");
    // Writes go on under the live rule, also to rows the failed staging had covered.
    env.admin
        .batch_execute("INSERT INTO app.docs VALUES (3, 'carol', 'boom'); UPDATE app.docs SET owner = 'ann' WHERE id = 1")
        .await
        .unwrap();
    drain(&mut worker).await;
    assert_eq!(blocked(&env).await, serde_json::Value::Null);
    assert!(edge_set(&env)
        .await
        .contains(&("user:carol".to_owned(), "\"3\"".to_owned())));
    // Retried with the cause still there: it stops again.
    assert_eq!(
        capture_cli(
            &env,
            &["retry-staging", "--schema", "app", "--relation", "docs"]
        ),
        serde_json::json!({ "restarted": true })
    );
    drain(&mut worker).await;
    assert_eq!(staging(&env).await.0["failed"], "function_error");
    // Abandoned: the live rule keeps serving, nothing is staged, health is ok.
    assert_eq!(
        capture_cli(
            &env,
            &["skip-staging", "--schema", "app", "--relation", "docs"]
        ),
        serde_json::json!({ "outcome": "change_abandoned" })
    );
    let (entry, check) = staging(&env).await;
    assert_eq!((entry, check.as_str()), (serde_json::Value::Null, "ok"));
    drain(&mut worker).await;
    let live: String = env
        .admin
        .query_one(
            "SELECT function_signature FROM synchro.membership_functions",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, "rules.doc_scopes(bigint)");
    assert!(edge_set(&env).await.len() > live_before.len());
    assert_eq!(coverage(&env).await.0, "ok");
    // A fixed rule registered again stages and activates.
    op.batch_execute(
        "CREATE OR REPLACE FUNCTION rules.v2(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'v2:' || owner FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.v2(bigint)');",
    )
    .await
    .unwrap();
    drain(&mut worker).await;
    assert_eq!(
        edge_set(&env).await,
        [
            ("v2:ann".to_owned(), "\"1\"".to_owned()),
            ("v2:bob".to_owned(), "\"2\"".to_owned()),
            ("v2:carol".to_owned(), "\"3\"".to_owned()),
        ]
    );
    assert_eq!(staging(&env).await.1, "ok");
    // `health` is one JSON object and exits non-zero while a check is not ok (no manifest
    // is published here; and with a failed staging, it names that too).
    let health = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .arg("health")
        .env(
            "DATABASE_URL",
            env.cluster.url("synchro_dev_operator", "app"),
        )
        .output()
        .unwrap();
    assert_eq!(health.status.code(), Some(1));
    let health: serde_json::Value = serde_json::from_slice(&health.stdout).unwrap();
    assert_eq!(health["ready"], false);
    assert!(health["not_ok"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("current_manifest")));
    assert_eq!(health["checks"]["membership_staging"], "ok");
    // An unknown relation is the registry's error, not a crash.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args([
            "capture",
            "retry-staging",
            "--schema",
            "app",
            "--relation",
            "nope",
        ])
        .env(
            "DATABASE_URL",
            env.cluster.url("synchro_dev_operator", "app"),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ambiguous_physical_relation"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test]
async fn operator_commands_leave_the_postgres_log_quiet() {
    let (env, mut worker) = setup().await;
    drain(&mut worker).await;
    let before = env.cluster.server_log().unwrap().len();
    for _ in 0..3 {
        let health = std::process::Command::new(env!("CARGO_BIN_EXE_synchro-server"))
            .arg("health")
            .env(
                "DATABASE_URL",
                env.cluster.url("synchro_dev_monitor", "app"),
            )
            .output()
            .unwrap();
        assert!(health.status.code().is_some(), "health ran to its end");
        capture_cli(&env, &["unblock"]);
        capture_cli(
            &env,
            &["retry-staging", "--schema", "app", "--relation", "docs"],
        );
    }
    // What PostgreSQL logged meanwhile: nothing (a session dropped without a Terminate
    // logs "could not receive data from client: Connection reset by peer").
    let log = env.cluster.server_log().unwrap()[before..].to_owned();
    assert!(
        log.lines().all(|l| l.contains("checkpoint")),
        "the commands' sessions left lines in the PostgreSQL log:\n{log}"
    );
}

fn settings_cli(env: &Env, login: &str, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    cli(env, login, &[&["settings"], args].concat())
}

#[tokio::test]
async fn an_operator_changes_the_client_ttl_within_its_range_and_nothing_else() {
    let env = Env::installed().await;
    // An app version nobody has used for ten days: active under the default 30 days.
    env.admin
        .batch_execute(
            "INSERT INTO synchro.clients (user_id, client_id, client_generation, scope_set_version,
                 assigned_scopes, generation_started_at)
             VALUES ('u', 'c', 1, 1, '{}', now() - interval '10 days')",
        )
        .await
        .unwrap();
    let active = || async {
        env.admin
            .query_one("SELECT count(*) FROM synchro.synchro_active_clients()", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(active().await, 1);
    let (code, shown) = settings_cli(&env, "synchro_dev_monitor", &[]);
    assert_eq!(code, Some(0));
    assert_eq!(
        shown["client_ttl_days"],
        serde_json::json!({"value": "30", "min": 1, "max": 3650})
    );
    assert_eq!(shown["max_bound"], serde_json::json!({"value": "100000"}));

    let (code, set) = settings_cli(
        &env,
        "synchro_dev_operator",
        &["--set", "client_ttl_days", "7"],
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        set,
        serde_json::json!({"key": "client_ttl_days", "value": "7", "previous": "30"})
    );
    assert_eq!(active().await, 0, "idle for longer than the new TTL");

    // Refusals are typed, exit 1 and change nothing.
    for (args, reason) in [
        (["--set", "client_ttl_days", "0"], "out_of_range"),
        (["--set", "client_ttl_days", "7 days"], "out_of_range"),
        (["--set", "client_ttl_days", "99999"], "out_of_range"),
        (["--set", "max_bound", "5"], "not_settable"),
        (["--set", "no_such_key", "5"], "not_settable"),
    ] {
        let (code, refused) = settings_cli(&env, "synchro_dev_operator", &args);
        assert_eq!(code, Some(1), "{args:?}");
        assert_eq!(refused["error"]["code"], "invalid_setting", "{refused}");
        assert_eq!(refused["error"]["reason"], reason, "{args:?}: {refused}");
    }
    // A monitor reads settings but changes none.
    let (code, _) = settings_cli(
        &env,
        "synchro_dev_monitor",
        &["--set", "client_ttl_days", "30"],
    );
    assert_ne!(code, Some(0));
    let ttl: String = env
        .admin
        .query_one(
            "SELECT value FROM synchro.settings WHERE key = 'client_ttl_days'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ttl, "7");

    // Not even a direct write stores a value the setter refuses (the worker used to clamp
    // a backfill_batch_size of 0 to 1, and a client_ttl_days of 0 expired every client):
    // no value is normalized where it is read.
    for (key, value) in [
        ("backfill_batch_size", "0"),
        ("backfill_batch_size", "-5"),
        ("client_ttl_days", "0"),
        ("client_ttl_days", "3651"),
        ("rebuild_session_idle_minutes", "1.5"),
        ("max_bound", "0"),
        ("max_bound", "007"),
    ] {
        let code = sqlstate(
            &env.admin,
            &format!("UPDATE synchro.settings SET value = '{value}' WHERE key = '{key}'"),
        )
        .await;
        assert!(
            code == "23514" || code == "22P02",
            "{key} = {value}: {code}"
        );
    }
}

fn registry_cli(env: &Env, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    cli(env, "synchro_dev_operator", &[&["registry"], args].concat())
}

#[tokio::test]
async fn an_operator_indexes_a_projection_column_a_rule_filters_on() {
    let (env, mut worker) = setup().await;
    let mut op = env.login("synchro_dev_operator").await;
    synchro_server::publish::publish(&mut op).await.unwrap();
    drain(&mut worker).await;
    env.as_app_owner(
        "ALTER TABLE app.docs ADD COLUMN due timestamptz;
         INSERT INTO app.docs (id, owner, team) SELECT g, 'u' || g, 't' || (g % 500) FROM generate_series(1, 5000) g",
    )
    .await;
    // (the added column is reconfigured in)
    synchro_server::registry::reconfigure(
        &mut op,
        &synchro_server::registry::ReconfigureRequest {
            schema: "app".into(),
            relation: "docs".into(),
            ..Default::default()
        },
        true,
    )
    .await
    .unwrap();
    drain(&mut worker).await;
    let plan = || async {
        env.admin
            .query(
                "EXPLAIN SELECT id FROM synchro_projection.\"app.docs\" WHERE team = 't7'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(!plan().await.contains("projection_idx_"));
    let (code, created) = registry_cli(
        &env,
        &[
            "projection-index",
            "--schema",
            "app",
            "--relation",
            "docs",
            "--column",
            "team",
        ],
    );
    assert_eq!(code, Some(0), "{created}");
    assert_eq!(created["created"], true);
    let index = created["index"].as_str().unwrap().to_owned();
    assert!(plan().await.contains(&index), "{}", plan().await);
    // Again: nothing new.
    let (_, again) = registry_cli(
        &env,
        &[
            "projection-index",
            "--schema",
            "app",
            "--relation",
            "docs",
            "--column",
            "team",
        ],
    );
    assert_eq!(
        (&again["created"], &again["index"]),
        (&serde_json::json!(false), &created["index"])
    );
    // Refusals name the column (and its type).
    let (code, refused) = registry_cli(
        &env,
        &[
            "projection-index",
            "--schema",
            "app",
            "--relation",
            "docs",
            "--column",
            "due",
        ],
    );
    assert_eq!(code, Some(1));
    assert_eq!(
        refused["error"]["reason"], "unsupported_column_type",
        "{refused}"
    );
    assert_eq!(
        (&refused["error"]["column"], &refused["error"]["type"]),
        (&serde_json::json!("due"), &serde_json::json!("datetime"))
    );
    let (_, refused) = registry_cli(
        &env,
        &[
            "projection-index",
            "--schema",
            "app",
            "--relation",
            "docs",
            "--column",
            "nope",
        ],
    );
    assert_eq!(refused["error"]["column"], "nope", "{refused}");
    let (code, dropped) = registry_cli(&env, &["projection-index", "--drop", &index]);
    assert_eq!(
        (code, &dropped["dropped"]),
        (Some(0), &serde_json::json!(true))
    );
    assert!(!plan().await.contains(&index));
    // Only projection indexes can be dropped this way.
    let (_, dropped) = registry_cli(
        &env,
        &["projection-index", "--drop", "projection_rows_pkey"],
    );
    assert_eq!(dropped["dropped"], false);
}

#[tokio::test]
async fn a_long_staging_batch_heartbeats_and_reports_its_progress() {
    let (env, mut worker) = setup().await;
    env.admin
        .batch_execute(
            "INSERT INTO app.docs SELECT g, 'u' || g, 'red' FROM generate_series(1, 2000) g",
        )
        .await
        .unwrap();
    let mut op = env.login("synchro_dev_operator").await;
    synchro_server::publish::publish(&mut op).await.unwrap();
    drain(&mut worker).await;
    // A rule that takes a few milliseconds a row (a deterministic count; pg_sleep is
    // volatile, which a rule may not call): one staging batch runs for seconds.
    op.batch_execute(&format!(
        "{}{}",
        create_rule(
            "slow",
            "'team:' || team",
            " AND (SELECT count(*) FROM generate_series(1, 100000 + length(team))) > 0"
        ),
        register_rule("slow")
    ))
    .await
    .unwrap();
    let stepping = tokio::spawn(async move {
        worker.step(Failpoint::None).await.unwrap();
        worker
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let progress = loop {
        let p: serde_json::Value = serde_json::from_str(
            &env.login("synchro_dev_monitor")
                .await
                .query_one(
                    "SELECT (synchro.synchro_capture_report()->'progress')::text",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, String>(0),
        )
        .unwrap();
        if p["phase"] == "staging" && !p["heartbeat_at"].is_null() {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no progress reported: {p}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let relation: String = env
        .admin
        .query_one("SELECT relation_id FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(progress["relation_id"], relation.as_str());
    let heartbeat: String = env
        .login("synchro_dev_monitor")
        .await
        .query_one(
            "SELECT synchro.synchro_health_detail()->>'capture_heartbeat'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        heartbeat, "ok",
        "the heartbeat is fresh while the batch runs"
    );
    assert!(!stepping.is_finished(), "the batch is still running");
    stepping.await.unwrap();
}
