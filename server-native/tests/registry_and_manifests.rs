//! Registration validation and manifest publication against a real PostgreSQL.

mod common;

use common::{sqlstate, Env};
use serde_json::Value;
use synchro_protocol::manifest::Manifest;
use synchro_server::publish::{load_lineage, publish, PublishOutcome};
use synchro_server::registry::{register, RegisterRequest, RegistrationError};

fn synced(relation: &str) -> RegisterRequest {
    RegisterRequest::synced("app", relation, "single_scope")
}

/// Spec 000 "Registration Errors": `reason is exactly one of`.
const SPEC_REASONS: [&str; 10] = [
    "ambiguous_physical_relation",
    "missing_primary_key",
    "nullable_primary_key",
    "composite_primary_key",
    "partial_primary_key",
    "unsupported_primary_key_type",
    "unsupported_replica_identity",
    "invalid_scope_function",
    "undeclared_dependency",
    "invalid_limit",
];

async fn reason(env: &Env, r: &RegisterRequest) -> (String, String) {
    let op = env.login("synchro_dev_operator").await;
    match register(&op, r).await {
        Err(e @ RegistrationError::Invalid(..)) => {
            let RegistrationError::Invalid(body, ..) = &e else {
                unreachable!()
            };
            // Exactly the spec's error shape with a reason of its closed list, no row
            // payload; a column refusal (no reason of the list fits) is invalid_column and
            // names the column and its type. A refused new registration names no ID: its
            // IDs were rolled back with it.
            let err = body["error"].as_object().expect("error object");
            let reason = err["reason"].as_str().unwrap();
            if reason == "unsupported_column_type" {
                assert_eq!(err["code"], "invalid_column", "{body}");
                let mut keys: Vec<_> = err.keys().map(String::as_str).collect();
                keys.sort_unstable();
                assert_eq!(keys, ["code", "column", "reason", "type"], "{body}");
            } else {
                assert_eq!(err["code"], "invalid_registration", "{body}");
                assert!(SPEC_REASONS.contains(&reason), "{body}");
                assert!(
                    err.keys().all(|k| ["code", "reason"].contains(&k.as_str())),
                    "{body}"
                );
            }
            (
                e.reason().unwrap().to_owned(),
                e.sqlstate().unwrap().to_owned(),
            )
        }
        other => panic!("{} registered: {other:?}", r.relation),
    }
}

