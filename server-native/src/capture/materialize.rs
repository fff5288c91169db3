//! Materialization of one decoded source transaction, or of a batch of consecutive ones
//! reduced to their final row states, in one transaction of the materialization session
//! (see [`Span`]): the dependency rows' images before it, the projection writes,
//! membership of every touched row and of every target row an impact function names, the
//! bootstraps it completes, then progress, notification and commit together.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};
use futures_util::FutureExt;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::{evaluation_failure, InRelation};
use super::heartbeat::Phase;
use super::membership::{column_image, membership_round, EvalRow};
use super::reconfigure::{self, Activation};
use super::registry::{Pending, Relations, Status};
use super::staging::{record_staging_failure, stage_rows, StagingRestarted};
use super::statements::{in_transaction, Statements};
use super::transaction::{FinalRow, RowKey, TxChanges};
use super::Worker;

/// Dependency events per impact function call (one statement each).
const IMPACT_CHUNK: usize = 2000;

/// A touched row of one relation, in its final state.
struct RowChange {
    seq: usize,
    pk: String,
    version: String,
    row: Option<String>,
}

/// The touched rows grouped by relation: relations in the order of their first change,
/// each relation's rows in change order.
struct ByRelation {
    order: Vec<u32>,
    rows: HashMap<u32, Vec<RowChange>>,
}

impl ByRelation {
    fn group(finals: HashMap<RowKey, FinalRow>) -> ByRelation {
        let mut rows: HashMap<u32, Vec<RowChange>> = HashMap::new();
        for (key, f) in finals {
            rows.entry(key.relation).or_default().push(RowChange {
                seq: f.seq,
                pk: key.pk,
                version: f.version,
                row: f.row,
            });
        }
        let mut order: Vec<u32> = rows.keys().copied().collect();
        order.sort_by_key(|r| rows[r].iter().map(|c| c.seq).min());
        for changes in rows.values_mut() {
            changes.sort_by_key(|c| c.seq);
        }
        ByRelation { order, rows }
    }
}

/// A relation whose membership this transaction evaluates, with the rows to evaluate.
struct Target {
    relation: u32,
    rows: Vec<EvalRow>,
}

/// The source transactions one materialization transaction applies: consecutive in commit
/// order, ending at a transaction-end boundary (the last one's), which is the only state
/// it makes visible — every effect, cursor and digest a reader can see is still at a source
/// transaction's end (docs/protocol-decisions.md, "Batched materialization").
pub(super) struct Span {
    /// Commit LSN of the last transaction.
    pub(super) commit_lsn: PgLsn,
    /// End LSN of the last transaction: the progress recorded.
    pub(super) end_lsn: PgLsn,
    /// How many source transactions.
    pub(super) transactions: i64,
    /// Commit time of the last transaction (microseconds since 2000-01-01 UTC).
    pub(super) commit_time: i64,
}

/// Rows' projected JSON at the start of the transaction (`None` when absent).
type OldImages = HashMap<RowKey, Option<String>>;

impl Worker {
    /// Applies a decoded transaction (or batch) and records its progress, atomically;
    /// afterwards the relations it bootstrapped are active.
    pub(super) async fn apply(
        &self,
        tx: &Span,
        changes: TxChanges,
        registry: &mut Relations,
    ) -> Result<()> {
        let TxChanges {
            finals,
            bootstrapped,
            reconfigured,
            seq: _,
        } = changes;
        let db = &self.materialize;
        // A reconfiguration this transaction activates: the transaction is applied with the
        // new generation's fields (its own changes of that relation were skipped: the stage
        // covers them). A failure leaves the step, which reloads the registry.
        let activations = reconfigure::load(db, registry, &reconfigured).await?;
        for a in &activations {
            a.install(registry);
        }
        in_transaction(
            db,
            self.write(tx, finals, &bootstrapped, &activations, registry),
        )
        .await?;
        for reg in registry.values_mut() {
            if bootstrapped.contains(&reg.relation_id) {
                reg.status = Status::Active;
            }
        }
        for a in &activations {
            if a.retirement {
                registry.remove(&a.relation);
                for r in registry.values_mut() {
                    r.impacts.retain(|i| i.target != a.relation);
                }
            } else if let Some(reg) = registry.get_mut(&a.relation) {
                reg.status = Status::Active;
            }
        }
        if !activations.is_empty() {
            tracing::info!(count = activations.len(), "reconfiguration activated");
        }
        if !bootstrapped.is_empty() || !activations.is_empty() {
            self.analyze_materialized().await;
        }
        Ok(())
    }

