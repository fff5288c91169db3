//! An operator's first deployment, end to end (issue 28): real PostgreSQL, the operator's
//! own logins, a superuser only for `install` and the logins (a DBA's job), then the
//! `synchro-server` commands and SQL an operator runs, each mistake the issue met and its
//! way out. Three relations of an existing `shop` schema with dependent per-customer rules
//! (items reach their customer through their order: a 1:N impact function), served by
//! `serve` with its capture worker.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use synchro_server::connect_db;
use synchro_server::pg_harness::TempCluster;
use tokio_postgres::Client;

const BIN: &str = env!("CARGO_BIN_EXE_synchro-server");

struct Shop {
    cluster: TempCluster,
    /// The DBA's superuser session: install, logins, and the checks of this test.
    dba: Client,
    /// The application's own login (owns the `shop` schema).
    app: Client,
    /// The operator's login (owns the `rules` schema and its functions).
    op: Client,
}

impl Shop {
    fn url(&self, login: &str) -> String {
        self.cluster.url(login, "shop")
    }

    /// `synchro-server <args>` with DATABASE_URL set to `login`'s: (exit code, stdout JSON).
    fn cli(&self, login: &str, args: &[&str]) -> (i32, Value) {
        common::cli_at(&self.url(login), args)
    }

    /// The same, which must succeed.
    fn ok(&self, login: &str, args: &[&str]) -> Value {
        let (code, json) = self.cli(login, args);
        assert_eq!(code, 0, "synchro-server {args:?}: {json}");
        json
    }

    fn health(&self) -> (i32, Value) {
        self.cli("app_monitor", &["health"])
    }

