//! The durable mutation queue (spec 000 "Authored-Schema Queued Mutations"), natively and in
//! Chromium on OPFS: a local write changes the visible row and appends its mutation in one
//! transaction, with presence kept apart from null, the authored schema, the base version,
//! the per-row client version and the local order; a refused write leaves neither; pull and
//! rebuild never overwrite a row with unresolved intent while still verifying the scope;
//! clearing resolved intent keeps what is pending, and no counter is handed out twice.

use synchro_testkit::fake_server as fake;
use synchro_testkit::manifests as common;
use synchro_testkit::target;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

use std::cell::Cell;
use std::collections::BTreeSet;
use std::rc::Rc;

use common::{field, manifest, table};
use fake::{Fake, Row};
use synchro_client::engine::Client;
use synchro_client::queue::{LocalWrite, MutationState, Operation, QueuedMutation};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::types::PortableType;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_protocol::wire::{AuthoredSchema, Column};

fn v1() -> Manifest {
    manifest(
        1,
        None,
        "initial",
        1,
        &[table(
            "tbl_docs",
            "docs",
            "multi_scope",
            &[
                field("f1", "id", "int64", false, false),
                field("f2", "title", "string", true, true),
                field("f3", "body", "string", true, true),
            ],
            &[],
        )],
    )
}

