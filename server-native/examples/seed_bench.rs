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
use synchro_server::seed;
use synchro_testkit::pg::{register_with_rule, Env};

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
    // The tests' throwaway stack: a cluster, synchro installed, the dev logins, `app`.
    let env = Env::installed().await;
    env.as_app_owner(&format!(
        "CREATE TABLE app.items (id bigint PRIMARY KEY, title text, qty integer NOT NULL);
         INSERT INTO app.items SELECT g, 'item ' || g, g % 100 FROM generate_series(1, {rows}) g"
    ))
    .await;
    register_with_rule(
        &env,
        "items",
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'board:all' FROM synchro_projection.\"app.items\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');
         SELECT synchro.synchro_add_shared_scope('board:all');
         SELECT synchro.synchro_declare_portable_scope('board:all');",
    )
    .await;
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app")).await?;
    while worker.step(Failpoint::None).await? != StepOutcome::Applied(0) {}
    let admin = &env.admin;
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

    let mut db = env.login("synchro_dev_seed").await;
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
    // The rest of `seed export`: the SQLite file written with the client's store, checked
    // again read-only, published.
    let out = std::env::temp_dir().join(format!("seed-bench-{}.sqlite", std::process::id()));
    let started = Instant::now();
    let evidence = seed::write_artifact(&verified, &out)?;
    let artifact_secs = started.elapsed().as_secs_f64();
    // A recipient: the seed copied beside a new database and checked there
    // (`Storage::open_seeded`, what `Client::open_from_seed` does before the engine opens),
    // then the scope's digest a first terminal pull page is checked against.
    let db = std::env::temp_dir().join(format!("seed-bench-{}.db", std::process::id()));
    let remove_db = || {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
    };
    let (mut opens, mut firsts) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        remove_db();
        let started = Instant::now();
        let (mut storage, outcome) = synchro_client::store::Storage::open_seeded(&db, &out)?;
        opens.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(
            matches!(
                outcome,
                synchro_client::store::seed::SeedOutcome::Installed(_)
            ),
            "{outcome:?}"
        );
        let manifest = storage.active_schema()?.expect("a schema");
        let started = Instant::now();
        storage.local_scope_digest(&manifest, "board:all")?;
        firsts.push(started.elapsed().as_secs_f64());
    }
    remove_db();
    opens.sort_by(f64::total_cmp);
    firsts.sort_by(f64::total_cmp);
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(seed::evidence_path(&out));
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
        "the artifact ({} bytes) written, checked again and published: {artifact_secs:.2} s; \
         the whole `seed export`: {:.2} s = {:.0} rows/s",
        evidence.bytes,
        secs + artifact_secs,
        exported as f64 / (secs + artifact_secs)
    );
    println!(
        "a recipient: the seed copied and verified beside a new database: median {:.3} s of 5; then the scope's first local digest: {:.1} ms",
        opens[2],
        firsts[2] * 1000.0
    );
    println!(
        "baseline: one plain read of the same rows: {baseline:.2} s = {:.0} rows/s; export/read time ratio {:.1}x",
        read as f64 / baseline,
        secs / baseline
    );
    Ok(())
}
