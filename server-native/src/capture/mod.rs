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
//! Three sessions of the worker login (which has REPLICATION): `control` holds the leader
//! lock, creates the slot and reads WAL positions; the replication stream (`stream`)
//! receives the slot's changes through `START_REPLICATION` and confirms positions once they
//! are applied; `materialize` runs `SET ROLE synchro_worker` and writes projections. Row
//! versions come from the writer's source-trigger fence, allocated before the row changed;
//! they are opaque to clients.
//!
//! | module | owns |
//! |---|---|
//! | `step` | one step: leader lock, blocked state, receive, confirmation, time budget, heartbeat |
//! | `stream` | the replication stream: START_REPLICATION, transactions in commit order, confirmation |
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
mod heartbeat;
mod lineage;
mod materialize;
mod membership;
pub mod pgoutput;
mod reconfigure;
mod registry;
mod row;
mod staging;
mod statements;
mod step;
mod stream;
mod transaction;
pub mod values;

pub use block::{BlockDetail, BlockReason};
pub use step::LEADER_LOCK;

use membership::Functions;
use statements::Statements;
use values::SESSION_SETTINGS;

/// The worker's public items under their original path (`capture::worker::Worker`, …).
pub mod worker {
    pub use super::block::BlockReason;
    pub use super::{run_forever, Failpoint, StepOutcome, Worker, LEADER_LOCK};
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
    /// Stop after committing the first transaction, before confirming it to the slot (the
    /// stream is dropped, as a crash would).
    AfterCommitBeforeAdvance,
    /// Stop after the first materialization commit, before confirming it: a batch of the
    /// consecutive transactions the stream held, reduced to their final state.
    AfterBatchCommitBeforeAdvance,
}

/// The capture worker of one database.
pub struct Worker {
    /// The worker login's connection string (the replication stream opens its own session).
    url: String,
    /// The leader lock, the slot's creation and WAL positions.
    control: Client,
    /// On `control`: how many of a batch's transactions are not visible yet
    /// (`step.rs::await_visible`), prepared once.
    unseen: tokio_postgres::Statement,
    /// The replication stream, open while this worker leads and capture is not blocked.
    stream: Option<stream::Stream>,
    materialize: Client,
    statements: Statements,
    /// On `materialize`: the registry's queries, prepared once.
    registry_queries: registry::Queries,
    /// Prepared membership and impact evaluations and the evaluators they run through.
    functions: Functions,
    slot: String,
    last_heartbeat: Instant,
    /// The registry generation of the last registry loaded, and the one last recorded as
    /// applied (`capture_state.applied_registry_generation`, which readiness compares).
    loaded_generation: std::sync::atomic::AtomicI64,
    recorded_generation: Option<i64>,
    /// Whether this worker has recorded `capture_state.caught_up_at` yet.
    recorded_caught_up: bool,
    /// When this worker last counted membership coverage (`None`: not yet).
    last_coverage: Option<Instant>,
    /// Its heartbeat session: progress and liveness while a step runs long.
    heartbeat: heartbeat::Heartbeat,
    /// When the last ANALYZE was put off by another session's lock (statistics to refresh).
    analyze_put_off: std::sync::Mutex<Option<Instant>>,
    /// How long one step stages batch after batch ([`Worker::set_staging_budget`]).
    staging_budget: Duration,
}

impl Worker {
    /// Connects the control and materialization sessions (`url` is the worker login); the
    /// slot's lineage is checked (the slot created at a first start, `lineage.rs`) and the
    /// replication stream opened at the first step that leads.
    pub async fn connect(url: &str) -> Result<Worker> {
        let control = crate::connect_db(url).await?;
        let materialize = crate::connect_db(url).await?;
        materialize.batch_execute("SET ROLE synchro_worker").await?;
        // The bootstrap copy reads output-function text through this session.
        materialize.batch_execute(SESSION_SETTINGS).await?;
        // Plan every execution with the tables' current sizes: a generic plan cached while
        // the projections were small keeps scanning them as they grow (the capture
        // benchmark measured per-transaction cost growing linearly with the table).
        materialize
            .batch_execute("SET plan_cache_mode = force_custom_plan")
            .await?;
        let row = materialize
            .query_one(
                "SELECT slot_name::text, pg_backend_pid() FROM synchro.capture_state",
                &[],
            )
            .await?;
        let slot: String = row.get(0);
        let heartbeat = heartbeat::Heartbeat::start(url, row.get(1));
        let unseen = control.prepare(step::UNSEEN).await?;
        let statements = Statements::prepare(&materialize).await?;
        let registry_queries = registry::Queries::prepare(&materialize).await?;
        Ok(Worker {
            url: url.to_owned(),
            control,
            unseen,
            stream: None,
            materialize,
            statements,
            registry_queries,
            functions: Functions::default(),
            slot,
            last_heartbeat: Instant::now()
                .checked_sub(step::HEARTBEAT_INTERVAL)
                .unwrap_or_else(Instant::now),
            loaded_generation: Default::default(),
            recorded_generation: None,
            recorded_caught_up: false,
            last_coverage: None,
            heartbeat,
            analyze_put_off: Default::default(),
            staging_budget: step::STAGING_BUDGET,
        })
    }