fn doc(id: i64, title: &str, version: &str) -> Row {
    Row {
        scope: "a".into(),
        table_id: "tbl_docs".into(),
        pk: id.to_string(),
        row: format!(r#"{{"f1":"{id}","f2":"{title}","f3":null}}"#),
        version: version.into(),
    }
}

fn key(id: i64) -> TypedValue {
    TypedValue::from_scalar(Scalar::Int64(id)).unwrap()
}

fn text(s: Option<&str>) -> TypedValue {
    match s {
        Some(s) => TypedValue::from_scalar(Scalar::String(s.into())).unwrap(),
        None => TypedValue::null(PortableType::String),
    }
}

/// A synced client over a fake server holding docs 1 and 2 in scope `a`.
async fn synced() -> (Fake, Client<Fake>) {
    let server = Fake::default();
    {
        let mut st = server.0.borrow_mut();
        st.lineage = vec![v1()];
        st.scopes = BTreeSet::from(["a".to_owned()]);
        st.rows = vec![doc(1, "one", "10"), doc(2, "two", "20")];
    }
    let counter = Rc::new(Cell::new(0u8));
    let c2 = counter.clone();
    let mut c = Client::open(target::fresh("queue").await, server.clone(), move || {
        c2.set(c2.get().wrapping_add(1));
        [c2.get(); 16]
    })
    .unwrap();
    c.set_clock(|| 1_764_000_000_000);
    c.sync_once().await.unwrap();
    (server, c)
}

/// A queued mutation's columns as the queue stores and pushes them: canonical JSON text.
fn columns(m: &QueuedMutation) -> String {
    to_output_string(&Column::list_to_json(&m.mutation.columns))
}

fn title(c: &Client<Fake>, id: i64) -> Option<Option<String>> {
    c.storage()
        .connection()
        .query_row("SELECT title FROM docs WHERE id = ?", [id], |r| r.get(0))
        .ok()
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_write_and_its_intent_commit_together() {
    let (_server, mut c) = synced().await;
    let pk3 = key(3);
    let id_insert = c
        .write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Insert,
            pk: &pk3,
            columns: &[("f3".into(), text(Some("b"))), ("f2".into(), text(None))],
        })
        .unwrap();
    let pk1 = key(1);
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Update,
        pk: &pk1,
        columns: &[("f2".into(), text(Some("edited")))],
    })
    .unwrap();
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Update,
        pk: &pk1,
        columns: &[("f3".into(), text(None))],
    })
    .unwrap();
    let pk2 = key(2);
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Delete,
        pk: &pk2,
        columns: &[],
    })
    .unwrap();

    // The visible rows.
    assert_eq!(title(&c, 3), Some(None));
    assert_eq!(title(&c, 1), Some(Some("edited".into())));
    assert_eq!(title(&c, 2), None);

    // The queue: order, operations, presence vs null, base versions, client versions,
    // authored schema, one open batch, UUIDv7 IDs from the injected clock.
    let m = c.storage().mutations().unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(m[0].mutation.mutation_id, id_insert);
    let ops: Vec<&str> = m.iter().map(|m| m.mutation.operation.as_str()).collect();
    assert_eq!(ops, ["insert", "update", "update", "delete"]);
    assert_eq!(
        m.iter().map(|m| m.mutation.local_order).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(
        columns(&m[0]),
        r#"[{"field_id":"f3","value":"b"},{"field_id":"f2","value":null}]"#,
        "the application's order, a null kept as present"
    );
    assert_eq!(columns(&m[1]), r#"[{"field_id":"f2","value":"edited"}]"#);
    assert_eq!(columns(&m[3]), "[]");
    assert_eq!(
        m.iter()
            .map(|m| m.mutation.base_version.clone())
            .collect::<Vec<_>>(),
        [
            None,
            Some("10".into()),
            Some("10".into()),
            Some("20".into())
        ]
    );
    assert_eq!(
        m.iter()
            .map(|m| m.mutation.client_version)
            .collect::<Vec<_>>(),
        [1, 1, 2, 1]
    );
    let authored = AuthoredSchema {
        version: 1,
        hash: v1().schema_hash_hex(),
    };
    assert!(m
        .iter()
        .all(|m| m.mutation.authored_schema == authored && m.state == MutationState::Pending));
    assert!(m.iter().all(|x| x.batch_id == m[0].batch_id));
    let ids: BTreeSet<&str> = m.iter().map(|m| m.mutation.mutation_id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    for id in ids {
        let hex: String = id.chars().filter(|c| *c != '-').collect();
        assert_eq!(id.len(), 36);
        // 1_764_000_000_000 ms as 48-bit hex (python3: format(1764000000000, "012x")).
        assert_eq!(&hex[..12], "019ab697e800", "48-bit millisecond timestamp");
        assert_eq!(&hex[12..13], "7", "version 7");
        assert!(
            matches!(&hex[16..17], "8" | "9" | "a" | "b"),
            "RFC 9562 variant"
        );
    }
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_refused_write_leaves_neither_row_nor_intent() {
    let (_server, mut c) = synced().await;
    let pk1 = key(1);
    let int = TypedValue::from_scalar(Scalar::Int64(5)).unwrap();
    for (operation, columns) in [
        // A value of the wrong type.
        (Operation::Update, vec![("f2".to_owned(), int.clone())]),
        // The key field is not a column, and an unknown field is refused.
        (Operation::Update, vec![("f1".to_owned(), key(9))]),
        (
            Operation::Update,
            vec![("nope".to_owned(), text(Some("x")))],
        ),
        // A field given twice.
        (
            Operation::Update,
            vec![
                ("f2".to_owned(), text(Some("a"))),
                ("f2".to_owned(), text(Some("b"))),
            ],
        ),
    ] {
        let e = c
            .write(&LocalWrite {
                table_id: "tbl_docs",
                operation,
                pk: &pk1,
                columns: &columns,
            })
            .unwrap_err();
        assert_eq!(e.code(), "invalid_value", "{operation:?} {columns:?}");
    }
    // An insert of an existing row, a delete of a missing one: the row's state, not a value.
    let e = c
        .write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Insert,
            pk: &pk1,
            columns: &[],
        })
        .unwrap_err();
    assert_eq!(e.code(), "invalid_row_state");
    let pk9 = key(9);
    let e = c
        .write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Delete,
            pk: &pk9,
            columns: &[],
        })
        .unwrap_err();
    assert_eq!(e.code(), "invalid_row_state");
    assert_eq!(title(&c, 1), Some(Some("one".into())));
    assert!(c.storage().mutations().unwrap().is_empty());

    // The queue append fails after the visible row was written (as a crash there would):
    // the transaction takes the row change back with it.
    c.storage()
        .connection()
        .execute_batch(
            r#"CREATE TEMP TRIGGER fail_append BEFORE INSERT ON "_synchro_mutations"
               BEGIN SELECT RAISE(ABORT, 'append failed'); END"#,
        )
        .unwrap();
    let e = c
        .write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Update,
            pk: &pk1,
            columns: &[("f2".into(), text(Some("half")))],
        })
        .unwrap_err();
    assert_eq!(e.code(), "local_database_error");
    assert_eq!(
        title(&c, 1),
        Some(Some("one".into())),
        "no row without its intent"
    );
    assert!(c.storage().mutations().unwrap().is_empty());
    let shadows: i64 = c
        .storage()
        .connection()
        .query_row(r#"SELECT count(*) FROM "_synchro_shadow""#, [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(shadows, 0);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn pull_and_rebuild_never_overwrite_unresolved_intent() {
    let (server, mut c) = synced().await;
    let pk1 = key(1);
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Update,
        pk: &pk1,
        columns: &[("f2".into(), text(Some("mine")))],
    })
    .unwrap();
    let pk2 = key(2);
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Delete,
        pk: &pk2,
        columns: &[],
    })
    .unwrap();
    // Someone else changes both rows on the server; a pull page and a whole rebuild of the
    // scope arrive while the intent is unresolved (pages built by the fake server, applied
    // to the storage directly: the engine always pushes first).
    server.0.borrow_mut().rows = vec![doc(1, "theirs", "11"), doc(2, "back", "21")];
    let manifest = c.manifest().unwrap().clone();
    let mut storage = c.into_storage();
    let page = server.0.borrow().pull();
    let applied = storage
        .apply_pull_page(&manifest, page, &BTreeSet::from(["a".to_owned()]))
        .unwrap();
    assert!(
        applied.verified.contains("a"),
        "the server layer still verifies"
    );
    let title_in = |s: &synchro_client::storage::Storage, id: i64| -> Option<Option<String>> {
        s.connection()
            .query_row("SELECT title FROM docs WHERE id = ?", [id], |r| r.get(0))
            .ok()
    };
    assert_eq!(
        title_in(&storage, 1),
        Some(Some("mine".into())),
        "intent kept"
    );
    assert_eq!(title_in(&storage, 2), None, "the local delete kept");
    let version: String = storage
        .connection()
        .query_row(
            r#"SELECT "server_version" FROM "_synchro_rows" WHERE "pk" = '"1"'"#,
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "11", "the server layer moved on");
    let req = synchro_protocol::wire::RebuildRequest {
        client_id: "c".into(),
        client_generation: 1,
        schema: Json::Null,
        scope_id: "a".into(),
        limit: 1000,
        continuation: None,
    };
    let rebuild = server.0.borrow().rebuild(&req);
    assert!(storage
        .apply_rebuild_page(&manifest, "a", &rebuild, true)
        .unwrap());
    assert_eq!(title_in(&storage, 1), Some(Some("mine".into())));
    assert_eq!(title_in(&storage, 2), None);
    assert_eq!(storage.mutations().unwrap().len(), 2);
    assert!(storage
        .mutations()
        .unwrap()
        .iter()
        .all(|m| m.state == MutationState::Pending));
}

