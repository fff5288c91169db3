//! The scope index that terminal digests are computed from: after random sequences of
//! upserts, deletes, rows shared by two scopes, rebuilds, removed scopes, refused (tampered)
//! pages and failed terminal checks, the digest it maintains equals a recomputation from the
//! tables and an independent model's digest, without being built again; a write it did not
//! make (through the connection) is seen; a tampered page is still refused.

use std::collections::{BTreeMap, BTreeSet};

use synchro_testkit::manifests::{field, manifest, table};
use synchro_testkit::target;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

use synchro_client::storage::Storage;
use synchro_protocol::digest::{row_digest, scope_digest, RowIdentity};
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::value::TypedValue;

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

const SCOPES: [&str; 2] = ["user:a", "user:b"];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn row(id: i64, title: &str) -> String {
    format!(r#"{{"f1":"{id}","f2":"{title}"}}"#)
}

fn digest(m: &Manifest, id: i64, title: &str, version: &str) -> [u8; 32] {
    row_digest(
        m,
        "tbl_docs",
        &Json::String(id.to_string()),
        &Json::parse(&row(id, title)).unwrap(),
        version,
    )
    .unwrap()
    .digest
}

fn checksum(d: &[u8; 32]) -> String {
    format!(
        r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{}"}}"#,
        hex(d)
    )
}

/// What the server holds: each row's (title, version), and which scopes hold which rows.
#[derive(Clone, Default)]
struct Model {
    rows: BTreeMap<i64, (String, String)>,
    scopes: BTreeMap<&'static str, BTreeSet<i64>>,
}

impl Model {
    fn digest(&self, m: &Manifest, scope: &str) -> [u8; 32] {
        let table = m.table("tbl_docs").unwrap();
        let mut entries: Vec<_> = self
            .scopes
            .get(scope)
            .into_iter()
            .flatten()
            .map(|id| {
                let (title, version) = &self.rows[id];
                let pk =
                    TypedValue::from_wire(&table.primary_key().spec, &Json::String(id.to_string()))
                        .unwrap();
                (
                    RowIdentity::new(table, &pk).unwrap(),
                    digest(m, *id, title, version),
                )
            })
            .collect();
        scope_digest(&m.schema_hash(), scope, &mut entries, false)
            .unwrap()
            .digest
    }

    fn drop_orphans(&mut self) {
        let held: BTreeSet<i64> = self.scopes.values().flatten().copied().collect();
        self.rows.retain(|id, _| held.contains(id));
    }
}

/// A small deterministic generator (the same sequence natively and in the browser).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn upsert(m: &Manifest, scope: &str, id: i64, title: &str, version: &str) -> String {
    format!(
        r#"{{"scope_id":"{scope}","table_id":"tbl_docs","pk":"{id}","op":"upsert","row":{},"server_version":"{version}","row_checksum":{}}}"#,
        row(id, title),
        checksum(&digest(m, id, title, version))
    )
}

fn delete(scope: &str, id: i64, version: &str) -> String {
    format!(
        r#"{{"scope_id":"{scope}","table_id":"tbl_docs","pk":"{id}","op":"delete","server_version":"{version}"}}"#
    )
}

