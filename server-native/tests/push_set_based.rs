//! A push batch's set-based execution (52_push) on real PostgreSQL, against the same
//! mutations executed one at a time in the same database:
//!
//! - `synchro_push_write_batch` runs consecutive mutations of one relation with the same
//!   operation and fields, distinct keys and none to discard set-based; each outcome, image
//!   and the table afterwards equal one-at-a-time execution; a run that meets a refused
//!   write, repeats a key or holds a write to discard goes one mutation at a time.
//! - `synchro_push_scopes` places the rows of a relation without a self-impact declaration
//!   together and evaluates them in one query, with the scopes of each row evaluated alone;
//!   a relation whose function reads sibling rows (self-impact) has each row evaluated alone.

mod common;

use common::Env;
use synchro_server::capture::worker::{Failpoint, Worker};
use synchro_server::registry::{register, RegisterRequest};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

/// One mutation: operation, key, base version, written (column, text value).
struct M {
    op: &'static str,
    key: i64,
    base: Option<String>,
    columns: Vec<(&'static str, Option<&'static str>)>,
    discard: bool,
}

fn m(
    op: &'static str,
    key: i64,
    base: Option<String>,
    columns: &[(&'static str, Option<&'static str>)],
) -> M {
    M {
        op,
        key,
        base,
        columns: columns.to_vec(),
        discard: false,
    }
}

/// One result row of `synchro_push_write_batch`.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    status: String,
    version: Option<String>,
    pre: Option<Vec<Option<String>>>,
    post: Option<Vec<Option<String>>>,
    set_based: bool,
}

struct Docs {
    env: Env,
    relation: String,
}

