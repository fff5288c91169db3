//! Installation (the install script, its upgrades and the ledger), the six roles and least
//! privilege, against a real PostgreSQL started by the harness.

mod common;

use common::{cli_at, sqlstate, Env};
use synchro_server::install::{self, ROLES};
use synchro_server::pg_harness::TempCluster;

#[tokio::test]
async fn install_is_idempotent_and_the_ledger_guards_upgrades() {
    let mut env = Env::installed().await;
    let again = install::install(&mut env.admin).await.unwrap();
    assert!(again.applied.is_empty(), "a second install applies nothing");
    assert_eq!(again.version, install::VERSION);
    let ledger: Vec<(i32, String, String)> = env
        .admin
        .query(
            "SELECT version, name, sha256 FROM synchro.schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected: Vec<(i32, String, String)> = install::steps()
        .iter()
        .map(|s| (s.version, s.name.to_owned(), s.sha256()))
        .collect();
    assert_eq!(
        ledger, expected,
        "one ledger row per step, with its text's hash"
    );
    assert_eq!(ledger[0].1, "install");

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

    // An applied step whose text changed refuses to run.
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
    assert!(
        err.contains("immutable") && err.contains("install"),
        "{err}"
    );
    // So does a ledger newer than this binary.
    env.admin
        .execute(
            "UPDATE synchro.schema_migrations SET sha256 = $1 WHERE version = 1",
            &[&install::steps()[0].sha256()],
        )
        .await
        .unwrap();
    env.admin
        .batch_execute(
            "INSERT INTO synchro.schema_migrations (version, name, sha256) VALUES (99, 'future.sql', 'x')",
        )
        .await
        .unwrap();
    let err = install::install(&mut env.admin)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("newer"), "{err}");
}

/// Every synchro catalog object with its definition, owner and privileges (normalized text).
const CATALOG: &str = include_str!("../sql/catalog.sql");

/// The lines only in `a`, for a readable failure.
fn only_in(a: &str, b: &str) -> Vec<String> {
    let b: std::collections::BTreeSet<&str> = b.lines().collect();
    a.lines()
        .filter(|l| !b.contains(l))
        .map(str::to_owned)
        .collect()
}

/// The upgrade path that remains: a database installed up to each version in turn, one run
/// per step, ends with the catalog of a fresh install. With no upgrade script yet this is
/// the install script alone; every upgrade added to `install::UPGRADES` joins the path.
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
    for step in 1..=install::VERSION {
        let r = install::install_to(&mut db, Some(step)).await.unwrap();
        assert_eq!(r.applied, vec![step]);
        assert_eq!(r.version, step);
    }
    let fresh: String = env.admin.query_one(CATALOG, &[]).await.unwrap().get(0);
    let stepwise: String = db.query_one(CATALOG, &[]).await.unwrap().get(0);
    assert!(fresh.lines().count() > 1000);
    assert!(
        stepwise == fresh,
        "only in the stepwise database: {:#?}\nonly in the fresh one: {:#?}",
        only_in(&stepwise, &fresh),
        only_in(&fresh, &stepwise)
    );
}

