//! Migration plans: hand-written golden SQL for a first install, every Class 2 and Class 3
//! example of spec 000, and a reset; hash binding; refusal of incompatible migrations; and
//! execution of every rendered plan against a real SQLite with data carried across.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::*;
use rusqlite::Connection;
use synchro_protocol::jcs;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::{MigrationPlan, PlanMode};

const SCHEMA_DDL: &str = r#"CREATE TABLE "_synchro_schema" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "version" INTEGER NOT NULL, "hash" TEXT NOT NULL, "body" TEXT NOT NULL) STRICT"#;
const DOCUMENTS_DDL: &str = r#"CREATE TABLE "documents" ("amount" TEXT, "count" INTEGER CHECK ("count" BETWEEN -2147483648 AND 2147483647), "id" TEXT NOT NULL PRIMARY KEY, "title" TEXT) STRICT"#;
const DOCUMENTS_PROV_SINGLE: &str = r#"CREATE TABLE "_synchro_provenance:tbl_documents" ("pk" TEXT NOT NULL PRIMARY KEY, "scope_id" TEXT NOT NULL) STRICT, WITHOUT ROWID"#;
const DOCUMENTS_PROV_MULTI: &str = r#"CREATE TABLE "_synchro_provenance:tbl_documents" ("pk" TEXT NOT NULL, "scope_id" TEXT NOT NULL, PRIMARY KEY ("pk", "scope_id")) STRICT, WITHOUT ROWID"#;
const DOCUMENTS_PROV_INDEX: &str = r#"CREATE INDEX "_synchro_provenance:tbl_documents:scope" ON "_synchro_provenance:tbl_documents" ("scope_id")"#;
const NOTES_DDL: &str =
    r#"CREATE TABLE "notes" ("body" TEXT, "id" INTEGER NOT NULL PRIMARY KEY) STRICT"#;
const NOTES_PROV_MULTI: &str = r#"CREATE TABLE "_synchro_provenance:tbl_notes" ("pk" INTEGER NOT NULL, "scope_id" TEXT NOT NULL, PRIMARY KEY ("pk", "scope_id")) STRICT, WITHOUT ROWID"#;
const NOTES_PROV_SINGLE: &str = r#"CREATE TABLE "_synchro_provenance:tbl_notes" ("pk" INTEGER NOT NULL PRIMARY KEY, "scope_id" TEXT NOT NULL) STRICT, WITHOUT ROWID"#;
const NOTES_PROV_INDEX: &str = r#"CREATE INDEX "_synchro_provenance:tbl_notes:scope" ON "_synchro_provenance:tbl_notes" ("scope_id")"#;
const NEW_TABLE: [&str; 3] = [
    r#"CREATE TABLE "new" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" BETWEEN -2147483648 AND 2147483647)) STRICT"#,
    r#"CREATE TABLE "_synchro_provenance:tbl_new" ("pk" INTEGER NOT NULL PRIMARY KEY, "scope_id" TEXT NOT NULL) STRICT, WITHOUT ROWID"#,
    r#"CREATE INDEX "_synchro_provenance:tbl_new:scope" ON "_synchro_provenance:tbl_new" ("scope_id")"#,
];

fn set_schema_prefix(m: &Manifest) -> String {
    format!(
        r#"INSERT OR REPLACE INTO "_synchro_schema" ("id", "version", "hash", "body") VALUES (1, {}, '{}', '"#,
        m.schema_version,
        m.schema_hash_hex()
    )
}

/// Compares a plan's SQL with the expected DDL; the final statement must record `target`.
fn assert_sql(plan: &MigrationPlan, target: &Manifest, ddl: &[&str]) {
    let sql = plan.render();
    let (last, body) = sql.split_last().expect("a plan has statements");
    assert_eq!(body, ddl, "DDL differs");
    assert!(last.starts_with(&set_schema_prefix(target)), "{last}");
    assert!(last.ends_with(&format!(
        "{}')",
        target.canonical_body().replace('\'', "''")
    )));
}

