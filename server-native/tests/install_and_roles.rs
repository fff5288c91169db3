//! Installation, the migration ledger, the six roles and least privilege, against a real
//! PostgreSQL started by the harness.

mod common;

use common::{sqlstate, Env};
use synchro_server::install::{self, ROLES};

#[tokio::test]
async fn install_is_idempotent_and_the_ledger_guards_upgrades() {
    let mut env = Env::installed().await;
    let again = install::install(&mut env.admin).await.unwrap();
    assert!(again.applied.is_empty(), "a second install applies nothing");
    // Versions may have gaps while parallel work holds reserved numbers.
    assert_eq!(again.version, install::MIGRATIONS.last().unwrap().version);

    // Every group role has exactly the spec's attributes.
    for role in ROLES {
        let row = env
            .admin
            .query_one(
                "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication
                   FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await
            .unwrap();
        let attrs: Vec<bool> = (0..6).map(|i| row.get(i)).collect();
        assert_eq!(attrs, vec![false; 6], "{role}");
    }

    // An edited applied migration, or a newer ledger, refuses to run.
    env.admin
        .batch_execute(
            "UPDATE synchro.schema_migrations SET sha256 = repeat('0', 64) WHERE version = 1",
        )
        .await
        .unwrap();
    let err = install::install(&mut env.admin)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("immutable"), "{err}");
    env.admin
        .batch_execute(
            "UPDATE synchro.schema_migrations SET sha256 = (SELECT sha256 FROM synchro.schema_migrations) WHERE false;
             INSERT INTO synchro.schema_migrations (version, name, sha256) VALUES (99, 'future.sql', 'x')",
        )
        .await
        .unwrap();
    let err = install::install(&mut env.admin)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("newer") || err.contains("immutable"), "{err}");
}

/// Every synchro catalog object with its definition and privileges, one line each.
const CATALOG: &str = "SELECT string_agg(x, E'\n' ORDER BY x) FROM (
    SELECT 'fn ' || p.oid::regprocedure::text || ' ' || pg_get_functiondef(p.oid) || ' ' || coalesce(p.proacl::text, '') AS x
      FROM pg_proc p WHERE p.pronamespace = 'synchro'::regnamespace
    UNION ALL SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.relacl::text, '')
      FROM pg_class c WHERE c.relnamespace = 'synchro'::regnamespace
    UNION ALL SELECT 'col ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
     WHERE c.relnamespace = 'synchro'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL SELECT 'con ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = 'synchro'::regnamespace
    UNION ALL SELECT 'trg ' || t.tgname || ' ' || c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = 'synchro'::regnamespace AND NOT t.tgisinternal) q";

#[tokio::test]
async fn stepwise_upgrade_equals_a_fresh_install() {
    let env = Env::installed().await;
    let boot = synchro_server::connect_db(&env.cluster.admin_url())
        .await
        .unwrap();
    boot.batch_execute("CREATE DATABASE stepwise")
        .await
        .unwrap();
    let mut db = synchro_server::connect_db(&env.cluster.url("postgres", "stepwise"))
        .await
        .unwrap();
    for step in install::MIGRATIONS.iter().map(|m| m.version) {
        let r = install::install_to(&mut db, Some(step)).await.unwrap();
        assert_eq!(r.applied, vec![step]);
    }
    let fresh: String = env.admin.query_one(CATALOG, &[]).await.unwrap().get(0);
    let stepwise: String = db.query_one(CATALOG, &[]).await.unwrap().get(0);
    assert!(fresh.lines().count() > 50);
    let only = |a: &str, b: &str| -> Vec<String> {
        a.lines()
            .filter(|l| !b.lines().any(|m| m == *l))
            .map(str::to_owned)
            .collect()
    };
    assert!(
        stepwise == fresh,
        "only in the stepwise database: {:?}\nonly in the fresh one: {:?}",
        only(&stepwise, &fresh),
        only(&fresh, &stepwise)
    );
}

