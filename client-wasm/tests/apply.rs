//! Verified pull application on real SQLite: rows are checked against their row checksums
//! before anything is written, a page applies atomically, terminal scope digests are
//! recomputed from the local rows before cursors are installed, and a mismatch invalidates
//! only its own scope.

use synchro_testkit::manifests as common;
use synchro_testkit::target;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

use std::collections::BTreeSet;

use common::{field, manifest, table};
use synchro_client::storage::Storage;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::PullResponse;

fn docs() -> Manifest {
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
            ],
            &[],
        )],
    )
}

fn row(id: i64, title: &str) -> String {
    format!(r#"{{"f1":"{id}","f2":"{title}"}}"#)
}

fn digest_hex(m: &Manifest, id: i64, title: &str, version: &str) -> String {
    let d = row_digest(
        m,
        "tbl_docs",
        &Json::String(id.to_string()),
        &Json::parse(&row(id, title)).unwrap(),
        version,
    )
    .unwrap();
    hex(&d.digest)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn upsert(m: &Manifest, scope: &str, id: i64, title: &str, version: &str) -> String {
    format!(
        r#"{{"scope_id":"{scope}","table_id":"tbl_docs","pk":"{id}","op":"upsert","row":{},"server_version":"{version}","row_checksum":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}}}"#,
        row(id, title),
        digest_hex(m, id, title, version)
    )
}

fn delete(scope: &str, id: i64, version: &str) -> String {
    format!(
        r#"{{"scope_id":"{scope}","table_id":"tbl_docs","pk":"{id}","op":"delete","server_version":"{version}"}}"#
    )
}

/// The scope digest of these (id, title, version) rows, computed independently of the
/// client's local state.
fn scope_hex(m: &Manifest, scope: &str, rows: &[(i64, &str, &str)]) -> String {
    let table = m.table("tbl_docs").unwrap();
    let mut entries: Vec<_> = rows
        .iter()
        .map(|(id, title, version)| {
            let pk =
                TypedValue::from_wire(&table.primary_key().spec, &Json::String(id.to_string()))
                    .unwrap();
            let d = row_digest(
                m,
                "tbl_docs",
                &Json::String(id.to_string()),
                &Json::parse(&row(*id, title)).unwrap(),
                version,
            )
            .unwrap();
            (RowIdentity::new(table, &pk).unwrap(), d.digest)
        })
        .collect();
    hex(&scope_digest(&m.schema_hash(), scope, &mut entries, false)
        .unwrap()
        .digest)
}

fn page(changes: &[String], terminal: Option<&[(&str, String)]>, cursors: &[(&str, &str)]) -> Json {
    let cursors: Vec<String> = cursors
        .iter()
        .map(|(s, c)| format!(r#""{s}":"{c}""#))
        .collect();
    let tail = match terminal {
        None => r#""has_more":true"#.to_owned(),
        Some(sums) => {
            let sums: Vec<String> = sums
                .iter()
                .map(|(s, d)| format!(r#""{s}":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{d}"}}"#))
                .collect();
            format!(r#""has_more":false,"checksums":{{{}}}"#, sums.join(","))
        }
    };
    Json::parse(&format!(
        r#"{{"protocol_version":3,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[]}},"changes":[{}],"scope_cursor_updates":{{{}}},"rebuild_scopes":[],{tail}}}"#,
        changes.join(","),
        cursors.join(",")
    ))
    .unwrap()
}

fn assigned() -> BTreeSet<String> {
    ["user:a".to_owned(), "user:b".to_owned()].into()
}

fn titles(db: &Storage) -> Vec<(i64, String)> {
    let mut s = db
        .connection()
        .prepare("SELECT id, title FROM docs ORDER BY id")
        .unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_verified_page_applies_and_installs_cursors_after_the_terminal_digests() {
    let m = docs();
    let mut db = target::fresh("t").await;
    db.install(&m).unwrap();
    // Page 1 (not terminal): cursors stay pending.
    let p1 = page(
        &[
            upsert(&m, "user:a", 1, "one", "v1"),
            upsert(&m, "user:b", 1, "one", "v1"),
        ],
        None,
        &[("user:a", "ca1"), ("user:b", "cb1")],
    );
    db.apply_pull(&m, p1, &assigned()).unwrap();
    assert_eq!(db.scope_state("user:a").unwrap(), Some((None, true)));
    // Page 2 (terminal): a row only in user:a, then both digests verify.
    let p2 = page(
        &[upsert(&m, "user:a", 2, "two", "v2")],
        Some(&[
            (
                "user:a",
                scope_hex(&m, "user:a", &[(1, "one", "v1"), (2, "two", "v2")]),
            ),
            ("user:b", scope_hex(&m, "user:b", &[(1, "one", "v1")])),
        ]),
        &[("user:a", "ca2"), ("user:b", "cb2")],
    );
    let applied = db.apply_pull(&m, p2, &assigned()).unwrap();
    assert_eq!(applied.verified, assigned());
    assert!(applied.rebuild.is_empty());
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("ca2".into()), false))
    );
    assert_eq!(titles(&db), [(1, "one".into()), (2, "two".into())]);

    // A delete from one scope keeps a row another scope still justifies; from the last
    // scope it removes the row.
    let p3 = page(
        &[delete("user:b", 1, "v3")],
        Some(&[
            (
                "user:a",
                scope_hex(&m, "user:a", &[(1, "one", "v1"), (2, "two", "v2")]),
            ),
            ("user:b", scope_hex(&m, "user:b", &[])),
        ]),
        &[("user:a", "ca3"), ("user:b", "cb3")],
    );
    db.apply_pull(&m, p3, &assigned()).unwrap();
    assert_eq!(titles(&db).len(), 2);
    let p4 = page(
        &[delete("user:a", 1, "v4")],
        Some(&[
            ("user:a", scope_hex(&m, "user:a", &[(2, "two", "v2")])),
            ("user:b", scope_hex(&m, "user:b", &[])),
        ]),
        &[("user:a", "ca4"), ("user:b", "cb4")],
    );
    let applied = db.apply_pull(&m, p4, &assigned()).unwrap();
    assert_eq!(applied.verified, assigned());
    assert_eq!(titles(&db), [(2, "two".into())]);
}

/// A terminal page applies in two steps: its rows (visible at once), then its digests and
/// cursors. A client that stops between them, reopened, still has its old cursors, so the
/// next pull repeats the page and verifies it.
#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_client_stopped_between_rows_and_digests_repeats_the_page() {
    let m = docs();
    let path = target::fresh_path("t").await;
    let mut db = target::open(&path);
    db.install(&m).unwrap();
    let sums = || {
        vec![
            (
                "user:a",
                scope_hex(&m, "user:a", &[(1, "one", "v1"), (2, "two", "v2")]),
            ),
            ("user:b", scope_hex(&m, "user:b", &[])),
        ]
    };
    let terminal = || {
        let sums = sums();
        let p = page(
            &[
                upsert(&m, "user:a", 1, "one", "v1"),
                upsert(&m, "user:a", 2, "two", "v2"),
            ],
            Some(&sums),
            &[("user:a", "ca1"), ("user:b", "cb1")],
        );
        PullResponse::from_json_owned(p).unwrap()
    };
    let (applied, _unverified) = db.apply_pull_rows(&m, terminal(), &assigned()).unwrap();
    assert_eq!(applied.changes, 2);
    assert!(applied.verified.is_empty(), "no digest checked yet");
    assert_eq!(titles(&db), [(1, "one".into()), (2, "two".into())]);
    assert_eq!(db.scope_state("user:a").unwrap(), Some((None, true)));
    drop(db);

    let mut db = target::open(&path);
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((None, true)),
        "no cursor was installed"
    );
    let (mut applied, unverified) = db.apply_pull_rows(&m, terminal(), &assigned()).unwrap();
    db.verify_terminal(&m, unverified, &mut applied).unwrap();
    assert_eq!(applied.verified, assigned());
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("ca1".into()), false))
    );
    assert_eq!(titles(&db), [(1, "one".into()), (2, "two".into())]);
    // A wrong digest found in the second step marks only its scope, rows kept.
    let mut wrong = sums();
    let flip = if wrong[1].1.starts_with("00") {
        "11"
    } else {
        "00"
    };
    wrong[1].1.replace_range(0..2, flip);
    let p = page(&[], Some(&wrong), &[("user:a", "ca2"), ("user:b", "cb2")]);
    let (mut applied, unverified) = db
        .apply_pull_rows(&m, PullResponse::from_json_owned(p).unwrap(), &assigned())
        .unwrap();
    db.verify_terminal(&m, unverified, &mut applied).unwrap();
    assert_eq!(applied.verified, ["user:a".to_owned()].into());
    assert_eq!(applied.rebuild, ["user:b".to_owned()].into());
    assert_eq!(db.scope_state("user:b").unwrap(), Some((None, true)));
    assert_eq!(titles(&db).len(), 2);
    drop(db);
    target::remove(&path);
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn tampering_is_detected_and_only_the_affected_scope_rebuilds() {
    let m = docs();
    let mut db = target::fresh("t").await;
    db.install(&m).unwrap();
    let good = |id| upsert(&m, "user:a", id, "ok", "v1");
    // A row whose value was changed after its checksum: the whole page is refused.
    let tampered = good(1).replace(r#""f2":"ok""#, r#""f2":"evil""#);
    let err = db
        .apply_pull(
            &m,
            page(&[good(2), tampered], None, &[("user:a", "c")]),
            &assigned(),
        )
        .unwrap_err();
    assert_eq!(err.code(), "sync_integrity_failure");
    assert!(titles(&db).is_empty(), "nothing of the page was applied");
    // A terminal map without one of the assigned scopes: refused as a whole.
    let err = db
        .apply_pull(
            &m,
            page(
                &[good(1)],
                Some(&[("user:a", scope_hex(&m, "user:a", &[(1, "ok", "v1")]))]),
                &[("user:a", "c")],
            ),
            &assigned(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("terminal checksum keys"), "{err}");
    assert!(titles(&db).is_empty());
    // A tampered terminal checksum for user:b: user:a's cursor installs, user:b rebuilds.
    let mut wrong = scope_hex(&m, "user:b", &[]);
    wrong.replace_range(0..2, if wrong.starts_with("00") { "11" } else { "00" });
    let applied = db
        .apply_pull(
            &m,
            page(
                &[good(1)],
                Some(&[
                    ("user:a", scope_hex(&m, "user:a", &[(1, "ok", "v1")])),
                    ("user:b", wrong),
                ]),
                &[("user:a", "ca"), ("user:b", "cb")],
            ),
            &assigned(),
        )
        .unwrap();
    assert_eq!(applied.verified, ["user:a".to_owned()].into());
    assert_eq!(applied.rebuild, ["user:b".to_owned()].into());
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("ca".into()), false))
    );
    assert_eq!(db.scope_state("user:b").unwrap(), Some((None, true)));
}