/// `app.docs` registered with its rule; rows 1..=19 written after registration (so their
/// versions are in `source_versions`): owner alice, team red, title t<id>; row 20 written
/// and deleted (its delete's version is in `source_versions`).
async fn docs() -> Docs {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(&env, "").await;
    env.as_app_owner(
        "INSERT INTO app.docs SELECT g, 'alice', 'red', 't' || g FROM generate_series(1, 20) g;
         DELETE FROM app.docs WHERE id = 20",
    )
    .await;
    let relation = env
        .admin
        .query_one(
            "SELECT relation_id FROM synchro.relations WHERE physical_relation = 'docs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    Docs { env, relation }
}

impl Docs {
    async fn version(&self, db: &impl GenericClient, key: i64) -> Option<String> {
        db.query_opt(
            "SELECT version::text FROM synchro.source_versions WHERE relation_id = $1 AND pk = $2",
            &[&self.relation, &key.to_string()],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
    }

    async fn field(&self, db: &impl GenericClient, column: &str) -> String {
        db.query_one(
            "SELECT field_id FROM synchro.fields WHERE relation_id = $1 AND column_name = $2",
            &[&self.relation, &column],
        )
        .await
        .unwrap()
        .get(0)
    }

    /// One call of `synchro_push_write_batch` with `ms`.
    async fn call(&self, db: &impl GenericClient, ms: &[M]) -> Vec<Out> {
        let relations: Vec<&str> = ms.iter().map(|_| self.relation.as_str()).collect();
        let ops: Vec<&str> = ms.iter().map(|m| m.op).collect();
        let keys: Vec<String> = ms.iter().map(|m| m.key.to_string()).collect();
        let wires: Vec<String> = ms.iter().map(|m| format!("\"{}\"", m.key)).collect();
        let bases: Vec<Option<&str>> = ms.iter().map(|m| m.base.as_deref()).collect();
        let counts: Vec<i32> = ms.iter().map(|m| m.columns.len() as i32).collect();
        let mut ids = std::collections::HashMap::new();
        let mut columns = Vec::new();
        let mut values: Vec<Option<&str>> = Vec::new();
        for m in ms {
            for (c, v) in &m.columns {
                if !ids.contains_key(c) {
                    ids.insert(*c, self.field(db, c).await);
                }
                columns.push(ids[c].clone());
                values.push(*v);
            }
        }
        let discard: Vec<bool> = ms.iter().map(|m| m.discard).collect();
        db.query_typed(
            "SELECT status, version, pre_image, post_image, set_based
               FROM synchro.synchro_push_write_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                (&relations, Type::TEXT_ARRAY),
                (&ops, Type::TEXT_ARRAY),
                (&keys, Type::TEXT_ARRAY),
                (&wires, Type::TEXT_ARRAY),
                (&bases, Type::TEXT_ARRAY),
                (&counts, Type::INT4_ARRAY),
                (&columns, Type::TEXT_ARRAY),
                (&values, Type::TEXT_ARRAY),
                (&discard, Type::BOOL_ARRAY),
            ],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| Out {
            status: r.get(0),
            version: r.get(1),
            pre: r.get(2),
            post: r.get(3),
            set_based: r.get(4),
        })
        .collect()
    }

    async fn table(&self, db: &impl GenericClient) -> Vec<(i64, String, String, Option<String>)> {
        db.query(
            "SELECT id, owner, team, title FROM app.docs ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
    }

    /// `ms` in one call, then one call per mutation, each in a transaction rolled back
    /// afterwards: the outcomes of both (applied versions checked against
    /// `source_versions`, then left out: the sequence moves on between the two), and
    /// asserts that both left the same table.
    async fn both(&self, ms: &[M]) -> (Vec<Out>, Vec<(i64, String, String, Option<String>)>) {
        let mut db = self.env.login("postgres").await;
        let mut runs = Vec::new();
        let mut tables = Vec::new();
        for batched in [true, false] {
            let tx = db.transaction().await.unwrap();
            let mut outs = Vec::new();
            if batched {
                outs = self.call(&tx, ms).await;
            } else {
                for one in ms {
                    outs.extend(self.call(&tx, std::slice::from_ref(one)).await);
                }
            }
            assert_eq!(outs.len(), ms.len());
            // Versions come from a sequence that moves on between the two executions: each
            // is checked against the row's version afterwards, then left out.
            for (m, o) in ms.iter().zip(&mut outs) {
                if matches!(o.status.as_str(), "applied" | "conflict") {
                    // A conflict on a missing row carries no version, even when the row
                    // had one before it was deleted.
                    let current = match (o.status.as_str(), &o.pre) {
                        ("conflict", None) => None,
                        _ => self.version(&tx, m.key).await,
                    };
                    if !m.discard {
                        assert_eq!(o.version, current, "{o:?}");
                    }
                    o.version = None;
                }
            }
            tables.push(self.table(&tx).await);
            tx.rollback().await.unwrap();
            runs.push(outs);
        }
        assert_eq!(
            tables[0], tables[1],
            "the batch left the table one-by-one leaves"
        );
        let single = runs.pop().unwrap();
        let batch = runs.pop().unwrap();
        assert!(single.iter().all(|o| !o.set_based));
        let strip = |v: &[Out]| -> Vec<Out> {
            v.iter()
                .map(|o| Out {
                    set_based: false,
                    ..o.clone()
                })
                .collect()
        };
        assert_eq!(strip(&batch), strip(&single));
        (batch, tables.swap_remove(0))
    }
}

fn statuses(outs: &[Out]) -> Vec<&str> {
    outs.iter().map(|o| o.status.as_str()).collect()
}

#[tokio::test]
async fn set_based_runs_equal_their_mutations_one_at_a_time() {
    let d = docs().await;
    let db = d.env.login("postgres").await;
    let mut v = Vec::new();
    for key in 0..=20 {
        v.push(d.version(&db, key).await);
    }
    let title = |t: &'static str| vec![("title", Some(t))];

    // Updates of one field: stale bases, a missing row and a null among them.
    let ms = vec![
        m("update", 1, v[1].clone(), &title("a")),
        m("update", 2, v[1].clone(), &title("b")),
        m("update", 999, v[3].clone(), &title("c")),
        m("update", 3, v[3].clone(), &[("title", None)]),
        m("update", 4, v[4].clone(), &title("e")),
        m(
            "update",
            5,
            v[5].clone(),
            &title("it's \"quoted\", {braced}, NULL"),
        ),
        m("update", 20, v[20].clone(), &title("f")),
    ];
    let (batch, _) = d.both(&ms).await;
    assert_eq!(
        statuses(&batch),
        ["applied", "conflict", "conflict", "applied", "applied", "applied", "conflict"]
    );
    assert!(batch.iter().all(|o| o.set_based), "{batch:?}");
    assert!(v[20].is_some() && batch[6].pre.is_none());
    // A conflict carries the current image (and version, checked in `both`); a missing
    // row neither.
    assert_eq!(batch[1].post, batch[1].pre);
    assert!(batch[1].pre.is_some());
    assert_eq!((&batch[2].version, &batch[2].pre), (&None, &None));
    assert_eq!(
        batch[5].post.as_ref().unwrap()[3].as_deref(),
        Some("it's \"quoted\", {braced}, NULL")
    );
    assert_eq!(batch[3].post.as_ref().unwrap()[3], None);

    // Inserts, one of an existing key; deletes, one stale.
    let row = |o: &'static str| {
        vec![
            ("owner", Some(o)),
            ("team", Some("red")),
            ("title", Some("n")),
        ]
    };
    let ms = vec![
        m("insert", 100, None, &row("alice")),
        m("insert", 6, None, &row("alice")),
        m("insert", 101, None, &row("bob")),
        m("delete", 7, v[7].clone(), &[]),
        m("delete", 8, v[9].clone(), &[]),
        m("delete", 9, v[9].clone(), &[]),
    ];
    let (batch, _) = d.both(&ms).await;
    assert_eq!(
        statuses(&batch),
        ["applied", "conflict", "applied", "applied", "conflict", "applied"]
    );
    assert!(batch.iter().all(|o| o.set_based), "{batch:?}");
    assert_eq!(batch[3].post, None);

    // A refused write (owner is NOT NULL) undoes its run, which then goes one at a time.
    let ms = vec![
        m("update", 10, v[10].clone(), &[("owner", Some("bob"))]),
        m("update", 11, v[11].clone(), &[("owner", None)]),
        m("update", 12, v[12].clone(), &[("owner", Some("carol"))]),
        m(
            "insert",
            102,
            None,
            &[("owner", Some("alice")), ("team", Some("red"))],
        ),
        m(
            "insert",
            103,
            None,
            &[("owner", None), ("team", Some("red"))],
        ),
    ];
    let (batch, _) = d.both(&ms).await;
    assert_eq!(
        statuses(&batch),
        [
            "applied",
            "constraint_violation",
            "applied",
            "applied",
            "constraint_violation"
        ]
    );
    assert!(batch.iter().all(|o| !o.set_based), "{batch:?}");

    // A key twice, and a write to discard: one at a time, and the runs around them set-based.
    let mut ms = vec![
        m("update", 13, v[13].clone(), &title("x")),
        m("update", 14, v[14].clone(), &title("x")),
        m("update", 13, v[13].clone(), &title("y")),
        m("update", 15, v[15].clone(), &[("team", Some("blue"))]),
        m("update", 16, v[16].clone(), &[("team", Some("blue"))]),
        m("update", 17, v[17].clone(), &[("team", Some("blue"))]),
        m("update", 18, v[18].clone(), &[("team", Some("blue"))]),
        m("update", 19, v[19].clone(), &[("team", Some("blue"))]),
    ];
    ms[5].discard = true;
    let (batch, table) = d.both(&ms).await;
    assert_eq!(
        statuses(&batch),
        ["applied", "applied", "conflict", "applied", "applied", "applied", "applied", "applied"]
    );
    let set_based: Vec<bool> = batch.iter().map(|o| o.set_based).collect();
    assert_eq!(
        set_based,
        [false, false, false, true, true, false, true, true]
    );
    // The discarded write reports its outcome and leaves the row as it was.
    assert_eq!(batch[5].post.as_ref().unwrap()[2].as_deref(), Some("blue"));
    let team = |id: i64| table.iter().find(|r| r.0 == id).unwrap().2.as_str();
    assert_eq!((team(16), team(17), team(18)), ("blue", "red", "blue"));
}

/// The fields a rule reads come from the dependencies of its body: the docs rule names id,
/// owner and team of its view, never title (a row differing only there is evaluated
/// without placement); a rule naming its view as a whole may read any field.
#[tokio::test]
async fn a_rules_read_fields_are_the_columns_its_body_names() {
    let d = docs().await;
    let read = |function: &'static str| {
        let d = &d;
        async move {
            d.env
                .admin
                .query_one(
                    "SELECT synchro.synchro_rule_read_fields($1, $2::text::regprocedure)",
                    &[&d.relation, &function],
                )
                .await
                .unwrap()
                .get::<_, Option<Vec<String>>>(0)
        }
    };
    let db = d.env.login("postgres").await;
    let mut want = Vec::new();
    for c in ["id", "owner", "team"] {
        want.push(d.field(&db, c).await);
    }
    want.sort();
    assert_eq!(read("rules.doc_scopes(bigint)").await, Some(want));
    d.env
        .admin
        .batch_execute(
            "CREATE FUNCTION rules.any_doc(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC SELECT 'all' WHERE EXISTS (SELECT FROM synchro_projection.\"app.docs\"); END",
        )
        .await
        .unwrap();
    assert_eq!(read("rules.any_doc(bigint)").await, None);
}

