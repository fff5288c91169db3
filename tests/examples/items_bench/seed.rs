//! (s) A fresh client from a portable seed: the scope is declared portable and exported
//! (`synchro_server::seed::export` and `write_artifact`, what `synchro-server seed export`
//! runs; timed as the export figure), a few rows change after the export, then a new client
//! downloads the seed from the server (`GET /seeds/items.seed.sqlite` with its token), opens
//! from it (`Client::open_from_seed`: every row digest and the scope digest checked before
//! use) and syncs once: its receipt becomes a cursor at the seed's boundary and one pull
//! brings what changed since. Timed from the download's first byte to the verified pull.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use synchro_client::engine::{Client, ClientConfig, SeedOutcome};
use synchro_client::http::HttpTransport;

/// What the phase needs from the benchmark's stack.
pub struct Setup<'a> {
    pub rows: usize,
    pub dir: &'a Path,
    /// The server's `--seed-dir`.
    pub seeds: &'a Path,
    pub base: &'a str,
    pub token: &'a str,
    pub operator: &'a tokio_postgres::Client,
    pub admin: &'a tokio_postgres::Client,
    /// The seed login's connection URL.
    pub seed_login: &'a str,
    pub transport: &'a dyn Fn() -> HttpTransport,
}

/// Changes committed between the export and the seeded client's first sync.
const LATER_UPDATES: i32 = 10;

/// Declares the scope portable (once), exports it into the server's seed directory, then
/// commits a few changes after the export; returns the seed's URL.
pub async fn export(s: &Setup<'_>) -> Result<String> {
    s.operator
        .batch_execute("SELECT synchro.synchro_declare_portable_scope('items')")
        .await?;
    let mut db = synchro_server::connect_db(s.seed_login).await?;
    let started = Instant::now();
    let verified = synchro_server::seed::export(&mut db, &["items".to_owned()], 5000, |_| {})
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let exported = started.elapsed().as_secs_f64();
    let artifact = s.seeds.join("items.seed.sqlite");
    let evidence = synchro_server::seed::write_artifact(&verified, &artifact)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let total = started.elapsed().as_secs_f64();
    println!(
        "seed export: {} rows in {total:.2} s = {:.0} rows/s (the export, both passes and every check of spec 001's 1-7: {exported:.2} s = {:.0} rows/s; the artifact, {:.1} MB, written and checked again: {:.2} s)",
        s.rows,
        s.rows as f64 / total,
        s.rows as f64 / exported,
        evidence.bytes as f64 / 1e6,
        total - exported
    );
    for i in 0..LATER_UPDATES {
        s.admin
            .execute(
                "UPDATE app.items SET val = val + 1 WHERE id = $1",
                &[&(1 + i * 7919 % s.rows as i32)],
            )
            .await?;
    }
    Ok(format!("{}/seeds/items.seed.sqlite", s.base))
}

/// Runs (s) natively; returns the seed's URL.
pub async fn fresh_from_seed(s: &Setup<'_>) -> Result<String> {
    let url = export(s).await?;
    let download = s.dir.join("downloaded.seed.sqlite");
    let database = s.dir.join("seeded.db");
    let _ = std::fs::remove_file(&download);
    let _ = std::fs::remove_file(&database);
    let started = Instant::now();
    let bytes = reqwest::Client::new()
        .get(&url)
        .bearer_auth(s.token)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    std::fs::write(&download, &bytes)?;
    let downloaded = started.elapsed().as_secs_f64();
    let (mut client, outcome) = Client::open_from_seed(
        &database,
        &download,
        (s.transport)(),
        crate::ids(50),
        ClientConfig::new(),
    )?;
    anyhow::ensure!(
        matches!(outcome, SeedOutcome::Installed(_)),
        "the seed was not installed: {outcome:?}"
    );
    let opened = started.elapsed().as_secs_f64();
    // The changes after the export are captured asynchronously: sync until they are here.
    let mut report = client.sync_once().await?;
    let mut pulled = report.pulled_changes;
    while pulled < LATER_UPDATES as u64 {
        anyhow::ensure!(
            started.elapsed().as_secs() < 120,
            "the later changes never arrived"
        );
        report = client.sync_once().await?;
        pulled += report.pulled_changes;
    }
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        !report.rebuilt.contains("items") && report.verified.contains("items"),
        "the seeded scope was rebuilt or did not verify: {report:?}"
    );
    anyhow::ensure!(
        crate::local_count(&client) == s.rows as i64,
        "the seeded client is incomplete"
    );
    println!(
        "(s) fresh client from a seed: {secs:.2} s for {} rows ({:.0} rows/s; download {downloaded:.2} s of {:.1} MB, verification and install {:.2} s, connect and pull of the {pulled} later changes {:.2} s, the terminal scope digest verified)",
        s.rows,
        s.rows as f64 / secs,
        bytes.len() as f64 / 1e6,
        opened - downloaded,
        secs - opened
    );
    std::fs::remove_file(&download).context("removing the download")?;
    Ok(url)
}