fn record(m: &Manifest, id: i64, title: &str, version: &str) -> String {
    format!(
        r#"{{"table_id":"tbl_docs","pk":"{id}","row":{},"server_version":"{version}","row_checksum":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}}}"#,
        row(id, title),
        digest_hex(m, id, title, version)
    )
}

fn rebuild_page(records: &[String], last: Option<(String, &str)>) -> Json {
    let tail = match last {
        None => r#""has_more":true,"continuation":"k""#.to_owned(),
        Some((digest, cursor)) => format!(
            r#""has_more":false,"final_scope_cursor":"{cursor}","checksum":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{digest}"}}"#
        ),
    };
    Json::parse(&format!(
        r#"{{"protocol_version":3,"scope_id":"user:a","records":[{}],{tail}}}"#,
        records.join(",")
    ))
    .unwrap()
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_rebuild_replaces_the_scope_only_after_its_final_checksum_verifies() {
    let m = docs();
    let mut db = target::fresh("t").await;
    db.install(&m).unwrap();
    db.apply_pull(
        &m,
        page(
            &[
                upsert(&m, "user:a", 1, "one", "v1"),
                upsert(&m, "user:a", 2, "two", "v2"),
                upsert(&m, "user:a", 3, "three", "v3"),
                upsert(&m, "user:b", 3, "three", "v3"),
            ],
            Some(&[
                (
                    "user:a",
                    scope_hex(
                        &m,
                        "user:a",
                        &[(1, "one", "v1"), (2, "two", "v2"), (3, "three", "v3")],
                    ),
                ),
                ("user:b", scope_hex(&m, "user:b", &[(3, "three", "v3")])),
            ]),
            &[("user:a", "ca"), ("user:b", "cb")],
        ),
        &assigned(),
    )
    .unwrap();
    let before = titles(&db);

    // A final checksum that does not match the pages: nothing changes, the scope rebuilds.
    assert!(!db
        .apply_rebuild(
            &m,
            "user:a",
            &rebuild_page(&[record(&m, 2, "two2", "v5")], None),
            true
        )
        .unwrap());
    let err = db
        .apply_rebuild(
            &m,
            "user:a",
            &rebuild_page(
                &[record(&m, 4, "four", "v6")],
                Some((scope_hex(&m, "user:a", &[(4, "four", "v6")]), "fa")),
            ),
            false,
        )
        .unwrap_err();
    assert_eq!(err.code(), "sync_integrity_failure");
    assert_eq!(titles(&db), before);
    assert_eq!(db.scope_state("user:a").unwrap(), Some((None, true)));

    // The snapshot now: row 2 changed, row 4 new, rows 1 and 3 no longer in user:a.
    assert!(!db
        .apply_rebuild(
            &m,
            "user:a",
            &rebuild_page(&[record(&m, 2, "two2", "v5")], None),
            true
        )
        .unwrap());
    assert!(db
        .apply_rebuild(
            &m,
            "user:a",
            &rebuild_page(
                &[record(&m, 4, "four", "v6")],
                Some((
                    scope_hex(&m, "user:a", &[(2, "two2", "v5"), (4, "four", "v6")]),
                    "fa",
                )),
            ),
            false,
        )
        .unwrap());
    // Row 1 had no other scope and is gone; row 3 stays for user:b.
    assert_eq!(
        titles(&db),
        [(2, "two2".into()), (3, "three".into()), (4, "four".into())]
    );
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("fa".into()), false))
    );
    // A tampered record is refused before anything is staged.
    let tampered = record(&m, 5, "five", "v7").replace(r#""f2":"five""#, r#""f2":"evil""#);
    assert_eq!(
        db.apply_rebuild(&m, "user:a", &rebuild_page(&[tampered], None), true)
            .unwrap_err()
            .code(),
        "sync_integrity_failure"
    );
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_removed_scope_takes_away_only_the_rows_nothing_else_justifies() {
    let m = docs();
    let mut db = target::fresh("t").await;
    db.install(&m).unwrap();
    db.apply_pull(
        &m,
        page(
            &[
                upsert(&m, "user:a", 1, "shared", "v1"),
                upsert(&m, "user:b", 1, "shared", "v1"),
                upsert(&m, "user:b", 2, "only b", "v2"),
            ],
            Some(&[
                ("user:a", scope_hex(&m, "user:a", &[(1, "shared", "v1")])),
                (
                    "user:b",
                    scope_hex(&m, "user:b", &[(1, "shared", "v1"), (2, "only b", "v2")]),
                ),
            ]),
            &[("user:a", "ca"), ("user:b", "cb")],
        ),
        &assigned(),
    )
    .unwrap();
    let only_a: BTreeSet<String> = ["user:a".to_owned()].into();
    let removal = |removed: &str| {
        Json::parse(&format!(
            r#"{{"protocol_version":3,"scope_set_version":2,"changes":[],"scope_updates":{{"added":[],"removed":["{removed}"]}},"scope_cursor_updates":{{}},"rebuild_scopes":[],"has_more":false,"checksums":{{"user:a":{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}}}}}"#,
            scope_hex(&m, "user:a", &[(1, "shared", "v1")])
        ))
        .unwrap()
    };
    // Claiming to remove a scope that is still assigned is refused as a whole.
    assert!(db.apply_pull(&m, removal("user:a"), &assigned()).is_err());
    assert_eq!(titles(&db).len(), 2);
    let applied = db.apply_pull(&m, removal("user:b"), &only_a).unwrap();
    assert_eq!(applied.verified, only_a);
    assert_eq!(titles(&db), [(1, "shared".into())]);
    assert_eq!(db.scope_state("user:b").unwrap(), None);
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("ca".into()), false))
    );
}