fn v2(tables: &[String]) -> Manifest {
    manifest(2, Some(&base()), "class_2", 1, tables)
}

fn v2c3(tables: &[String]) -> Manifest {
    manifest(2, Some(&base()), "class_3", 2, tables)
}

fn new_table() -> String {
    table(
        "tbl_new",
        "new",
        "single_scope",
        &[field("fld_new_id", "id", "int", false, false)],
        &[],
    )
}

#[test]
fn install_plan_golden() {
    let m = base();
    let plan = MigrationPlan::derive(None, &m, false).unwrap();
    assert_eq!(plan.mode, PlanMode::Install);
    assert_eq!(plan.source, None);
    assert_sql(
        &plan,
        &m,
        &[
            SCHEMA_DDL,
            DOCUMENTS_DDL,
            DOCUMENTS_PROV_SINGLE,
            DOCUMENTS_PROV_INDEX,
            NOTES_DDL,
            NOTES_PROV_MULTI,
            NOTES_PROV_INDEX,
        ],
    );
}

/// Every Class 2 and Class 3 example: (name, target manifest, expected DDL).
fn compatible_cases() -> Vec<(&'static str, Manifest, Vec<&'static str>)> {
    let extra = field("fld_doc_extra", "extra", "string", true, true);
    let flag = field("fld_doc_flag", "flag", "boolean", false, true);
    let idx = index("idx_doc_title", "idx_doc_title", &["fld_doc_title"], false);
    vec![
        (
            "class 2: add nullable field",
            v2(&[documents(&[extra], &[]), notes()]),
            vec![r#"ALTER TABLE "documents" ADD COLUMN "extra" TEXT"#],
        ),
        (
            "class 2: add empty table",
            v2(&[documents(&[], &[]), notes(), new_table()]),
            NEW_TABLE.to_vec(),
        ),
        (
            "class 2: add local index",
            v2(&[documents(&[], &[idx]), notes()]),
            vec![r#"CREATE INDEX "idx_doc_title" ON "documents" ("title")"#],
        ),
        (
            "class 2: nullable false -> true",
            v2(&[
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 10, 2, true),
                ),
                notes(),
            ]),
            vec![],
        ),
        (
            "class 2: writable false -> true",
            v2(&[
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "count", "int", false, true),
                ),
                notes(),
            ]),
            vec![],
        ),
        (
            "class 2: widen decimal",
            v2(&[
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 12, 3, false),
                ),
                notes(),
            ]),
            vec![],
        ),
        (
            "class 3: add table with rows",
            v2c3(&[documents(&[], &[]), notes(), new_table()]),
            NEW_TABLE.to_vec(),
        ),
        (
            "class 3: add field with historical values",
            v2c3(&[documents(&[flag], &[]), notes()]),
            vec![r#"ALTER TABLE "documents" ADD COLUMN "flag" INTEGER CHECK ("flag" IN (0, 1))"#],
        ),
        (
            "class 3: single_scope -> multi_scope",
            v2c3(&[documents_multi(), notes()]),
            vec![
                r#"DROP TABLE "_synchro_provenance:tbl_documents""#,
                DOCUMENTS_PROV_MULTI,
                DOCUMENTS_PROV_INDEX,
            ],
        ),
        (
            "class 3: multi_scope -> single_scope",
            v2c3(&[documents(&[], &[]), notes_single()]),
            vec![
                r#"DROP TABLE "_synchro_provenance:tbl_notes""#,
                NOTES_PROV_SINGLE,
                NOTES_PROV_INDEX,
            ],
        ),
        (
            "class 3: membership materialization or reconfiguration (same shape)",
            v2c3(&[documents(&[], &[]), notes()]),
            vec![],
        ),
    ]
}

#[test]
fn compatible_plan_goldens() {
    let src = base();
    for (name, target, ddl) in compatible_cases() {
        let plan = MigrationPlan::derive(Some(&src), &target, false)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.mode, PlanMode::Migrate, "{name}");
        assert_eq!(plan.source, Some(src.schema_ref()));
        assert_eq!(plan.target, target.schema_ref());
        assert_sql(&plan, &target, &ddl);
    }
}