    /// Everything a transaction writes, ending with its COMMIT.
    async fn write(
        &self,
        tx: &Span,
        mut finals: HashMap<RowKey, FinalRow>,
        bootstrapped: &[String],
        activations: &[Activation],
        registry: &Relations,
    ) -> Result<()> {
        let db = &self.materialize;
        let commit_lsn = u64::from(tx.commit_lsn);
        let mut seq = finals.values().map(|f| f.seq).max().unwrap_or(0);
        let mut diffs = Vec::with_capacity(activations.len());
        for a in activations {
            let diff = a
                .diff(db, registry, commit_lsn, &mut finals, &mut seq)
                .await
                .map_err(|e| e.context(InRelation(a.relation_id.clone())))?;
            diffs.push(diff);
        }
        let old_images = old_images(db, &self.statements, registry, &finals).await?;
        let changed = ByRelation::group(finals);
        write_projections(db, &self.statements, registry, &changed).await?;
        let targets = self.targets(registry, &changed, &old_images).await?;
        let mut effects = self.evaluate(registry, &targets).await?;
        effects += self
            .finish_bootstraps(registry, bootstrapped, commit_lsn)
            .await?;
        for (a, diff) in activations.iter().zip(&diffs) {
            self.heartbeat
                .report(Phase::Activating, Some(&a.relation_id), None, None);
            a.record_scopes(db, diff).await?;
            a.activate(db, commit_lsn, diff).await?;
        }
        if !activations.is_empty() || !bootstrapped.is_empty() {
            // A manifest waiting for this activation or table may be served from this commit
            // (api::events checks, and tells clients to connect when it is).
            db.batch_execute("NOTIFY synchro_schema").await?;
        }
        commit(db, &self.statements, effects, tx).await
    }

    /// Membership against the transaction's final projected state: each touched row once,
    /// with the version of its last change, in change order; then every target row an
    /// impact function named (old and new state), at its current version.
    async fn targets(
        &self,
        registry: &Relations,
        changed: &ByRelation,
        old_images: &OldImages,
    ) -> Result<Vec<Target>> {
        let db = &self.materialize;
        let mut targets: Vec<Target> = changed
            .order
            .iter()
            .map(|rel| Target {
                relation: *rel,
                rows: changed.rows[rel]
                    .iter()
                    .map(|c| EvalRow {
                        pk: c.pk.clone(),
                        version: c.version.clone(),
                        exists: c.row.is_some(),
                    })
                    .collect(),
            })
            .collect();
        for rel in &changed.order {
            let reg = &registry[rel];
            for impact in &reg.impacts {
                let (mut olds, mut news) = (Vec::new(), Vec::new());
                for c in &changed.rows[rel] {
                    let key = RowKey {
                        relation: *rel,
                        pk: c.pk.clone(),
                    };
                    let old = old_images.get(&key).cloned().flatten();
                    olds.push(old.map(|o| column_image(reg, &o)).transpose()?);
                    news.push(c.row.as_ref().map(|n| column_image(reg, n)).transpose()?);
                }
                let target = &registry[&impact.target];
                // In chunks, reporting progress: one statement for 50,000 events gave no
                // sign of life for as long as it ran.
                let mut named = Vec::new();
                let mut seen = HashSet::new();
                for (i, (olds, news)) in olds
                    .chunks(IMPACT_CHUNK)
                    .zip(news.chunks(IMPACT_CHUNK))
                    .enumerate()
                {
                    self.heartbeat.report(
                        Phase::Impacts,
                        Some(&target.relation_id),
                        Some((i * IMPACT_CHUNK) as i64),
                        Some(changed.rows[rel].len() as i64),
                    );
                    let keys = self
                        .functions
                        .impacted(db, impact, target, olds, news)
                        .await
                        .map_err(|e| e.context(InRelation(target.relation_id.clone())))?;
                    named.extend(keys.into_iter().filter(|k| seen.insert(k.clone())));
                }
                let entry = match targets.iter().position(|t| t.relation == impact.target) {
                    Some(i) => i,
                    None => {
                        targets.push(Target {
                            relation: impact.target,
                            rows: Vec::new(),
                        });
                        targets.len() - 1
                    }
                };
                let present: HashSet<&str> =
                    targets[entry].rows.iter().map(|r| r.pk.as_str()).collect();
                let fresh: Vec<&str> = named
                    .iter()
                    .map(String::as_str)
                    .filter(|pk| !present.contains(pk))
                    .collect();
                for r in db
                    .query(&self.statements.versions, &[&target.relation_id, &fresh])
                    .await?
                {
                    targets[entry].rows.push(EvalRow {
                        pk: r.get(0),
                        version: r.get(1),
                        exists: true,
                    });
                }
            }
        }
        Ok(targets)
    }

