//! The migration journal and the ten-step procedure (spec 000 "Client Migration Rules")
//! under injected interruptions: at every step boundary and inside the DDL transaction the
//! engine is stopped (its connection dropped without a commit), the database is reopened
//! and must be either at the source schema with the journal pending, or at the target with
//! its rebuild markers durable — never in between — with every local-only row intact. A
//! reopened engine then finishes the migration. Also: the journal replaces an earlier one
//! that still waits for rebuild, an inconsistent journal blocks without a request, and the
//! application's local-table ladder.

use synchro_testkit::manifests as common;
use synchro_testkit::target;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);
use synchro_testkit::fake_server as fake;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{field, manifest, table};
use fake::{Fake, Row};
use synchro_client::engine::{Client, Failpoint, SchemaActionKind};
use synchro_client::queue::{LocalWrite, MutationState, Operation};
use synchro_protocol::manifest::Manifest;
use synchro_protocol::state::ClientState;
use synchro_protocol::value::{Scalar, TypedValue};

fn docs_table() -> String {
    table(
        "tbl_docs",
        "docs",
        "multi_scope",
        &[
            field("f1", "id", "int64", false, false),
            field("f2", "title", "string", true, true),
        ],
        &[],
    )
}

fn v1() -> Manifest {
    manifest(1, None, "initial", 1, &[docs_table()])
}

/// Class 3: a new table with rows; only scope `a` is affected.
fn v2(parent: &Manifest) -> Manifest {
    let notes = table(
        "tbl_notes",
        "notes",
        "single_scope",
        &[
            field("n1", "id", "int64", false, false),
            field("n2", "body", "string", true, true),
        ],
        &[],
    );
    manifest(2, Some(parent), "class_3", 2, &[docs_table(), notes])
}

fn doc(scope: &str, id: i64, title: &str) -> Row {
    Row {
        scope: scope.into(),
        table_id: "tbl_docs".into(),
        pk: id.to_string(),
        row: format!(r#"{{"f1":"{id}","f2":"{title}"}}"#),
        version: format!("{id}"),
    }
}

fn note(scope: &str, id: i64) -> Row {
    Row {
        scope: scope.into(),
        table_id: "tbl_notes".into(),
        pk: id.to_string(),
        row: format!(r#"{{"n1":"{id}","n2":"note {id}"}}"#),
        version: format!("{}", 100 + id),
    }
}

const LADDER: &[&str] = &["CREATE TABLE drafts (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"];

fn open(
    path: &PathBuf,
    server: &Fake,
) -> Result<Client<Fake>, synchro_client::engine::ClientError> {
    let mut storage = target::open(path);
    storage.migrate_local(LADDER).unwrap();
    let mut n = 0u8;
    Client::open(storage, server.clone(), move || {
        n = n.wrapping_add(1);
        [n; 16]
    })
}

/// A v1 client with two scopes, three local-only rows, synced; the server then moves to v2.
async fn at_v1(path: &PathBuf) -> (Fake, Client<Fake>) {
    let server = Fake::default();
    {
        let mut st = server.0.borrow_mut();
        st.lineage = vec![v1()];
        st.scopes = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        st.rows = vec![
            doc("a", 1, "one"),
            doc("a", 2, "two"),
            doc("a", 3, "three"),
            doc("b", 4, "four"),
        ];
    }
    let mut c = open(path, &server).unwrap();
    for i in 1..=3 {
        c.storage()
            .connection()
            .execute("INSERT INTO drafts VALUES (?, 'mine')", [i])
            .unwrap();
    }
    let r = c.sync_once().await.unwrap();
    assert_eq!(r.action, SchemaActionKind::Replace);
    // Offline intent that every step must keep: an update of a row of the affected scope
    // and an insert of a row the server has never seen.
    let one = TypedValue::from_scalar(Scalar::Int64(1)).unwrap();
    let nine = TypedValue::from_scalar(Scalar::Int64(9)).unwrap();
    let queued = TypedValue::from_scalar(Scalar::String("queued".into())).unwrap();
    for (operation, pk) in [(Operation::Update, &one), (Operation::Insert, &nine)] {
        c.write(&LocalWrite {
            table_id: "tbl_docs",
            operation,
            pk,
            columns: &[("f2".into(), queued.clone())],
        })
        .unwrap();
    }
    {
        let mut st = server.0.borrow_mut();
        let next = v2(&st.lineage[0]);
        st.lineage.push(next);
        st.rebuild_scopes
            .insert(2, BTreeSet::from(["a".to_owned()]));
        st.rows.push(note("a", 1));
        st.rows.push(note("a", 2));
        st.rows.push(note("a", 3));
    }
    (server, c)
}

struct Durable {
    version: u64,
    journal: Option<String>,
    rebuild: Vec<(String, bool)>,
    drafts: i64,
    docs: i64,
}

fn inspect(path: &PathBuf) -> Durable {
    let s = target::open(path);
    let conn = s.connection();
    let rebuild = {
        let mut q = conn
            .prepare(r#"SELECT "scope_id", "rebuild" FROM "_synchro_scopes" ORDER BY 1"#)
            .unwrap();
        let out = q
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? == 1)))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        out
    };
    Durable {
        version: s.active_schema().unwrap().unwrap().schema_version,
        journal: conn
            .query_row(r#"SELECT "phase" FROM "_synchro_journal""#, [], |r| {
                r.get(0)
            })
            .ok(),
        rebuild,
        drafts: conn
            .query_row("SELECT count(*) FROM drafts", [], |r| r.get(0))
            .unwrap(),
        docs: conn
            .query_row("SELECT count(*) FROM docs", [], |r| r.get(0))
            .unwrap(),
    }
}

