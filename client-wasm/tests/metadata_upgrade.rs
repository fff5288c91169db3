//! The versioned `_synchro_*` metadata tables (`store::schema`): a database written before
//! the metadata version existed opens with this engine, keeps its data and ends with exactly
//! the layout of a fresh database (V1, then every rung of the ladder). Its tables were
//! created on first need by the `IF NOT EXISTS` statements below, copied verbatim from that
//! code (`engine.rs`, `apply.rs` and `queue.rs` at f969238), so such a database holds one of
//! three subsets: after the engine's first open, after a first migration (or both), or after
//! a bare `Storage::install`. Also: a synchro table of another shape, and a metadata version
//! from a newer engine, are refused with nothing changed.

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

use rusqlite::{params, Connection};
use synchro_client::engine::{Client, Response, Transport, TransportError};
use synchro_client::queue::{LocalWrite, MutationState, Operation};
use synchro_client::storage::Storage;
use synchro_client::store::schema::METADATA_VERSION;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::MigrationPlan;
use synchro_protocol::state::ClientState;
use synchro_protocol::value::{Scalar, TypedValue};

// ----- the statements of the code before the metadata version, verbatim --------------------

/// Run by `Client::open`, with the queue tables, on every open.
const BEFORE_CLIENT_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_client" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "client_id" TEXT NOT NULL, "client_generation" INTEGER, "scope_set_version" INTEGER, "upgrade_required" INTEGER NOT NULL DEFAULT 0 CHECK ("upgrade_required" IN (0, 1)), "reset_requested" INTEGER NOT NULL DEFAULT 0 CHECK ("reset_requested" IN (0, 1))) STRICT"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_journal" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "journal_version" INTEGER NOT NULL, "source_version" INTEGER, "source_hash" TEXT, "source_body" TEXT, "target_version" INTEGER NOT NULL, "target_hash" TEXT NOT NULL, "target_body" TEXT NOT NULL, "action" TEXT NOT NULL CHECK ("action" IN ('replace', 'rebuild_local')), "affected_scopes" TEXT NOT NULL, "cursor_updates" TEXT NOT NULL, "migration_plan_version" INTEGER NOT NULL, "plan" TEXT NOT NULL, "plan_hash" TEXT NOT NULL, "phase" TEXT NOT NULL CHECK ("phase" IN ('pending', 'committed')), "reset" INTEGER NOT NULL DEFAULT 0 CHECK ("reset" IN (0, 1))) STRICT"#,
];
/// Run by a migration's DDL transaction and by `Storage::install`, with the queue tables.
const BEFORE_METADATA_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_scopes" ("scope_id" TEXT NOT NULL PRIMARY KEY, "cursor" TEXT, "pending_cursor" TEXT, "rebuild" INTEGER NOT NULL DEFAULT 1 CHECK ("rebuild" IN (0, 1))) STRICT, WITHOUT ROWID"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_rows" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_rebuild_rows" ("scope_id" TEXT NOT NULL, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "row" TEXT NOT NULL, "server_version" TEXT NOT NULL, "digest" BLOB NOT NULL CHECK (length("digest") = 32), PRIMARY KEY ("scope_id", "table_id", "pk")) STRICT, WITHOUT ROWID"#,
];
/// Run with each of the two above.
const BEFORE_QUEUE_DDL: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS "_synchro_batches" ("batch_id" TEXT NOT NULL PRIMARY KEY, "seq" INTEGER NOT NULL UNIQUE, "sealed" INTEGER NOT NULL DEFAULT 0 CHECK ("sealed" IN (0, 1)), "request" TEXT, "completed" INTEGER NOT NULL DEFAULT 0 CHECK ("completed" IN (0, 1))) STRICT"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_mutations" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "batch_id" TEXT NOT NULL, "local_order" INTEGER NOT NULL UNIQUE, "table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "operation" TEXT NOT NULL CHECK ("operation" IN ('insert', 'update', 'delete')), "base_version" TEXT, "client_version" INTEGER NOT NULL, "columns" TEXT NOT NULL, "authored_version" INTEGER NOT NULL, "authored_hash" TEXT NOT NULL, "state" TEXT NOT NULL DEFAULT 'pending' CHECK ("state" IN ('pending', 'applied', 'conflict', 'rejected_terminal'))) STRICT"#,
    r#"CREATE INDEX IF NOT EXISTS "_synchro_mutations_row" ON "_synchro_mutations" ("table_id", "pk", "state")"#,
    r#"CREATE TABLE IF NOT EXISTS "_synchro_outcomes" ("mutation_id" TEXT NOT NULL PRIMARY KEY, "status" TEXT NOT NULL, "code" TEXT, "outcome" TEXT NOT NULL) STRICT"#,
    // The latest server state of a row with unresolved intent (row: its values by field ID
    // as wire JSON, or NULL when the server has no such row): what the visible row returns
    // to when the intent ends in a conflict or a rejection.
    r#"CREATE TABLE IF NOT EXISTS "_synchro_shadow" ("table_id" TEXT NOT NULL, "pk" TEXT NOT NULL, "row" TEXT, PRIMARY KEY ("table_id", "pk")) STRICT, WITHOUT ROWID"#,
];