fn reset_target() -> Manifest {
    // notes removed; documents: count int -> int64, title renamed to heading, amount kept.
    let docs = table(
        "tbl_documents",
        "documents",
        "single_scope",
        &[
            field("fld_doc_id", "id", "string", false, false),
            field("fld_doc_title", "heading", "string", true, true),
            decimal("fld_doc_amount", "amount", 10, 2, false),
            field("fld_doc_count", "count", "int64", false, false),
        ],
        &[index(
            "idx_doc_heading",
            "idx_doc_heading",
            &["fld_doc_title"],
            true,
        )],
    );
    manifest(2, Some(&base()), "class_4", 2, &[docs])
}

#[test]
fn reset_plan_golden() {
    let src = base();
    let target = reset_target();
    assert!(
        MigrationPlan::derive(Some(&src), &target, false).is_err(),
        "migrate mode refuses class 4"
    );
    let plan = MigrationPlan::derive(Some(&src), &target, true).unwrap();
    assert_eq!(plan.mode, PlanMode::Reset);
    assert_sql(
        &plan,
        &target,
        &[
            r#"DROP TABLE "_synchro_provenance:tbl_notes""#,
            r#"DROP TABLE "notes""#,
            r#"CREATE TABLE "_synchro_rebuild:documents" ("amount" TEXT, "count" INTEGER, "id" TEXT NOT NULL PRIMARY KEY, "heading" TEXT) STRICT"#,
            r#"INSERT INTO "_synchro_rebuild:documents" ("amount", "id", "heading") SELECT "amount", "id", "title" FROM "documents""#,
            r#"DROP TABLE "documents""#,
            r#"ALTER TABLE "_synchro_rebuild:documents" RENAME TO "documents""#,
            r#"CREATE UNIQUE INDEX "idx_doc_heading" ON "documents" ("heading")"#,
        ],
    );
}

#[test]
fn migrate_mode_refuses_every_incompatible_difference() {
    let src = base();
    for (name, tables) in [
        ("removed table", vec![documents(&[], &[])]),
        (
            "retyped field",
            vec![
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "count", "int64", false, false),
                ),
                notes(),
            ],
        ),
        (
            "renamed field",
            vec![
                documents_with(
                    "fld_doc_count",
                    field("fld_doc_count", "n", "int", false, false),
                ),
                notes(),
            ],
        ),
        (
            "narrowed decimal",
            vec![
                documents_with(
                    "fld_doc_amount",
                    decimal("fld_doc_amount", "amount", 9, 2, false),
                ),
                notes(),
            ],
        ),
    ] {
        let target = manifest(2, Some(&src), "class_4", 2, &tables);
        let err = MigrationPlan::derive(Some(&src), &target, false).unwrap_err();
        assert_eq!(err.code(), "invalid_migration_plan", "{name}");
    }
    let with_idx = manifest(
        1,
        None,
        "initial",
        1,
        &[
            documents(&[], &[index("i", "i", &["fld_doc_title"], false)]),
            notes(),
        ],
    );
    let without = manifest(
        2,
        Some(&with_idx),
        "class_4",
        2,
        &[documents(&[], &[]), notes()],
    );
    assert!(
        MigrationPlan::derive(Some(&with_idx), &without, false).is_err(),
        "removed index"
    );
}

