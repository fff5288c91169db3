//! The operator's `shop` workload (issue 28): an existing database of customers, orders and
//! order items with per-customer membership rules, order items depending on their order
//! through a 1:N impact function ("the items of order X"). Measured against a throwaway
//! PostgreSQL with the capture worker running as `serve` runs it:
//!
//! - bootstrap: the three tables registered and published with the customer and order
//!   rules, until both rules are live (the copy of every row, and their staging);
//! - initial staging: the order-item rule (its order looked up by a scalar subquery)
//!   registered over the bootstrapped items, until it is live, in rows per second;
//! - a Class 3 change of every order (a column added with a populated default, reconfigured):
//!   the worker stages it, and at its activation each changed order calls the impact
//!   function, whose items are evaluated again; until the generation is active;
//! - the longest heartbeat gap seen meanwhile (readiness fails past 60 s);
//! - the cost of one impact call and of 1,000 item evaluations with the good rule (indexed
//!   projection, scalar subquery) and the bad ones (no index; a join), for docs/operator.md.
//!
//! `cargo run --release -p synchro-server --example shop_bench -- [customers] [orders]
//! [items]` (defaults 10,000, 50,000, 120,000: the figures; scripts/bench-shop.sh).
//! With `--no-index` the projection index on the items' order is not created (the Class 3
//! change is then bounded by a scan of every item per order: expect it to take very long).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{reconfigure, register, ReconfigureRequest, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish};
use tokio_postgres::Client;