    /// Until `health` is ready (60 s at most).
    async fn ready(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (code, h) = self.health();
            if code == 0 {
                return h;
            }
            assert!(Instant::now() < deadline, "never ready: {h}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Until `health` satisfies `want` (30 s at most); the health object.
    async fn health_until(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, h) = self.health();
            if want(&h) {
                return h;
            }
            assert!(Instant::now() < deadline, "{what}: {h}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn relation_id(&self, table: &str) -> String {
        self.dba
            .query_one(
                "SELECT relation_id FROM synchro.relations r
                  WHERE physical_relation = $1
                    AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                                     WHERE g.relation_id = r.relation_id AND g.change = 'retirement')",
                &[&table],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Rows of `table` that are not in the scope of their customer (none when membership is
    /// right).
    async fn misplaced(&self, table: &str, customer: &str) -> i64 {
        self.dba
            .query_one(
                &format!(
                    "SELECT count(*) FROM shop.{table} t
                      WHERE NOT EXISTS (SELECT 1 FROM synchro.membership_edges e JOIN synchro.relations r USING (relation_id)
                                         WHERE r.physical_relation = '{table}' AND e.pk = to_jsonb(t.id::text)::text
                                           AND e.scope_id = 'customer:' || ({customer}))"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn all_in_place(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let wrong = (
                self.misplaced("customers", "t.id").await,
                self.misplaced("orders", "t.customer_id").await,
                self.misplaced(
                    "order_items",
                    "SELECT o.customer_id FROM shop.orders o WHERE o.id = t.order_id",
                )
                .await,
            );
            if wrong == (0, 0, 0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "rows out of their scope: {wrong:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The projection index the item rule and the impact function read through.
const INDEX_ITEMS_BY_ORDER: &[&str] = &[
    "registry",
    "projection-index",
    "--schema",
    "shop",
    "--relation",
    "order_items",
    "--column",
    "order_id",
];

/// The operator's rule functions (in their `rules` schema, executable by the worker only).
fn rule(name: &str, args: &str, returns: &str, body: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION rules.{name}({args}) RETURNS SETOF {returns} LANGUAGE sql STABLE
         BEGIN ATOMIC {body}; END;
         REVOKE EXECUTE ON FUNCTION rules.{name} FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.{name} TO synchro_worker;"
    )
}

fn order_rule(extra: &str) -> String {
    rule(
        "order_scopes",
        "p_id bigint",
        "text",
        &format!(
            "SELECT 'customer:' || customer_id{extra} FROM synchro_projection.\"shop.orders\" WHERE id = p_id"
        ),
    )
}

fn item_rules(items_table_id: &str) -> String {
    rule(
        "item_scopes",
        "p_id bigint",
        "text",
        "SELECT 'customer:' || (SELECT o.customer_id FROM synchro_projection.\"shop.orders\" o WHERE o.id = i.order_id)
           FROM synchro_projection.\"shop.order_items\" i WHERE i.id = p_id",
    ) + &rule(
        "items_of_order",
        "p_old jsonb, p_new jsonb",
        "synchro.synchro_row_ref",
        &format!(
            "SELECT ROW('{items_table_id}', 'int64', i.id::text)::synchro.synchro_row_ref
               FROM synchro_projection.\"shop.order_items\" i
              WHERE i.order_id IN ((p_old ->> 'id')::bigint, (p_new ->> 'id')::bigint)"
        ),
    ) + "SELECT synchro.synchro_register_impact_function('shop', 'order_items', 'shop', 'orders',
             'rules.items_of_order(jsonb,jsonb)', 100);
         SELECT synchro.synchro_register_membership_function('shop', 'order_items', 'rules.item_scopes(bigint)');"
}

async fn deploy() -> Shop {
    let cluster = TempCluster::start().expect("throwaway PostgreSQL");
    connect_db(&cluster.admin_url())
        .await
        .unwrap()
        .batch_execute("CREATE DATABASE shop")
        .await
        .unwrap();
    // The DBA: install (the only command that needs a superuser), the logins, the
    // application's existing schema and rows.
    let out = Command::new(BIN)
        .arg("install")
        .env("DATABASE_URL", cluster.url("postgres", "shop"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dba = connect_db(&cluster.url("postgres", "shop")).await.unwrap();
    dba.batch_execute(
        "CREATE ROLE shop_app LOGIN;
         CREATE SCHEMA shop AUTHORIZATION shop_app;
         CREATE ROLE app_operator LOGIN; GRANT synchro_operator TO app_operator;
         CREATE ROLE app_monitor LOGIN; GRANT synchro_monitor TO app_monitor;
         CREATE ROLE app_adapter LOGIN; GRANT synchro_adapter TO app_adapter;
         CREATE ROLE app_worker LOGIN REPLICATION NOINHERIT; GRANT synchro_worker TO app_worker;
         -- registration acts for the tables' owner (the worker is a member of no rule
         -- owner: it calls each rule's evaluator, which runs as the owner)
         GRANT shop_app TO synchro_owner;
         CREATE SCHEMA rules AUTHORIZATION app_operator;",
    )
    .await
    .unwrap();
    let app = connect_db(&cluster.url("shop_app", "shop")).await.unwrap();
    app.batch_execute(
        "CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL);
         CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES shop.customers,
                                   status text NOT NULL);
         CREATE TABLE shop.order_items (id bigint PRIMARY KEY, order_id bigint NOT NULL REFERENCES shop.orders,
                                        sku text NOT NULL);
         INSERT INTO shop.customers SELECT g, 'customer ' || g FROM generate_series(1, 100) g;
         INSERT INTO shop.orders SELECT g, 1 + g % 100, 'open' FROM generate_series(1, 500) g;
         INSERT INTO shop.order_items SELECT g, 1 + g % 500, 'sku-' || g FROM generate_series(1, 1200) g;",
    )
    .await
    .unwrap();
    let op = connect_db(&cluster.url("app_operator", "shop"))
        .await
        .unwrap();
    Shop {
        cluster,
        dba,
        app,
        op,
    }
}

/// One journey, long on purpose: each step is what the operator does next, on the state the
/// steps before left.
#[tokio::test]
async fn an_operator_deploys_evolves_and_recovers_from_every_mistake_without_a_superuser() {
    let shop = deploy().await;
    let mut table_ids = Vec::new();
    for table in ["customers", "orders", "order_items"] {
        let reg = shop.ok(
            "app_operator",
            &[
                "registry",
                "register",
                "--schema",
                "shop",
                "--relation",
                table,
                "--composition",
                "multi_scope",
            ],
        );
        table_ids.push(reg["table_id"].as_str().unwrap().to_owned());
    }

    // Mistake: the rules schema's grants forgotten. Registration names the one to run.
    shop.op
        .batch_execute(&rule(
            "customer_scopes",
            "p_id bigint",
            "text",
            "SELECT 'customer:' || id FROM synchro_projection.\"shop.customers\" WHERE id = p_id",
        ))
        .await
        .unwrap();
    let refused = shop
        .op
        .batch_execute(
            "SELECT synchro.synchro_register_membership_function('shop', 'customers', 'rules.customer_scopes(bigint)')",
        )
        .await
        .unwrap_err();
    let detail: Value =
        serde_json::from_str(refused.as_db_error().unwrap().detail().unwrap()).unwrap();
    let grant = detail["error"]["missing_grant"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        grant,
        "GRANT USAGE ON SCHEMA rules TO synchro_owner, synchro_worker"
    );
    // The operator owns the schema: they run it themselves.
    shop.op.batch_execute(&grant).await.unwrap();
    shop.op
        .batch_execute(&format!(
            "SELECT synchro.synchro_register_membership_function('shop', 'customers', 'rules.customer_scopes(bigint)');
             {}
             SELECT synchro.synchro_register_membership_function('shop', 'orders', 'rules.order_scopes(bigint)');
             {}",
            order_rule(""),
            item_rules(&table_ids[2]),
        ))
        .await
        .unwrap();
    let index = shop.ok("app_operator", INDEX_ITEMS_BY_ORDER);
    assert_eq!(index["created"], true);
    assert_eq!(shop.ok("app_operator", &["publish"])["published"], true);

    // Serve, with its capture worker, configured by the environment only.
    let port = synchro_testkit::pg::free_port();
    let mut serve = Command::new(BIN)
        .arg("serve")
        .env("DATABASE_URL", shop.url("app_adapter"))
        .env("SYNCHRO_WORKER_DATABASE_URL", shop.url("app_worker"))
        .env("SYNCHRO_JWT_SECRET", "operator-journey-secret-0123456789")
        .env("SYNCHRO_LISTEN", format!("127.0.0.1:{port}"))
        .env("SYNCHRO_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let h = shop.ready().await;
    assert_eq!(h["checks"]["membership_coverage"], "ok", "{h}");
    shop.all_in_place().await;

    // Mistake: a live rule that raises for one row (replaced and registered again: a rule
    // replaced in place is never evaluated until then). Capture blocks, naming the relation,
    // the detail and the SQLSTATE; the operator fixes the rule, registers it and unblocks.
    let orders = shop.relation_id("orders").await;
    let reregister = "SELECT synchro.synchro_register_membership_function('shop', 'orders', 'rules.order_scopes(bigint)')";
    shop.op
        .batch_execute(&format!(
            "{} {reregister}",
            order_rule(
                // (a divisor known only at run time: a constant 1 / 0 fails at planning, for every row)
                " || CASE WHEN status = 'held' THEN (1 / (length(status) - 4))::text ELSE '' END",
            )
        ))
        .await
        .unwrap();
    shop.app
        .batch_execute("UPDATE shop.orders SET status = 'held' WHERE id = 7")
        .await
        .unwrap();
    let h = shop
        .health_until("a block", |h| h["report"]["blocked"].is_object())
        .await;
    let blocked = &h["report"]["blocked"];
    assert_eq!(
        (
            &blocked["reason"],
            &blocked["detail"],
            &blocked["relation_id"],
            &blocked["sqlstate"]
        ),
        (
            &Value::from("scope_evaluation_failed"),
            &Value::from("function_error"),
            &Value::from(orders.as_str()),
            &Value::from("22012")
        ),
        "{h}"
    );
    assert_eq!(shop.health().0, 1, "not ready while blocked");
    shop.op
        .batch_execute(&format!("{} {reregister}", order_rule("")))
        .await
        .unwrap();
    let lifted = shop.ok("app_operator", &["capture", "unblock"]);
    assert_eq!(lifted["unblocked"]["reason"], "scope_evaluation_failed");
    // The registered rule is staged over every row again; it is live once that is done.
    shop.health_until("the rule staged", |h| {
        h["ready"] == true && h["report"]["membership_staging"] == serde_json::json!({})
    })
    .await;
    shop.all_in_place().await;

    // Mistake: a grant the worker needs taken away after registration. Capture blocks
    // naming it (insufficient_privilege); granted again, the operator unblocks.
    shop.op
        .batch_execute("REVOKE USAGE ON SCHEMA rules FROM synchro_worker")
        .await
        .unwrap();
    shop.app
        .batch_execute("UPDATE shop.orders SET status = 'paid' WHERE id = 8")
        .await
        .unwrap();
    let h = shop
        .health_until("a block for the revoked grant", |h| {
            h["report"]["blocked"].is_object()
        })
        .await;
    assert_eq!(
        (
            &h["report"]["blocked"]["detail"],
            &h["report"]["blocked"]["sqlstate"]
        ),
        (
            &Value::from("insufficient_privilege"),
            &Value::from("42501")
        ),
        "{h}"
    );
    shop.op
        .batch_execute("GRANT USAGE ON SCHEMA rules TO synchro_worker")
        .await
        .unwrap();
    shop.ok("app_operator", &["capture", "unblock"]);
    shop.ready().await;
    shop.all_in_place().await;

    // Mistake: the item rule registered again while its previous registration is still
    // staging (twice in a row); no item is left without its scope.
    shop.op
        .batch_execute(
            &(rule(
                "item_scopes_v2",
                "p_id bigint",
                "text",
                "SELECT 'customer:' || (SELECT o.customer_id FROM synchro_projection.\"shop.orders\" o WHERE o.id = i.order_id)
                   FROM synchro_projection.\"shop.order_items\" i WHERE i.id = p_id",
            ) + "SELECT synchro.synchro_register_membership_function('shop', 'order_items', 'rules.item_scopes_v2(bigint)');
                 SELECT pg_sleep(0.05);
                 SELECT synchro.synchro_register_membership_function('shop', 'order_items', 'rules.item_scopes(bigint)');"),
        )
        .await
        .unwrap();
    let h = shop
        .health_until("the rule staged", |h| {
            h["ready"] == true && h["report"]["membership_staging"] == serde_json::json!({})
        })
        .await;
    assert_eq!(h["checks"]["membership_coverage"], "ok", "{h}");
    shop.all_in_place().await;

    // Mistake: a changed rule that fails while it stages. Only its staging stops; capture
    // goes on under the live rule. Fixed, then staged again.
    let customers = shop.relation_id("customers").await;
    shop.op
        .batch_execute(&format!(
            "{}SELECT synchro.synchro_register_membership_function('shop', 'customers', 'rules.customer_scopes_v2(bigint)');",
            rule(
                "customer_scopes_v2",
                "p_id bigint",
                "text",
                "SELECT 'customer:' || id || CASE WHEN id = 42 THEN (1 / (id - 42))::text ELSE '' END
                   FROM synchro_projection.\"shop.customers\" WHERE id = p_id"
            )
        ))
        .await
        .unwrap();
    let h = shop
        .health_until("a stopped staging", |h| {
            h["checks"]["membership_staging"] == "failed"
        })
        .await;
    assert_eq!(
        h["report"]["membership_staging"][&customers]["failed"], "function_error",
        "{h}"
    );
    shop.app
        .batch_execute("INSERT INTO shop.orders VALUES (501, 3, 'open')")
        .await
        .unwrap();
    shop.all_in_place().await; // capture went on
    shop.op
        .batch_execute(&rule(
            "customer_scopes_v2",
            "p_id bigint",
            "text",
            "SELECT 'customer:' || id FROM synchro_projection.\"shop.customers\" WHERE id = p_id",
        ))
        .await
        .unwrap();
    let retried = shop.ok(
        "app_operator",
        &[
            "capture",
            "retry-staging",
            "--schema",
            "shop",
            "--relation",
            "customers",
        ],
    );
    assert_eq!(retried["restarted"], true);
    let h = shop.ready().await;
    assert_eq!(h["checks"]["membership_staging"], "ok");

    // Evolve: a Class 3 change of orders (a column with a populated default). The plan
    // shows the field ID the reconfiguration assigns.
    shop.app
        .batch_execute("ALTER TABLE shop.orders ADD COLUMN channel text NOT NULL DEFAULT 'web'")
        .await
        .unwrap();
    let plan = shop.ok(
        "app_operator",
        &[
            "registry",
            "plan",
            "--schema",
            "shop",
            "--relation",
            "orders",
        ],
    );
    assert_eq!(plan["class"], "class_3", "{plan}");
    let applied = shop.ok(
        "app_operator",
        &[
            "registry",
            "reconfigure",
            "--schema",
            "shop",
            "--relation",
            "orders",
        ],
    );
    assert_eq!(
        applied["registry"]["added"][0]["field_id"],
        plan["registry"]["added"][0]["field_id"]
    );
    shop.health_until("the change activated", |h| {
        h["report"]["reconfigurations_staged"] == 0 && h["report"]["reconfigurations_pending"] == 0
    })
    .await;
    shop.ready().await;
    shop.all_in_place().await;

    // Mistake: the items table dropped and recreated by a migration. Capture blocks on the
    // drift (and says so); retiring and registering it again recovers.
    let old_items = shop.relation_id("order_items").await;
    shop.app
        .batch_execute(
            "DROP TABLE shop.order_items;
             CREATE TABLE shop.order_items (id bigint PRIMARY KEY, order_id bigint NOT NULL REFERENCES shop.orders,
                                            sku text NOT NULL);
             INSERT INTO shop.order_items SELECT g, 1 + g % 500, 'sku-' || g FROM generate_series(1, 900) g;",
        )
        .await
        .unwrap();
    let h = shop
        .health_until("drift reported", |h| {
            h["checks"]["registry_drift"] == "failed"
        })
        .await;
    assert_eq!(h["ready"], false);
    let retired = shop.ok(
        "app_operator",
        &[
            "registry",
            "retire-table",
            "--schema",
            "shop",
            "--relation",
            "order_items",
        ],
    );
    assert_eq!(
        retired["change"]["relation_id"],
        old_items.as_str(),
        "{retired}"
    );
    let reg = shop.ok(
        "app_operator",
        &[
            "registry",
            "register",
            "--schema",
            "shop",
            "--relation",
            "order_items",
            "--composition",
            "multi_scope",
        ],
    );
    shop.op
        .batch_execute(&item_rules(reg["table_id"].as_str().unwrap()))
        .await
        .unwrap();
    shop.ok("app_operator", INDEX_ITEMS_BY_ORDER);
    shop.ok("app_operator", &["publish"]);
    let h = shop.ready().await;
    assert_eq!(h["checks"]["registry_drift"], "ok", "{h}");
    shop.all_in_place().await;

    // Abandoned installs would hold the rollout advisor for 30 days: the operator shortens it.
    let set = shop.ok(
        "app_operator",
        &["settings", "--set", "client_ttl_days", "7"],
    );
    assert_eq!(set["value"], "7");

    // A clean stop; nothing the commands or the server did is in the PostgreSQL log as a
    // dropped session.
    Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(serve.wait().unwrap().success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = shop.cluster.server_log().unwrap();
    let dropped: Vec<&str> = log
        .lines()
        .filter(|l| {
            [
                "could not receive data",
                "unexpected EOF",
                "connection to client lost",
                "could not send data",
            ]
            .iter()
            .any(|n| l.contains(n))
        })
        .collect();
    assert!(dropped.is_empty(), "{dropped:#?}");
}