fn pull_page(changes: &[String], removed: &[&str], terminal: Option<String>) -> Json {
    let removed: Vec<String> = removed.iter().map(|s| format!(r#""{s}""#)).collect();
    let tail = match terminal {
        None => r#""has_more":true"#.to_owned(),
        Some(sums) => format!(r#""has_more":false,"checksums":{{{sums}}}"#),
    };
    Json::parse(&format!(
        r#"{{"protocol_version":3,"scope_set_version":1,"scope_updates":{{"added":[],"removed":[{}]}},"changes":[{}],"scope_cursor_updates":{{}},"rebuild_scopes":[],{tail}}}"#,
        removed.join(","),
        changes.join(",")
    ))
    .unwrap()
}

fn terminal_map(
    m: &Manifest,
    model: &Model,
    assigned: &BTreeSet<String>,
    wrong: Option<&str>,
) -> String {
    assigned
        .iter()
        .map(|s| {
            let mut d = model.digest(m, s);
            if wrong == Some(s.as_str()) {
                d[0] ^= 1;
            }
            format!(r#""{s}":{}"#, checksum(&d))
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn rebuild_page(m: &Manifest, model: &Model, scope: &str) -> Json {
    let records: Vec<String> = model.scopes[scope]
        .iter()
        .map(|id| {
            let (title, version) = &model.rows[id];
            format!(
                r#"{{"table_id":"tbl_docs","pk":"{id}","row":{},"server_version":"{version}","row_checksum":{}}}"#,
                row(*id, title),
                checksum(&digest(m, *id, title, version))
            )
        })
        .collect();
    Json::parse(&format!(
        r#"{{"protocol_version":3,"scope_id":"{scope}","records":[{}],"has_more":false,"final_scope_cursor":"r","checksum":{}}}"#,
        records.join(","),
        checksum(&model.digest(m, scope))
    ))
    .unwrap()
}

/// The index's digest, the tables' digest and the model's digest of every scope agree.
fn check(db: &mut Storage, m: &Manifest, model: &Model, step: usize) {
    for scope in SCOPES {
        let indexed = db.local_scope_digest(m, scope).unwrap();
        let recomputed = db.recompute_scope_digest(m, scope).unwrap();
        assert_eq!(indexed, recomputed, "step {step}: {scope}");
        assert_eq!(indexed, model.digest(m, scope), "step {step}: {scope}");
    }
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn the_maintained_index_equals_a_recomputation_after_random_sequences() {
    let m = docs();
    for seed in 1..=4u64 {
        let mut db = target::fresh("index").await;
        db.install(&m).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut model = Model::default();
        let mut assigned: BTreeSet<String> = SCOPES.iter().map(|s| s.to_string()).collect();
        let mut version = 0u64;
        check(&mut db, &m, &model, 0);
        let builds = db.scope_index_builds();
        for step in 1..=40 {
            let mut next = model.clone();
            let mut changes = Vec::new();
            for _ in 0..rng.below(6) {
                let scope = SCOPES[rng.below(2) as usize];
                if !assigned.contains(scope) {
                    continue;
                }
                let id = rng.below(12) as i64;
                version += 1;
                let held = next.scopes.get(scope).is_some_and(|s| s.contains(&id));
                if held && rng.below(3) == 0 {
                    changes.push(delete(scope, id, &version.to_string()));
                    next.scopes.get_mut(scope).unwrap().remove(&id);
                    next.drop_orphans();
                } else {
                    let title = format!("t{}", rng.below(5));
                    changes.push(upsert(&m, scope, id, &title, &version.to_string()));
                    next.rows.insert(id, (title, version.to_string()));
                    next.scopes.entry(scope).or_default().insert(id);
                }
            }
            match rng.below(10) {
                // A tampered row: the whole page is refused and nothing changes.
                0 if !changes.is_empty() => {
                    let i = rng.below(changes.len() as u64) as usize;
                    changes[i] = changes[i].replace(r#""f2":"t"#, r#""f2":"evil"#);
                    let tampered = changes.iter().any(|c| c.contains("evil"));
                    let r = db.apply_pull(&m, pull_page(&changes, &[], None), &assigned);
                    assert_eq!(r.is_err(), tampered, "step {step}");
                    if !tampered {
                        model = next;
                    }
                }
                // A wrong terminal digest for one scope: the page commits and that scope
                // is marked for rebuild.
                1 => {
                    let wrong = SCOPES[rng.below(2) as usize];
                    let sums = terminal_map(&m, &next, &assigned, Some(wrong));
                    let applied = db
                        .apply_pull(&m, pull_page(&changes, &[], Some(sums)), &assigned)
                        .unwrap();
                    assert!(
                        !assigned.contains(wrong) || applied.rebuild.contains(wrong),
                        "step {step}"
                    );
                    model = next;
                }
                // A rebuild of one scope from the server's state.
                2 => {
                    db.apply_pull(&m, pull_page(&changes, &[], None), &assigned)
                        .unwrap();
                    model = next;
                    let scope = SCOPES[rng.below(2) as usize];
                    if assigned.contains(scope) {
                        model.scopes.entry(scope).or_default();
                        assert!(db
                            .apply_rebuild(&m, scope, &rebuild_page(&m, &model, scope), true)
                            .unwrap());
                    }
                }
                // user:b is taken away (and later comes back empty).
                3 if assigned.contains("user:b") && assigned.len() == 2 => {
                    // (A page that takes a scope away carries no changes for it.)
                    changes.clear();
                    next = model.clone();
                    assigned.remove("user:b");
                    next.scopes.remove("user:b");
                    next.drop_orphans();
                    let sums = terminal_map(&m, &next, &assigned, None);
                    let applied = db
                        .apply_pull(&m, pull_page(&changes, &["user:b"], Some(sums)), &assigned)
                        .unwrap();
                    assert_eq!(applied.verified, assigned, "step {step}");
                    model = next;
                }
                4 if !assigned.contains("user:b") => {
                    assigned.insert("user:b".into());
                    let sums = terminal_map(&m, &next, &assigned, None);
                    let applied = db
                        .apply_pull(&m, pull_page(&changes, &[], Some(sums)), &assigned)
                        .unwrap();
                    assert_eq!(applied.verified, assigned, "step {step}");
                    model = next;
                }
                // A terminal page whose digests must verify from the index.
                _ => {
                    let sums = terminal_map(&m, &next, &assigned, None);
                    let applied = db
                        .apply_pull(&m, pull_page(&changes, &[], Some(sums)), &assigned)
                        .unwrap();
                    assert_eq!(applied.verified, assigned, "step {step}");
                    assert!(applied.rebuild.is_empty(), "step {step}");
                    model = next;
                }
            }
            check(&mut db, &m, &model, step);
            assert_eq!(
                db.scope_index_builds(),
                builds,
                "step {step}: the index was maintained, not built again"
            );
        }
    }
}

#[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
async fn a_write_the_store_did_not_make_is_seen_and_a_failed_page_changes_nothing() {
    let m = docs();
    let mut db = target::fresh("index-outside").await;
    db.install(&m).unwrap();
    let assigned: BTreeSet<String> = SCOPES.iter().map(|s| s.to_string()).collect();
    let mut model = Model::default();
    model.rows.insert(1, ("one".into(), "v1".into()));
    model.rows.insert(2, ("two".into(), "v1".into()));
    model.scopes.insert("user:a", [1, 2].into());
    model.scopes.insert("user:b", [2].into());
    let changes = [
        upsert(&m, "user:a", 1, "one", "v1"),
        upsert(&m, "user:a", 2, "two", "v1"),
        upsert(&m, "user:b", 2, "two", "v1"),
    ];
    let sums = terminal_map(&m, &model, &assigned, None);
    let applied = db
        .apply_pull(&m, pull_page(&changes, &[], Some(sums.clone())), &assigned)
        .unwrap();
    assert_eq!(applied.verified, assigned);
    check(&mut db, &m, &model, 0);
    let builds = db.scope_index_builds();

    // A tampered page is refused before anything is written: the digests are unchanged and
    // the index was not touched.
    let tampered = upsert(&m, "user:a", 1, "one", "v2").replace(r#""f2":"one""#, r#""f2":"evil""#);
    let err = db
        .apply_pull(
            &m,
            pull_page(&[tampered], &[], Some(sums.clone())),
            &assigned,
        )
        .unwrap_err();
    assert_eq!(err.code(), "sync_integrity_failure");
    check(&mut db, &m, &model, 1);
    assert_eq!(db.scope_index_builds(), builds);

    // A terminal page whose digest check fails inside its transaction (a provenance edge
    // whose row has no stored digest, planted through the connection): its rows were applied
    // in the step before (they are visible), the check's transaction rolls back and installs
    // nothing; the index is rebuilt because of the outside write and agrees with the tables.
    db.connection()
        .execute(
            r#"INSERT INTO "_synchro_provenance:tbl_docs" ("pk", "scope_id") VALUES (9, 'user:b')"#,
            [],
        )
        .unwrap();
    let good = upsert(&m, "user:a", 1, "changed", "v3");
    let err = db
        .apply_pull(&m, pull_page(&[good], &[], Some(sums.clone())), &assigned)
        .unwrap_err();
    assert!(err.to_string().contains("provenance edge"), "{err}");
    db.connection()
        .execute(
            r#"DELETE FROM "_synchro_provenance:tbl_docs" WHERE "pk" = 9"#,
            [],
        )
        .unwrap();
    model.rows.insert(1, ("changed".into(), "v3".into()));
    check(&mut db, &m, &model, 2);

    // A stored digest changed through the connection: the index is built again and the
    // terminal check sees the change (the scope rebuilds).
    db.connection()
        .execute(
            r#"UPDATE "_synchro_rows" SET "digest" = zeroblob(32) WHERE "pk" = '"1"'"#,
            [],
        )
        .unwrap();
    let before = db.scope_index_builds();
    let applied = db
        .apply_pull(&m, pull_page(&[], &[], Some(sums)), &assigned)
        .unwrap();
    assert_eq!(applied.rebuild, ["user:a".to_owned()].into());
    assert_eq!(applied.verified, ["user:b".to_owned()].into());
    assert_eq!(db.scope_index_builds(), before + 1);
    assert_eq!(
        db.local_scope_digest(&m, "user:a").unwrap(),
        db.recompute_scope_digest(&m, "user:a").unwrap()
    );
}