    /// Evaluates each target under its live rule, and re-stages the rows a staged rule has
    /// already covered from their final state. Returns the scope effects written.
    async fn evaluate(&self, registry: &Relations, targets: &[Target]) -> Result<usize> {
        let db = &self.materialize;
        let mut effects = 0;
        for Target { relation, rows } in targets {
            let reg = &registry[relation];
            self.heartbeat.report(
                Phase::Membership,
                Some(&reg.relation_id),
                None,
                Some(rows.len() as i64),
            );
            if let Some(m) = reg.live_membership() {
                let in_relation = |e: anyhow::Error| e.context(InRelation(reg.relation_id.clone()));
                let eval = self
                    .functions
                    .membership(db, &m.function, &m.key_type)
                    .await
                    .map_err(in_relation)?;
                effects += membership_round(db, &self.statements, &eval, reg, m.fanout, rows)
                    .await
                    .map_err(in_relation)?;
            }
            // A staged rule: rows already staged are re-staged from this final state.
            if let (
                Some(m),
                Some(Pending {
                    function: pending,
                    staged_through: Some(through),
                    epoch,
                    failed: false,
                }),
            ) = (&reg.membership, &reg.pending)
            {
                let staged: Vec<&EvalRow> = rows
                    .iter()
                    .filter(|r| r.pk.as_bytes() <= through.as_bytes())
                    .collect();
                if !staged.is_empty() {
                    // The staging must still be the one loaded, and stay so until this
                    // commits (a re-registration waits for the lock, then resets it).
                    let current: Option<i64> = db
                        .query_opt(
                            "SELECT staging_epoch FROM synchro.membership_functions
                              WHERE relation_id = $1 FOR SHARE",
                            &[&reg.relation_id],
                        )
                        .await?
                        .map(|r| r.get(0));
                    if current != Some(*epoch) {
                        bail!(StagingRestarted);
                    }
                    // A rule that is not live never blocks capture: a failed evaluation
                    // undoes only the re-staging and stops the staging.
                    db.batch_execute("SAVEPOINT staging").await?;
                    let restaged = async {
                        let eval = self.functions.membership(db, pending, &m.key_type).await?;
                        stage_rows(db, &eval, reg, m.fanout, &staged).await
                    }
                    .await;
                    match restaged {
                        Ok(()) => db.batch_execute("RELEASE SAVEPOINT staging").await?,
                        Err(e) => match evaluation_failure(&e) {
                            Some(failure) => {
                                db.batch_execute("ROLLBACK TO SAVEPOINT staging").await?;
                                record_staging_failure(db, reg, *epoch, failure).await?;
                            }
                            None => return Err(e),
                        },
                    }
                }
            }
        }
        Ok(effects)
    }
}

/// Dependency rows' state at the start of the transaction, for impact functions: every
/// touched row of a relation that has impacts.
async fn old_images(
    db: &Client,
    statements: &Statements,
    registry: &Relations,
    finals: &HashMap<RowKey, FinalRow>,
) -> Result<OldImages> {
    let mut old_images = OldImages::new();
    for key in finals.keys() {
        if !registry[&key.relation].impacts.is_empty() {
            old_images.insert(key.clone(), None);
        }
    }
    let relations: HashSet<u32> = old_images.keys().map(|k| k.relation).collect();
    for rel in relations {
        let pks: Vec<&str> = old_images
            .keys()
            .filter(|k| k.relation == rel)
            .map(|k| k.pk.as_str())
            .collect();
        let rows = db
            .query(
                &statements.current_rows,
                &[&registry[&rel].relation_id, &pks],
            )
            .await?;
        for r in rows {
            let key = RowKey {
                relation: rel,
                pk: r.get(0),
            };
            old_images.insert(key, Some(r.get(1)));
        }
    }
    Ok(old_images)
}

/// One relation's projection writes, as parallel arrays for `unnest`.
struct ProjectionWrite<'a> {
    relation_id: &'a String,
    deleted: Vec<&'a str>,
    pks: Vec<&'a str>,
    rows: Vec<&'a str>,
    versions: Vec<&'a str>,
}

/// Projections: one delete and one upsert per relation, pipelined.
async fn write_projections(
    db: &Client,
    statements: &Statements,
    registry: &Relations,
    changed: &ByRelation,
) -> Result<()> {
    let batches: Vec<ProjectionWrite> = changed
        .order
        .iter()
        .map(|rel| {
            let mut batch = ProjectionWrite {
                relation_id: &registry[rel].relation_id,
                deleted: Vec::new(),
                pks: Vec::new(),
                rows: Vec::new(),
                versions: Vec::new(),
            };
            for c in &changed.rows[rel] {
                match &c.row {
                    None => batch.deleted.push(&c.pk),
                    Some(row) => {
                        batch.pks.push(&c.pk);
                        batch.rows.push(row);
                        batch.versions.push(&c.version);
                    }
                }
            }
            batch
        })
        .collect();
    let mut writes = Vec::new();
    for b in &batches {
        writes.push(
            async move {
                db.execute(&statements.delete, &[b.relation_id, &b.deleted])
                    .await
            }
            .boxed(),
        );
        writes.push(
            async move {
                db.execute(
                    &statements.upsert,
                    &[b.relation_id, &b.pks, &b.rows, &b.versions],
                )
                .await
            }
            .boxed(),
        );
    }
    futures_util::future::try_join_all(writes).await?;
    Ok(())
}

/// Progress, the notification (when there are effects) and COMMIT, pipelined.
async fn commit(db: &Client, statements: &Statements, effects: usize, span: &Span) -> Result<()> {
    let notify = async {
        if effects > 0 {
            // Wakes change-notification streams at commit; carries no data.
            db.batch_execute("NOTIFY synchro_effects").await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let progress = async {
        db.execute(
            &statements.progress,
            &[&span.end_lsn, &span.transactions, &span.commit_time],
        )
        .await
    };
    let commit = db.batch_execute("COMMIT");
    futures_util::try_join!(notify, progress, commit)?;
    Ok(())
}