/// Sends nothing: opening never needs the network.
struct Offline;

impl Transport for Offline {
    async fn post(&self, _: &str, _: String) -> Result<Response, TransportError> {
        Err(TransportError("offline".into()))
    }
}

fn docs() -> Manifest {
    Manifest::parse(
        r#"{"schema_version":1,"parent_schema":null,"transition_class":"initial","compatibility_floor":1,"tables":[{"table_id":"tbl_docs","relation_id":"rel_docs","name":"docs","composition":"multi_scope","primary_key_field_id":"f1","lifecycle":{"created_at_field_id":null,"updated_at_field_id":null,"deleted_at_field_id":null},"fields":[{"field_id":"f1","name":"id","type":"int64","nullable":false,"writable":false},{"field_id":"f2","name":"title","type":"string","nullable":true,"writable":true}],"indexes":[]}]}"#,
    )
    .unwrap()
}

fn run_all(conn: &Connection, statements: &[&str]) {
    for s in statements {
        conn.execute_batch(s).unwrap();
    }
}

/// What the code before the version wrote on the engine's first open.
fn before_first_open(conn: &Connection) {
    run_all(conn, BEFORE_CLIENT_DDL);
    run_all(conn, BEFORE_QUEUE_DDL);
    conn.execute(
        r#"INSERT INTO "_synchro_client" ("id", "client_id") VALUES (1, 'legacy-client')"#,
        [],
    )
    .unwrap();
}

/// What the code before the version ran in a first migration's DDL transaction (and in
/// `Storage::install`): the plan, then the metadata and queue tables.
fn before_install(conn: &Connection, m: &Manifest) {
    for s in MigrationPlan::derive(None, m, false).unwrap().render() {
        conn.execute_batch(&s).unwrap();
    }
    run_all(conn, BEFORE_METADATA_DDL);
    run_all(conn, BEFORE_QUEUE_DDL);
}

/// Every `_synchro_` object: (type, name, SQL), sorted.
fn synchro_objects(conn: &Connection) -> Vec<(String, String, Option<String>)> {
    let mut q = conn
        .prepare(
            r"SELECT type, name, sql FROM sqlite_schema WHERE name LIKE '\_synchro\_%' ESCAPE '\' ORDER BY type, name",
        )
        .unwrap();
    let out = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    out
}

/// The objects of a database this engine created (after an install of `m`).
fn fresh_objects(m: Option<&Manifest>) -> Vec<(String, String, Option<String>)> {
    let mut storage = Storage::open_in_memory().unwrap();
    if let Some(m) = m {
        storage.install(m).unwrap();
    }
    let c = Client::open(storage, Offline, || [7; 16]).unwrap();
    synchro_objects(c.storage().connection())
}

fn metadata_version(conn: &Connection) -> i64 {
    conn.query_row(
        r#"SELECT "metadata_version" FROM "_synchro_meta" WHERE "id" = 1"#,
        [],
        |r| r.get(0),
    )
    .unwrap()
}

fn int64(i: i64) -> TypedValue {
    TypedValue::from_scalar(Scalar::Int64(i)).unwrap()
}