/// The scopes of each probe from `synchro_push_scopes`, as the adapter login calls it.
async fn scopes(env: &Env, probes: &[(&str, i64, &str)]) -> Vec<Vec<String>> {
    let mut db = env.login("synchro_dev_adapter").await;
    let relations: Vec<&str> = probes.iter().map(|p| p.0).collect();
    let wires: Vec<String> = probes.iter().map(|p| format!("\"{}\"", p.1)).collect();
    let keys: Vec<String> = probes.iter().map(|p| p.1.to_string()).collect();
    let rows: Vec<&str> = probes.iter().map(|p| p.2).collect();
    let tx = db.transaction().await.unwrap();
    let mut out = vec![Vec::new(); probes.len()];
    for r in tx
        .query(
            "SELECT ord, scopes FROM synchro.synchro_push_scopes($1, $2, $3, $4)",
            &[&relations, &wires, &keys, &rows],
        )
        .await
        .unwrap()
    {
        let mut s: Vec<String> = r.get(1);
        s.sort();
        out[r.get::<_, i32>(0) as usize - 1] = s;
    }
    tx.rollback().await.unwrap();
    out
}

#[tokio::test]
async fn rows_placed_together_are_each_evaluated_as_if_alone() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, grp text NOT NULL, flag boolean NOT NULL);
         CREATE TABLE app.tags (id bigint PRIMARY KEY, grp text NOT NULL, flag boolean NOT NULL)",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let mut ids = Vec::new();
    for t in ["items", "tags"] {
        let r = register(&op, &RegisterRequest::synced("app", t, "multi_scope"))
            .await
            .unwrap();
        ids.push(r["table_id"].as_str().unwrap().to_owned());
    }
    env.admin
        .batch_execute(
            "CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;",
        )
        .await
        .unwrap();
    // items: a row is in its group's scope while any row of the group is flagged (it reads
    // its siblings, declared by a self-impact). tags: the same rule, undeclared, over its
    // own row only (flagged: its group).
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'grp:' || i.grp FROM synchro_projection.\"app.items\" i
            WHERE i.id = p_id
              AND EXISTS (SELECT 1 FROM synchro_projection.\"app.items\" s WHERE s.grp = i.grp AND s.flag);
         END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');
         CREATE FUNCTION rules.siblings(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{}', 'int64', s.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"app.items\" s
            WHERE s.grp IN (p_old ->> 'grp', p_new ->> 'grp');
         END;
         REVOKE EXECUTE ON FUNCTION rules.siblings(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.siblings(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('app', 'items', 'app', 'items',
                                                         'rules.siblings(jsonb,jsonb)', 50);
         CREATE FUNCTION rules.tag_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'grp:' || t.grp FROM synchro_projection.\"app.tags\" t WHERE t.id = p_id AND t.flag;
         END;
         REVOKE EXECUTE ON FUNCTION rules.tag_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.tag_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'tags', 'rules.tag_scopes(bigint)');",
        ids[0]
    ))
    .await
    .unwrap();
    let mut op = op;
    synchro_server::publish::publish(&mut op).await.unwrap();
    // Before the worker has staged a first rule, a pushed row's scopes are not known yet:
    // refused as retryable (55000, which push answers 503 temporary_unavailable), never
    // evaluated as a row in no scope (which was a terminal `forbidden`).
    let tags: String = env
        .admin
        .query_one(
            "SELECT relation_id FROM synchro.relations WHERE physical_relation = 'tags'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let adapter = env.login("synchro_dev_adapter").await;
    assert_eq!(
        common::sqlstate(
            &adapter,
            &format!(
                "SELECT * FROM synchro.synchro_push_scopes(ARRAY['{tags}'], ARRAY['\"1\"'], ARRAY['1'], ARRAY['{{}}'])"
            )
        )
        .await,
        "55000"
    );
    // The capture worker activates the relations, which makes the first rules live.
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        worker.step(Failpoint::None).await.unwrap();
        let live: bool = env
            .admin
            .query_one(
                "SELECT count(*) = 2 AND bool_and(live) FROM synchro.membership_functions",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if live {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rules never went live"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let relation = |name: &str| {
        let env = &env;
        let name = name.to_owned();
        async move {
            env.admin
                .query_one(
                    "SELECT relation_id FROM synchro.relations WHERE physical_relation = $1",
                    &[&name],
                )
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    let (items, tags) = (relation("items").await, relation("tags").await);
    let fields = |rel: &str| {
        let env = &env;
        let rel = rel.to_owned();
        async move {
            let r = env
                .admin
                .query(
                    "SELECT field_id FROM synchro.fields WHERE relation_id = $1 ORDER BY attnum",
                    &[&rel],
                )
                .await
                .unwrap();
            r.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>()
        }
    };
    let row = |f: &[String], id: i64, grp: &str, flag: bool| {
        format!(
            "{{\"{}\":\"{id}\",\"{}\":\"{grp}\",\"{}\":{flag}}}",
            f[0], f[1], f[2]
        )
    };
    let (fi, ft) = (fields(&items).await, fields(&tags).await);
    // Row 1 flagged and row 2 not, both in group a, neither in the projection yet.
    let item_rows = [row(&fi, 1, "a", true), row(&fi, 2, "a", false)];
    let tag_rows = [
        row(&ft, 1, "a", true),
        row(&ft, 2, "a", false),
        row(&ft, 3, "b", true),
        // Row 1 again, unflagged: a second image of one key (another round).
        row(&ft, 1, "a", false),
    ];
    let mut probes: Vec<(&str, i64, &str)> =
        vec![(&items, 1, &item_rows[0]), (&items, 2, &item_rows[1])];
    for (i, r) in tag_rows.iter().enumerate() {
        probes.push((&tags, [1, 2, 3, 1][i], r));
    }
    let together = scopes(&env, &probes).await;
    let mut alone = Vec::new();
    for p in &probes {
        alone.extend(scopes(&env, std::slice::from_ref(p)).await);
    }
    assert_eq!(together, alone);
    let grp = |g: &str| vec![format!("grp:{g}")];
    assert_eq!(
        together,
        [grp("a"), vec![], grp("a"), vec![], grp("b"), vec![]],
        "row 2 of items, alone, sees no flagged sibling"
    );
}