#[test]
fn plans_are_hash_bound_to_both_references() {
    let src = base();
    let cases = compatible_cases();
    let (_, target, _) = &cases[0];
    let plan = MigrationPlan::derive(Some(&src), target, false).unwrap();
    plan.verify(Some(&src), target).unwrap();
    // Canonical JSON, stable hash.
    let text = plan.to_json_string();
    assert_eq!(jcs::canonicalize(&text).unwrap(), text);
    assert_eq!(
        plan.plan_hash(),
        MigrationPlan::derive(Some(&src), target, false)
            .unwrap()
            .plan_hash()
    );
    // Another source, another target, another mode or an edited op: another hash, and
    // verification against the persisted manifests fails.
    let other_target = &cases[1].1;
    let from_install = MigrationPlan::derive(None, target, false).unwrap();
    assert_ne!(from_install.plan_hash(), plan.plan_hash());
    assert_ne!(
        MigrationPlan::derive(Some(&src), other_target, false)
            .unwrap()
            .plan_hash(),
        plan.plan_hash()
    );
    let reset = MigrationPlan::derive(Some(&src), target, true).unwrap();
    assert_ne!(reset.plan_hash(), plan.plan_hash(), "mode is bound");
    assert!(plan.verify(Some(&src), other_target).is_err());
    assert!(plan.verify(None, target).is_err());
    let mut edited = plan.clone();
    edited.ops.remove(0);
    assert_ne!(edited.plan_hash(), plan.plan_hash());
    assert_eq!(
        edited.verify(Some(&src), target).unwrap_err().code(),
        "invalid_migration_plan"
    );
}

#[test]
fn local_names_sqlite_would_reject_or_confuse_are_refused() {
    for (name, tables) in [
        (
            "reserved prefix",
            vec![table(
                "t",
                "_synchro_x",
                "single_scope",
                &[field("k", "k", "int", false, false)],
                &[],
            )],
        ),
        (
            "sqlite prefix",
            vec![table(
                "t",
                "SQLite_stat",
                "single_scope",
                &[field("k", "k", "int", false, false)],
                &[],
            )],
        ),
        (
            "case-insensitive table collision",
            vec![
                table(
                    "t1",
                    "Docs",
                    "single_scope",
                    &[field("k", "k", "int", false, false)],
                    &[],
                ),
                table(
                    "t2",
                    "docs",
                    "single_scope",
                    &[field("k", "k", "int", false, false)],
                    &[],
                ),
            ],
        ),
        (
            "index named like a table",
            vec![table(
                "t1",
                "docs",
                "single_scope",
                &[field("k", "k", "int", false, false)],
                &[index("i", "DOCS", &["k"], false)],
            )],
        ),
        (
            "case-insensitive column collision",
            vec![table(
                "t1",
                "docs",
                "single_scope",
                &[
                    field("k", "k", "int", false, false),
                    field("k2", "K", "int", true, true),
                ],
                &[],
            )],
        ),
        (
            "table IDs colliding in provenance names",
            vec![
                table(
                    "T",
                    "a",
                    "single_scope",
                    &[field("k", "k", "int", false, false)],
                    &[],
                ),
                table(
                    "t",
                    "b",
                    "single_scope",
                    &[field("k", "k", "int", false, false)],
                    &[],
                ),
            ],
        ),
    ] {
        let m = manifest(1, None, "initial", 1, &tables);
        assert_eq!(
            MigrationPlan::derive(None, &m, false).unwrap_err().code(),
            "invalid_migration_plan",
            "{name}"
        );
    }
    // Quotes in names are quoted, not interpreted.
    let m = manifest(
        1,
        None,
        "initial",
        1,
        &[table(
            "t",
            "a\\\"b",
            "single_scope",
            &[field("k", "k'\\\"", "string", false, false)],
            &[],
        )],
    );
    let sql = MigrationPlan::derive(None, &m, false).unwrap().render();
    assert_eq!(
        sql[1],
        r#"CREATE TABLE "a""b" ("k'""" TEXT NOT NULL PRIMARY KEY) STRICT"#
    );
    let db = Connection::open_in_memory().unwrap();
    run(&db, &sql);
}

