//! Scope-local compaction (spec 003 "Scope-local compaction"): durable client expiry, then
//! per scope, batches that delete effects at or below the safe position and raise the
//! scope's resume floor in the same transaction (`synchro_compact_scope`, migration 8).

use anyhow::Result;
use tokio_postgres::Client;

/// Default `compaction.batch_size`.
pub const DEFAULT_BATCH_SIZE: i32 = 1000;

/// What one compaction pass did (counts only: no scope ids, they are user data).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Client generations newly marked expired.
    pub clients_expired: i64,
    /// Scopes whose floor moved.
    pub scopes_compacted: usize,
    /// Effects deleted.
    pub effects_deleted: i64,
}

/// Runs one compaction pass on a session that may execute the compaction functions
/// (synchro_worker or synchro_operator). Each batch is its own transaction.
pub async fn compact(db: &Client, batch_size: i32) -> Result<Compaction> {
    let mut out = Compaction {
        clients_expired: db
            .query_one("SELECT synchro.synchro_expire()", &[])
            .await?
            .get(0),
        ..Compaction::default()
    };
    let scopes: Vec<String> = db
        .query("SELECT * FROM synchro.synchro_compaction_scopes()", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for scope in scopes {
        let mut moved = false;
        loop {
            let deleted: i64 = db
                .query_one(
                    "SELECT synchro.synchro_compact_scope($1, $2)",
                    &[&scope, &batch_size],
                )
                .await
                .map_err(|e| anyhow::anyhow!("compaction: {}", crate::install::describe(&e)))?
                .get(0);
            out.effects_deleted += deleted;
            moved |= deleted > 0;
            if deleted < i64::from(batch_size) {
                break;
            }
        }
        out.scopes_compacted += usize::from(moved);
    }
    Ok(out)
}

/// Runs a compaction pass every `every` for ever, the first after one interval, each on a
/// new connection of `url` (an operator login); `report` gets each pass's counts. A failed
/// pass is logged (its kind only) and the next one tried.
pub async fn every(
    url: &str,
    batch_size: i32,
    every: std::time::Duration,
    report: impl Fn(Compaction),
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let pass = async {
            let db = crate::connect_db(url).await?;
            compact(&db, batch_size).await
        };
        match pass.await {
            Ok(c) => report(c),
            Err(e) => tracing::warn!(cause = %crate::capture::cause(&e), "compaction pass failed"),
        }
    }
}