#[tokio::test]
async fn a_foreign_synchro_schema_is_not_adopted() {
    let env = Env::installed().await;
    let boot = synchro_server::connect_db(&env.cluster.admin_url())
        .await
        .unwrap();
    boot.batch_execute("CREATE DATABASE other").await.unwrap();
    let mut other = synchro_server::connect_db(&env.cluster.url("postgres", "other"))
        .await
        .unwrap();
    other.batch_execute("CREATE SCHEMA synchro").await.unwrap();
    let err = install::install(&mut other).await.unwrap_err().to_string();
    assert!(err.contains("not installed by synchro-server"), "{err}");
}

#[tokio::test]
async fn each_role_can_do_only_its_own_capability() {
    let env = Env::installed().await;
    env.as_app_owner("CREATE TABLE app.items (id text PRIMARY KEY, label text)")
        .await;
    let calls = [
        ("history", "SELECT * FROM synchro.synchro_manifest_history()"),
        ("register", "SELECT synchro.synchro_register_relation('app', 'items')"),
        ("client", "SELECT * FROM synchro.synchro_client_state('u', 'c')"),
        ("connect", "SELECT * FROM synchro.synchro_client_connect('u', 'c', true, '{}', NULL, NULL)"),
        ("assigned", "SELECT synchro.synchro_assigned_scopes('u')"),
        ("grant", "SELECT synchro.synchro_grant_user_scope('u', 's')"),
        ("ready", "SELECT synchro.synchro_readiness()"),
        ("detail", "SELECT synchro.synchro_health_detail()"),
        ("insert_manifest", "SELECT synchro.synchro_insert_manifest(1, repeat('a', 64), '{}', NULL, NULL, 'initial', 1)"),
        ("read_table", "SELECT * FROM synchro.manifests"),
        ("read_clients", "SELECT * FROM synchro.clients"),
        ("emit_message", "SELECT pg_logical_emit_message(true, 'synchro', 'forged')"),
    ];
    // (login, calls it may make); every other call must fail with 42501. An allowed call
    // may still fail for its bogus arguments, but never for permission.
    let allowed: [(&str, &[&str]); 6] = [
        (
            "synchro_dev_adapter",
            &["history", "client", "connect", "assigned", "ready"],
        ),
        ("synchro_dev_seed", &["history"]),
        ("synchro_dev_monitor", &["ready", "detail"]),
        (
            "synchro_dev_operator",
            &["history", "register", "grant", "detail", "insert_manifest"],
        ),
        ("synchro_dev_worker", &[]),
        ("nobody", &[]),
    ];
    for (login, ok) in allowed {
        let db = env.login(login).await;
        for (name, sql) in calls {
            let got = sqlstate(&db, sql).await;
            if ok.contains(&name) {
                assert_ne!(got, "42501", "{login} calling {name}");
            } else {
                assert_eq!(got, "42501", "{login} calling {name}");
            }
        }
    }
}

#[tokio::test]
async fn privileged_functions_are_owned_pinned_and_not_public() {
    let env = Env::installed().await;
    let rows = env
        .admin
        .query(
            "SELECT p.proname, pg_get_userbyid(p.proowner), p.prosecdef, coalesce(p.proconfig, '{}'),
                    has_function_privilege('public', p.oid, 'EXECUTE')
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'synchro'",
            &[],
        )
        .await
        .unwrap();
    assert!(rows.len() > 10);
    for r in rows {
        let name: String = r.get(0);
        assert_eq!(r.get::<_, String>(1), "synchro_owner", "{name} owner");
        let config: Vec<String> = r.get(3);
        assert!(
            config.contains(&"search_path=pg_catalog, synchro, pg_temp".to_owned()),
            "{name} search_path {config:?}"
        );
        assert!(!r.get::<_, bool>(4), "{name} is executable by PUBLIC");
    }
    let public_schema: bool = env
        .admin
        .query_one(
            "SELECT has_schema_privilege('public', 'synchro', 'USAGE')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!public_schema);
    let defaults: i64 = env
        .admin
        .query_one(
            "SELECT count(*) FROM pg_default_acl d JOIN pg_roles r ON r.oid = d.defaclrole
              WHERE r.rolname = 'synchro_owner' AND d.defaclobjtype = 'f'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        defaults >= 1,
        "default privileges revoke EXECUTE from PUBLIC"
    );
}