fn arg(i: usize, default: i64) -> i64 {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Until `sql` (one boolean) is true, sampling the heartbeat age meanwhile; the time taken
/// and the largest heartbeat age seen (seconds).
async fn until(db: &Client, sql: &str, limit: Duration) -> Result<(f64, f64)> {
    let started = Instant::now();
    let mut max_age: f64 = 0.0;
    loop {
        let r = db
            .query_one(
                &format!(
                    "SELECT ({sql}), extract(epoch FROM now() - greatest(c.heartbeat_at, p.heartbeat_at))::float8,
                            c.blocked_reason
                       FROM synchro.capture_state c LEFT JOIN synchro.capture_progress p ON true"
                ),
                &[],
            )
            .await?;
        if let Some(reason) = r.get::<_, Option<String>>(2) {
            bail!("capture blocked: {reason}");
        }
        max_age = max_age.max(r.get::<_, Option<f64>>(1).unwrap_or(0.0));
        if r.get::<_, bool>(0) {
            return Ok((started.elapsed().as_secs_f64(), max_age));
        }
        if started.elapsed() > limit {
            bail!("not done after {limit:?}: {sql}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Seconds per call of `sql` run `n` times in one statement (a PL/pgSQL loop).
async fn per_call(db: &Client, sql: &str, n: i64) -> Result<f64> {
    let started = Instant::now();
    db.batch_execute(&format!(
        "DO $$ DECLARE i bigint; BEGIN FOR i IN 1..{n} LOOP PERFORM ({sql}); END LOOP; END $$"
    ))
    .await?;
    Ok(started.elapsed().as_secs_f64() / n as f64)
}

const RULES_READY: &str =
    "NOT EXISTS (SELECT 1 FROM synchro.membership_functions WHERE NOT live OR pending_function_oid IS NOT NULL)
     AND NOT EXISTS (SELECT 1 FROM synchro.relation_capture WHERE status <> 'active')
     AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations WHERE state IN ('pending', 'staged'))";

/// One benchmark run, long on purpose: one stack is set up and each measurement runs on it
/// in turn, printing its figure as it ends; the steps share the cluster, the server and the
/// rows the steps before wrote.
#[tokio::main]
async fn main() -> Result<()> {
    let customers = arg(0, 10_000);
    let orders = arg(1, 50_000);
    let items = arg(2, 120_000);
    let index = !std::env::args().any(|a| a == "--no-index");

    let cluster = TempCluster::start()?;
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute("CREATE DATABASE shop")
        .await?;
    let url = |user: &str| cluster.url(user, "shop");
    let mut admin = connect_db(&url("postgres")).await?;
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE shop_owner NOLOGIN; GRANT shop_owner TO synchro_owner;
             CREATE SCHEMA shop AUTHORIZATION shop_owner;
             SET ROLE shop_owner;
             CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL, region text NOT NULL);
             CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES shop.customers,
                                       status text NOT NULL, total numeric(12,2) NOT NULL);
             CREATE TABLE shop.order_items (id bigint PRIMARY KEY, order_id bigint NOT NULL REFERENCES shop.orders,
                                            sku text NOT NULL, qty integer NOT NULL);
             CREATE INDEX ON shop.order_items (order_id);
             INSERT INTO shop.customers SELECT g, 'customer ' || g, 'r' || (g % 7) FROM generate_series(1, {customers}) g;
             INSERT INTO shop.orders SELECT g, 1 + (g::bigint * 7919) % {customers}, 'open', (g % 1000) / 10.0
               FROM generate_series(1, {orders}) g;
             INSERT INTO shop.order_items SELECT g, 1 + (g::bigint * 104729) % {orders}, 'sku-' || (g % 500), 1 + g % 5
               FROM generate_series(1, {items}) g;
             RESET ROLE;
             ANALYZE shop.customers, shop.orders, shop.order_items;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;"
        ))
        .await?;
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    let mut table_ids = Vec::new();
    for table in ["customers", "orders", "order_items"] {
        let reg = register(&op, &RegisterRequest::synced("shop", table, "multi_scope"))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        table_ids.push(reg["table_id"].as_str().context("a table ID")?.to_owned());
    }
    let items_table = &table_ids[2];
    let worker = tokio::spawn(synchro_server::capture::run_forever(
        url("synchro_dev_worker"),
        Duration::from_millis(5),
    ));
    let monitor = connect_db(&url("postgres")).await?;

    // Bootstrap: copy, and the customer and order rules staged over their rows.
    op.batch_execute(
        "CREATE FUNCTION rules.customer_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'customer:' || id FROM synchro_projection.\"shop.customers\" WHERE id = p_id; END;
         CREATE FUNCTION rules.order_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'customer:' || customer_id FROM synchro_projection.\"shop.orders\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.customer_scopes(bigint), rules.order_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.customer_scopes(bigint), rules.order_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('shop', 'customers', 'rules.customer_scopes(bigint)');
         SELECT synchro.synchro_register_membership_function('shop', 'orders', 'rules.order_scopes(bigint)');",
    )
    .await?;
    publish::publish(&mut op).await?;
    let (bootstrap_secs, bootstrap_gap) = until(
        &monitor,
        "(SELECT count(*) FROM synchro.membership_functions WHERE live) = 2
         AND NOT EXISTS (SELECT 1 FROM synchro.relation_capture WHERE status <> 'active')",
        Duration::from_secs(1800),
    )
    .await?;

    // The projection index the impact function and the item rule read through.
    let index_secs = if index {
        let started = Instant::now();
        op.query_one(
            "SELECT synchro.synchro_index_projection('shop', 'order_items', ARRAY['order_id'])",
            &[],
        )
        .await?;
        Some(started.elapsed().as_secs_f64())
    } else {
        None
    };

    // Initial staging of the item rule (a scalar subquery for its order's customer), with
    // the order dependency's impact function.
    op.batch_execute(&format!(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'customer:' || (SELECT o.customer_id FROM synchro_projection.\"shop.orders\" o WHERE o.id = i.order_id)
             FROM synchro_projection.\"shop.order_items\" i WHERE i.id = p_id;
         END;
         CREATE FUNCTION rules.item_scopes_join(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT 'customer:' || o.customer_id
             FROM synchro_projection.\"shop.order_items\" i JOIN synchro_projection.\"shop.orders\" o ON o.id = i.order_id
            WHERE i.id = p_id;
         END;
         CREATE FUNCTION rules.items_of_order(p_old jsonb, p_new jsonb) RETURNS SETOF synchro.synchro_row_ref
         LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT ROW('{items_table}', 'int64', i.id::text)::synchro.synchro_row_ref
             FROM synchro_projection.\"shop.order_items\" i
            WHERE i.order_id IN ((p_old ->> 'id')::bigint, (p_new ->> 'id')::bigint);
         END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint), rules.item_scopes_join(bigint),
             rules.items_of_order(jsonb, jsonb) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint), rules.item_scopes_join(bigint),
             rules.items_of_order(jsonb, jsonb) TO synchro_worker;
         SELECT synchro.synchro_register_impact_function('shop', 'order_items', 'shop', 'orders',
             'rules.items_of_order(jsonb,jsonb)', 100);"
    ))
    .await?;
    op.batch_execute(
        "SELECT synchro.synchro_register_membership_function('shop', 'order_items', 'rules.item_scopes(bigint)')",
    )
    .await?;
    let (staging_secs, staging_gap) =
        until(&monitor, RULES_READY, Duration::from_secs(3600)).await?;
    publish::publish(&mut op).await?;
    until(&monitor, RULES_READY, Duration::from_secs(600)).await?;

    // A Class 3 change of every order: a column with a populated default.
    admin
        .batch_execute(
            "SET ROLE shop_owner; ALTER TABLE shop.orders ADD COLUMN channel text NOT NULL DEFAULT 'web'; RESET ROLE",
        )
        .await?;
    let started = Instant::now();
    let plan = reconfigure(
        &mut op,
        &ReconfigureRequest {
            schema: "shop".into(),
            relation: "orders".into(),
            ..Default::default()
        },
        true,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let class = plan.to_json()["class"].clone();
    let (class3_secs, class3_gap) = until(&monitor, RULES_READY, Duration::from_secs(7200)).await?;
    let reconfigure_secs = started.elapsed().as_secs_f64() - class3_secs;

    // Every item is in its order's customer's scope.
    let wrong: i64 = monitor
        .query_one(
            "SELECT count(*) FROM shop.order_items i JOIN shop.orders o ON o.id = i.order_id
              WHERE NOT EXISTS (SELECT 1 FROM synchro.membership_edges e JOIN synchro.relations r USING (relation_id)
                                 WHERE r.physical_relation = 'order_items' AND e.pk = to_jsonb(i.id::text)::text
                                   AND e.scope_id = 'customer:' || o.customer_id)",
            &[],
        )
        .await?
        .get(0);
    if wrong != 0 {
        let sample: String = monitor
            .query_one(
                "SELECT coalesce(string_agg(pk || ' ' || scope_id, '; '), 'none') FROM (SELECT e.pk, e.scope_id
                   FROM synchro.membership_edges e JOIN synchro.relations r USING (relation_id)
                  WHERE r.physical_relation = 'order_items' LIMIT 3) x",
                &[],
            )
            .await?
            .get(0);
        bail!("{wrong} items are not in their customer's scope (edges: {sample})");
    }

    // The cost of good and bad rules, as the worker's owner runs them.
    let impact_call = per_call(
        &op,
        "SELECT count(*) FROM rules.items_of_order(NULL, jsonb_build_object('id', (1 + i % 40000)::text))",
        2000,
    )
    .await?;
    let good_rule = per_call(
        &op,
        "SELECT count(*) FROM rules.item_scopes(1 + i * 97 % 100000)",
        1000,
    )
    .await?;
    let join_rule = per_call(
        &op,
        "SELECT count(*) FROM rules.item_scopes_join(1 + i * 97 % 100000)",
        1000,
    )
    .await?;
    // Without the index, for comparison (a few calls: each scans every item).
    let unindexed_call = if index {
        let name: String = op
            .query_one(
                "SELECT synchro.synchro_index_projection('shop', 'order_items', ARRAY['order_id'])->>'index'",
                &[],
            )
            .await?
            .get(0);
        op.query_one("SELECT synchro.synchro_drop_projection_index($1)", &[&name])
            .await?;
        let call = per_call(
            &op,
            "SELECT count(*) FROM rules.items_of_order(NULL, jsonb_build_object('id', (1 + i % 40000)::text))",
            5,
        )
        .await?;
        Some(call)
    } else {
        None
    };
    worker.abort();

    println!("shop workload: {customers} customers, {orders} orders, {items} order items (multi_scope, per-customer rules)");
    println!(
        "bootstrap (copy of every row, customer and order rules staged): {bootstrap_secs:.1} s = {:.0} rows/s; longest heartbeat gap {bootstrap_gap:.1} s",
        (customers + orders + items) as f64 / bootstrap_secs
    );
    if let Some(s) = index_secs {
        println!("projection index on order_items.order_id: {s:.2} s");
    }
    println!(
        "initial staging of the item rule over {items} rows: {staging_secs:.1} s = {:.0} rows/s (goal >= 20,000); longest heartbeat gap {staging_gap:.1} s",
        items as f64 / staging_secs
    );
    println!(
        "Class 3 change of {orders} orders ({class}; reconfigure {reconfigure_secs:.1} s), 1:N impact function, until active: {class3_secs:.1} s (goal < 30 s); longest heartbeat gap {class3_gap:.1} s"
    );
    println!(
        "one impact call (items of one order): {:.3} ms {}{}",
        impact_call * 1e3,
        if index { "indexed" } else { "without an index" },
        unindexed_call.map_or(String::new(), |c| format!(
            ", {:.1} ms without the index ({:.0}x)",
            c * 1e3,
            c / impact_call
        ))
    );
    println!(
        "1,000 item evaluations: {:.1} ms with a scalar subquery, {:.1} ms with a join",
        good_rule * 1e6,
        join_rule * 1e6,
    );
    Ok(())
}