fn run(db: &Connection, sql: &[String]) {
    let tx = db.unchecked_transaction().unwrap();
    for s in sql {
        tx.execute_batch(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    tx.commit().unwrap();
}

fn installed(m: &Manifest) -> Connection {
    let db = Connection::open_in_memory().unwrap();
    run(
        &db,
        &MigrationPlan::derive(None, m, false).unwrap().render(),
    );
    db.execute_batch(
        r#"INSERT INTO "documents" ("id", "title", "amount", "count") VALUES ('d1', 'hello', '12.50', 3), ('d2', NULL, '0.01', -4);
           INSERT INTO "_synchro_provenance:tbl_documents" ("pk", "scope_id") VALUES ('d1', 'user:a'), ('d2', 'user:a');
           INSERT INTO "notes" ("id", "body") VALUES (9223372036854775807, 'n');"#,
    )
    .unwrap();
    db
}

fn active_schema(db: &Connection) -> (i64, String) {
    db.query_row(
        r#"SELECT "version", "hash" FROM "_synchro_schema""#,
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[test]
fn every_plan_runs_on_real_sqlite_and_keeps_rows() {
    let src = base();
    let mut targets: Vec<(&str, Manifest, bool)> = compatible_cases()
        .into_iter()
        .map(|(n, m, _)| (n, m, false))
        .collect();
    targets.push(("reset", reset_target(), true));
    for (name, target, reset) in targets {
        let db = installed(&src);
        assert_eq!(active_schema(&db), (1, src.schema_hash_hex()));
        run(
            &db,
            &MigrationPlan::derive(Some(&src), &target, reset)
                .unwrap()
                .render(),
        );
        assert_eq!(active_schema(&db), (2, target.schema_hash_hex()), "{name}");
        let body: String = db
            .query_row(r#"SELECT "body" FROM "_synchro_schema""#, [], |r| r.get(0))
            .unwrap();
        assert_eq!(body, target.canonical_body());
        // Document rows and their values survive every plan (the reset keeps the columns
        // whose contract did not narrow).
        let kept: Vec<(String, String)> = db
            .prepare(r#"SELECT "id", "amount" FROM "documents" ORDER BY "id""#)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            kept,
            [
                ("d1".to_owned(), "12.50".to_owned()),
                ("d2".to_owned(), "0.01".to_owned())
            ],
            "{name}"
        );
        // STRICT storage refuses a value its column type cannot hold.
        assert!(
            db.execute(
                r#"INSERT INTO "documents" ("id", "count") VALUES ('x', 'abc')"#,
                []
            )
            .is_err(),
            "{name}"
        );
        assert!(
            db.execute(r#"INSERT INTO "documents" ("id") VALUES (NULL)"#, [])
                .is_err(),
            "{name}"
        );
    }
    // The reset carried the renamed column's values and left the retyped one empty.
    let db = installed(&src);
    run(
        &db,
        &MigrationPlan::derive(Some(&src), &reset_target(), true)
            .unwrap()
            .render(),
    );
    let (heading, count): (Option<String>, Option<i64>) = db
        .query_row(
            r#"SELECT "heading", "count" FROM "documents" WHERE "id" = 'd1'"#,
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((heading.as_deref(), count), (Some("hello"), None));
    assert!(
        db.execute(r#"SELECT 1 FROM "notes""#, []).is_err(),
        "notes dropped"
    );
    // A boolean column refuses values other than 0 and 1.
    let db = installed(&src);
    let flag = &compatible_cases()[7];
    run(
        &db,
        &MigrationPlan::derive(Some(&src), &flag.1, false)
            .unwrap()
            .render(),
    );
    assert!(db
        .execute(r#"UPDATE "documents" SET "flag" = 2"#, [])
        .is_err());
    db.execute(r#"UPDATE "documents" SET "flag" = 1"#, [])
        .unwrap();
}

#[test]
fn a_failing_plan_leaves_the_previous_schema_intact() {
    let src = base();
    let db = installed(&src);
    let target = v2(&[
        documents(
            &[field("fld_doc_extra", "extra", "string", true, true)],
            &[],
        ),
        notes(),
    ]);
    let mut sql = MigrationPlan::derive(Some(&src), &target, false)
        .unwrap()
        .render();
    sql.insert(1, "SELECT no_such_function()".into());
    let tx = db.unchecked_transaction().unwrap();
    let failed = sql.iter().any(|s| tx.execute_batch(s).is_err());
    assert!(failed);
    tx.rollback().unwrap();
    assert_eq!(active_schema(&db), (1, src.schema_hash_hex()));
    assert!(db
        .execute(r#"SELECT "extra" FROM "documents""#, [])
        .is_err());
}