fn title(s: &str) -> TypedValue {
    TypedValue::from_scalar(Scalar::String(s.into())).unwrap()
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_synced_database_from_before_the_version_opens_with_its_data() {
    let m = docs();
    let storage = Storage::open_in_memory().unwrap();
    let conn = storage.connection();
    before_first_open(conn);
    conn.execute(
        r#"UPDATE "_synchro_client" SET "client_generation" = 7, "scope_set_version" = 3"#,
        [],
    )
    .unwrap();
    before_install(conn, &m);
    // A synced row of a verified scope, and a queued edit of it in the open batch.
    conn.execute_batch(
        r#"INSERT INTO docs (id, title) VALUES (1, 'edited');
           INSERT INTO "_synchro_scopes" VALUES ('a', 'c1', NULL, 0);
           INSERT INTO "_synchro_rows" VALUES ('tbl_docs', '"1"', '10', zeroblob(32));
           INSERT INTO "_synchro_provenance:tbl_docs" VALUES (1, 'a');
           INSERT INTO "_synchro_shadow" VALUES ('tbl_docs', '"1"', '{"f1":"1","f2":"one"}');
           INSERT INTO "_synchro_batches" ("batch_id", "seq") VALUES ('b1', 1);"#,
    )
    .unwrap();
    conn.execute(
        r#"INSERT INTO "_synchro_mutations" VALUES ('m1', 'b1', 1, 'tbl_docs', '"1"', 'update', '10', 1,
               '[{"field_id":"f2","value":"edited"}]', 1, ?, 'pending')"#,
        params![m.schema_hash_hex()],
    )
    .unwrap();
    let before = synchro_objects(conn);
    assert!(!before.iter().any(|(_, n, _)| n == "_synchro_meta"));

    let mut n = 0u8;
    let random = move || {
        n += 1;
        [n; 16]
    };
    let mut c = Client::open(storage, Offline, random).unwrap();
    assert_eq!(c.client_id(), "legacy-client");
    assert_eq!(c.state(), ClientState::Stopped);
    assert_eq!(c.manifest(), Some(&m));
    assert_eq!(c.journal_phase().unwrap(), None);
    let conn = c.storage().connection();
    assert_eq!(metadata_version(conn), METADATA_VERSION);
    assert_eq!(synchro_objects(conn), fresh_objects(Some(&m)));
    assert_eq!(
        c.storage().scope_state("a").unwrap(),
        Some((Some("c1".into()), false))
    );
    let queue = c.storage().mutations().unwrap();
    assert_eq!(queue.len(), 1);
    assert_eq!(
        (
            queue[0].mutation.operation,
            queue[0].state,
            queue[0].mutation.base_version.as_deref()
        ),
        (Operation::Update, MutationState::Pending, Some("10"))
    );

    // And it goes on working: the next write queues behind the old one, in its batch.
    c.write(&LocalWrite {
        table_id: "tbl_docs",
        operation: Operation::Update,
        pk: &int64(1),
        columns: &[("f2".into(), title("again"))],
    })
    .unwrap();
    let queue = c.storage().mutations().unwrap();
    assert_eq!(queue.len(), 2);
    assert_eq!(
        (
            queue[1].mutation.local_order,
            queue[1].mutation.client_version
        ),
        (2, 2)
    );
    assert_eq!(queue[1].batch_id, "b1");
    assert_eq!(queue[1].mutation.base_version.as_deref(), Some("10"));

    // Opening again changes nothing.
    let storage = c.into_storage();
    let after = synchro_objects(storage.connection());
    let c = Client::open(storage, Offline, || unreachable!()).unwrap();
    assert_eq!(synchro_objects(c.storage().connection()), after);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_subset_the_code_before_could_leave_is_adopted() {
    let m = docs();
    // Opened by the engine, never connected: no scope, row or rebuild tables yet.
    let storage = Storage::open_in_memory().unwrap();
    before_first_open(storage.connection());
    let c = Client::open(storage, Offline, || unreachable!()).unwrap();
    assert_eq!(
        (c.client_id(), c.state()),
        ("legacy-client", ClientState::Fresh)
    );
    assert_eq!(metadata_version(c.storage().connection()), METADATA_VERSION);
    assert_eq!(
        synchro_objects(c.storage().connection()),
        fresh_objects(None)
    );

    // Installed by `Storage::install` alone: no identity or journal table yet.
    let storage = Storage::open_in_memory().unwrap();
    before_install(storage.connection(), &m);
    let c = Client::open(storage, Offline, || [0xab; 16]).unwrap();
    assert_eq!(c.client_id(), "ab".repeat(16));
    assert_eq!(c.state(), ClientState::Stopped);
    assert_eq!(
        synchro_objects(c.storage().connection()),
        fresh_objects(Some(&m))
    );

    // Installed through this engine onto a database the code before had opened.
    let mut storage = Storage::open_in_memory().unwrap();
    before_first_open(storage.connection());
    storage.install(&m).unwrap();
    assert_eq!(metadata_version(storage.connection()), METADATA_VERSION);
    let c = Client::open(storage, Offline, || unreachable!()).unwrap();
    assert_eq!(
        synchro_objects(c.storage().connection()),
        fresh_objects(Some(&m))
    );
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn an_unknown_shape_or_a_newer_version_is_refused_untouched() {
    // A `_synchro_client` without its reset flag (a shape no engine of ours wrote).
    let m = docs();
    let mut storage = Storage::open_in_memory().unwrap();
    storage
        .connection()
        .execute_batch(
            r#"CREATE TABLE "_synchro_client" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "client_id" TEXT NOT NULL) STRICT"#,
        )
        .unwrap();
    let before = synchro_objects(storage.connection());
    let e = storage.install(&m).unwrap_err();
    assert_eq!(e.code(), "local_schema_error");
    assert_eq!(
        synchro_objects(storage.connection()),
        before,
        "nothing changed"
    );
    assert!(storage.active_schema().unwrap().is_none());
    let e = Client::open(storage, Offline, || [1; 16]).err().unwrap();
    assert_eq!(e.code(), "local_schema_error");

    // A version from a newer engine.
    let storage = Storage::open_in_memory().unwrap();
    let c = Client::open(storage, Offline, || [1; 16]).unwrap();
    let storage = c.into_storage();
    storage
        .connection()
        .execute(
            r#"UPDATE "_synchro_meta" SET "metadata_version" = ?"#,
            [METADATA_VERSION + 1],
        )
        .unwrap();
    let e = Client::open(storage, Offline, || [1; 16]).err().unwrap();
    assert_eq!(e.code(), "local_schema_error");
}