/// A write no push could carry (over the server's strict per-mutation limit) is refused at
/// once, leaving neither row nor intent, instead of sealing a batch the server would refuse
/// every time; and batches are sealed small enough for the server's body limit (the fake
/// refuses a larger body as the server does), however much is queued.
#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn writes_and_batches_fit_what_a_push_may_carry() {
    let (server, mut c) = synced().await;
    let huge = "x".repeat(70_000);
    let e = c
        .write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Update,
            pk: &key(1),
            columns: &[("f2".into(), text(Some(&huge)))],
        })
        .unwrap_err();
    assert_eq!(e.code(), "write_too_large");
    assert_eq!(title(&c, 1), Some(Some("one".into())));
    assert!(c.storage().mutations().unwrap().is_empty());

    // 30 inserts of 40 KB each: 1.2 MB in all, more than one request body may be.
    let big = "y".repeat(40_000);
    for id in 100..130 {
        c.write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Insert,
            pk: &key(id),
            columns: &[("f2".into(), text(Some(&big)))],
        })
        .unwrap();
    }
    let before = server.0.borrow().requests.len();
    assert_eq!(c.push().await.unwrap(), 30);
    let pushes = server.0.borrow().requests[before..]
        .iter()
        .filter(|p| *p == "/sync/push")
        .count();
    assert_eq!(pushes, 3, "batches of at most 512 KiB of mutations");
    let applied = c
        .storage()
        .mutations()
        .unwrap()
        .iter()
        .filter(|m| m.state == MutationState::Applied)
        .count();
    assert_eq!(applied, 30);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_write_under_a_chosen_id_is_queued_at_most_once() {
    let (_server, mut c) = synced().await;
    let pk3 = key(3);
    let insert = LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Insert,
        pk: &pk3,
        columns: &[("f2".into(), text(Some("once")))],
    };
    let id = "0197e83a-f7e8-7e21-92c0-c621732bd5de";
    assert_eq!(c.write_once(&insert, id).unwrap(), id);
    // The same request again (re-sent by a caller that could not know it committed):
    // nothing more is written, not even the insert's duplicate key refused.
    assert_eq!(c.write_once(&insert, id).unwrap(), id);
    let m = c.storage().mutations().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].mutation.mutation_id, id);
    assert_eq!(title(&c, 3), Some(Some("once".into())));
    // Still once after its outcome.
    c.sync_once().await.unwrap();
    assert_eq!(c.write_once(&insert, id).unwrap(), id);
    let m = c.storage().mutations().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].state, MutationState::Applied);
    // An ID that is not a canonical UUID is refused, and nothing is written.
    let pk4 = key(4);
    let other = LocalWrite { pk: &pk4, ..insert };
    for bad in [
        "",
        "0197E83A-F7E8-7E21-92C0-C621732BD5DE",
        "0197e83a-f7e8-7e21-92c0-c621732bd5d",
        "0197e83af7e87e2192c0c621732bd5de0000",
        "0197e83a-f7e8-7e21-92c0_c621732bd5de",
    ] {
        let e = c.write_once(&other, bad).unwrap_err();
        assert_eq!(e.code(), "invalid_value", "{bad:?}");
    }
    assert_eq!(c.storage().mutations().unwrap().len(), 1);
    assert_eq!(title(&c, 4), None);
}