#[tokio::test]
async fn invalid_relations_are_refused_with_the_exact_reason() {
    let env = Env::installed().await;
    env.admin
        .batch_execute("CREATE SCHEMA other AUTHORIZATION app_owner")
        .await
        .unwrap();
    env.as_app_owner(
        "CREATE TABLE app.no_key (a int);
         CREATE TABLE app.composite (a int, b int, PRIMARY KEY (a, b));
         CREATE TABLE app.deferrable (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED);
         CREATE DOMAIN app.key_text AS text;
         CREATE TABLE app.domain_key (id app.key_text PRIMARY KEY);
         CREATE TABLE app.interval_key (id interval PRIMARY KEY);
         CREATE TABLE app.full_identity (id int PRIMARY KEY); ALTER TABLE app.full_identity REPLICA IDENTITY FULL;
         CREATE TABLE app.generated_key (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);
         CREATE TABLE app.odd_column (id int PRIMARY KEY, at point);
         CREATE TABLE app.unbounded_numeric (id int PRIMARY KEY, n numeric);
         CREATE VIEW app.a_view AS SELECT 1 AS id;
         CREATE TABLE app.fine (id int PRIMARY KEY);
         CREATE TABLE other.fine (id int PRIMARY KEY)",
    )
    .await;
    let cases = [
        (synced("missing"), "ambiguous_physical_relation", "42P17"),
        (synced("a_view"), "ambiguous_physical_relation", "42P17"),
        (
            RegisterRequest {
                schema: "nope".into(),
                ..synced("fine")
            },
            "ambiguous_physical_relation",
            "42P17",
        ),
        (synced("no_key"), "missing_primary_key", "42P17"),
        (synced("composite"), "composite_primary_key", "42P17"),
        (
            synced("deferrable"),
            "unsupported_replica_identity",
            "42P17",
        ),
        (
            synced("domain_key"),
            "unsupported_primary_key_type",
            "42P17",
        ),
        (
            synced("interval_key"),
            "unsupported_primary_key_type",
            "42P17",
        ),
        (
            synced("full_identity"),
            "unsupported_replica_identity",
            "42P17",
        ),
        (
            synced("generated_key"),
            "unsupported_primary_key_type",
            "42P17",
        ),
        (synced("odd_column"), "unsupported_column_type", "42P17"),
        (
            synced("unbounded_numeric"),
            "unsupported_column_type",
            "42P17",
        ),
        (
            RegisterRequest {
                fanout_bound: 0,
                ..synced("fine")
            },
            "invalid_limit",
            "22023",
        ),
        (
            RegisterRequest {
                impact_bound: 100_001,
                ..synced("fine")
            },
            "invalid_limit",
            "22023",
        ),
    ];
    for (req, want, state) in cases {
        let (got, sqlstate) = reason(&env, &req).await;
        assert_eq!(
            (got.as_str(), sqlstate.as_str()),
            (want, state),
            "{}.{}",
            req.schema,
            req.relation
        );
    }
    // The column refusal names the column and its type as PostgreSQL spells it.
    let op = env.login("synchro_dev_operator").await;
    match register(&op, &synced("odd_column")).await {
        Err(RegistrationError::Invalid(body, ..)) => {
            assert_eq!(
                (&body["error"]["column"], &body["error"]["type"]),
                (&serde_json::json!("at"), &serde_json::json!("point")),
                "{body}"
            );
        }
        other => panic!("odd_column registered: {other:?}"),
    }
    // The fanout and impact bounds are required at the SQL entry point: never defaulted
    // (they used to default to 1000), NULL is invalid_limit (22023).
    assert_eq!(
        sqlstate(
            &op,
            "SELECT synchro.synchro_register_relation('app', 'fine')"
        )
        .await,
        "42883"
    );
    assert_eq!(
        sqlstate(
            &op,
            "SELECT synchro.synchro_register_relation('app', 'fine', NULL, 1000)"
        )
        .await,
        "22023"
    );
    // Nothing was recorded by any refused registration.
    let count: i64 = env
        .admin
        .query_one("SELECT count(*) FROM synchro.relations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0);
    // A generated key is fine when clients do not push.
    let op = env.login("synchro_dev_operator").await;
    register(
        &op,
        &RegisterRequest {
            push_enabled: false,
            ..synced("generated_key")
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_valid_registration_records_identity_types_trigger_and_publication() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.orders (id uuid PRIMARY KEY, customer text NOT NULL, qty integer, big bigint,
           amount numeric(12,2), ratio double precision, small real, paid boolean, at timestamptz, day date,
           tm time, doc jsonb, raw bytea, total numeric(14,2) GENERATED ALWAYS AS (amount * 2) STORED);
         INSERT INTO app.orders (id, customer) VALUES ('00000000-0000-0000-0000-000000000001', 'a')",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let got = register(&op, &synced("orders")).await.unwrap();
    let relation_id = got["relation_id"].as_str().unwrap();
    let table_id = got["table_id"].as_str().unwrap();
    assert!(relation_id.starts_with("rel_") && table_id.starts_with("tbl_"));
    assert!(
        !relation_id.contains("orders") && !table_id.contains("orders"),
        "IDs are not derived from names"
    );
    let types: Vec<(String, String)> = got["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["column"].as_str().unwrap().into(),
                f["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        ("id", "string"),
        ("customer", "string"),
        ("qty", "int"),
        ("big", "int64"),
        ("amount", "decimal"),
        ("ratio", "float"),
        ("small", "float"),
        ("paid", "boolean"),
        ("at", "datetime"),
        ("day", "date"),
        ("tm", "time"),
        ("doc", "json"),
        ("raw", "bytes"),
        ("total", "decimal"),
    ];
    assert_eq!(types, want.map(|(a, b)| (a.to_owned(), b.to_owned())));
    // Registering again returns the same IDs.
    assert_eq!(register(&op, &synced("orders")).await.unwrap(), got);

    let row = env
        .admin
        .query_one(
            "SELECT physical_schema::text, physical_relation::text, physical_relation_oid = 'app.orders'::regclass::oid,
                    replica_identity::text, capture_key_column::text, primary_key_type = 'uuid'::regtype::oid
               FROM synchro.relations",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, bool>(2),
            row.get::<_, String>(3),
            row.get::<_, String>(4),
            row.get::<_, bool>(5)
        ),
        (
            "app".into(),
            "orders".into(),
            true,
            "d".into(),
            "id".into(),
            true
        )
    );
    let decimals = env
        .admin
        .query(
            "SELECT column_name::text, decimal_precision, decimal_scale, writable, nullable FROM synchro.fields
              WHERE portable_type = 'decimal' ORDER BY attnum",
            &[],
        )
        .await
        .unwrap();
    let d: Vec<(String, i32, i32, bool, bool)> = decimals
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        d,
        [
            ("amount".into(), 12, 2, true, true),
            ("total".into(), 14, 2, false, true)
        ]
    );

    // The source trigger refuses key updates; other updates go through.
    assert_eq!(
        sqlstate(
            &env.admin,
            "UPDATE app.orders SET id = '00000000-0000-0000-0000-000000000002'"
        )
        .await,
        "55000"
    );
    assert_eq!(
        sqlstate(&env.admin, "UPDATE app.orders SET customer = 'b'").await,
        "ok"
    );
    let published: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'synchro_publication' AND tablename = 'orders'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 1);

    // A capture dependency has no table ID; its projected fields are every column with a
    // portable type.
    env.as_app_owner("CREATE TABLE app.members (id bigint PRIMARY KEY, team text)")
        .await;
    let dep = register(
        &op,
        &RegisterRequest {
            kind: "capture_dependency".into(),
            ..synced("members")
        },
    )
    .await
    .unwrap();
    assert!(dep.get("table_id").is_none());
    let fields = dep["fields"].as_array().unwrap();
    assert_eq!(fields.len(), 2, "{dep}");
    assert_eq!(fields[0]["column"], "id");
    assert_eq!(fields[1]["type"], "string");
}

#[tokio::test]
async fn publication_classifies_from_database_facts_and_records_are_immutable() {
    let env = Env::installed().await;
    let mut op = env.login("synchro_dev_operator").await;
    env.as_app_owner("CREATE TABLE app.a (id int PRIMARY KEY, v text)")
        .await;
    register(&op, &synced("a")).await.unwrap();
    let first = publish(&mut op).await.unwrap();
    assert!(
        matches!(&first, PublishOutcome::Published { version: 1, class, .. } if class == "initial"),
        "{first:?}"
    );
    assert_eq!(
        publish(&mut op).await.unwrap(),
        PublishOutcome::Unchanged { version: 1 }
    );

    env.as_app_owner("CREATE TABLE app.b (id bigint PRIMARY KEY)")
        .await;
    register(&op, &synced("b")).await.unwrap();
    let second = publish(&mut op).await.unwrap();
    assert!(
        matches!(&second, PublishOutcome::Published { version: 2, class, .. } if class == "class_2"),
        "{second:?}"
    );

    env.as_app_owner("CREATE TABLE app.c (id text PRIMARY KEY); INSERT INTO app.c VALUES ('row')")
        .await;
    register(
        &op,
        &RegisterRequest {
            composition: "multi_scope".into(),
            ..synced("c")
        },
    )
    .await
    .unwrap();
    let third = publish(&mut op).await.unwrap();
    assert!(
        matches!(&third, PublishOutcome::Published { version: 3, class, .. } if class == "class_3"),
        "{third:?}"
    );

    let lineage = load_lineage(&op).await.unwrap();
    let floors: Vec<u64> = lineage.manifests().map(|m| m.compatibility_floor).collect();
    assert_eq!(floors, [1, 1, 3]);
    assert_eq!(lineage.current().unwrap().tables.len(), 3);

    // Historical records resolve to their original body, and nothing can change them.
    let v1: String = env
        .admin
        .query_one(
            "SELECT body FROM synchro.manifests WHERE schema_version = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(Manifest::parse(&v1).unwrap().tables.len(), 1);
    for sql in [
        "UPDATE synchro.manifests SET body = '{}' WHERE schema_version = 1",
        "DELETE FROM synchro.manifests WHERE schema_version = 3",
        "TRUNCATE synchro.manifests CASCADE",
    ] {
        assert_eq!(sqlstate(&env.admin, sql).await, "55000", "{sql}");
    }
    // A body that does not match its hash, or a parent that is not current, is refused.
    let bad_hash =
        "SELECT synchro.synchro_insert_manifest(4, repeat('a', 64), '{}', 3, NULL, 'class_2', 1)";
    assert_eq!(sqlstate(&op, bad_hash).await, "22023");
}

/// Creates `assign.<name>` owned by the operator login from `definition` (the part after
/// the function name), revokes PUBLIC and grants synchro_owner unless told otherwise.
async fn assignment_function(
    env: &Env,
    op: &tokio_postgres::Client,
    name: &str,
    definition: &str,
    grant: bool,
) {
    op.batch_execute(&format!("CREATE FUNCTION assign.{name}{definition}"))
        .await
        .unwrap();
    op.batch_execute(&format!(
        "REVOKE EXECUTE ON FUNCTION assign.{name} FROM PUBLIC"
    ))
    .await
    .unwrap();
    if grant {
        op.batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION assign.{name} TO synchro_owner"
        ))
        .await
        .unwrap();
    }
    let _ = env;
}