/// A fresh install's catalog equals `sql/catalog.expected.txt`. That file was generated from
/// a database installed by the 26 pre-release migrations the install script replaced, so it
/// is a reference independent of the script; `sql/README.md` says when and how to regenerate
/// it (`SYNCHRO_WRITE_CATALOG=1` writes it from this test's fresh install).
#[tokio::test]
async fn a_fresh_install_has_the_expected_catalog() {
    // A cluster of its own: no dev logins, no application roles.
    let cluster = TempCluster::start().unwrap();
    let boot = synchro_server::connect_db(&cluster.admin_url())
        .await
        .unwrap();
    boot.batch_execute("CREATE DATABASE fresh").await.unwrap();
    let mut db = synchro_server::connect_db(&cluster.url("postgres", "fresh"))
        .await
        .unwrap();
    install::install(&mut db).await.unwrap();
    let got = format!(
        "{}\n",
        db.query_one(CATALOG, &[])
            .await
            .unwrap()
            .get::<_, String>(0)
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/catalog.expected.txt");
    if std::env::var_os("SYNCHRO_WRITE_CATALOG").is_some() {
        std::fs::write(path, &got).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap();
    let major: i32 = db
        .query_one(
            "SELECT current_setting('server_version_num')::int / 10000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let got = as_of_postgresql_15(&got, major);
    assert!(
        got == expected,
        "only in this install: {:#?}\nonly in catalog.expected.txt: {:#?}",
        only_in(&got, &expected),
        only_in(&expected, &got)
    );
}

/// A catalog listing of PostgreSQL `major` in the form PostgreSQL 15 gives (the expected
/// catalog's), undoing only what newer versions list differently for the same objects, so the
/// one reference holds every version to the same definitions and privileges:
/// - 17 gives a table's owner MAINTAIN as well (`m` after its implicit `arwdDxt`); a grant of
///   MAINTAIN to anyone else stays in the listing, and fails the comparison;
/// - 17 added a fourth argument (`flush`, with a default) to `pg_logical_emit_message`;
/// - 18 records each column's NOT NULL as a constraint too (named `<table>_<column>_not_null`);
///   the column lines carry `notnull=t` on every version, so these lines only repeat them, and
///   one is dropped only when its column line says `notnull=t`.
fn as_of_postgresql_15(catalog: &str, major: i32) -> String {
    let not_null_columns: std::collections::BTreeSet<(String, String)> = catalog
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("column ")?;
            let mut words = rest.split(' ');
            let (table, _, column) = (words.next()?, words.next()?, words.next()?);
            rest.contains(" notnull=t ")
                .then(|| (table.to_owned(), column.trim_matches('"').to_owned()))
        })
        .collect();
    let mut out = String::new();
    for line in catalog.lines() {
        if major >= 18 {
            if let Some(rest) = line.strip_prefix("constraint ") {
                if let Some((head, column)) = rest.split_once(" type=n ") {
                    let table = head.split(' ').next().unwrap_or_default();
                    let column = column.rsplit(" NOT NULL ").next().unwrap_or_default();
                    if not_null_columns
                        .contains(&(table.to_owned(), column.trim_matches('"').to_owned()))
                    {
                        continue;
                    }
                }
            }
        }
        let mut line = line.to_owned();
        if major >= 17 {
            line = line.replace("=arwdDxtm/", "=arwdDxt/");
            line = line.replace(
                "pg_logical_emit_message(boolean,text,bytea,boolean)",
                "pg_logical_emit_message(boolean,text,bytea)",
            );
            line = line.replace(
                "pg_logical_emit_message(boolean,text,text,boolean)",
                "pg_logical_emit_message(boolean,text,text)",
            );
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The install files, with each function body (`$$ ... $$`), string literal and `--` comment
/// blanked out: what remains is the script's own DDL, one statement per `;`.
fn top_level_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("--") {
            rest = rest.find('\n').map_or("", |i| &rest[i..]);
        } else if rest.starts_with("$$") {
            let end = rest[2..].find("$$").expect("an unterminated $$ body") + 4;
            cur.push_str(" $$ ");
            rest = &rest[end..];
        } else if c == '\'' {
            let mut end = 1;
            loop {
                let i = rest[end..].find('\'').expect("an unterminated literal") + end;
                if rest[i + 1..].starts_with('\'') {
                    end = i + 2;
                } else {
                    end = i + 1;
                    break;
                }
            }
            cur.push_str(" '' ");
            rest = &rest[end..];
        } else if c == ';' {
            out.push(cur.split_whitespace().collect::<Vec<_>>().join(" "));
            cur.clear();
            rest = &rest[1..];
        } else {
            cur.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    assert!(
        cur.trim().is_empty(),
        "text after the last statement: {cur}"
    );
    out
}

/// The install script defines each object once, in its final shape: every table, function,
/// trigger, index, type, sequence, schema and publication is created by exactly one
/// statement, nothing is replaced, altered or dropped afterwards, no DDL says IF [NOT]
/// EXISTS (it emits NOTICEs), and each function is revoked from PUBLIC beside its
/// definition. The file list compiled into the binary is the directory's, in name order,
/// and each file opens with the spec sections it implements.
#[test]
fn the_install_script_defines_each_object_once() {
    let dir = |d: &str| -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(format!("{}/sql/{d}", env!("CARGO_MANIFEST_DIR")))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(".sql"))
                .collect();
        names.sort();
        names
    };
    let compiled: Vec<String> = install::INSTALL.iter().map(|f| f.name.to_owned()).collect();
    assert_eq!(
        compiled,
        dir("install"),
        "install::INSTALL lists sql/install/"
    );
    let upgrades: Vec<String> = install::UPGRADES
        .iter()
        .map(|f| f.name.to_owned())
        .collect();
    assert_eq!(
        upgrades,
        dir("upgrades"),
        "install::UPGRADES lists sql/upgrades/"
    );
    for (to, name) in (2..).zip(&upgrades) {
        assert_eq!(
            *name,
            format!("{:04}_to_{to:04}.sql", to - 1),
            "version {to}"
        );
    }

    let mut defined: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for file in install::INSTALL {
        let head: Vec<&str> = file
            .sql
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect();
        assert!(
            head.first()
                .is_some_and(|l| l.starts_with(&format!("-- synchro install {}:", &file.name[..2])))
                && head
                    .iter()
                    .any(|l| l.contains("Spec ") || l.contains("spec ")),
            "{} opens with its number and the spec sections it implements",
            file.name
        );
        for st in top_level_statements(file.sql) {
            assert!(
                !st.contains("IF NOT EXISTS") && !st.contains("IF EXISTS"),
                "{}: {st}",
                file.name
            );
            assert!(
                !st.starts_with("CREATE OR REPLACE")
                    && !st.starts_with("ALTER TABLE")
                    && !st.starts_with("DROP ")
                    && !st.starts_with("DO "),
                "{}: the install script defines objects once, in their final shape: {st}",
                file.name
            );
            if let Some((kind, name)) = created(&st) {
                defined
                    .entry(format!("{kind} {name}"))
                    .or_default()
                    .push(file.name);
                if kind == "FUNCTION" {
                    assert!(
                        file.sql
                            .contains(&format!("REVOKE EXECUTE ON FUNCTION {name}(")),
                        "{}: {name} has no REVOKE ... FROM PUBLIC beside it",
                        file.name
                    );
                }
            }
        }
    }
    let twice: Vec<_> = defined
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .collect();
    assert!(twice.is_empty(), "defined more than once: {twice:?}");
    let functions = defined
        .keys()
        .filter(|k| k.starts_with("FUNCTION "))
        .count();
    assert!(functions > 70, "{functions} functions");
}

/// The kind and name of the object a `CREATE` statement defines.
fn created(statement: &str) -> Option<(&str, &str)> {
    const KINDS: [&str; 9] = [
        "TABLE",
        "FUNCTION",
        "TRIGGER",
        "INDEX",
        "TYPE",
        "SEQUENCE",
        "SCHEMA",
        "PUBLICATION",
        "VIEW",
    ];
    let mut words = statement.split(|c: char| c.is_whitespace() || c == '(');
    if words.next() != Some("CREATE") {
        return None;
    }
    let kind = words.next()?;
    KINDS
        .contains(&kind)
        .then(|| (kind, words.next().unwrap_or("")))
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
        ("register", "SELECT synchro.synchro_register_relation('app', 'items', 1000, 1000)"),
        ("client", "SELECT * FROM synchro.synchro_client_state('u', 'c')"),
        ("connect", "SELECT * FROM synchro.synchro_client_connect('u', 'c', true, '{}', NULL, NULL, 64)"),
        ("assigned", "SELECT synchro.synchro_assigned_scopes('u')"),
        ("grant", "SELECT synchro.synchro_grant_user_scope('u', 's')"),
        ("ready", "SELECT synchro.synchro_readiness()"),
        ("detail", "SELECT synchro.synchro_health_detail()"),
        ("insert_manifest", "SELECT synchro.synchro_insert_manifest(1, repeat('a', 64), '{}', NULL, NULL, 'initial', 1)"),
        ("read_table", "SELECT * FROM synchro.manifests"),
        ("read_clients", "SELECT * FROM synchro.clients"),
        // The monitor reads metadata only through functions (it used to have SELECT on
        // these two, against spec 001's "no direct metadata access").
        ("read_capture", "SELECT * FROM synchro.relation_capture"),
        ("read_generations", "SELECT * FROM synchro.registry_generations"),
        ("report", "SELECT synchro.synchro_capture_report()"),
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
        ("synchro_dev_monitor", &["ready", "detail", "report"]),
        (
            "synchro_dev_operator",
            &[
                "history",
                "register",
                "grant",
                "detail",
                "insert_manifest",
                "report",
            ],
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

/// PUBLIC has nothing in the synchro schema: not the schema, no function, no table or
/// sequence, no type of its own (PostgreSQL grants USAGE on every new type to PUBLIC; a
/// table's row type has no privileges of its own), and the schema's default privileges give
/// PUBLIC nothing either (spec 001: default-deny).
#[tokio::test]
async fn the_public_role_has_nothing_in_the_synchro_schema() {
    let env = Env::installed().await;
    let leaks: Vec<String> = env
        .admin
        .query(
            "SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'synchro' AND has_function_privilege('public', p.oid, 'EXECUTE')
             UNION ALL
             SELECT 'type ' || t.oid::regtype::text FROM pg_type t
               JOIN pg_namespace n ON n.oid = t.typnamespace
               LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
               LEFT JOIN pg_class tc ON tc.oid = coalesce(e.typrelid, t.typrelid)
              WHERE n.nspname = 'synchro' AND has_type_privilege('public', t.oid, 'USAGE')
                -- A table's row type (and its array) has no privileges of its own.
                AND (tc.oid IS NULL OR tc.relkind = 'c')
             UNION ALL
             SELECT 'schema synchro' WHERE has_schema_privilege('public', 'synchro', 'USAGE, CREATE')
             UNION ALL
             SELECT 'relation ' || c.oid::regclass::text FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'synchro' AND c.relkind IN ('r', 'v', 'm', 'S', 'p', 'f')
                AND (has_table_privilege('public', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                     OR (c.relkind = 'S' AND has_sequence_privilege('public', c.oid, 'USAGE, SELECT, UPDATE')))
             UNION ALL
             SELECT 'default privileges ' || d.defaclobjtype::text FROM pg_default_acl d
               JOIN pg_namespace n ON n.oid = d.defaclnamespace, aclexplode(d.defaclacl) a
              WHERE n.nspname = 'synchro' AND a.grantee = 0
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// Who may execute each function of the synchro schema, beside synchro_owner (which owns
/// them all): spec 001's role table ("PostgreSQL schema and authorization"), function by
/// function. The adapter has the identity-bearing runtime (connect, push, pull, rebuild),
/// the schema and sanitized readiness; the seed login the manifest and seed export; the
/// monitor sanitized and detailed health; the operator registry, shared scopes, backfill,
/// compaction, recovery, stream reset and debug; the worker WAL consumption and
/// materialization. A function not listed is synchro_owner's alone (called only inside
/// the privileged functions).
const EXECUTE: &[(&str, &[&str])] = &[
    ("synchro_activate_generation", &["synchro_worker"]),
    (
        "synchro_active_client_schemas",
        &["synchro_monitor", "synchro_operator"],
    ),
    ("synchro_add_shared_scope", &["synchro_operator"]),
    ("synchro_analyze_materialized", &["synchro_worker"]),
    ("synchro_assigned_scopes", &["synchro_adapter"]),
    (
        "synchro_assignment_function_check",
        &["synchro_adapter", "synchro_monitor"],
    ),
    ("synchro_assignment_scopes", &["synchro_adapter"]),
    ("synchro_bootstrap_columns", &["synchro_worker"]),
    ("synchro_bootstrap_lock", &["synchro_worker"]),
    ("synchro_bootstrap_rows", &["synchro_worker"]),
    ("synchro_capture_blocked", &["synchro_adapter"]),
    (
        "synchro_capture_report",
        &["synchro_monitor", "synchro_operator"],
    ),
    ("synchro_capture_unblock", &["synchro_operator"]),
    (
        "synchro_catalog_drift",
        &["synchro_monitor", "synchro_operator", "synchro_worker"],
    ),
    ("synchro_changed_scopes", &["synchro_adapter"]),
    ("synchro_changed_scopes_since", &["synchro_adapter"]),
    ("synchro_client_connect", &["synchro_adapter"]),
    ("synchro_client_hold", &["synchro_adapter"]),
    ("synchro_client_state", &["synchro_adapter"]),
    ("synchro_column_has_values", &["synchro_operator"]),
    ("synchro_column_report", &["synchro_operator"]),
    ("synchro_column_zone", &["synchro_worker"]),
    ("synchro_compact_scope", &["synchro_operator"]),
    ("synchro_clear_evaluator_name", &["synchro_operator"]),
    ("synchro_rule_unusable", &["synchro_worker"]),
    ("synchro_compaction_scopes", &["synchro_operator"]),
    (
        "synchro_contract_check",
        &["synchro_monitor", "synchro_operator"],
    ),
    ("synchro_declare_index", &["synchro_operator"]),
    ("synchro_declare_portable_scope", &["synchro_operator"]),
    ("synchro_drop_projection_index", &["synchro_operator"]),
    ("synchro_emit_bootstrap", &["synchro_worker"]),
    ("synchro_expire", &["synchro_operator"]),
    ("synchro_function_definition_sha256", &["synchro_worker"]),
    ("synchro_grant_user_scope", &["synchro_operator"]),
    (
        "synchro_health_detail",
        &["synchro_monitor", "synchro_operator"],
    ),
    ("synchro_index_projection", &["synchro_operator"]),
    ("synchro_insert_manifest", &["synchro_operator"]),
    (
        "synchro_manifest_history",
        &["synchro_adapter", "synchro_operator", "synchro_seed"],
    ),
    ("synchro_pending_generations", &["synchro_operator"]),
    (
        "synchro_portable_scopes",
        &["synchro_operator", "synchro_seed"],
    ),
    ("synchro_pull_page", &["synchro_adapter"]),
    ("synchro_pull_watermark", &["synchro_adapter"]),
    ("synchro_push_fields", &["synchro_adapter"]),
    ("synchro_push_lookup", &["synchro_adapter"]),
    ("synchro_push_mutation_outcomes", &["synchro_adapter"]),
    ("synchro_push_record", &["synchro_adapter"]),
    ("synchro_push_rule_reads", &["synchro_adapter"]),
    ("synchro_push_scopes", &["synchro_adapter"]),
    ("synchro_push_seen", &["synchro_adapter"]),
    ("synchro_push_write_batch", &["synchro_adapter"]),
    ("synchro_readiness", &["synchro_adapter", "synchro_monitor"]),
    ("synchro_rebuild_append", &["synchro_adapter"]),
    ("synchro_rebuild_complete", &["synchro_adapter"]),
    ("synchro_rebuild_create", &["synchro_adapter"]),
    ("synchro_rebuild_page", &["synchro_adapter"]),
    ("synchro_rebuild_session", &["synchro_adapter"]),
    ("synchro_rebuild_sessions_in_progress", &["synchro_adapter"]),
    ("synchro_reconfigure_relation", &["synchro_operator"]),
    ("synchro_record_acks", &["synchro_adapter"]),
    ("synchro_record_membership_coverage", &["synchro_worker"]),
    (
        "synchro_register_assignment_function",
        &["synchro_operator"],
    ),
    ("synchro_register_assignment_rule", &["synchro_operator"]),
    ("synchro_register_impact_function", &["synchro_operator"]),
    ("synchro_register_impact_rule", &["synchro_operator"]),
    (
        "synchro_register_membership_function",
        &["synchro_operator"],
    ),
    ("synchro_register_membership_rule", &["synchro_operator"]),
    ("synchro_register_relation", &["synchro_operator"]),
    ("synchro_registry_snapshot", &["synchro_operator"]),
    ("synchro_remove_shared_scope", &["synchro_operator"]),
    ("synchro_reset_relation", &["synchro_operator"]),
    ("synchro_restart_staging", &["synchro_worker"]),
    ("synchro_retire_relation", &["synchro_operator"]),
    ("synchro_retry_staging", &["synchro_operator"]),
    ("synchro_revoke_user_scope", &["synchro_operator"]),
    (
        "synchro_rollout_report",
        &["synchro_monitor", "synchro_operator"],
    ),
    ("synchro_rule_evaluator", &["synchro_operator"]),
    ("synchro_rule_read_fields", &["synchro_worker"]),
    (
        "synchro_schema_ledger",
        &["synchro_adapter", "synchro_monitor", "synchro_operator"],
    ),
    ("synchro_scope_fingerprint", &["synchro_adapter"]),
    ("synchro_scope_floor", &["synchro_adapter"]),
    ("synchro_scope_keys", &["synchro_adapter"]),
    ("synchro_scope_retention", &["synchro_adapter"]),
    ("synchro_scope_rows", &["synchro_adapter"]),
    ("synchro_scope_rows_of", &["synchro_adapter"]),
    ("synchro_scope_touched", &["synchro_adapter"]),
    ("synchro_seed_export_begin", &["synchro_seed"]),
    ("synchro_seed_export_seal", &["synchro_seed"]),
    ("synchro_seed_page", &["synchro_seed"]),
    ("synchro_seed_receipt", &["synchro_adapter"]),
    ("synchro_seed_scope_rows", &["synchro_seed"]),
    ("synchro_set_setting", &["synchro_operator"]),
    ("synchro_settings", &["synchro_monitor", "synchro_operator"]),
    ("synchro_skip_staging", &["synchro_operator"]),
    (
        "synchro_stage_generation",
        &["synchro_operator", "synchro_worker"],
    ),
    ("synchro_lineage_reset", &["synchro_operator"]),
    ("synchro_lineage_reset_begin", &["synchro_worker"]),
    ("synchro_lineage_reset_prepare", &["synchro_worker"]),
    ("synchro_lineage_copy", &["synchro_worker"]),
    ("synchro_lineage_snapshot_copies", &["synchro_worker"]),
    ("synchro_lineage_restage", &["synchro_worker"]),
    ("synchro_lineage_reset_scope", &["synchro_operator"]),
    ("synchro_stream_state", &["synchro_adapter"]),
    (
        "synchro_transition_scopes",
        &["synchro_adapter", "synchro_operator"],
    ),
    (
        "synchro_unactivated_manifests",
        &["synchro_adapter", "synchro_operator"],
    ),
    ("synchro_undeclare_portable_scope", &["synchro_operator"]),
    (
        "synchro_unready_tables",
        &["synchro_adapter", "synchro_monitor", "synchro_operator"],
    ),
    (
        "synchro_unregister_assignment_function",
        &["synchro_operator"],
    ),
    ("synchro_unregistered_tables", &["synchro_operator"]),
    ("synchro_value_source", &["synchro_worker"]),
];

/// The privileges the worker has on each table and sequence of the synchro schema (every
/// other role has none: spec 001, tables stay inaccessible to adapter, seed and monitor,
/// and the operator works through functions).
const WORKER_TABLES: &[(&str, &str)] = &[
    ("capture_progress", "rw"),
    ("capture_state", "rw"),
    ("fields", "r"),
    ("manifest_affected_scopes", "ar"),
    ("membership_dependencies", "r"),
    ("membership_edges", "ard"),
    ("membership_functions", "rw"),
    ("membership_staged_edges", "ard"),
    ("membership_staged_unscoped", "ard"),
    ("membership_unscoped", "ard"),
    ("pending_fields", "r"),
    ("projection_rows", "arwd"),
    ("projection_stage", "r"),
    ("registry_generations", "r"),
    ("relation_capture", "rw"),
    ("relations", "r"),
    ("rule_evaluators", "r"),
    ("scope_effects", "ar"),
    ("scope_retention", "arw"),
    ("settings", "r"),
];

/// Whether `sql`, run in a transaction that is rolled back, passed the privilege check of
/// what it names: refused means SQLSTATE 42501 with PostgreSQL's own "permission denied
/// for ..." message (a function may raise 42501 itself, for another reason).
async fn permitted(db: &tokio_postgres::Client, set_role: Option<&str>, sql: &str) -> bool {
    db.batch_execute("BEGIN; SET LOCAL statement_timeout = '10s'; SET LOCAL lock_timeout = '2s'")
        .await
        .unwrap();
    if let Some(role) = set_role {
        db.batch_execute(&format!("SET LOCAL ROLE {role}"))
            .await
            .unwrap();
    }
    let result = db.batch_execute(sql).await;
    db.batch_execute("ROLLBACK").await.unwrap();
    match result {
        Ok(()) => true,
        Err(e) => {
            let d = e.as_db_error().expect("a database error");
            !(d.code().code() == "42501" && d.message().starts_with("permission denied for "))
        }
    }
}

/// Item 1 of issue 32: for each of the six group roles, a login that is a member of that
/// role alone (the worker's NOINHERIT login both before and after SET ROLE synchro_worker),
/// calls every function of the synchro schema the catalog lists, with NULL arguments (each
/// a subquery: a STRICT function of constant NULLs is folded away before its EXECUTE
/// privilege is checked), and
/// touches every table and sequence: what the role table allows passes the privilege
/// check, everything else is refused. PUBLIC (a login in no group) may do nothing.
#[tokio::test]
async fn every_role_executes_and_reads_exactly_what_spec_001_grants_it() {
    let env = Env::installed().await;
    env.admin
        .batch_execute("CREATE ROLE matrix_owner LOGIN; GRANT synchro_owner TO matrix_owner")
        .await
        .unwrap();
    // (login, SET ROLE first, the group role whose grants apply)
    let cases: [(&str, Option<&str>, Option<&str>); 8] = [
        ("matrix_owner", None, Some("synchro_owner")),
        ("synchro_dev_adapter", None, Some("synchro_adapter")),
        ("synchro_dev_seed", None, Some("synchro_seed")),
        ("synchro_dev_monitor", None, Some("synchro_monitor")),
        ("synchro_dev_operator", None, Some("synchro_operator")),
        (
            "synchro_dev_worker",
            Some("synchro_worker"),
            Some("synchro_worker"),
        ),
        // NOINHERIT: without SET ROLE the worker login has nothing.
        ("synchro_dev_worker", None, None),
        ("nobody", None, None),
    ];
    let functions: Vec<(String, String, bool)> = env
        .admin
        .query(
            "SELECT p.proname::text,
                    format('SELECT synchro.%I(%s)', p.proname,
                           coalesce((SELECT string_agg(format('(SELECT NULL::%s)', format_type(t, NULL)), ', ' ORDER BY n)
                                       FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n)), '')),
                    p.prorettype = 'trigger'::regtype
               FROM pg_proc p WHERE p.pronamespace = 'synchro'::regnamespace ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(functions.len() > 150, "{}", functions.len());
    let expected: std::collections::BTreeMap<&str, &[&str]> = EXECUTE.iter().copied().collect();
    let mut deviations = Vec::new();
    for (login, set_role, group) in cases {
        let db = env.login(login).await;
        for (name, call, trigger) in &functions {
            let allowed = match group {
                Some("synchro_owner") => true,
                Some(g) => expected
                    .get(name.as_str())
                    .is_some_and(|roles| roles.contains(&g)),
                None => false,
            };
            let got = permitted(&db, set_role, call).await;
            if got != allowed {
                let role = group.unwrap_or(login);
                deviations.push((name.clone(), role.to_owned(), got, *trigger));
            }
        }
    }
    assert_eq!(
        deviations,
        Vec::<(String, String, bool, bool)>::new(),
        "(function, role, executes, is a trigger)"
    );
    // Every function listed exists (a renamed one would silently leave the list).
    for (name, _) in EXECUTE {
        assert!(
            functions.iter().any(|(n, _, _)| n == name),
            "{name} is not in the catalog"
        );
    }

    // Tables and sequences: each privilege tried for real (a statement that touches no row).
    let relations: Vec<(String, String, String)> = env
        .admin
        .query(
            "SELECT c.relname::text, c.relkind::text,
                    (SELECT quote_ident(a.attname) FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                        -- (an identity column refuses a value whatever the privileges)
                        AND a.attidentity = '' AND a.attgenerated = '' ORDER BY a.attnum LIMIT 1)
               FROM pg_class c WHERE c.relnamespace = 'synchro'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get::<_, Option<String>>(2).unwrap_or_default()))
        .collect();
    let worker: std::collections::BTreeMap<&str, &str> = WORKER_TABLES.iter().copied().collect();
    let mut wrong = Vec::new();
    for (login, set_role, group) in cases {
        let db = env.login(login).await;
        for (table, kind, column) in &relations {
            let t = format!("synchro.{table}");
            let tries: Vec<(char, String)> = if kind == "S" {
                vec![
                    ('r', format!("SELECT last_value FROM {t}")),
                    ('w', format!("SELECT nextval('{t}')")),
                ]
            } else {
                vec![
                    ('r', format!("SELECT 1 FROM {t} LIMIT 0")),
                    (
                        'a',
                        format!("INSERT INTO {t} ({column}) SELECT NULL WHERE false"),
                    ),
                    ('w', format!("UPDATE {t} SET {column} = NULL WHERE false")),
                    ('d', format!("DELETE FROM {t} WHERE false")),
                ]
            };
            for (privilege, sql) in tries {
                let allowed = match group {
                    Some("synchro_owner") => true,
                    Some("synchro_worker") => worker
                        .get(table.as_str())
                        .is_some_and(|p| p.contains(privilege)),
                    _ => false,
                };
                if permitted(&db, set_role, &sql).await != allowed {
                    wrong.push(format!("{} {privilege} {table}", group.unwrap_or(login)));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A cluster of its own where the superuser did only what a managed service's provider does:
/// it created `dbowner` (CREATEROLE, no superuser) and its database `managed`; and that
/// superuser's session.
async fn managed_database() -> (TempCluster, tokio_postgres::Client) {
    let cluster = TempCluster::start().unwrap();
    let boot = synchro_server::connect_db(&cluster.admin_url())
        .await
        .unwrap();
    for sql in [
        "CREATE ROLE dbowner LOGIN CREATEROLE",
        "CREATE DATABASE managed OWNER dbowner",
    ] {
        boot.batch_execute(sql).await.unwrap();
    }
    (cluster, boot)
}

/// A managed service's database owner (CREATEROLE, never a superuser) installs and upgrades
/// synchro: the superuser only creates that owner and its database. The result equals a
/// superuser's install but for what only the function's owner can change (PUBLIC keeps
/// EXECUTE on `pg_logical_emit_message`, which `install --check` reports), and the owner
/// login is not left a member of synchro_owner.
#[tokio::test]
async fn a_createrole_database_owner_installs_without_a_superuser() {
    let (cluster, boot) = managed_database().await;
    boot.batch_execute("CREATE DATABASE reference")
        .await
        .unwrap();
    let mut db = synchro_server::connect_db(&cluster.url("dbowner", "managed"))
        .await
        .unwrap();
    let first = install::install(&mut db).await.unwrap();
    assert_eq!(first.applied, (1..=install::VERSION).collect::<Vec<_>>());
    let again = install::install(&mut db).await.unwrap();
    assert!(again.applied.is_empty(), "a second install applies nothing");
    assert_eq!(again.version, install::VERSION);
    for role in ROLES {
        let attrs: Vec<bool> = db
            .query_one(
                "SELECT ARRAY[rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolreplication]
                   FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(attrs, vec![false; 6], "{role}");
    }
    // On PostgreSQL 16 and later the creator stays synchro_owner's administrator (it can
    // grant the group roles to logins), without its privileges or SET ROLE to it.
    let acts_as_owner: bool = db
        .query_one(
            "SELECT pg_has_role('dbowner', 'synchro_owner', 'USAGE')
                 OR (current_setting('server_version_num')::int >= 160000
                     AND pg_has_role('dbowner', 'synchro_owner', 'SET'))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !acts_as_owner,
        "the installing login keeps no way to act as synchro_owner"
    );

    let mut reference = synchro_server::connect_db(&cluster.url("postgres", "reference"))
        .await
        .unwrap();
    install::install(&mut reference).await.unwrap();
    // Listed by the superuser (the catalog query reads what the owner login may not).
    let managed = synchro_server::connect_db(&cluster.url("postgres", "managed"))
        .await
        .unwrap();
    let theirs: String = managed.query_one(CATALOG, &[]).await.unwrap().get(0);
    let ours: String = reference.query_one(CATALOG, &[]).await.unwrap().get(0);
    let differs = |a: &str, b: &str| -> Vec<String> {
        only_in(a, b)
            .into_iter()
            .filter(|l| !l.starts_with("function pg_logical_emit_message("))
            .collect()
    };
    assert_eq!(
        differs(&theirs, &ours),
        Vec::<String>::new(),
        "only in the owner's install"
    );
    assert_eq!(
        differs(&ours, &theirs),
        Vec::<String>::new(),
        "only in the superuser's install"
    );
    let public_may_emit: bool = db
        .query_one(
            "SELECT bool_and(has_function_privilege('public', p.oid, 'EXECUTE'))
               FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        public_may_emit,
        "the owner cannot revoke it, and the install did not pretend to"
    );
}

/// The statuses of `install --check`'s report by check name.
fn statuses(report: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    report["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("no checks: {report}"))
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The `fix` of check `name`.
fn fix<'a>(report: &'a serde_json::Value, name: &str) -> &'a str {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .and_then(|c| c["fix"].as_str())
        .unwrap_or_else(|| panic!("no fix for {name}: {report}"))
}

/// `install --check` changes nothing and names what is missing, with what to do: before an
/// install by a managed service's owner (CREATEROLE, no REPLICATION: the worker login needs
/// the provider's way), after it (PUBLIC's right to emit logical messages, which only the
/// function's owner can take away), on a server without logical decoding (each service's
/// setting), and for a complete superuser install (all ok, exit 0).
#[tokio::test]
async fn install_check_lists_every_prerequisite_and_changes_nothing() {
    let (cluster, boot) = managed_database().await;
    let owner_url = cluster.url("dbowner", "managed");
    let (code, before) = cli_at(&owner_url, &["install", "--check"]);
    assert_eq!(code, 1, "{before}");
    assert_eq!(before["ok"], false);
    let s = statuses(&before);
    for (name, status) in [
        ("postgresql_version", "ok"),
        ("wal_level", "ok"),
        ("replication_slots", "ok"),
        ("wal_senders", "ok"),
        ("tls", "ok"),
        ("installing_login", "ok"),
        ("schema", "missing"),
    ] {
        assert_eq!(s[name], status, "{name}: {before}");
    }
    // A CREATEROLE login can give REPLICATION only with it, from PostgreSQL 16 on.
    assert_eq!(s["worker_login"], "missing", "{before}");
    assert!(fix(&before, "worker_login").contains("rds_replication"));
    let nothing: bool = boot
        .query_one(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname LIKE 'synchro%')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(nothing, "the check created no role");
    let text = before.to_string();
    assert!(
        !text.contains("dbowner") && !text.contains("managed"),
        "no names: {text}"
    );

    let (code, installed) = cli_at(&owner_url, &["install"]);
    assert_eq!(code, 0, "{installed}");
    let (_, after) = cli_at(&owner_url, &["install", "--check"]);
    let s = statuses(&after);
    assert_eq!(s["schema"], "ok", "{after}");
    // The runtime logins, none made yet: serve's and the operator's are missing.
    assert_eq!(s["adapter_login"], "missing", "{after}");
    assert_eq!(s["operator_login"], "missing", "{after}");
    assert_eq!(s["monitor_login"], "ok", "{after}");
    assert!(fix(&after, "adapter_login").contains("GRANT synchro_adapter TO app_adapter"));
    assert_eq!(s["logical_messages"], "warning", "{after}");
    assert!(fix(&after, "logical_messages").contains("REVOKE EXECUTE"));

    // Amazon RDS and Aurora (their roles stood in for): the owner can grant rds_replication,
    // and a worker login replicates through that membership, not the REPLICATION attribute.
    boot.batch_execute(
        "CREATE ROLE rds_replication NOLOGIN; GRANT rds_replication TO dbowner WITH ADMIN OPTION",
    )
    .await
    .unwrap();
    let (_, rds) = cli_at(&owner_url, &["install", "--check"]);
    assert_eq!(statuses(&rds)["worker_login"], "warning", "{rds}");
    assert!(
        fix(&rds, "worker_login").contains("GRANT rds_replication TO app_worker"),
        "{rds}"
    );
    boot.batch_execute(
        "CREATE ROLE app_worker LOGIN NOINHERIT IN ROLE synchro_worker; GRANT rds_replication TO app_worker",
    )
    .await
    .unwrap();
    let (_, rds) = cli_at(&owner_url, &["install", "--check"]);
    assert_eq!(statuses(&rds)["worker_login"], "ok", "{rds}");

    // A complete install by a superuser, with a worker login: nothing missing.
    let env = Env::installed().await;
    let (code, complete) = cli_at(&env.cluster.url("postgres", "app"), &["install", "--check"]);
    assert_eq!(code, 0, "{complete}");
    assert_eq!(complete["ok"], true);
    assert!(
        statuses(&complete).values().all(|s| s == "ok"),
        "{complete}"
    );

    // No logical decoding: the one thing missing, with each service's setting.
    let replica = TempCluster::start_with(&["wal_level=replica"]).unwrap();
    let (code, no_decoding) = cli_at(&replica.admin_url(), &["install", "--check"]);
    assert_eq!(code, 1);
    assert_eq!(statuses(&no_decoding)["wal_level"], "missing");
    let how = fix(&no_decoding, "wal_level");
    assert!(
        how.contains("rds.logical_replication") && how.contains("cloudsql.logical_decoding"),
        "{how}"
    );
}
