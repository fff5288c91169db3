//! Portable seeds (issue 30), against a real PostgreSQL: which scopes an operator may
//! declare portable, through the `synchro-server seed` commands an operator runs, and who
//! may do what; the export functions of spec 001 (one SERIALIZABLE READ ONLY DEFERRABLE
//! transaction, pages bound by sp1. tokens, sc1. receipts), checked with the protocol core.

mod common;

use common::{cli, sqlstate, Env};
use serde_json::{json, Value};
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::seed::{ExportManifest, SeedPage, SeedReceipt, SnapshotBoundary};
use synchro_protocol::token::Keyring;
use synchro_protocol::value::TypedValue;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use tokio_postgres::Client;

#[tokio::test]
async fn only_shared_scopes_are_declared_portable_and_only_by_the_operator() {
    let env = Env::installed().await;
    let op = "synchro_dev_operator";
    env.admin
        .batch_execute("SELECT synchro.synchro_add_shared_scope('board:shared')")
        .await
        .unwrap();

    // Refused with a typed reason that names no scope, and nothing written.
    for (scope, reason) in [
        ("user:alice", "user_scope"),
        ("board:granted", "not_shared"),
        ("", "empty"),
    ] {
        env.admin
            .batch_execute("SELECT synchro.synchro_grant_user_scope('alice', 'board:granted')")
            .await
            .unwrap();
        let (code, out) = cli(&env, op, &["seed", "declare", "--scope", scope]);
        assert_eq!(code, 1, "{scope:?}: {out}");
        assert_eq!(
            out,
            json!({"error": {"code": "invalid_portable_scope", "reason": reason}}),
            "{scope:?}"
        );
    }
    let (code, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!((code, out), (0, json!({"scopes": []})), "nothing declared");

    // A shared scope: declared once, a second time changes nothing.
    let (code, out) = cli(&env, op, &["seed", "declare", "--scope", "board:shared"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        json!({"scope_id": "board:shared", "portable": true, "changed": true})
    );
    let (_, out) = cli(&env, op, &["seed", "declare", "--scope", "board:shared"]);
    assert_eq!(out["changed"], json!(false));
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out["scopes"].as_array().unwrap().len(), 1);
    assert_eq!(out["scopes"][0]["scope_id"], json!("board:shared"));
    assert_eq!(out["scopes"][0]["shared"], json!(true));

    // No longer shared: still declared, but listed as not shared (not portable).
    env.admin
        .batch_execute("SELECT synchro.synchro_remove_shared_scope('board:shared')")
        .await
        .unwrap();
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out["scopes"][0]["shared"], json!(false));

    // The seed login reads the declarations; only the operator changes them.
    let seed = env.login("synchro_dev_seed").await;
    let listed: i64 = seed
        .query_one(
            "SELECT count(*) FROM synchro.synchro_portable_scopes()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listed, 1);
    for login in [
        "synchro_dev_seed",
        "synchro_dev_adapter",
        "synchro_dev_monitor",
    ] {
        let db = env.login(login).await;
        for sql in [
            "SELECT synchro.synchro_declare_portable_scope('board:shared')",
            "SELECT synchro.synchro_undeclare_portable_scope('board:shared')",
            "SELECT * FROM synchro.portable_scopes",
        ] {
            assert_eq!(sqlstate(&db, sql).await, "42501", "{login}: {sql}");
        }
    }
    for login in ["synchro_dev_adapter", "synchro_dev_monitor"] {
        let db = env.login(login).await;
        let sql = "SELECT * FROM synchro.synchro_portable_scopes()";
        assert_eq!(sqlstate(&db, sql).await, "42501", "{login}");
    }

    // Undeclared: once, then nothing to change.
    let (code, out) = cli(&env, op, &["seed", "undeclare", "--scope", "board:shared"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        json!({"scope_id": "board:shared", "portable": false, "changed": true})
    );
    let (_, out) = cli(&env, op, &["seed", "undeclare", "--scope", "board:shared"]);
    assert_eq!(out["changed"], json!(false));
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out, json!({"scopes": []}));
}

/// `app.docs (id, team, title)`, each row in the scope `board:<team>`; `board:a` and
/// `board:b` shared and declared portable, `board:c` shared only. Returns the worker, with
/// every row captured.
async fn boards(env: &Env, rows: i64) -> Worker {
    env.as_app_owner(&format!(
        "CREATE TABLE app.docs (id bigint PRIMARY KEY, team text NOT NULL, title text);
         INSERT INTO app.docs SELECT g, (ARRAY['a', 'b', 'c'])[1 + g % 3], 'doc ' || g
           FROM generate_series(1, {rows}) g"
    ))
    .await;
    common::register_with_rule(
        env,
        "docs",
        "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'board:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');
         SELECT synchro.synchro_add_shared_scope(s) FROM unnest(ARRAY['board:a', 'board:b', 'board:c']) s;
         SELECT synchro.synchro_declare_portable_scope(s) FROM unnest(ARRAY['board:a', 'board:b']) s;",
    )
    .await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    capture(&mut worker).await;
    worker
}

async fn capture(worker: &mut Worker) {
    while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
}

const BEGIN: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE";

/// The keyring of one seed key purpose, read as the superuser (the test stands in for
/// whoever holds a key).
async fn ring(env: &Env, purpose: &str) -> Keyring {
    let r = env
        .admin
        .query_one(
            "SELECT key_id, key FROM synchro.seed_keys WHERE purpose = $1 AND current",
            &[&purpose],
        )
        .await
        .unwrap();
    Keyring::new(r.get(0), r.get::<_, &[u8]>(1)).unwrap()
}

/// A refusal's SQLSTATE, message and JSON detail reason. The statement runs in a savepoint
/// (every caller is inside a transaction), so the transaction goes on after it.
async fn refusal(
    db: &Client,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> (String, String, String) {
    db.batch_execute("SAVEPOINT refusal").await.unwrap();
    let e = db.query(sql, args).await.expect_err(sql);
    db.batch_execute("ROLLBACK TO SAVEPOINT refusal")
        .await
        .unwrap();
    let d = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    let reason = d
        .detail()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v["reason"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (d.code().code().to_owned(), d.message().to_owned(), reason)
}

/// One scope's rows read by synchro_seed_scope_rows: (cardinality, digest hex), computed
/// with the protocol core.
async fn digest_of(db: &Client, manifest: &Manifest, scope: &str) -> (i64, String) {
    let rows = db
        .query(
            "SELECT * FROM synchro.synchro_seed_scope_rows($1)",
            &[&scope],
        )
        .await
        .unwrap();
    let mut entries: Vec<(RowIdentity, [u8; 32])> = rows
        .iter()
        .map(|r| {
            let d = row_digest(
                manifest,
                r.get(0),
                &Json::parse(r.get(1)).unwrap(),
                &Json::parse(r.get(2)).unwrap(),
                r.get(3),
            )
            .unwrap();
            (d.identity, d.digest)
        })
        .collect();
    let d = scope_digest(&manifest.schema_hash(), scope, &mut entries, false).unwrap();
    (rows.len() as i64, hex::encode(d.digest))
}

/// Begins and seals an export of `scopes` (byte order) with pages of `limit`: the sealed
/// answer.
async fn sealed(db: &Client, manifest: &Manifest, scopes: &[&str], limit: i32) -> Value {
    let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
    db.query_one(
        "SELECT synchro.synchro_seed_export_begin($1, $2)",
        &[&scopes, &limit],
    )
    .await
    .unwrap();
    let (mut counts, mut digests) = (Vec::new(), Vec::new());
    for s in &scopes {
        let (n, d) = digest_of(db, manifest, s).await;
        counts.push(n);
        digests.push(d);
    }
    json_of(
        db,
        "SELECT synchro.synchro_seed_export_seal($1, $2)::text",
        &[&digests, &counts],
    )
    .await
}

/// A function's jsonb answer.
async fn json_of(
    db: &Client,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Value {
    let text: String = db.query_one(sql, args).await.unwrap().get(0);
    serde_json::from_str(&text).unwrap()
}

async fn page(db: &Client, token: &str) -> String {
    db.query_one("SELECT synchro.synchro_seed_page($1)", &[&token])
        .await
        .unwrap()
        .get(0)
}

/// One export, long on purpose: every check is on the pages, tokens and receipts of the
/// same transaction, then on what is refused after it.
#[tokio::test]
async fn an_export_pages_one_snapshot_in_identity_order_with_tokens_bound_to_it() {
    let env = Env::installed().await;
    let mut worker = boards(&env, 2500).await;
    let manifest = synchro_server::publish::load_serving_lineage(&env.admin)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let (page_keys, receipt_keys) = (ring(&env, "page").await, ring(&env, "receipt").await);
    let seed = env.login("synchro_dev_seed").await;
    seed.batch_execute(BEGIN).await.unwrap();
    let facts = json_of(
        &seed,
        "SELECT synchro.synchro_seed_export_begin(ARRAY['board:b', 'board:a'], 300)::text",
        &[],
    )
    .await;
    // The facts of the snapshot: the served schema, the boundary of what was materialized.
    assert_eq!(facts["schema_hash"], json!(manifest.schema_hash_hex()));
    assert_eq!(
        facts["scopes"][0]["scope_id"],
        json!("board:a"),
        "byte order"
    );
    assert_eq!(facts["scopes"][0]["cardinality"], json!("833"));
    assert_eq!(facts["scopes"][1]["cardinality"], json!("834"));
    let watermark: i64 = env
        .admin
        .query_one(
            "SELECT effect_position FROM synchro.synchro_pull_watermark()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let boundary =
        SnapshotBoundary::from_json(&Json::parse(&facts["snapshot_boundary"].to_string()).unwrap())
            .unwrap();
    assert_eq!(boundary.position(), watermark as u64);
    assert!(matches!(boundary, SnapshotBoundary::TransactionEnd { .. }));

    // Writes committed and captured during the export are never in its pages.
    env.admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (9001, 'a', 'new');
             UPDATE app.docs SET title = 'changed' WHERE id = 3;
             DELETE FROM app.docs WHERE id = 6",
        )
        .await
        .unwrap();
    capture(&mut worker).await;

    let (mut counts, mut digests) = (Vec::new(), Vec::new());
    for s in ["board:a", "board:b"] {
        let (n, d) = digest_of(&seed, &manifest, s).await;
        counts.push(n);
        digests.push(d);
    }
    assert_eq!(counts, vec![833, 834], "the snapshot, not the new writes");
    // A cardinality the database did not count is refused, and nothing is sealed.
    let wrong = vec![counts[0] + 1, counts[1]];
    assert_eq!(
        refusal(
            &seed,
            "SELECT synchro.synchro_seed_export_seal($1, $2)",
            &[&digests, &wrong]
        )
        .await,
        (
            "22023".into(),
            "invalid_seed_export".into(),
            "cardinality_mismatch".into()
        )
    );
    let sealed = json_of(
        &seed,
        "SELECT synchro.synchro_seed_export_seal($1, $2)::text",
        &[&digests, &counts],
    )
    .await;
    // The manifest the hash covers, checked by the protocol core.
    let body = Json::parse(&sealed["manifest"].to_string()).unwrap();
    let export = ExportManifest::from_json(&body).unwrap();
    assert_eq!(
        hex::encode(export.hash()),
        sealed["export_manifest_hash"].as_str().unwrap()
    );
    assert_eq!(export.scopes.len(), 2);
    assert_eq!(export.page_limit, 300);
    assert_eq!(export.snapshot_boundary, boundary);

    for (i, scope) in export.scopes.iter().enumerate() {
        let mut token = sealed["page_tokens"][&scope.scope_id]
            .as_str()
            .unwrap()
            .to_owned();
        let mut entries: Vec<(RowIdentity, [u8; 32])> = Vec::new();
        let mut ordinal = 0;
        let receipt = loop {
            let bound = SeedPage::open(&page_keys, &token).unwrap();
            assert_eq!(bound.next_row_ordinal, ordinal);
            assert_eq!(bound.binding.export_manifest_hash, export.hash());
            assert_eq!(bound.binding.scope_id, scope.scope_id);
            let text = page(&seed, &token).await;
            assert_eq!(
                page(&seed, &token).await,
                text,
                "a replayed token gives the same page"
            );
            let v = Json::parse(&text).unwrap();
            let Some(Json::Array(records)) = v.get("records") else {
                panic!("{text}")
            };
            for r in records {
                let table_id = r.get("table_id").and_then(Json::as_str).unwrap();
                let d = row_digest(
                    &manifest,
                    table_id,
                    r.get("pk").unwrap(),
                    r.get("row").unwrap(),
                    r.get("server_version").and_then(Json::as_str).unwrap(),
                )
                .unwrap();
                let table = manifest.table(table_id).unwrap();
                let key =
                    TypedValue::from_wire(&table.primary_key().spec, r.get("pk").unwrap()).unwrap();
                assert_eq!(d.identity, RowIdentity::new(table, &key).unwrap());
                if let Some((last, _)) = entries.last() {
                    assert!(last < &d.identity, "strictly in identity order: {i}");
                }
                entries.push((d.identity, d.digest));
            }
            ordinal += records.len() as u64;
            match (v.get("next_page_token"), v.get("receipt")) {
                (Some(Json::String(next)), None) => {
                    assert_eq!(records.len(), 300);
                    token = next.clone();
                }
                (None, Some(Json::String(receipt))) => break receipt.clone(),
                _ => panic!("a page ends with a next token or a receipt: {text}"),
            }
        };
        assert_eq!(ordinal, scope.cardinality);
        assert!(!entries.iter().any(|(_, d)| d == &[0; 32]));
        let digest = scope_digest(
            &manifest.schema_hash(),
            &scope.scope_id,
            &mut entries,
            false,
        )
        .unwrap();
        assert_eq!(digest.digest, scope.checksum.0);
        // The receipt binds the scope's digest, cardinality and the boundary; no user.
        let r = SeedReceipt::open(&receipt_keys, &receipt).unwrap();
        assert_eq!(r, SeedReceipt::read_unverified(&receipt).unwrap());
        assert_eq!(
            (r.cardinality, r.checksum),
            (scope.cardinality, scope.checksum)
        );
        assert_eq!(r.binding.snapshot_boundary, boundary);
        assert_eq!(r.binding.export_manifest_hash, export.hash());
        assert!(
            SeedReceipt::open(&page_keys, &receipt).is_err(),
            "its own key"
        );
    }
    let state: String = seed
        .query_one("SELECT current_setting('synchro.seed_export')", &[])
        .await
        .unwrap()
        .get(0);
    let first_a = sealed["page_tokens"]["board:a"]
        .as_str()
        .unwrap()
        .to_owned();
    // The export belongs to its connection: another one, in a transaction of its own, has
    // none.
    let elsewhere = env.login("synchro_dev_seed").await;
    elsewhere.batch_execute(BEGIN).await.unwrap();
    assert_eq!(
        refusal(
            &elsewhere,
            "SELECT synchro.synchro_seed_page($1)",
            &[&first_a]
        )
        .await,
        (
            "25000".into(),
            "seed_export_state".into(),
            "not_sealed".into()
        )
    );
    seed.batch_execute("COMMIT").await.unwrap();

    // After the transaction: nothing to page; a state carried over by hand is refused.
    seed.batch_execute(BEGIN).await.unwrap();
    assert_eq!(
        refusal(&seed, "SELECT synchro.synchro_seed_page($1)", &[&first_a]).await,
        (
            "25000".into(),
            "seed_export_state".into(),
            "not_sealed".into()
        )
    );
    seed.batch_execute("ROLLBACK").await.unwrap();
    seed.batch_execute(BEGIN).await.unwrap();
    seed.query_one(
        "SELECT set_config('synchro.seed_export', $1, true)",
        &[&state],
    )
    .await
    .unwrap();
    assert_eq!(
        refusal(&seed, "SELECT synchro.synchro_seed_page($1)", &[&first_a]).await,
        (
            "25000".into(),
            "seed_export_state".into(),
            "not_this_transaction".into()
        )
    );
    seed.batch_execute("ROLLBACK").await.unwrap();

    // Another export: the first export's tokens are not its own; an altered token is not a
    // token.
    seed.batch_execute(BEGIN).await.unwrap();
    let other = sealed_export(&seed, &manifest).await;
    assert_eq!(
        refusal(&seed, "SELECT synchro.synchro_seed_page($1)", &[&first_a])
            .await
            .2,
        "other_export"
    );
    let own = other["page_tokens"]["board:a"].as_str().unwrap().to_owned();
    assert!(page(&seed, &own).await.contains("records"));
    for i in [4, own.len() / 2, own.len() - 2] {
        let mut bytes = own.clone().into_bytes();
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(bytes).unwrap();
        assert_eq!(
            refusal(&seed, "SELECT synchro.synchro_seed_page($1)", &[&altered])
                .await
                .2,
            "malformed_or_forged",
            "{i}"
        );
    }
    // A correctly signed token for an ordinal this export never issues (the test holds the
    // page key), and one for a scope outside the export.
    let mut bound = SeedPage::open(&page_keys, &own).unwrap();
    bound.next_row_ordinal = 7;
    assert_eq!(
        refusal(
            &seed,
            "SELECT synchro.synchro_seed_page($1)",
            &[&bound.sign(&page_keys)]
        )
        .await
        .2,
        "ordinal"
    );
    bound.next_row_ordinal = 0;
    bound.binding.scope_id = "board:c".into();
    assert_eq!(
        refusal(
            &seed,
            "SELECT synchro.synchro_seed_page($1)",
            &[&bound.sign(&page_keys)]
        )
        .await
        .2,
        "other_export"
    );
    // One export per transaction.
    assert_eq!(
        refusal(
            &seed,
            "SELECT synchro.synchro_seed_export_begin(ARRAY['board:a'], 10)",
            &[]
        )
        .await
        .2,
        "already_begun"
    );
    seed.batch_execute("ROLLBACK").await.unwrap();
}

async fn sealed_export(db: &Client, manifest: &Manifest) -> Value {
    sealed(db, manifest, &["board:a", "board:b"], 1000).await
}

#[tokio::test]
async fn an_export_runs_only_in_its_transaction_for_portable_scopes_as_the_seed_login() {
    let env = Env::installed().await;
    let _worker = boards(&env, 30).await;
    let seed = env.login("synchro_dev_seed").await;
    let begin = "SELECT synchro.synchro_seed_export_begin(ARRAY['board:a'], 100)";
    for (start, reason) in [
        ("BEGIN", "not_serializable"),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            "not_serializable",
        ),
        (
            "BEGIN ISOLATION LEVEL SERIALIZABLE DEFERRABLE",
            "not_read_only",
        ),
        (
            "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY",
            "not_deferrable",
        ),
    ] {
        seed.batch_execute(start).await.unwrap();
        assert_eq!(
            refusal(&seed, begin, &[]).await,
            (
                "25000".into(),
                "seed_export_transaction_required".into(),
                reason.into()
            ),
            "{start}"
        );
        seed.batch_execute("ROLLBACK").await.unwrap();
    }
    for (scopes, limit, reason) in [
        (vec!["board:c"], 100, "not_portable"),
        (vec!["user:alice"], 100, "not_portable"),
        (vec!["board:a", "board:a"], 100, "duplicate_scope"),
        (vec![], 100, "no_scopes"),
        (vec!["board:a"], 0, "page_limit"),
        (vec!["board:a"], 10001, "page_limit"),
    ] {
        seed.batch_execute(BEGIN).await.unwrap();
        let scopes: Vec<String> = scopes.into_iter().map(str::to_owned).collect();
        assert_eq!(
            refusal(
                &seed,
                "SELECT synchro.synchro_seed_export_begin($1, $2)",
                &[&scopes, &limit]
            )
            .await,
            ("22023".into(), "invalid_seed_export".into(), reason.into()),
            "{scopes:?} {limit}"
        );
        seed.batch_execute("ROLLBACK").await.unwrap();
    }
    // Before begin, nothing; pages before the seal, nothing.
    seed.batch_execute(BEGIN).await.unwrap();
    assert_eq!(
        refusal(
            &seed,
            "SELECT * FROM synchro.synchro_seed_scope_rows('board:a')",
            &[]
        )
        .await
        .2,
        "not_begun"
    );
    seed.batch_execute("ROLLBACK").await.unwrap();
    // Only the seed login runs an export; it reads no table directly.
    for login in [
        "synchro_dev_adapter",
        "synchro_dev_operator",
        "synchro_dev_monitor",
    ] {
        let db = env.login(login).await;
        db.batch_execute(BEGIN).await.unwrap();
        assert_eq!(sqlstate(&db, begin).await, "42501", "{login}");
        db.batch_execute("ROLLBACK").await.unwrap();
    }
    for sql in [
        "SELECT * FROM synchro.seed_keys",
        "SELECT * FROM synchro.projection_rows",
        "SELECT synchro.synchro_seed_sign('receipt', '{}')",
        "SELECT * FROM app.docs",
    ] {
        assert_eq!(sqlstate(&seed, sql).await, "42501", "{sql}");
    }
}

/// Spec 001 negative control 10, for what exists of it so far: a real export verifies, and a
/// missing row, an altered row, a missing or stale server version, a wrong digest, an
/// incomplete page sequence and a stale receipt each prevent publication. (A corrupt SQLite
/// file and a nonempty queue come with the artifact.)
#[tokio::test]
async fn the_exporter_verifies_an_export_and_every_tampered_page_prevents_it() {
    use synchro_server::seed::{self, SeedError};
    let env = Env::installed().await;
    let _worker = boards(&env, 700).await;
    let mut db = env.login("synchro_dev_seed").await;
    let scopes = vec!["board:a".to_owned(), "board:b".to_owned()];
    let mut seen = Vec::new();
    let verified = seed::export(&mut db, &scopes, 100, |p| seen.push(p))
        .await
        .unwrap();
    assert_eq!(verified.scopes.len(), 2);
    for s in &verified.scopes {
        assert_eq!(s.records.len() as u64, s.scope.cardinality);
        assert_eq!(
            SeedReceipt::read_unverified(&s.receipt)
                .unwrap()
                .cardinality,
            s.scope.cardinality
        );
    }
    assert_eq!(
        verified.scopes[0].records.len() + verified.scopes[1].records.len(),
        467
    );
    let last = seen.last().unwrap();
    assert_eq!(
        (last.rows, last.total, last.pass),
        (467, 467, 2),
        "progress reaches the total"
    );

    let fetched = seed::fetch(&mut db, &scopes, 100, |_| {}).await.unwrap();
    let check = |pages: Vec<seed::ScopePages>, export: ExportManifest| {
        seed::verify(fetched.manifest.clone(), export, &scopes, &pages)
    };
    assert!(check(fetched.pages.clone(), fetched.export.clone()).is_ok());
    // The first scope's pages with one member of page `page` (`-1`: the last) edited.
    let edited = |page: isize, member: &str, edit: &dyn Fn(&mut Json)| {
        let mut pages = fetched.pages.clone();
        let all = &mut pages[0].pages;
        let at = if page < 0 {
            all.len() - 1
        } else {
            page as usize
        };
        let Json::Object(members) = &mut all[at].1 else {
            panic!("a page is an object")
        };
        let (_, value) = members.iter_mut().find(|(k, _)| k == member).unwrap();
        edit(value);
        pages
    };
    // The same, for member `name` of the fourth record of the first page.
    let tamper = |name: &'static str, edit: &dyn Fn(&mut Json)| {
        edited(0, "records", &|records| {
            let Json::Array(records) = records else {
                panic!()
            };
            let Json::Object(record) = &mut records[3] else {
                panic!()
            };
            edit(&mut record.iter_mut().find(|(k, _)| k == name).unwrap().1);
        })
    };
    let refused = |r: Result<seed::VerifiedExport, SeedError>, why: &str| match r {
        Err(SeedError::Verification(w)) => assert_eq!(w, why),
        other => panic!("{why}: {other:?}"),
    };
    let export = || fetched.export.clone();
    // A missing row.
    let missing = edited(0, "records", &|records| {
        let Json::Array(records) = records else {
            panic!()
        };
        records.remove(5);
    });
    refused(
        check(missing, export()),
        "a page ends neither with a full page nor a receipt",
    );
    // An altered row: its digest recomputes, but the scope's no longer matches.
    let altered = tamper("row", &|row| {
        let Json::Object(fields) = row else { panic!() };
        for (_, f) in fields.iter_mut() {
            if let Json::String(s) = f {
                if s.starts_with("doc ") {
                    *s = "forged".into();
                }
            }
        }
    });
    refused(
        check(altered, export()),
        "a scope's rows do not match its digest",
    );
    // A missing and a stale server version.
    let version = |v: &'static str| move |j: &mut Json| *j = Json::String(v.into());
    refused(
        check(tamper("server_version", &version("")), export()),
        "a row has no server version",
    );
    refused(
        check(tamper("server_version", &version("999999")), export()),
        "a scope's rows do not match its digest",
    );
    // A wrong digest in the export manifest (its pages and receipt name the true hash).
    let mut wrong = export();
    wrong.scopes[0].checksum.0[0] ^= 1;
    refused(
        check(fetched.pages.clone(), wrong),
        "a page is not bound to this export at its ordinal",
    );
    // An incomplete page sequence: a middle page dropped, or the final one.
    let mut gap = fetched.pages.clone();
    gap[0].pages.remove(1);
    refused(
        check(gap, export()),
        "a page is not bound to this export at its ordinal",
    );
    let mut cut = fetched.pages.clone();
    cut[0].pages.pop();
    refused(check(cut, export()), "the scope's final page is missing");
    // A stale receipt: the one of an earlier export of the same scope.
    let earlier = verified.scopes[0].receipt.clone();
    let stale = edited(-1, "receipt", &|r| *r = Json::String(earlier.clone()));
    refused(check(stale, export()), "a receipt does not match its scope");
    // Scopes other than the requested ones.
    assert!(matches!(
        seed::verify(
            fetched.manifest.clone(),
            fetched.export.clone(),
            &scopes[..1],
            &fetched.pages
        ),
        Err(SeedError::Verification(
            "the exported scopes are not the requested ones"
        ))
    ));
    // A refusal of the database is typed, naming no scope.
    let err = seed::export(&mut db, &["board:c".to_owned()], 100, |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SeedError::Refused { code, reason } if code == "invalid_seed_export" && reason == "not_portable"),
        "{err}"
    );
    assert!(!err.to_string().contains("board"), "{err}");
}

/// Pages follow the canonical row-identity order for every key type, across tables: string
/// keys of every length with escapes and non-ASCII text, int keys with negatives (which sort
/// after the positives as unsigned octets), int64 keys; the verification checks the order
/// of every record.
#[tokio::test]
async fn string_int_and_int64_keys_are_paged_in_identity_order() {
    use synchro_server::seed;
    let env = Env::installed().await;
    env.as_app_owner(
        r#"CREATE TABLE app.tags (id text PRIMARY KEY, note text);
           INSERT INTO app.tags VALUES ('', 'empty'), ('a', 'x'), ('b', 'x'), ('aa', 'x'), ('é', 'x'),
             ('z', 'x'), ('a"q', 'x'), (E'back\\slash', 'x'), (E'tab\there', 'x'), ('ü', 'x'), ('ab', 'x');
           CREATE TABLE app.nums (id integer PRIMARY KEY, note text);
           INSERT INTO app.nums VALUES (-5, 'x'), (-1, 'x'), (0, 'x'), (1, 'x'), (2147483647, 'x'),
             (-2147483648, 'x'), (300, 'x');
           CREATE TABLE app.bigs (id bigint PRIMARY KEY, note text);
           INSERT INTO app.bigs VALUES (-9223372036854775808, 'x'), (-1, 'x'), (0, 'x'), (9223372036854775807, 'x'), (256, 'x')"#,
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    for (table, key) in [("tags", "text"), ("nums", "integer"), ("bigs", "bigint")] {
        synchro_server::registry::register(
            &op,
            &synchro_server::registry::RegisterRequest::synced("app", table, "single_scope"),
        )
        .await
        .unwrap();
        op.batch_execute(&format!(
            "CREATE FUNCTION rules.{table}_scopes(p_id {key}) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC SELECT 'board:mix' FROM synchro_projection.\"app.{table}\" WHERE id = p_id; END;
             REVOKE EXECUTE ON FUNCTION rules.{table}_scopes({key}) FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION rules.{table}_scopes({key}) TO synchro_worker;
             SELECT synchro.synchro_register_membership_function('app', '{table}', 'rules.{table}_scopes({key})');"
        ))
        .await
        .unwrap();
    }
    op.batch_execute(
        "SELECT synchro.synchro_add_shared_scope('board:mix');
         SELECT synchro.synchro_declare_portable_scope('board:mix');",
    )
    .await
    .unwrap();
    let mut op = op;
    synchro_server::publish::publish(&mut op).await.unwrap();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    capture(&mut worker).await;
    let mut db = env.login("synchro_dev_seed").await;
    let verified = seed::export(&mut db, &["board:mix".to_owned()], 3, |_| {})
        .await
        .unwrap();
    assert_eq!(verified.scopes[0].records.len(), 23);
}

/// Spec 001 "Seed continuation receipt", through the real server: a fresh client that
/// installed a seed presents its receipt at connect and gets a normal cursor of its own at
/// the seed's boundary; its pull then brings exactly what changed since the export, and
/// the seed's rows with those changes digest to the server's terminal checksum. A tampered,
/// misplaced or garbage receipt, and one of a scope no longer portable, are null: rebuild.
#[tokio::test]
async fn a_receipt_becomes_a_cursor_at_the_seed_boundary_and_the_pull_resumes_there() {
    use synchro_server::seed;
    const SECRET: &str = "seed-receipt-secret-0123456789abcdef";
    let env = Env::installed().await;
    let worker = boards(&env, 600).await;
    drop(worker); // the server's own capture takes over
    let mut db = env.login("synchro_dev_seed").await;
    let verified = seed::export(&mut db, &["board:a".to_owned()], 1000, |_| {})
        .await
        .unwrap();
    let scope = &verified.scopes[0];
    let receipt = scope.receipt.clone();

    let port = common::free_port();
    let _server = common::start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    common::wait_ready(&http, &base).await;
    let post = |path: &'static str, user: &'static str, body: Value| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r = http
                .post(format!("{base}{path}"))
                .header(
                    "authorization",
                    format!(
                        "Bearer {}",
                        synchro_server::auth::mint(SECRET.as_bytes(), user, 600)
                    ),
                )
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    // Changes after the export.
    env.admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (9003, 'a', 'after the seed');
             UPDATE app.docs SET title = 'changed after' WHERE id = 3;
             DELETE FROM app.docs WHERE id = 6;",
        )
        .await
        .unwrap();
    let schema = json!({
        "version": verified.manifest.schema_version,
        "hash": verified.manifest.schema_hash_hex(),
    });
    let connect = |client: &'static str, receipts: Value| {
        json!({"protocol_version": 3, "client_id": client, "schema": schema.clone(),
               "seed_receipts": receipts})
    };
    let (st, c) = post(
        "/sync/connect",
        "alice",
        connect("seeded", json!({"board:a": receipt})),
    )
    .await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["schema"]["action"], json!("none"), "{c}");
    let cursor = c["scope_cursor_updates"]["board:a"]
        .as_str()
        .expect("a cursor")
        .to_owned();
    let generation = c["client_generation"].clone();

    // The pull from the boundary brings exactly the three later changes (once captured).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let page = loop {
        let (st, p) = post(
            "/sync/pull",
            "alice",
            json!({"protocol_version": 3, "client_id": "seeded", "client_generation": generation,
                   "schema": schema, "scope_cursors": {"board:a": cursor}, "limit": 1000}),
        )
        .await;
        assert_eq!(st, 200, "{p}");
        if p["changes"].as_array().unwrap().len() == 3 {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "never captured: {p}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(page["rebuild_scopes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s != "board:a"));
    // The seed's rows with those changes are the server's scope: its terminal checksum.
    let mut rows: std::collections::BTreeMap<String, (Json, Json, String)> = scope
        .records
        .iter()
        .map(|r| {
            (
                synchro_protocol::jcs::to_output_string(&r.pk),
                (r.pk.clone(), r.row.clone(), r.server_version.clone()),
            )
        })
        .collect();
    for change in page["changes"].as_array().unwrap() {
        let pk = Json::parse(&change["pk"].to_string()).unwrap();
        let key = synchro_protocol::jcs::to_output_string(&pk);
        match change["op"].as_str() {
            Some("upsert") => {
                let row = Json::parse(&change["row"].to_string()).unwrap();
                let version = change["server_version"].as_str().unwrap().to_owned();
                rows.insert(key, (pk, row, version));
            }
            _ => {
                rows.remove(&key);
            }
        }
    }
    let table_id = &verified.manifest.tables[0].table_id;
    let mut entries: Vec<(RowIdentity, [u8; 32])> = rows
        .values()
        .map(|(pk, row, version)| {
            let d = row_digest(&verified.manifest, table_id, pk, row, version).unwrap();
            (d.identity, d.digest)
        })
        .collect();
    let digest = scope_digest(
        &verified.manifest.schema_hash(),
        "board:a",
        &mut entries,
        false,
    )
    .unwrap();
    assert_eq!(
        page["checksums"]["board:a"]["digest"].as_str(),
        Some(hex::encode(digest.digest).as_str()),
        "the seed plus the changes since its boundary is the server's scope"
    );

    // What is not a receipt of this scope, portable now, is null: the scope rebuilds.
    let mut tampered = receipt.clone().into_bytes();
    let i = tampered.len() - 3;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    for (client, receipts) in [
        ("tampered", json!({"board:a": tampered})),
        ("misplaced", json!({"board:b": receipt})),
        ("garbage", json!({"board:a": "sc1.not.a-receipt"})),
        ("unassigned", json!({"board:z": receipt})),
    ] {
        let (st, c) = post("/sync/connect", "alice", connect(client, receipts.clone())).await;
        assert_eq!(st, 200, "{client}: {c}");
        let updates = c["scope_cursor_updates"].as_object().unwrap();
        assert_eq!(updates.len(), 1, "{client}: {c}");
        assert!(updates.values().all(Value::is_null), "{client}: {c}");
    }
    env.admin
        .batch_execute("SELECT synchro.synchro_undeclare_portable_scope('board:a')")
        .await
        .unwrap();
    let (_, c) = post(
        "/sync/connect",
        "bob",
        connect("after-undeclare", json!({"board:a": receipt})),
    )
    .await;
    assert_eq!(c["scope_cursor_updates"]["board:a"], Value::Null, "{c}");
    // The cursor alice got is hers: bob, with a generation of his own, cannot pull with it.
    let (_, c) = post("/sync/connect", "bob", connect("seeded", json!({}))).await;
    let (st, v) = post(
        "/sync/pull",
        "bob",
        json!({"protocol_version": 3, "client_id": "seeded", "client_generation": c["client_generation"],
               "schema": schema, "scope_cursors": {"board:a": cursor}, "limit": 10}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{v}"
    );
}

