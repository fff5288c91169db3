//! One step of the worker: the leader lock, the durable blocked state, pending bootstraps,
//! changed membership contracts and staged rules, then the transactions the replication
//! stream received applied in commit order within a time budget, each batch followed by its
//! confirmation; an idle leader confirms what it received and records its heartbeat. A
//! blocking condition raised anywhere is recorded here and ends the step.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio_postgres::types::PgLsn;

use super::block::{
    block_site, BlockDetail, BlockReason, BlockSite, Blocked, Decoding, Drifted, InTransaction,
};
use super::heartbeat::Phase;
use super::materialize::Span;
use super::registry::{Relations, Status};
use super::staging::{Staged, StagingRestarted};
use super::stream::Stream;
use super::transaction::{decode_changes, record_shapes, Shapes, Transaction, TxChanges};
use super::{Failpoint, StepOutcome, Worker};

/// Advisory lock key of the capture leader ("synchro" in ASCII).
pub const LEADER_LOCK: i64 = 0x73796e6368726f;

/// Messages handed out per batch (whole transactions are always handed out).
const BATCH_MESSAGES: usize = 10_000;

/// How long a step waits for the stream to deliver everything committed before the step
/// began (the walsender usually needs a few milliseconds).
const HORIZON_WAIT: Duration = Duration::from_millis(500);

/// How long one step keeps applying once it has applied something.
const STEP_BUDGET: Duration = Duration::from_secs(1);

/// How long one step stages pending rules (batch after batch) before it turns to the stream.
pub(super) const STAGING_BUDGET: Duration = Duration::from_millis(500);

/// How long a step waits for decoded transactions to become visible before it fails (and
/// the next step tries again).
const VISIBILITY_WAIT: Duration = Duration::from_secs(10);

/// How many of the transactions `$1` (32-bit IDs) a new snapshot does not see yet. The IDs
/// are widened to the epoch of the snapshot's xmax: live IDs lie within 2^31 of it
/// (wraparound protection), on either side.
pub(super) const UNSEEN: &str = "WITH s AS (SELECT pg_current_snapshot() AS snap),
                   m AS (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax FROM s),
                   f AS (SELECT m.snap, m.xmax, ((m.xmax >> 32) << 32) | t.x AS wide
                           FROM m, unnest($1::bigint[]) AS t(x))
              SELECT count(*) FROM f
               WHERE NOT pg_visible_in_snapshot(
                         (CASE WHEN wide > xmax + 2147483648 THEN wide - 4294967296
                               WHEN wide < xmax - 2147483648 THEN wide + 4294967296
                               ELSE wide END)::text::xid8, snap)";

/// How often the leader counts membership coverage (health check `membership_coverage`;
/// about 0.3 s per 100,000 projected rows), besides once when it starts leading.
const COVERAGE_INTERVAL: Duration = Duration::from_secs(300);

/// How often an idle leader records its heartbeat.
pub(super) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// Unrelated WAL an idle worker confirms without waiting for its next heartbeat.
const IDLE_CONFIRM_BYTES: u64 = 1 << 20;

/// How applying one batch of transactions ended.
struct Applied {
    /// Source transactions applied.
    count: usize,
    /// End of the last transaction applied or skipped: the position to confirm.
    last_end: Option<PgLsn>,
    /// The failpoint stopped the step before the confirmation.
    stopped: bool,
}