#[tokio::test]
async fn assignment_function_registration_enforces_every_rule() {
    let env = Env::installed().await;
    env.admin
        .batch_execute(
            "CREATE SCHEMA assign AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA assign TO synchro_owner;
             GRANT USAGE ON SCHEMA app TO synchro_dev_operator;",
        )
        .await
        .unwrap();
    env.as_app_owner(
        "CREATE TABLE app.team_members (user_id text, team text);
         CREATE TABLE app.secret (user_id text);
         GRANT SELECT ON app.team_members TO synchro_dev_operator",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let ok_body = "(p_user text) RETURNS SETOF text LANGUAGE sql STABLE SET search_path = pg_catalog, synchro \
                   BEGIN ATOMIC SELECT 'team:' || team FROM app.team_members WHERE user_id = p_user; END";
    assignment_function(
        &env,
        &op,
        "helper",
        "() RETURNS text LANGUAGE sql STABLE BEGIN ATOMIC SELECT 'x'; END",
        true,
    )
    .await;
    let cases: [(&str, String, bool, &str); 10] = [
        ("plpgsql", "(p_user text) RETURNS SETOF text LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro AS $$ BEGIN RETURN NEXT 'a'; END $$".into(), true, "invalid_scope_function"),
        ("string_body", "(p_user text) RETURNS SETOF text LANGUAGE sql STABLE SET search_path = pg_catalog, synchro AS $$ SELECT 'a' $$".into(), true, "invalid_scope_function"),
        ("volatile", ok_body.replace("STABLE", "VOLATILE"), true, "invalid_scope_function"),
        ("definer", ok_body.replace("STABLE", "STABLE SECURITY DEFINER"), true, "invalid_scope_function"),
        ("path", ok_body.replace("pg_catalog, synchro", "pg_catalog"), true, "invalid_scope_function"),
        ("scalar", ok_body.replace("SETOF text", "text").replace("SELECT 'team:' || team FROM app.team_members WHERE user_id = p_user", "SELECT 'a'"), true, "invalid_scope_function"),
        ("no_grant", ok_body.to_owned(), false, "invalid_scope_function"),
        ("reads_synchro", ok_body.replace("team FROM app.team_members WHERE user_id = p_user", "scope_id FROM synchro.shared_scopes"), true, "undeclared_dependency"),
        ("calls_user_function", ok_body.replace("'team:' || team", "assign.helper()"), true, "undeclared_dependency"),
        ("unreadable", ok_body.replace("team FROM app.team_members WHERE user_id = p_user", "user_id FROM app.secret"), true, "undeclared_dependency"),
    ];
    for (name, body, grant, want) in cases {
        assignment_function(&env, &op, name, &body, grant).await;
        let err = op
            .query_one(
                "SELECT synchro.synchro_register_assignment_function($1)",
                &[&format!("assign.{name}")],
            )
            .await
            .unwrap_err();
        let db = err.as_db_error().unwrap_or_else(|| panic!("{name}: {err}"));
        let detail: Value = serde_json::from_str(db.detail().unwrap_or("null")).unwrap();
        assert_eq!(detail["error"]["reason"], want, "{name}: {}", db.message());
    }
    assignment_function(&env, &op, "teams", ok_body, true).await;
    assert_eq!(
        sqlstate(
            &op,
            "SELECT synchro.synchro_register_assignment_function('assign.teams', 0)"
        )
        .await,
        "22023"
    );
    // NULL changes nothing.
    op.execute(
        "SELECT synchro.synchro_register_assignment_function(NULL, 0)",
        &[],
    )
    .await
    .unwrap();
    let none: i64 = env
        .admin
        .query_one("SELECT count(*) FROM synchro.assignment_function", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(none, 0);
    op.execute(
        "SELECT synchro.synchro_register_assignment_function('assign.teams', 2)",
        &[],
    )
    .await
    .unwrap();
    let adapter = env.login("synchro_dev_adapter").await;
    let intact: bool = adapter
        .query_one(
            "SELECT intact FROM synchro.synchro_assignment_function_check()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(intact);
    // Another role cannot register one.
    assert_eq!(
        sqlstate(
            &adapter,
            "SELECT synchro.synchro_register_assignment_function('assign.teams')"
        )
        .await,
        "42501"
    );
    // A changed definition is detected.
    op.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION assign.teams{}",
        ok_body.replace("'team:'", "'crew:'")
    ))
    .await
    .unwrap();
    let intact: bool = adapter
        .query_one(
            "SELECT intact FROM synchro.synchro_assignment_function_check()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!intact);
    let monitor = env.login("synchro_dev_monitor").await;
    let detail: String = monitor
        .query_one(
            "SELECT synchro.synchro_health_detail()->>'assignment_function'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(detail, "failed");
}