/// `synchro-server seed export` and `seed verify`, as an operator runs them (spec 001
/// checks 8 to 10 and negative control 10's corrupt file and nonempty queue): the artifact
/// is published with its evidence only when every check passed, holds the client's own
/// layout (rows, versions, provenance, receipts; no cursor, no queue, no client identity),
/// and a corrupt file, a queued mutation, an altered row and a sidecar file each fail the
/// offline check; a refused export publishes nothing.
#[tokio::test]
async fn the_export_command_publishes_a_verified_artifact_and_nothing_on_failure() {
    use synchro_client::store::Storage;
    let env = Env::installed().await;
    let _worker = boards(&env, 700).await;
    let dir = std::env::temp_dir().join(format!("synchro-seed-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("board.seed.sqlite");
    let out_s = out.to_str().unwrap();
    let seed = "synchro_dev_seed";
    let (code, evidence) = cli(
        &env,
        seed,
        &[
            "seed",
            "export",
            "--scope",
            "board:b",
            "--scope",
            "board:a",
            "--out",
            out_s,
            "--page-limit",
            "100",
        ],
    );
    assert_eq!(code, 0, "{evidence}");
    assert_eq!(evidence["scopes"][0]["scope_id"], json!("board:a"));
    assert_eq!(evidence["scopes"][0]["cardinality"], json!(233));
    assert_eq!(evidence["scopes"][1]["cardinality"], json!(234));
    let bytes = std::fs::read(&out).unwrap();
    use sha2::Digest as _;
    assert_eq!(
        evidence["sha256"],
        json!(hex::encode(sha2::Sha256::digest(&bytes)))
    );
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("board.seed.json")).unwrap())
            .unwrap();
    assert_eq!(written, evidence, "the evidence beside the artifact");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["board.seed.json", "board.seed.sqlite"],
        "no temporary or sidecar file"
    );
    assert_eq!(
        cli(&env, seed, &["seed", "verify", out_s]),
        (0, evidence.clone())
    );

    // The client's own layout: rows with versions and provenance, a receipt per scope, each
    // scope waiting for connect (no cursor), nothing queued, no client identity.
    let storage = Storage::open_read_only(&out).unwrap();
    let summary = storage.verify_seed().unwrap();
    assert_eq!(summary.scopes.len(), 2);
    assert_eq!(storage.seed_receipts().unwrap().len(), 2);
    // The evidence names the export and, for each scope, the boundary its receipt binds.
    for (i, (_, receipt)) in storage.seed_receipts().unwrap().iter().enumerate() {
        let binding = SeedReceipt::read_unverified(receipt).unwrap().binding;
        assert_eq!(evidence["export_id"], json!(binding.export_id));
        assert_eq!(
            evidence["stream_generation"],
            json!(binding.stream_generation)
        );
        let boundary: Value = serde_json::from_str(&synchro_protocol::jcs::to_output_string(
            &binding.snapshot_boundary.to_json(),
        ))
        .unwrap();
        assert_eq!(evidence["scopes"][i]["boundary"], boundary);
        assert_eq!(boundary["kind"], json!("transaction_end"), "{boundary}");
    }
    let count = |sql: &str| -> i64 {
        storage
            .connection()
            .query_row(sql, [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(count("SELECT count(*) FROM \"docs\""), 467);
    assert_eq!(count("SELECT count(*) FROM \"_synchro_rows\""), 467);
    assert_eq!(
        count(
            "SELECT count(*) FROM \"_synchro_scopes\" WHERE \"rebuild\" = 1 AND \"cursor\" IS NULL"
        ),
        2
    );
    assert_eq!(count("SELECT count(*) FROM \"_synchro_client\""), 0);
    assert_eq!(count("SELECT count(*) FROM \"_synchro_mutations\""), 0);
    drop(storage);

    // Each tampered copy fails the offline check.
    let tampered = |name: &str, edit: &dyn Fn(&std::path::Path)| -> Value {
        let copy = dir.join(name);
        std::fs::copy(&out, &copy).unwrap();
        edit(&copy);
        let (code, v) = cli(&env, seed, &["seed", "verify", copy.to_str().unwrap()]);
        assert_eq!(code, 1, "{name}: {v}");
        v["error"].clone()
    };
    let with_sql = |sql: &'static str| {
        move |p: &std::path::Path| {
            let s = Storage::open(p).unwrap();
            s.connection().execute_batch(sql).unwrap();
            s.close_as_artifact().unwrap();
        }
    };
    let e = tampered("queued.sqlite", &with_sql(
        "INSERT INTO \"_synchro_batches\" (\"batch_id\", \"seq\") VALUES ('b', 1);
         INSERT INTO \"_synchro_mutations\" (\"mutation_id\", \"batch_id\", \"local_order\", \"table_id\", \"pk\", \"operation\",
             \"client_version\", \"columns\", \"authored_version\", \"authored_hash\") VALUES ('m', 'b', 1, 't', '1', 'delete', 1, '[]', 1, 'h')",
    ));
    assert_eq!(
        e["reason"],
        json!("the seed holds a client's state (identity, queue or cursor)")
    );
    let e = tampered(
        "altered.sqlite",
        &with_sql("UPDATE \"docs\" SET \"title\" = 'forged' WHERE \"id\" = 3"),
    );
    assert_eq!(e["reason"], json!("a seed row does not match its digest"));
    let e = tampered(
        "cursor.sqlite",
        &with_sql("UPDATE \"_synchro_scopes\" SET \"cursor\" = 'c1.x'"),
    );
    assert_eq!(
        e["reason"],
        json!("the seed holds a client's state (identity, queue or cursor)")
    );
    let e = tampered("sidecar.sqlite", &|p| {
        let mut wal = p.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::write(wal, b"").unwrap();
    });
    assert_eq!(e["reason"], json!("the artifact has a sidecar file"));
    let e = tampered("corrupt.sqlite", &|p| {
        let mut bytes = std::fs::read(p).unwrap();
        let n = bytes.len();
        for b in &mut bytes[n / 2..n / 2 + 4096] {
            *b ^= 0x5a;
        }
        std::fs::write(p, bytes).unwrap();
    });
    assert!(e["code"].is_string(), "{e}");

    // Another login than a seed login, and an output directory that does not exist: typed,
    // and found before the export.
    let (code, v) = cli(
        &env,
        "synchro_dev_adapter",
        &["seed", "export", "--scope", "board:a", "--out", out_s],
    );
    assert_eq!(
        (code, &v["error"]),
        (
            1,
            &json!({"code": "seed_export_forbidden", "reason": "not_a_seed_login"})
        ),
        "{v}"
    );
    let (code, v) = cli(
        &env,
        seed,
        &[
            "seed",
            "export",
            "--scope",
            "board:a",
            "--out",
            dir.join("no/such.sqlite").to_str().unwrap(),
        ],
    );
    assert_eq!(
        (code, &v["error"]["code"]),
        (1, &json!("seed_failed")),
        "{v}"
    );
    // A refused export publishes nothing.
    let nothing = dir.join("nothing.seed.sqlite");
    let (code, v) = cli(
        &env,
        seed,
        &[
            "seed",
            "export",
            "--scope",
            "board:c",
            "--out",
            nothing.to_str().unwrap(),
        ],
    );
    assert_eq!(
        (code, &v["error"]["reason"]),
        (1, &json!("not_portable")),
        "{v}"
    );
    assert!(!nothing.exists());
    assert!(!dir.join("nothing.seed.sqlite.tmp").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --seed-dir` (issue 30, item 4): the artifact and its evidence behind a bearer
/// token (or public with `--public-seeds`), content-addressed (the ETag is the SHA-256 the
/// evidence records; `If-None-Match` answers 304; `?v=<sha256>` is immutable, any other
/// `v` 404), ranges, and nothing but plain seed file names.
#[tokio::test]
async fn serve_publishes_seeds_content_addressed_with_ranges_behind_a_token() {
    const SECRET: &str = "seed-serving-secret-0123456789abcdef";
    let env = Env::installed().await;
    let _worker = boards(&env, 300).await;
    let dir = std::env::temp_dir().join(format!("synchro-seed-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), b"not a seed").unwrap();
    let out = dir.join("board.seed.sqlite");
    let (code, evidence) = cli(
        &env,
        "synchro_dev_seed",
        &[
            "seed",
            "export",
            "--scope",
            "board:a",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{evidence}");
    let sha = evidence["sha256"].as_str().unwrap().to_owned();
    let bytes = std::fs::read(&out).unwrap();
    let http = reqwest::Client::new();
    let start = |extra: &[&str]| {
        let port = common::free_port();
        let mut args = vec!["--seed-dir".to_owned(), dir.to_str().unwrap().to_owned()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let server = synchro_testkit::pg::start_server_binary_with(
            env!("CARGO_BIN_EXE_synchro-server"),
            &env,
            port,
            SECRET,
            &args,
        );
        (server, format!("http://127.0.0.1:{port}"))
    };
    let (server, base) = start(&[]);
    common::wait_ready(&http, &base).await;
    let token = synchro_server::auth::mint(SECRET.as_bytes(), "alice", 600);
    let get = |path: String, headers: Vec<(&'static str, String)>| {
        let http = http.clone();
        let token = token.clone();
        async move {
            let mut r = http
                .get(path)
                .header("authorization", format!("Bearer {token}"));
            for (k, v) in headers {
                r = r.header(k, v);
            }
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let h = r.headers().clone();
            (status, h, r.bytes().await.unwrap().to_vec())
        }
    };
    let url = format!("{base}/seeds/board.seed.sqlite");
    // Without a token: 401, with the server's error body.
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // The artifact, its ETag the recorded SHA-256, revalidated without a version.
    let (st, h, body) = get(url.clone(), vec![]).await;
    assert_eq!(st, 200);
    assert_eq!(body, bytes);
    assert_eq!(h["etag"], format!("\"{sha}\"").as_str());
    assert_eq!(h["cache-control"], "private, no-cache");
    assert_eq!(h["accept-ranges"], "bytes");
    let (st, _, body) = get(url.clone(), vec![("if-none-match", format!("\"{sha}\""))]).await;
    assert_eq!((st, body.len()), (304, 0));
    // Addressed by its hash: immutable; another hash: gone.
    let (st, h, _) = get(format!("{url}?v={sha}"), vec![]).await;
    assert_eq!(
        (st, &h["cache-control"]),
        (
            200,
            &"private, max-age=31536000, immutable"
                .parse::<reqwest::header::HeaderValue>()
                .unwrap()
        )
    );
    let (st, _, _) = get(format!("{url}?v={}", "0".repeat(64)), vec![]).await;
    assert_eq!(st, 404);
    // Ranges.
    let len = bytes.len();
    let (st, h, body) = get(url.clone(), vec![("range", "bytes=100-199".into())]).await;
    assert_eq!((st, body.as_slice()), (206, &bytes[100..200]));
    assert_eq!(h["content-range"], format!("bytes 100-199/{len}").as_str());
    let (st, _, body) = get(url.clone(), vec![("range", "bytes=-10".into())]).await;
    assert_eq!((st, body.as_slice()), (206, &bytes[len - 10..]));
    let (st, h, _) = get(url.clone(), vec![("range", format!("bytes={len}-"))]).await;
    assert_eq!(st, 416);
    assert_eq!(h["content-range"], format!("bytes */{len}").as_str());
    // The evidence, and nothing that is not a seed file.
    let (st, h, body) = get(format!("{base}/seeds/board.seed.json"), vec![]).await;
    assert_eq!(st, 200);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), evidence);
    assert_eq!(h["content-type"], "application/json");
    for name in [
        "notes.txt",
        "missing.seed.sqlite",
        "..%2Fboard.seed.sqlite",
        ".hidden.json",
        "board.seed.sqlite.tmp",
    ] {
        let (st, _, _) = get(format!("{base}/seeds/{name}"), vec![]).await;
        assert_eq!(st, 404, "{name}");
    }
    drop(server);
    // Public: no token needed.
    let (_public, base) = start(&["--public-seeds"]);
    common::wait_ready(&http, &base).await;
    let r = http
        .get(format!("{base}/seeds/board.seed.sqlite"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["cache-control"], "public, no-cache");
    assert_eq!(r.bytes().await.unwrap().to_vec(), bytes);
    let _ = std::fs::remove_dir_all(&dir);
}
