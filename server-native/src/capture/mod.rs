//! Commit-ordered capture: the worker decodes the publication through the logical slot in
//! commit order and applies each complete source transaction to the synced projections,
//! membership edges and scope effects, together with its progress row, in one transaction;
//! only after that commit does it advance the slot.
//!
//! Exactly once: a crash after the commit but before the slot advance replays transactions
//! whose end LSN is at or below the recorded `confirmed_lsn`; they are skipped. A crash
//! before the commit leaves nothing applied. One worker per database holds an advisory
//! lock. Drift of a registered relation (renamed, moved, recreated, other replica identity)
//! or a value its portable type cannot hold blocks capture durably with a bounded
//! [`BlockReason`]; the transaction is neither applied nor acknowledged.
//!
//! Two sessions: `replication` (the worker login, which has REPLICATION) peeks and advances
//! the slot; `materialize` runs `SET ROLE synchro_worker` and writes projections. Row
//! versions come from the writer's source-trigger fence, allocated before the row changed;
//! they are opaque to clients.
//!
//! | module | owns |
//! |---|---|
//! | `step` | one step: leader lock, blocked state, peek, slot advance, time budget, heartbeat |
//! | `registry` | the registered relations, fields, membership rules and impacts; `load` |
//! | `transaction` | slot messages → complete transactions → `TxChanges` (final rows, bootstraps) |
//! | `materialize` | old images, projection writes, membership, progress + notify + commit |
//! | `row` | a source row's key text and wire JSON under its relation's shape |
//! | `membership` | membership and impact functions (run as their owner), edge diffs |
//! | `staging` | staged rule batches and activation, re-evaluation of a changed contract |
//! | `bootstrap` | the copy of a new relation and its completion in the stream |
//! | `statements` | prepared statements, the explicit transaction helper |
//! | `block` | [`BlockReason`], the CHECK list of `capture_state.blocked_reason` |
//! | [`pgoutput`], [`values`] | the pgoutput decoder; PostgreSQL text to wire values |

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::Client;

mod block;
mod bootstrap;
mod materialize;
mod membership;
pub mod pgoutput;
mod reconfigure;
mod registry;
mod row;
mod staging;
mod statements;
mod step;
mod transaction;
pub mod values;

pub use block::{BlockReason, DriftDetail};
pub use step::LEADER_LOCK;

use membership::Functions;
use statements::Statements;
use values::SESSION_SETTINGS;

/// The worker's public items under their original path (`capture::worker::Worker`, …).
pub mod worker {
    pub use super::block::BlockReason;
    pub use super::{
        run_forever, Failpoint, StepOutcome, Worker, COMPACTION_INTERVAL, LEADER_LOCK,
    };
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Another worker is the leader.
    NotLeader,
    /// Capture is blocked (bounded reason, a [`BlockReason`] code).
    Blocked(String),
    /// Applied this many source transactions and staging batches (0 when caught up).
    Applied(usize),
}

/// A fault to inject in tests, standing in for a crash at a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// None.
    None,
    /// Stop after committing the first transaction, before advancing the slot.
    AfterCommitBeforeAdvance,
    /// Stop after the first materialization commit, before confirming it: a batch of the
    /// consecutive transactions the peek returned, reduced to their final state.
    AfterBatchCommitBeforeAdvance,
}

/// How often the leader compacts retention.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(60);

/// The capture worker of one database.
pub struct Worker {
    replication: Client,
    materialize: Client,
    statements: Statements,
    /// Prepared membership and impact evaluations and the owners they run as.
    functions: Functions,
    slot: String,
    last_compaction: Instant,
    last_heartbeat: Instant,
}

impl Worker {
    /// Connects both sessions (`url` is the worker login) and ensures the slot exists.
    pub async fn connect(url: &str) -> Result<Worker> {
        let replication = crate::connect_db(url).await?;
        let materialize = crate::connect_db(url).await?;
        materialize.batch_execute("SET ROLE synchro_worker").await?;
        replication.batch_execute(SESSION_SETTINGS).await?;
        // The bootstrap copy reads output-function text through this session.
        materialize.batch_execute(SESSION_SETTINGS).await?;
        // Plan every execution with the tables' current sizes: a generic plan cached while
        // the projections were small keeps scanning them as they grow (the capture
        // benchmark measured per-transaction cost growing linearly with the table).
        materialize
            .batch_execute("SET plan_cache_mode = force_custom_plan")
            .await?;
        let slot: String = materialize
            .query_one("SELECT slot_name::text FROM synchro.capture_state", &[])
            .await?
            .get(0);
        ensure_slot(&replication, &slot).await?;
        let statements = Statements::prepare(&materialize).await?;
        Ok(Worker {
            replication,
            materialize,
            statements,
            functions: Functions::default(),
            slot,
            last_compaction: Instant::now(),
            last_heartbeat: Instant::now()
                .checked_sub(step::HEARTBEAT_INTERVAL)
                .unwrap_or_else(Instant::now),
        })
    }

    /// Compacts retention when [`COMPACTION_INTERVAL`] has passed since the last time.
    async fn compact_if_due(&mut self) {
        if self.last_compaction.elapsed() < COMPACTION_INTERVAL {
            return;
        }
        self.last_compaction = Instant::now();
        match crate::retention::compact(&self.materialize, crate::retention::DEFAULT_BATCH_SIZE)
            .await
        {
            Ok(c) => tracing::info!(
                clients_expired = c.clients_expired,
                scopes = c.scopes_compacted,
                effects = c.effects_deleted,
                "compaction"
            ),
            Err(_) => tracing::warn!("compaction failed"),
        }
    }
}

/// Creates the logical slot when it does not exist.
async fn ensure_slot(replication: &Client, slot: &str) -> Result<()> {
    let exists = replication
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .is_some();
    if !exists {
        replication
            .query(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "creating the capture slot: {}",
                    crate::install::describe(&e)
                )
            })?;
    }
    Ok(())
}

/// Runs the worker forever: reconnects after errors, idles while blocked or not leader.
/// Logs carry no row data (a failed step logs only that it failed).
/// The leader also compacts retention every [`COMPACTION_INTERVAL`].
pub async fn run_forever(url: String, interval: Duration) {
    loop {
        match Worker::connect(&url).await {
            Ok(mut worker) => loop {
                match worker.step(Failpoint::None).await {
                    Ok(StepOutcome::Applied(0)) => {
                        worker.compact_if_due().await;
                        tokio::time::sleep(interval).await
                    }
                    Ok(StepOutcome::Applied(_)) => {}
                    Ok(StepOutcome::NotLeader | StepOutcome::Blocked(_)) => {
                        tokio::time::sleep(Duration::from_secs(1)).await
                    }
                    Err(_) => {
                        tracing::warn!("capture step failed; reconnecting");
                        break;
                    }
                }
            },
            Err(_) => tracing::warn!("capture worker cannot connect; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