/// The wire checksum object these tests' pages carry for a digest.
fn good_checksum(digest: &str) -> String {
    format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{digest}"}}"#)
}

/// Every way a checksum object can differ from spec 001's exact shape.
fn bad_checksums(digest: &str) -> Vec<String> {
    let upper = digest.to_uppercase();
    let short = &digest[..62];
    let alphabet = format!("g{}", &digest[1..]);
    vec![
        format!(r#"{{"algorithm":"md5","version":1,"encoding":"hex","digest":"{digest}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":7,"encoding":"hex","digest":"{digest}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":"1","encoding":"hex","digest":"{digest}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":1,"encoding":"base64","digest":"{digest}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{upper}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{short}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{alphabet}"}}"#),
        format!(r#"{{"algorithm":"sha256","version":1,"digest":"{digest}"}}"#),
        format!(r#"{{"algorithm":"sha256","digest":"{digest}"}}"#),
        format!(r#"{{"digest":"{digest}"}}"#),
        format!(
            r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{digest}","x":1}}"#
        ),
        format!(r#""{digest}""#),
        format!(r#"["sha256",1,"hex","{digest}"]"#),
        "null".to_owned(),
    ]
}

/// Everything the client stores about synced state: visible rows, row digests and every
/// scope column (cursor, pending cursor, rebuild mark).
fn stored_state(db: &Storage) -> String {
    let mut out = String::new();
    for sql in [
        "SELECT id || ':' || coalesce(title, '') FROM docs ORDER BY id",
        r#"SELECT "table_id" || ':' || "pk" || ':' || "server_version" || ':' || hex("digest") FROM "_synchro_rows" ORDER BY 1"#,
        r#"SELECT "scope_id" || ':' || coalesce("cursor", '-') || ':' || coalesce("pending_cursor", '-') || ':' || "rebuild" FROM "_synchro_scopes" ORDER BY 1"#,
        r#"SELECT count(*) FROM "_synchro_rebuild_rows""#,
    ] {
        let mut q = db.connection().prepare(sql).unwrap();
        let rows: Vec<String> = q
            .query_map([], |r| r.get::<_, rusqlite::types::Value>(0))
            .unwrap()
            .map(|v| format!("{:?}", v.unwrap()))
            .collect();
        out.push_str(&rows.join(","));
        out.push('|');
    }
    out
}

/// A database holding a verified row 1 in both scopes (cursors ca and cb).
async fn baseline(m: &Manifest) -> Storage {
    let mut db = target::fresh("t").await;
    db.install(m).unwrap();
    db.apply_pull(
        m,
        page(
            &[
                upsert(m, "user:a", 1, "one", "v1"),
                upsert(m, "user:b", 1, "one", "v1"),
            ],
            Some(&[
                ("user:a", scope_hex(m, "user:a", &[(1, "one", "v1")])),
                ("user:b", scope_hex(m, "user:b", &[(1, "one", "v1")])),
            ]),
            &[("user:a", "ca"), ("user:b", "cb")],
        ),
        &assigned(),
    )
    .unwrap();
    db
}

/// Applies `text` as a pull page and expects a whole-page contract failure that changed
/// nothing stored.
fn refused_pull(db: &mut Storage, m: &Manifest, text: &str, assigned: &BTreeSet<String>) {
    let before = stored_state(db);
    let page = Json::parse(text).unwrap();
    let err = db.apply_pull(m, page, assigned).unwrap_err();
    assert_eq!(err.code(), "sync_integrity_failure", "{text}");
    assert_eq!(stored_state(db), before, "nothing is written: {text}");
}

fn refused_rebuild(db: &mut Storage, m: &Manifest, text: &str, first: bool) {
    let before = stored_state(db);
    let page = Json::parse(text).unwrap();
    let err = db.apply_rebuild(m, "user:a", &page, first).unwrap_err();
    assert_eq!(err.code(), "sync_integrity_failure", "{text}");
    assert_eq!(stored_state(db), before, "nothing is written: {text}");
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_checksum_object_of_any_other_shape_fails_the_whole_page() {
    let m = docs();
    let mut db = baseline(&m).await;
    // A terminal pull page: row 1 changes, row 2 arrives, both scopes' digests.
    let a_rows = [(1, "uno", "v3"), (2, "two", "v2")];
    let row_2 = digest_hex(&m, 2, "two", "v2");
    let scope_a = scope_hex(&m, "user:a", &a_rows);
    let good = page(
        &[
            upsert(&m, "user:a", 1, "uno", "v3"),
            upsert(&m, "user:a", 2, "two", "v2"),
        ],
        Some(&[
            ("user:a", scope_a.clone()),
            ("user:b", scope_hex(&m, "user:b", &[(1, "uno", "v3")])),
        ]),
        &[("user:a", "ca2"), ("user:b", "cb2")],
    );
    let good = synchro_protocol::jcs::to_output_string(&good);
    // In a pull change's row_checksum and in the terminal map.
    for target in [&row_2, &scope_a] {
        let canonical =
            synchro_protocol::jcs::to_output_string(&Json::parse(&good_checksum(target)).unwrap());
        assert!(good.contains(&canonical));
        for bad in bad_checksums(target) {
            refused_pull(&mut db, &m, &good.replace(&canonical, &bad), &assigned());
        }
    }
    // The page itself is fine.
    db.apply_pull(&m, Json::parse(&good).unwrap(), &assigned())
        .unwrap();
    assert_eq!(titles(&db), [(1, "uno".into()), (2, "two".into())]);

    // In a rebuild record's row_checksum and in the final checksum.
    let record_1 = digest_hex(&m, 1, "eins", "v4");
    let final_a = scope_hex(&m, "user:a", &[(1, "eins", "v4")]);
    let good = rebuild_page(
        &[record(&m, 1, "eins", "v4")],
        Some((final_a.clone(), "ra")),
    );
    let good = synchro_protocol::jcs::to_output_string(&good);
    for target in [&record_1, &final_a] {
        let canonical =
            synchro_protocol::jcs::to_output_string(&Json::parse(&good_checksum(target)).unwrap());
        assert!(good.contains(&canonical));
        for bad in bad_checksums(target) {
            refused_rebuild(&mut db, &m, &good.replace(&canonical, &bad), true);
        }
    }
    assert!(db
        .apply_rebuild(&m, "user:a", &Json::parse(&good).unwrap(), true)
        .unwrap());
    assert_eq!(
        db.scope_state("user:a").unwrap(),
        Some((Some("ra".into()), false))
    );
}

/// Long on purpose: one short case per terminal rule of spec 001, so a failure names its
/// rule.
#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn every_terminal_rule_is_a_whole_page_contract() {
    let m = docs();
    let mut db = baseline(&m).await;
    let change = upsert(&m, "user:a", 2, "two", "v2");
    let sums = [
        (
            "user:a",
            scope_hex(&m, "user:a", &[(1, "one", "v1"), (2, "two", "v2")]),
        ),
        ("user:b", scope_hex(&m, "user:b", &[(1, "one", "v1")])),
    ];
    let terminal = synchro_protocol::jcs::to_output_string(&page(
        std::slice::from_ref(&change),
        Some(&sums),
        &[("user:a", "ca2"), ("user:b", "cb2")],
    ));
    let more = synchro_protocol::jcs::to_output_string(&page(
        std::slice::from_ref(&change),
        None,
        &[("user:a", "ca2")],
    ));
    let map = |entries: &[(&str, &String)]| {
        entries
            .iter()
            .map(|(s, d)| format!(r#""{s}":{}"#, good_checksum(d)))
            .collect::<Vec<_>>()
            .join(",")
    };
    // Rule 1: a page with has_more = true omits checksums entirely (even an empty map).
    for extra in [
        format!(
            r#""checksums":{{{}}},"#,
            map(&[("user:a", &sums[0].1), ("user:b", &sums[1].1)])
        ),
        r#""checksums":{},"#.to_owned(),
        r#""checksums":null,"#.to_owned(),
    ] {
        refused_pull(
            &mut db,
            &m,
            &more.replacen('{', &format!("{{{extra}"), 1),
            &assigned(),
        );
    }
    // has_more is a boolean, and present.
    for has_more in [
        r#""has_more":"false""#,
        r#""has_more":0"#,
        r#""has_more":null"#,
    ] {
        refused_pull(
            &mut db,
            &m,
            &terminal.replace(r#""has_more":false"#, has_more),
            &assigned(),
        );
    }
    refused_pull(
        &mut db,
        &m,
        &terminal.replace(r#""has_more":false,"#, ""),
        &assigned(),
    );
    // Rule 2: a page with has_more = false includes checksums.
    let start = terminal.find(r#""checksums":"#).unwrap();
    let end = start + terminal[start..].find("}}").unwrap() + 2;
    let without = format!("{}{}", &terminal[..start], &terminal[end + 1..]);
    assert!(Json::parse(&without).unwrap().get("checksums").is_none());
    refused_pull(&mut db, &m, &without, &assigned());
    // Rule 3: the key set equals the assigned scopes: a missing or an extra key fails,
    // also on an empty no-change page.
    let with_map = |entries: &str| {
        format!(
            "{}\"checksums\":{{{entries}}}{}",
            &terminal[..start],
            &terminal[end..]
        )
    };
    refused_pull(
        &mut db,
        &m,
        &with_map(&map(&[("user:a", &sums[0].1)])),
        &assigned(),
    );
    refused_pull(
        &mut db,
        &m,
        &with_map(&map(&[
            ("user:a", &sums[0].1),
            ("user:b", &sums[1].1),
            ("user:c", &sums[1].1),
        ])),
        &assigned(),
    );
    let empty = r#"{"protocol_version":3,"scope_set_version":1,"scope_updates":{"added":[],"removed":[]},"changes":[],"scope_cursor_updates":{},"rebuild_scopes":[],"has_more":false,"checksums":{}}"#;
    refused_pull(&mut db, &m, empty, &assigned());
    // The unmodified pages apply.
    db.apply_pull(&m, Json::parse(&more).unwrap(), &assigned())
        .unwrap();
    db.apply_pull(&m, Json::parse(&terminal).unwrap(), &assigned())
        .unwrap();
    assert_eq!(titles(&db), [(1, "one".into()), (2, "two".into())]);

    // Rule 5: a rebuild page with has_more = true omits final_scope_cursor and checksum.
    let final_a = scope_hex(&m, "user:a", &[(1, "eins", "v4")]);
    let rec = record(&m, 1, "eins", "v4");
    let first =
        synchro_protocol::jcs::to_output_string(&rebuild_page(std::slice::from_ref(&rec), None));
    for extra in [
        r#""final_scope_cursor":"ra","#.to_owned(),
        format!(r#""checksum":{},"#, good_checksum(&final_a)),
    ] {
        refused_rebuild(
            &mut db,
            &m,
            &first.replacen('{', &format!("{{{extra}"), 1),
            true,
        );
    }
    // Rule 6: a rebuild page with has_more = false includes both, for the requested scope.
    let last = synchro_protocol::jcs::to_output_string(&rebuild_page(
        std::slice::from_ref(&rec),
        Some((final_a.clone(), "ra")),
    ));
    let no_cursor = last.replace(r#""final_scope_cursor":"ra","#, "");
    assert!(Json::parse(&no_cursor)
        .unwrap()
        .get("final_scope_cursor")
        .is_none());
    refused_rebuild(&mut db, &m, &no_cursor, true);
    let canonical =
        synchro_protocol::jcs::to_output_string(&Json::parse(&good_checksum(&final_a)).unwrap());
    let no_checksum = last.replace(&format!(r#""checksum":{canonical},"#), "");
    assert!(Json::parse(&no_checksum).unwrap().get("checksum").is_none());
    refused_rebuild(&mut db, &m, &no_checksum, true);
    refused_rebuild(
        &mut db,
        &m,
        &last.replace(r#""scope_id":"user:a""#, r#""scope_id":"user:b""#),
        true,
    );
    refused_rebuild(
        &mut db,
        &m,
        &last.replace(r#""has_more":false"#, r#""has_more":"no""#),
        true,
    );
    assert!(db
        .apply_rebuild(&m, "user:a", &Json::parse(&last).unwrap(), true)
        .unwrap());
}