impl Worker {
    /// Applies the complete transactions available, in commit order, until caught up (then
    /// `Applied(0)` when nothing was applied), blocked, or — once something was applied — a
    /// time budget of about a second is spent, so bootstraps and heartbeats are never
    /// starved by a sustained write load.
    pub async fn step(&mut self, failpoint: Failpoint) -> Result<StepOutcome> {
        // The leader lock (on the control session) and the state (on the materialization
        // session) are asked for together; the state is used only by the leader.
        let (leader, state) = futures_util::try_join!(
            self.control
                .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK]),
            self.materialize.query_one(
                "SELECT confirmed_lsn, blocked_reason, lineage_reset_requested_at IS NOT NULL
                   FROM synchro.capture_state",
                &[],
            ),
        )?;
        if !leader.get::<_, bool>(0) {
            return Ok(StepOutcome::NotLeader);
        }
        if state.get::<_, bool>(2) {
            // The operator asked for a lineage reset (`synchro-server lineage reset`): a new
            // slot, every relation copied from its snapshot; the next step activates the
            // copies before it reads the new stream.
            self.stream = None;
            super::lineage::reset(&self.url, &self.control, &self.materialize, &self.slot).await?;
            self.functions.forget_prepared();
            return Ok(StepOutcome::Applied(1));
        }
        let confirmed: PgLsn = state.get(0);
        if let Some(reason) = state.get::<_, Option<String>>(1) {
            // A blocked worker receives and confirms nothing.
            self.stream = None;
            if self.lift_drift_of_a_retirement().await? == 0 {
                return Ok(StepOutcome::Blocked(reason));
            }
            tracing::info!("a drift block lifted: its relation is being retired");
        }
        match self.run(confirmed, failpoint).await {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                // What the stream handed out was not applied: the next stream starts again
                // at the slot's confirmed position.
                self.stream = None;
                if e.chain().any(|c| c.is::<StagingRestarted>()) {
                    // Applied again at once, with the registry as it now is.
                    return Ok(StepOutcome::Applied(1));
                }
                match block_site(&e) {
                    Some(site) => self.block(site).await,
                    None => Err(e),
                }
            }
        }
    }

    /// Drift of a registered relation's physical identity that the catalog already shows
    /// (a drop, recreation, rename, another key or replica identity), so that it blocks even
    /// before a change of the relation reaches the stream.
    async fn catalog_drift(&self) -> Result<()> {
        let Some(row) = self
            .materialize
            .query_opt(
                "SELECT relation_id, detail FROM synchro.synchro_catalog_drift() ORDER BY relation_id LIMIT 1",
                &[],
            )
            .await?
        else {
            return Ok(());
        };
        let detail = BlockDetail::parse(row.get(1)).context("an unknown drift detail")?;
        Err(Drifted {
            relation_id: row.get(0),
            detail,
            ordinal: None,
        }
        .into())
    }

    /// Lifts a block on the catalog drift (a drop, recreation, rename, another key or replica
    /// identity) of a relation whose retirement is now pending or staged: the retirement is
    /// the documented recovery and lifts such a block itself, but a drift check that read the
    /// catalog just before the retirement committed records its block just after (the
    /// retirement found nothing to lift, and capture stayed blocked for good).
    async fn lift_drift_of_a_retirement(&self) -> Result<u64> {
        Ok(self
            .materialize
            .execute(
                "UPDATE synchro.capture_state
                    SET blocked_reason = NULL, blocked_at = NULL, blocked_relation_id = NULL, blocked_detail = NULL,
                        blocked_lsn = NULL, blocked_ordinal = NULL, blocked_sqlstate = NULL
                  WHERE blocked_reason = 'registered_relation_drift'
                    AND blocked_detail IN ('relation_dropped', 'relation_renamed', 'replica_identity_changed',
                                           'primary_key_changed')
                    AND EXISTS (SELECT 1 FROM synchro.registry_generations g
                                 WHERE g.relation_id = blocked_relation_id AND g.change = 'retirement'
                                   AND g.state IN ('pending', 'staged'))",
                &[],
            )
            .await?)
    }

    /// The step of a leader that is not blocked.
    async fn run(&mut self, confirmed: PgLsn, failpoint: Failpoint) -> Result<StepOutcome> {
        // Before a stream opens (at start, after a failure), the slot must be the one whose
        // stream was materialized (issue 38); a first start creates it, before anything (a
        // bootstrap's message) must be in its stream.
        if self.stream.is_none() {
            if let Some(reason) =
                super::lineage::check(&self.control, &self.materialize, &self.slot).await?
            {
                return Err(Blocked(reason).into());
            }
            // A lineage reset's copies from the new slot's snapshot are activated where the
            // stream begins, before it is read; the generations it put back to pending are
            // staged again into it.
            self.activate_snapshot_copies().await?;
            if !super::lineage::restage(&self.materialize).await? {
                return Ok(StepOutcome::Applied(0));
            }
        }
        // The drift check and the registry load go out together (both only read).
        let (drift, registry) = futures_util::join!(self.catalog_drift(), self.registry());
        drift?;
        let mut registry = self.bootstrap_pending(registry?).await?;
        self.count_coverage_if_due().await?;
        self.analyze_if_due().await;
        self.reevaluate_stale(&mut registry).await?;
        // Work done this step: source transactions applied plus staging batches, so
        // `Applied(0)` means caught up with both.
        let mut applied = self.stage_pending(&mut registry).await?;
        let mut source_applied = 0;
        // Everything committed before this point is received before the step goes idle
        // (and then everything committed before `horizon_at` is applied).
        let row = self
            .control
            .query_one(
                "SELECT pg_current_wal_flush_lsn(),
                        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
                &[],
            )
            .await?;
        let (horizon, horizon_at): (PgLsn, i64) = (row.get(0), row.get(1));
        let mut caught_up = None;
        if self.stream.is_none() {
            self.stream = Some(Stream::open(&self.url, &self.slot, &self.control).await?);
        }
        let started = Instant::now();
        while applied == 0 || started.elapsed() < STEP_BUDGET {
            let stream = self.stream.as_mut().expect("opened");
            let transactions = stream
                .receive(horizon, HORIZON_WAIT, BATCH_MESSAGES)
                .await?;
            if transactions.is_empty() {
                caught_up = Some(horizon_at);
                break;
            }
            self.await_visible(&transactions).await?;
            self.heartbeat
                .report(Phase::Applying, None, None, Some(transactions.len() as i64));
            let stream = self.stream.as_mut().expect("opened");
            let mut shapes = std::mem::take(&mut stream.shapes);
            let done = self
                .apply_all(
                    &transactions,
                    confirmed,
                    &mut registry,
                    &mut shapes,
                    failpoint,
                )
                .await?;
            applied += done.count;
            source_applied += done.count;
            if done.stopped {
                // As a crash would: nothing more is confirmed.
                self.stream = None;
                return Ok(StepOutcome::Applied(applied));
            }
            let stream = self.stream.as_mut().expect("opened");
            stream.shapes = shapes;
            if let Some(end) = done.last_end {
                stream.confirm(end);
            }
        }
        self.heartbeat(source_applied, caught_up).await?;
        self.heartbeat.report(Phase::Idle, None, None, None);
        Ok(StepOutcome::Applied(applied))
    }

    /// Activates a lineage reset's copies made from the new slot's snapshot, as a
    /// transaction at the slot's beginning that changes nothing but carries their activation
    /// (the copy compared with the projection: only the rows that differ become changes).
    async fn activate_snapshot_copies(&self) -> Result<()> {
        let Some((at, generations)) = super::lineage::snapshot_copies(&self.materialize).await?
        else {
            return Ok(());
        };
        let mut registry = self.registry().await?;
        let micros_since_2000 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0)
            - 946_684_800_000_000;
        let span = Span {
            commit_lsn: at,
            end_lsn: at,
            transactions: 0,
            commit_time: micros_since_2000,
        };
        let changes = TxChanges {
            finals: Default::default(),
            seq: 0,
            bootstrapped: Vec::new(),
            reconfigured: generations,
        };
        self.apply(&span, changes, &mut registry).await
    }

    /// Waits until every transaction of a batch is visible to new snapshots. Decoding hands
    /// out a transaction once its commit record is flushed, before the committing backend
    /// has left the process array (a synchronous-replication wait holds it there for as long
    /// as the standby takes): until then the worker's queries would not see its writes — a
    /// stage's generation, a reconfiguration's fields — and would apply it without them.
    async fn await_visible(&self, transactions: &[Transaction]) -> Result<()> {
        let xids: Vec<i64> = transactions.iter().map(|t| i64::from(t.xid)).collect();
        let started = Instant::now();
        loop {
            let unseen: i64 = self.control.query_one(&self.unseen, &[&xids]).await?.get(0);
            if unseen == 0 {
                return Ok(());
            }
            if started.elapsed() > VISIBILITY_WAIT {
                anyhow::bail!(
                    "{unseen} decoded source transaction(s) not visible after {VISIBILITY_WAIT:?} \
                     (a synchronous standby holding the commit?)"
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Records a blocking condition durably, with where it was found (the WAL position now
    /// when no source transaction was being applied) — unless it was found decoding a change
    /// of a relation that has been staged since this step loaded the registry: that copy
    /// covers the change, and the next step skips it. (A failure of the activation itself,
    /// or anything found outside decoding, is always recorded.)
    async fn block(&self, site: BlockSite) -> Result<StepOutcome> {
        let reason = site.reason.as_str();
        let detail = site.detail.map(BlockDetail::as_str);
        let sqlstate = site.sqlstate.as_deref();
        let recorded = self
            .materialize
            .execute(
                "UPDATE synchro.capture_state
                    SET blocked_reason = $1, blocked_at = now(), blocked_relation_id = $2, blocked_detail = $3,
                        blocked_lsn = coalesce($4, pg_current_wal_lsn()), blocked_ordinal = $5,
                        blocked_sqlstate = $7
                  WHERE NOT $6 OR $2::text IS NULL OR NOT EXISTS (
                        SELECT 1 FROM synchro.registry_generations g
                         WHERE g.relation_id = $2 AND g.state = 'staged')",
                &[
                    &reason,
                    &site.relation_id,
                    &detail,
                    &site.lsn.map(PgLsn::from),
                    &site.ordinal,
                    &site.decoding,
                    &sqlstate,
                ],
            )
            .await?;
        if recorded == 0 {
            return Ok(StepOutcome::Applied(0));
        }
        // Relation IDs and codes only: never a value, key or scope.
        if matches!(
            site.reason,
            BlockReason::SlotMissing | BlockReason::SlotInvalidated | BlockReason::LineageChanged
        ) {
            tracing::error!(
                reason,
                "capture blocked: the capture slot is not the one whose stream was materialized; `synchro-server lineage reset` (see docs/operator.md, \"When the capture slot is lost\")"
            );
        } else {
            tracing::error!(
                reason,
                detail,
                relation_id = site.relation_id.as_deref(),
                sqlstate,
                "capture blocked; fix the cause, then `synchro-server capture unblock` (see docs/operator.md, \"When capture blocks\")"
            );
        }
        self.functions.forget_prepared();
        Ok(StepOutcome::Blocked(reason.to_owned()))
    }

    /// Loads the registry and records the evaluators of its functions.
    async fn registry(&self) -> Result<Relations> {
        let loaded = super::registry::load(&self.materialize, &self.registry_queries).await?;
        self.loaded_generation
            .store(loaded.generation, std::sync::atomic::Ordering::Relaxed);
        self.functions.record_evaluators(loaded.evaluators);
        Ok(loaded.relations)
    }

    /// Bootstraps every pending relation of `registry` (just loaded); returns the registry
    /// as it then is.
    async fn bootstrap_pending(&mut self, registry: Relations) -> Result<Relations> {
        let pending: Vec<String> = registry
            .values()
            .filter(|r| r.status == Status::Pending)
            .map(|r| r.relation_id.clone())
            .collect();
        for relation_id in &pending {
            self.heartbeat
                .report(Phase::Bootstrapping, Some(relation_id), None, None);
            self.bootstrap(&registry, relation_id).await?;
        }
        if pending.is_empty() {
            Ok(registry)
        } else {
            self.registry().await
        }
    }

    /// A changed membership contract: re-evaluates every row under the new rule.
    async fn reevaluate_stale(&self, registry: &mut Relations) -> Result<()> {
        let stale: Vec<u32> = registry
            .iter()
            .filter(|(_, r)| {
                // (A pending rule is staged instead; its activation records the contract.)
                r.status == Status::Active
                    && r.membership.is_some()
                    && r.pending.is_none()
                    && r.contract.current != r.contract.evaluated
            })
            .map(|(oid, _)| *oid)
            .collect();
        for oid in stale {
            self.reevaluate(&registry[&oid]).await?;
            let reg = registry.get_mut(&oid).expect("listed");
            reg.contract.evaluated = reg.contract.current;
        }
        Ok(())
    }

    /// Staged rule changes: one bounded batch each (activation when complete). Returns the
    /// batches staged.
    async fn stage_pending(&self, registry: &mut Relations) -> Result<usize> {
        let started = Instant::now();
        let mut staging_again: Vec<u32> = Vec::new();
        let mut staging: Vec<u32> = registry
            .iter()
            .filter(|(_, r)| {
                r.status == Status::Active && r.pending.as_ref().is_some_and(|p| !p.failed)
            })
            .map(|(oid, _)| *oid)
            .collect();
        let mut batches = 0;
        while let Some(oid) = staging.pop().or_else(|| {
            staging.append(&mut staging_again);
            staging.pop()
        }) {
            // An earlier relation's activation or restart reloaded the registry.
            let Some(reg) = registry
                .get(&oid)
                .filter(|r| r.pending.as_ref().is_some_and(|p| !p.failed))
            else {
                continue;
            };
            self.heartbeat
                .report(Phase::Staging, Some(&reg.relation_id), None, None);
            let staged = self.stage_batch(reg).await?;
            batches += 1;
            match staged {
                Staged::Through(t) => {
                    let reg = registry.get_mut(&oid).expect("listed");
                    reg.pending.as_mut().expect("pending").staged_through = Some(t);
                    // More batches of this relation while the step's staging budget lasts:
                    // one batch per step paid the step's fixed cost (drift check, registry,
                    // stream) for every 1,000 rows.
                    if started.elapsed() < self.staging_budget {
                        staging_again.push(oid);
                    }
                }
                // Activated (a new live rule), restarted (another pending state) or stopped
                // on a failed evaluation: reload.
                Staged::Activated | Staged::Restarted | Staged::Failed => {
                    *registry = self.registry().await?
                }
            }
        }
        Ok(batches)
    }

    /// Applies a batch of transactions in commit order, skipping those a crash left applied
    /// but not confirmed (end at or below `confirmed`); `shapes` are the stream's relation
    /// descriptions, which its transactions extend. Consecutive plain transactions are
    /// reduced to their final row states and materialized together ([`Span`]); a bootstrap
    /// or an activation is applied on its own, after what precedes it.
    async fn apply_all(
        &self,
        transactions: &[Transaction],
        confirmed: PgLsn,
        registry: &mut Relations,
        shapes: &mut Shapes,
        failpoint: Failpoint,
    ) -> Result<Applied> {
        let mut done = Applied {
            count: 0,
            last_end: None,
            stopped: false,
        };
        // The pending batch: its first transaction's index and its changes so far.
        let mut batch: Option<(usize, TxChanges)> = None;
        let none = TxChanges::default();
        for (i, tx) in transactions.iter().enumerate() {
            record_shapes(tx, shapes);
            if u64::from(tx.end_lsn) <= u64::from(confirmed) {
                done.last_end = Some(tx.end_lsn);
                continue; // applied before a crash; the slot was not advanced yet
            }
            let earlier = batch.as_ref().map_or(&none, |(_, c)| c);
            let decoded = decode_changes(
                &self.materialize,
                &self.statements,
                tx,
                registry,
                shapes,
                earlier,
            )
            .await;
            match decoded {
                Ok(changes) if !changes.is_milestone() => {
                    match batch.as_mut() {
                        Some((_, so_far)) => so_far.extend(changes),
                        None => batch = Some((i, changes)),
                    }
                    // The failpoint stands for a crash after the first commit.
                    if failpoint == Failpoint::AfterCommitBeforeAdvance {
                        let (first, changes) = batch.take().expect("just added");
                        self.apply_batch(
                            &transactions[first..=i],
                            changes,
                            registry,
                            shapes,
                            &mut done,
                        )
                        .await?;
                        done.stopped = true;
                        return Ok(done);
                    }
                }
                other => {
                    // What precedes it is applied first (its handling may reload the
                    // registry; a milestone decoded against the batch saw the same rows).
                    if let Some((first, changes)) = batch.take() {
                        self.apply_batch(
                            &transactions[first..i],
                            changes,
                            registry,
                            shapes,
                            &mut done,
                        )
                        .await?;
                        if failpoint != Failpoint::None {
                            done.stopped = true;
                            return Ok(done);
                        }
                    }
                    let changes = match other {
                        Ok(changes) => changes,
                        Err(e) => self.redecode(tx, e, registry, shapes).await?,
                    };
                    self.apply_one(tx, changes, registry, &mut done).await?;
                    if failpoint != Failpoint::None {
                        done.stopped = true;
                        return Ok(done);
                    }
                }
            }
        }
        if let Some((first, changes)) = batch.take() {
            self.apply_batch(&transactions[first..], changes, registry, shapes, &mut done)
                .await?;
            done.stopped = failpoint != Failpoint::None;
        }
        Ok(done)
    }

    /// A transaction whose decoding failed: column drift may be explained by a
    /// reconfiguration recorded after the registry was loaded (with or since its DDL), so it
    /// is decoded once more with the registry as it is now; anything else blocks there.
    async fn redecode(
        &self,
        tx: &Transaction,
        e: anyhow::Error,
        registry: &mut Relations,
        shapes: &Shapes,
    ) -> Result<TxChanges> {
        let position = InTransaction(u64::from(tx.commit_lsn));
        if !column_drift(&e) {
            return Err(e.context(Decoding).context(position));
        }
        *registry = self.registry().await?;
        decode_changes(
            &self.materialize,
            &self.statements,
            tx,
            registry,
            shapes,
            &TxChanges::default(),
        )
        .await
        .context(Decoding)
        .context(position)
    }

    /// Materializes one transaction on its own.
    async fn apply_one(
        &self,
        tx: &Transaction,
        changes: TxChanges,
        registry: &mut Relations,
        done: &mut Applied,
    ) -> Result<()> {
        let span = Span {
            commit_lsn: tx.commit_lsn,
            end_lsn: tx.end_lsn,
            transactions: 1,
            commit_time: tx.commit_time,
        };
        self.apply(&span, changes, registry)
            .await
            .context(InTransaction(u64::from(tx.commit_lsn)))?;
        done.count += 1;
        done.last_end = Some(tx.end_lsn);
        Ok(())
    }

    /// Materializes a batch of plain transactions in one transaction. When that blocks, the
    /// batch's transactions are applied one by one instead, so the block names the exact
    /// source transaction (and those before it are applied).
    async fn apply_batch(
        &self,
        batch: &[Transaction],
        changes: TxChanges,
        registry: &mut Relations,
        shapes: &Shapes,
        done: &mut Applied,
    ) -> Result<()> {
        let last = batch.last().expect("a batch has a transaction");
        if batch.len() == 1 {
            return self.apply_one(last, changes, registry, done).await;
        }
        let span = Span {
            commit_lsn: last.commit_lsn,
            end_lsn: last.end_lsn,
            transactions: batch.len() as i64,
            commit_time: last.commit_time,
        };
        match self.apply(&span, changes, registry).await {
            Ok(()) => {
                done.count += batch.len();
                done.last_end = Some(last.end_lsn);
                Ok(())
            }
            Err(e) if block_site(&e).is_some() => {
                for tx in batch {
                    let changes = decode_changes(
                        &self.materialize,
                        &self.statements,
                        tx,
                        registry,
                        shapes,
                        &TxChanges::default(),
                    )
                    .await
                    .context(Decoding)
                    .context(InTransaction(u64::from(tx.commit_lsn)))?;
                    self.apply_one(tx, changes, registry, done).await?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Counts, per relation with a live rule, the projected rows that are in no scope
    /// although the rule was never asked about them (there should be none), when this leader
    /// has not yet or not for [`COVERAGE_INTERVAL`]; health reads the recorded counts.
    async fn count_coverage_if_due(&mut self) -> Result<()> {
        if self
            .last_coverage
            .is_some_and(|t| t.elapsed() < COVERAGE_INTERVAL)
        {
            return Ok(());
        }
        let uncovered: i64 = self
            .materialize
            .query_one("SELECT synchro.synchro_record_membership_coverage()", &[])
            .await?
            .get(0);
        if uncovered > 0 {
            tracing::error!(
                uncovered,
                "projected rows are in no scope although their rule was never asked about them \
                 (health: membership_coverage); re-register the relation's rule to stage it again"
            );
        }
        self.last_coverage = Some(Instant::now());
        Ok(())
    }

    /// Records the heartbeat when the step applied no source transaction and the last one
    /// is older than [`HEARTBEAT_INTERVAL`] (every applied transaction writes it; staging
    /// batches do not: a rule staged over many rows left it stale for the whole staging),
    /// or when the registry generation loaded is not the one recorded. With it go what
    /// readiness compares: when the worker was last caught up (`caught_up`, Unix
    /// microseconds: everything committed before then is applied), the generation applied,
    /// and, once everything received is applied, the position received, recorded as
    /// acknowledgeable before the slot is told (idle confirmation, so the slot does not
    /// retain unrelated WAL, which readiness bounds; never past what is recorded).
    async fn heartbeat(&mut self, transactions: usize, caught_up: Option<i64>) -> Result<()> {
        let generation = self
            .loaded_generation
            .load(std::sync::atomic::Ordering::Relaxed);
        if transactions > 0 {
            self.last_heartbeat = Instant::now(); // each apply wrote it
        }
        let received = match (caught_up, self.stream.as_ref()) {
            (Some(_), Some(stream)) => stream.idle_position(),
            _ => None,
        };
        // (Unrelated WAL is confirmed at once when there is much of it, otherwise with the
        // heartbeat: the record itself is WAL, which a walsender reports in a keepalive, so
        // recording every idle position would write for ever.)
        if self.last_heartbeat.elapsed() >= HEARTBEAT_INTERVAL
            || self.recorded_generation != Some(generation)
            || (caught_up.is_some() && !self.recorded_caught_up)
            || received.is_some_and(|(_, unconfirmed)| unconfirmed >= IDLE_CONFIRM_BYTES)
        {
            let received = received.map(|(at, _)| at);
            self.materialize
                .execute(
                    "UPDATE synchro.capture_state
                        SET heartbeat_at = now(), applied_registry_generation = $1,
                            caught_up_at = greatest(caught_up_at, to_timestamp($2::bigint / 1000000.0)),
                            acknowledged_lsn = greatest(acknowledged_lsn, $3)",
                    &[&generation, &caught_up, &received],
                )
                .await?;
            self.last_heartbeat = Instant::now();
            self.recorded_generation = Some(generation);
            self.recorded_caught_up |= caught_up.is_some();
            if let (Some(target), Some(stream)) = (received, self.stream.as_mut()) {
                stream
                    .confirm_idle(target, &self.control, &self.slot)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Whether an error is column drift of a registered relation (an added, missing or retyped
/// column), which a reconfiguration recorded after the registry was loaded may explain.
fn column_drift(e: &anyhow::Error) -> bool {
    matches!(
        block_site(e).and_then(|s| s.detail),
        Some(
            BlockDetail::ColumnAdded | BlockDetail::ColumnMissing | BlockDetail::ColumnTypeChanged
        )
    )
}