/// `(local_order, client_version)` of every queued mutation, in local order.
fn counters(c: &Client<Fake>) -> Vec<(u64, u64)> {
    c.storage()
        .mutations()
        .unwrap()
        .iter()
        .map(|m| (m.mutation.local_order, m.mutation.client_version))
        .collect()
}

/// The batches `(completed, mutations in it)` the queue keeps.
fn batches(c: &Client<Fake>) -> Vec<(i64, i64)> {
    let conn = c.storage().connection();
    let mut q = conn
        .prepare(
            r#"SELECT b."completed", (SELECT count(*) FROM "_synchro_mutations" m WHERE m."batch_id" = b."batch_id")
                 FROM "_synchro_batches" b ORDER BY b."seq""#,
        )
        .unwrap();
    let out = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    out
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn clearing_resolved_intent_keeps_what_is_pending_and_never_reuses_a_counter() {
    let (server, mut c) = synced().await;
    let update = |c: &mut Client<Fake>, id: i64, t: &str| {
        c.write(&LocalWrite {
            table_id: "tbl_docs",
            operation: Operation::Update,
            pk: &key(id),
            columns: &[("f2".into(), text(Some(t)))],
        })
        .unwrap()
    };
    assert_eq!(c.clear_resolved().unwrap(), 0, "nothing to clear");
    let resolved = [
        update(&mut c, 1, "a"),
        update(&mut c, 1, "b"),
        update(&mut c, 2, "c"),
    ];
    assert_eq!(c.push().await.unwrap(), 3);
    let pending = update(&mut c, 1, "d");
    assert_eq!(counters(&c), [(1, 1), (2, 2), (3, 1), (4, 3)]);

    assert_eq!(c.clear_resolved().unwrap(), 3);
    let m = c.storage().mutations().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].mutation.mutation_id.as_str(), m[0].state),
        (pending.as_str(), MutationState::Pending)
    );
    for id in &resolved {
        assert_eq!(
            c.storage().outcome(id).unwrap(),
            None,
            "its outcome went too"
        );
    }
    assert_eq!(
        batches(&c),
        [(0, 1)],
        "only the open batch, with the pending write"
    );
    assert_eq!(
        title(&c, 1),
        Some(Some("d".into())),
        "the visible rows are untouched"
    );
    assert_eq!(title(&c, 2), Some(Some("c".into())));
    // A write re-sent under a cleared ID is still not written twice.
    let again = LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Update,
        pk: &key(2),
        columns: &[("f2".into(), text(Some("c, re-sent")))],
    };
    assert_eq!(c.write_once(&again, &resolved[2]).unwrap(), resolved[2]);
    assert_eq!(c.storage().mutations().unwrap().len(), 1);
    assert_eq!(title(&c, 2), Some(Some("c".into())));

    // Counters go on from where they were, also across a restart.
    // (Randomness that differs per draw: two writes in one millisecond of the real clock
    // with constant randomness got the same UUIDv7, and the test failed now and then.)
    let mut draws = 0u64;
    let mut c = Client::open(c.into_storage(), server, move || {
        draws += 1;
        let mut r = [7; 16];
        r[8..].copy_from_slice(&draws.to_be_bytes());
        r
    })
    .unwrap();
    update(&mut c, 1, "e");
    update(&mut c, 2, "f");
    assert_eq!(counters(&c), [(4, 3), (5, 4), (6, 2)]);
    c.sync_once().await.unwrap();
    assert_eq!(
        c.clear_resolved().unwrap(),
        3,
        "the three were pushed and applied"
    );
    assert!(c.storage().mutations().unwrap().is_empty());
    assert!(
        batches(&c)
            .iter()
            .all(|&(completed, n)| completed == 0 && n == 0),
        "no completed batch is kept: {:?}",
        batches(&c)
    );
}