/// Long on purpose: every failpoint in turn, each followed by the same checks of what
/// survives and of the recovery.
#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn every_interruption_leaves_source_with_journal_or_target_with_markers() {
    let cases = [
        (Failpoint::AfterJournal, "source"),
        (Failpoint::InsideDdl, "source"),
        (Failpoint::BeforeDdlCommit, "source"),
        (Failpoint::AfterDdlCommit, "target"),
        (Failpoint::InsideRebuild, "target"),
        (Failpoint::BeforeJournalClear, "target-rebuilt"),
    ];
    for (failpoint, expect) in cases {
        let path = target::fresh_path(&format!("{failpoint:?}")).await;
        let (server, mut c) = at_v1(&path).await;
        let queue = c.storage().mutations().unwrap();
        assert_eq!(queue.len(), 2);
        c.set_failpoint(failpoint);
        let e = c.sync_once().await.unwrap_err();
        assert_eq!(e.code(), "injected", "{failpoint:?}");
        drop(c); // the process stops here: an open transaction is rolled back

        let d = inspect(&path);
        let markers = match expect {
            "source" => {
                assert_eq!(
                    (d.version, d.journal.as_deref()),
                    (1, Some("pending")),
                    "{failpoint:?}"
                );
                let tables: i64 = target::open(&path)
                    .connection()
                    .query_row(
                        "SELECT count(*) FROM sqlite_schema WHERE name = 'notes'",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert_eq!(tables, 0, "no DDL of the target: {failpoint:?}");
                vec![("a".to_owned(), false), ("b".to_owned(), false)]
            }
            "target" => {
                assert_eq!(
                    (d.version, d.journal.as_deref()),
                    (2, Some("committed")),
                    "{failpoint:?}"
                );
                vec![("a".to_owned(), true), ("b".to_owned(), false)]
            }
            _ => {
                assert_eq!(
                    (d.version, d.journal.as_deref()),
                    (2, Some("committed")),
                    "{failpoint:?}"
                );
                vec![("a".to_owned(), false), ("b".to_owned(), false)]
            }
        };
        assert_eq!(d.rebuild, markers, "{failpoint:?}");
        assert_eq!(
            (d.drafts, d.docs),
            (3, 5),
            "local-only and synced rows kept: {failpoint:?}"
        );
        // Every queued mutation intact (pushed already when the interruption came after
        // step 7, push first).
        let kept: Vec<_> = target::open(&path)
            .mutations()
            .unwrap()
            .into_iter()
            .map(|m| {
                let pushed = m.state == MutationState::Applied;
                assert!(pushed || m.state == MutationState::Pending, "{failpoint:?}");
                synchro_client::queue::QueuedMutation {
                    state: MutationState::Pending,
                    ..m
                }
            })
            .collect();
        assert_eq!(kept, queue, "every queued mutation intact: {failpoint:?}");

        // Restart: recovery reads the journal before any request, then the next round
        // finishes the migration.
        let before = server.0.borrow().requests.len();
        let mut c = open(&path, &server).unwrap();
        assert_eq!(
            server.0.borrow().requests.len(),
            before,
            "recovery sends nothing"
        );
        assert_eq!(c.manifest().unwrap().schema_version, 2, "{failpoint:?}");
        let r = c.sync_once().await.unwrap();
        assert!(
            r.verified.contains("a") && r.verified.contains("b"),
            "{failpoint:?}"
        );
        assert_eq!(c.journal_phase().unwrap(), None, "{failpoint:?}");
        assert_eq!(c.state(), ClientState::Idle);
        let d = inspect(&path);
        assert_eq!(
            d.rebuild,
            [("a".to_owned(), false), ("b".to_owned(), false)]
        );
        assert_eq!((d.drafts, d.docs), (3, 5));
        // The same intent, now pushed (push first: before the rebuild).
        let after = c.storage().mutations().unwrap();
        let same = |q: &synchro_client::queue::QueuedMutation| {
            let m = &q.mutation;
            (
                m.mutation_id.clone(),
                m.columns.clone(),
                m.authored_schema.clone(),
            )
        };
        assert_eq!(
            after.iter().map(same).collect::<Vec<_>>(),
            queue.iter().map(same).collect::<Vec<_>>(),
            "{failpoint:?}"
        );
        assert!(
            after.iter().all(|m| m.state == MutationState::Applied),
            "{failpoint:?}"
        );
        let st = server.0.borrow();
        let requests = &st.requests[before..];
        // (When the interruption came after step 7, the push was already done.)
        if let (Some(rebuild), Some(push)) = (
            requests.iter().position(|p| p == "/sync/rebuild"),
            requests.iter().position(|p| p == "/sync/push"),
        ) {
            assert!(
                push < rebuild,
                "push before rebuild: {failpoint:?} {requests:?}"
            );
        }
        drop(st);
        let notes: i64 = c
            .storage()
            .connection()
            .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(notes, 3, "{failpoint:?}");
        // Only the affected scope was rebuilt for the migration.
        let st = server.0.borrow();
        let rebuilds = st.requests[before..]
            .iter()
            .filter(|p| *p == "/sync/rebuild")
            .count();
        assert_eq!(
            rebuilds,
            if expect == "target-rebuilt" { 0 } else { 3 },
            "{failpoint:?}: scope a only, its 6 rows in pages of 2"
        );
        drop(st);
        target::remove(&path);
    }
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn an_inconsistent_journal_blocks_without_a_request() {
    let path = target::fresh_path("inconsistent").await;
    let (server, mut c) = at_v1(&path).await;
    c.set_failpoint(Failpoint::AfterJournal);
    c.sync_once().await.unwrap_err();
    drop(c);
    // The pending journal's source is not the active schema any more.
    target::open(&path)
        .connection()
        .execute(
            r#"UPDATE "_synchro_journal" SET "source_body" = "target_body""#,
            [],
        )
        .unwrap();
    let before = server.0.borrow().requests.len();
    let e = open(&path, &server).err().expect("blocked");
    assert_eq!(
        (e.code(), e.retryable()),
        ("local_state_inconsistent", false)
    );
    assert_eq!(server.0.borrow().requests.len(), before);
    let d = inspect(&path);
    assert_eq!((d.version, d.drafts, d.docs), (1, 3, 5));
    assert_eq!(target::open(&path).mutations().unwrap().len(), 2);
    target::remove(&path);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_new_migration_carries_over_unfinished_rebuilds() {
    let path = target::fresh_path("carry").await;
    let (server, mut c) = at_v1(&path).await;
    c.set_failpoint(Failpoint::AfterDdlCommit);
    c.sync_once().await.unwrap_err();
    // While scope a still waits for rebuild, the server moves on with a Class 2 change.
    {
        let mut st = server.0.borrow_mut();
        let parent = st.lineage[1].clone();
        let tags = table(
            "tbl_tags",
            "tags",
            "multi_scope",
            &[field("t1", "id", "string", false, false)],
            &[],
        );
        let notes = table(
            "tbl_notes",
            "notes",
            "single_scope",
            &[
                field("n1", "id", "int64", false, false),
                field("n2", "body", "string", true, true),
            ],
            &[],
        );
        st.lineage.push(manifest(
            3,
            Some(&parent),
            "class_2",
            2,
            &[docs_table(), notes, tags],
        ));
    }
    c.set_failpoint(Failpoint::AfterDdlCommit);
    c.sync_once().await.unwrap_err();
    let d = inspect(&path);
    assert_eq!((d.version, d.journal.as_deref()), (3, Some("committed")));
    assert_eq!(
        d.rebuild,
        [("a".to_owned(), true), ("b".to_owned(), false)],
        "a's rebuild obligation stays journaled"
    );
    c.set_failpoint(Failpoint::None);
    let r = c.sync_once().await.unwrap();
    assert_eq!(r.rebuilt, BTreeSet::from(["a".to_owned()]));
    assert_eq!(c.journal_phase().unwrap(), None);
    target::remove(&path);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn the_local_ladder_is_contiguous_transactional_and_refuses_newer_databases() {
    let path = target::fresh_path("ladder").await;
    let mut s = target::open(&path);
    s.install(&v1()).unwrap();
    assert_eq!(
        s.migrate_local(&["CREATE TABLE cache (k TEXT PRIMARY KEY)"])
            .unwrap(),
        1
    );
    // A failing rung rolls back with its version bump; earlier rungs stay.
    let ladder = [
        "CREATE TABLE cache (k TEXT PRIMARY KEY)",
        "ALTER TABLE cache ADD COLUMN v TEXT; CREATE TABLE broken (",
    ];
    assert!(s.migrate_local(&ladder).is_err());
    let version: i64 = s
        .connection()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let columns: i64 = s
        .connection()
        .query_row("SELECT count(*) FROM pragma_table_info('cache')", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!((version, columns), (1, 1));
    // A rung may not touch synced tables or synchro metadata.
    for bad in [
        "ALTER TABLE docs ADD COLUMN mine TEXT",
        "CREATE INDEX docs_title ON docs (title)",
        r#"DROP TABLE "_synchro_rows""#,
    ] {
        let e = s
            .migrate_local(&["CREATE TABLE cache (k TEXT PRIMARY KEY)", bad])
            .unwrap_err();
        assert_eq!(e.code(), "local_schema_error", "{bad}");
    }
    assert_eq!(
        s.migrate_local(&[
            "CREATE TABLE cache (k TEXT PRIMARY KEY)",
            "ALTER TABLE cache ADD COLUMN v TEXT"
        ])
        .unwrap(),
        2
    );
    drop(s);
    // An older application (a shorter ladder) refuses the newer database untouched.
    let mut s = target::open(&path);
    let e = s
        .migrate_local(&["CREATE TABLE cache (k TEXT PRIMARY KEY)"])
        .unwrap_err();
    assert_eq!(e.code(), "local_schema_error");
    let version: i64 = s
        .connection()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 2);
    target::remove(&path);
}
