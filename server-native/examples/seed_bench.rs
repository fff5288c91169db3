//! Portable seed export benchmark (issue 30's goal: at least 100,000 rows/s) against a
//! throwaway PostgreSQL: one shared, portable scope of `rows` rows (default 100,000),
//! exported with `synchro_server::seed::export` (both passes, every check; pages of 5,000 by
//! default, the size the exporter will use), beside the baseline of the same run: one plain
//! read of the same rows and versions from the projection by the seed functions' owner (these
//! machines are noisy: compare the ratio).
//!
//! `cargo run --release -p synchro-server --example seed_bench -- [rows] [page_limit]`

use std::time::Instant;

use anyhow::Result;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish, seed};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows = arg(1, 100_000);
    let page_limit = arg(2, 5000) as u32;
    let cluster = TempCluster::start()?;
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute("CREATE DATABASE bench")
        .await?;
    let url = |user: &str| cluster.url(user, "bench");
    let mut admin = connect_db(&url("postgres")).await?;
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE app.items (id bigint PRIMARY KEY, title text, qty integer NOT NULL);
             INSERT INTO app.items SELECT g, 'item ' || g, g % 100 FROM generate_series(1, {rows}) g;
             RESET ROLE;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT synchro_dev_operator TO synchro_dev_worker;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;"
        ))
        .await?;
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    register(
        &op,
        &RegisterRequest::synced("app", "items", "single_scope"),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    op.batch_execute(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'board:all' FROM synchro_projection.\"app.items\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');
         SELECT synchro.synchro_add_shared_scope('board:all');
         SELECT synchro.synchro_declare_portable_scope('board:all');",
    )
    .await?;
    publish::publish(&mut op).await?;
    let mut worker = Worker::connect(&url("synchro_dev_worker")).await?;
    while worker.step(Failpoint::None).await? != StepOutcome::Applied(0) {}
    admin.batch_execute("ANALYZE").await?;

    // Baseline: the same rows and versions read once, as plainly as PostgreSQL serves them.
    let started = Instant::now();
    let read = admin
        .query(
            "SELECT p.pk, p.row_json, p.server_version FROM synchro.membership_edges m
               JOIN synchro.projection_rows p USING (relation_id, pk) WHERE m.scope_id = 'board:all'",
            &[],
        )
        .await?
        .len();
    let baseline = started.elapsed().as_secs_f64();

    let mut db = connect_db(&url("synchro_dev_seed")).await?;
    let scopes = vec!["board:all".to_owned()];
    let started = Instant::now();
    let mut marks = (None, None);
    let fetched = seed::fetch(&mut db, &scopes, page_limit, |p| {
        if p.pass == 1 {
            marks.0 = Some(started.elapsed().as_secs_f64());
        } else if marks.1.is_none() {
            marks.1 = Some(started.elapsed().as_secs_f64());
        }
    })
    .await?;
    let fetched_at = started.elapsed().as_secs_f64();
    let verified = seed::verify(fetched.manifest, fetched.export, &scopes, &fetched.pages)?;
    let secs = started.elapsed().as_secs_f64();
    let exported = verified.scopes[0].records.len();
    assert_eq!(exported, rows);
    assert_eq!(read, rows);
    println!(
        "seed export of {exported} rows (pages of {page_limit}, both passes, every check): {secs:.2} s = {:.0} rows/s",
        exported as f64 / secs
    );
    let (pass1, first_page) = (marks.0.unwrap_or(0.0), marks.1.unwrap_or(0.0));
    println!(
        "  begin + pass 1 (rows read, digested): {pass1:.2} s; seal + first page: {:.2} s; \
         the other pages: {:.2} s; verification: {:.2} s",
        first_page - pass1,
        fetched_at - first_page,
        secs - fetched_at
    );
    // Where the seal's time goes: the scope's records built and sorted in identity order
    // (what the first page's cursor does), timed alone.
    admin.batch_execute("SET work_mem = '64MB'").await?;
    let started = Instant::now();
    admin
        .query_one(
            "SELECT count(*) FROM synchro.synchro_seed_records('board:all',
                 (SELECT body FROM synchro.manifests ORDER BY schema_version DESC LIMIT 1))",
            &[],
        )
        .await?;
    println!(
        "  of which the records built and sorted in identity order, alone: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "baseline: one plain read of the same rows: {baseline:.2} s = {:.0} rows/s; export/read time ratio {:.1}x",
        read as f64 / baseline,
        secs / baseline
    );
    Ok(())
}