    /// How long one step stages pending rules, batch after batch (500 ms by default);
    /// `Duration::ZERO` stages one batch per relation per step (tests that step through a
    /// staging batch by batch).
    pub fn set_staging_budget(&mut self, budget: Duration) {
        self.staging_budget = budget;
    }

    /// Waits up to `max` before the next step: until the replication stream delivers
    /// something, or the whole time when no stream is open.
    pub async fn idle(&mut self, max: Duration) -> Result<()> {
        match self.stream.as_mut() {
            Some(stream) => {
                let waited = stream.wait(max).await;
                if waited.is_err() {
                    self.stream = None;
                }
                waited
            }
            None => {
                tokio::time::sleep(max).await;
                Ok(())
            }
        }
    }

    /// Refreshes the planner's statistics of the worker's tables after a bulk write (a
    /// bootstrap copy, an activation, a re-evaluated rule: `synchro_analyze_materialized`);
    /// a failure only leaves them to autovacuum.
    async fn analyze_materialized(&self) {
        match self
            .materialize
            .query_one("SELECT synchro.synchro_analyze_materialized()", &[])
            .await
        {
            // Done, or another session holds a lock it needs: tried again later.
            Ok(row) => {
                *self.analyze_put_off.lock().expect("analyze state") =
                    (!row.get::<_, bool>(0)).then(Instant::now)
            }
            Err(_) => tracing::warn!("refreshing the projection statistics failed"),
        }
    }

    /// [`Worker::analyze_materialized`] again when the last one was put off by a lock, at
    /// most once a second (an autovacuum can hold the lock for minutes; an idle worker steps
    /// every 25 ms).
    async fn analyze_if_due(&self) {
        let due = self
            .analyze_put_off
            .lock()
            .expect("analyze state")
            .is_some_and(|at| at.elapsed() >= Duration::from_secs(1));
        if due {
            self.analyze_materialized().await;
        }
    }
}

/// Runs the worker forever: reconnects after errors, idles while blocked or not leader; a
/// caught-up leader steps again when its stream delivers, or after `interval`.
/// Logs carry no row data (a failed step logs only that it failed).
/// Compaction is not the worker's (spec 001 gives it to `synchro_operator`: `synchro-server
/// compact --every`).
pub async fn run_forever(url: String, interval: Duration) {
    loop {
        match Worker::connect(&url).await {
            Ok(mut worker) => loop {
                match worker.step(Failpoint::None).await {
                    Ok(StepOutcome::Applied(0)) => {
                        if worker.idle(interval).await.is_err() {
                            tracing::warn!("capture stream failed; reconnecting");
                            break;
                        }
                    }
                    Ok(StepOutcome::Applied(_)) => {}
                    Ok(StepOutcome::NotLeader | StepOutcome::Blocked(_)) => {
                        tokio::time::sleep(Duration::from_secs(1)).await
                    }
                    Err(e) => {
                        tracing::warn!(cause = %cause(&e), "capture step failed; reconnecting");
                        break;
                    }
                }
            },
            Err(_) => tracing::warn!("capture worker cannot connect; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A bounded description of why a step failed, for the log: the SQLSTATE of a database
/// error (never its message, which can quote values), or what kind of failure it was.
pub(crate) fn cause(e: &anyhow::Error) -> String {
    for c in e.chain() {
        if let Some(pg) = c.downcast_ref::<tokio_postgres::Error>() {
            return match pg.code() {
                Some(code) => format!("SQLSTATE {}", code.code()),
                None => "connection".to_owned(),
            };
        }
        if c.is::<block::TransientEvaluation>() {
            return "evaluation interrupted".to_owned();
        }
    }
    "other".to_owned()
}
