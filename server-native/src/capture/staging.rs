//! A changed membership contract, applied without a gap: a pending rule is staged in
//! bounded batches beside the live one (`synchro.membership_staged_edges`) and activated
//! atomically once every row is staged; a changed contract without a pending rule
//! (a dependency's generation) re-evaluates every row in one transaction.

use std::collections::HashMap;

use anyhow::{Context, Result};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::{evaluation_failure, BlockDetail};
use super::membership::{evaluate, reevaluate_relation, rowless_version, Eval, EvalRow};
use super::registry::Registered;
use super::statements::{in_transaction, Statements};
use super::Worker;

/// Raises the membership generation of these scopes: their cursors and rebuild sessions
/// are stale, every other scope stays resumable.
pub(super) const BUMP_GENERATIONS: &str =
    "INSERT INTO synchro.scope_retention AS r (scope_id, membership_generation)
     SELECT s, 2 FROM unnest($1::text[]) AS s
     ON CONFLICT (scope_id) DO UPDATE SET membership_generation = r.membership_generation + 1";

/// How one staging batch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Staged {
    /// The batch was staged through this key (byte order).
    Through(String),
    /// The last batch was staged and the rule activated.
    Activated,
    /// The staging was restarted under the batch (a re-registration of the rule or of a
    /// dependency, or an incomplete staging found at activation): nothing was staged, and
    /// the registry must be loaded again.
    Restarted,
    /// The pending rule's evaluation failed: its staging stopped and says why
    /// (`membership_functions.staging_failed_*`); capture goes on under the live rule.
    Failed,
}

/// Records why a staging stopped, unless it was restarted meanwhile (another epoch), and
/// logs it (relation ID and codes only).
pub(super) async fn record_staging_failure(
    db: &Client,
    reg: &Registered,
    epoch: i64,
    (detail, sqlstate): (BlockDetail, Option<String>),
) -> Result<()> {
    db.execute(
        "UPDATE synchro.membership_functions
            SET staging_failed_detail = $3, staging_failed_sqlstate = $4, staging_failed_at = now()
          WHERE relation_id = $1 AND staging_epoch = $2",
        &[&reg.relation_id, &epoch, &detail.as_str(), &sqlstate],
    )
    .await?;
    tracing::error!(
        relation_id = reg.relation_id.as_str(),
        detail = detail.as_str(),
        sqlstate = sqlstate.as_deref(),
        "staged membership rule failed to evaluate; its staging stopped (capture goes on under the \
         live rule): fix the rule, then `synchro-server capture retry-staging`, or abandon it with \
         `synchro-server capture skip-staging`"
    );
    Ok(())
}

/// A transaction being applied found the staging it re-stages rows for restarted since the
/// registry was loaded: it is rolled back, and the next step applies it again.
#[derive(Debug, thiserror::Error)]
#[error("a staged membership rule was restarted while a transaction was applied")]
pub(crate) struct StagingRestarted;

/// Locks a pending rule's row and checks it is still the staging the worker loaded (same
/// epoch, same progress): a re-registration committed since then reset it, and a batch of the
/// old staging must not record its progress over the reset (rows would never be staged).
const LOCK_STAGING: &str = "SELECT staging_epoch, staged_through FROM synchro.membership_functions
                             WHERE relation_id = $1 AND pending_function_oid IS NOT NULL FOR UPDATE";

/// Projected rows the staging did not evaluate: neither staged edges nor an in-no-scope
/// record. Zero before an activation, always.
const UNSTAGED_ROWS: &str = "SELECT count(*) FROM synchro.projection_rows p
                              WHERE p.relation_id = $1
                                AND NOT EXISTS (SELECT 1 FROM synchro.membership_staged_edges s
                                                 WHERE s.relation_id = p.relation_id AND s.pk = p.pk)
                                AND NOT EXISTS (SELECT 1 FROM synchro.membership_staged_unscoped u
                                                 WHERE u.relation_id = p.relation_id AND u.pk = p.pk)";

impl Worker {
    /// Stages the next batch of a pending rule (rows after `staged_through`, byte order) in
    /// one transaction; when the batch is the last, activates the rule in that same
    /// transaction, once every projected row is accounted for.
    pub(super) async fn stage_batch(&self, reg: &Registered) -> Result<Staged> {
        let pending = reg.pending.as_ref().context("nothing pending")?;
        match self.stage_batch_of(reg).await {
            Err(e) => match evaluation_failure(&e) {
                Some(failure) => {
                    record_staging_failure(&self.materialize, reg, pending.epoch, failure).await?;
                    Ok(Staged::Failed)
                }
                None => Err(e),
            },
            staged => staged,
        }
    }

    /// [`Worker::stage_batch`], failing on a failed evaluation.
    async fn stage_batch_of(&self, reg: &Registered) -> Result<Staged> {
        let m = reg.membership.as_ref().context("no membership function")?;
        let pending = reg.pending.as_ref().context("nothing pending")?;
        let eval = self
            .functions
            .membership(&self.materialize, &pending.function, &m.key_type)
            .await?;
        let db = &self.materialize;
        let outcome = in_transaction(db, async {
            let current = db.query_opt(LOCK_STAGING, &[&reg.relation_id]).await?;
            let unchanged = current.is_some_and(|r| {
                r.get::<_, i64>(0) == pending.epoch
                    && r.get::<_, Option<String>>(1) == pending.staged_through
            });
            if !unchanged {
                db.batch_execute("ROLLBACK").await?;
                tracing::info!("membership staging restarted by a re-registration");
                return Ok(Staged::Restarted);
            }
            let batch: i64 = db
                .query_one(
                    "SELECT value::bigint FROM synchro.settings WHERE key = 'backfill_batch_size'",
                    &[],
                )
                .await?
                .get(0);
            let pks: Vec<String> = db
                .query(
                    "SELECT pk FROM synchro.projection_rows
                      WHERE relation_id = $1 AND ($2::text IS NULL OR pk COLLATE \"C\" > $2::text COLLATE \"C\")
                      ORDER BY pk COLLATE \"C\" LIMIT $3",
                    &[&reg.relation_id, &pending.staged_through, &batch],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let rows: Vec<EvalRow> = pks
                .iter()
                .map(|pk| EvalRow {
                    pk: pk.clone(),
                    version: String::new(),
                    exists: true,
                })
                .collect();
            stage_rows(db, &eval, reg, m.fanout, &rows.iter().collect::<Vec<_>>()).await?;
            let outcome = if (pks.len() as i64) < batch {
                let unstaged: i64 = db
                    .query_one(UNSTAGED_ROWS, &[&reg.relation_id])
                    .await?
                    .get(0);
                if unstaged > 0 {
                    // Never activate a rule that was not asked about every row: those rows
                    // would be in no scope. Stage it again from the start.
                    db.execute(
                        "SELECT synchro.synchro_restart_staging($1)",
                        &[&reg.relation_id],
                    )
                    .await?;
                    tracing::error!(
                        unstaged,
                        "staged membership rule left rows unevaluated; staging it again"
                    );
                    Staged::Restarted
                } else {
                    let at = confirmed_lsn(db).await?;
                    let effects = activate(db, &self.statements, reg, at).await?;
                    if effects > 0 {
                        db.batch_execute("NOTIFY synchro_effects").await?;
                    }
                    // A table is served once its rule is live (api::events checks the manifest).
                    db.batch_execute("NOTIFY synchro_schema").await?;
                    tracing::info!(effects, "staged membership rule activated");
                    Staged::Activated
                }
            } else {
                let last = pks.last().cloned().expect("a full batch");
                db.execute(
                    "UPDATE synchro.membership_functions SET staged_through = $2 WHERE relation_id = $1",
                    &[&reg.relation_id, &last],
                )
                .await?;
                Staged::Through(last)
            };
            db.batch_execute("COMMIT").await?;
            Ok::<_, anyhow::Error>(outcome)
        })
        .await?;
        if outcome == Staged::Activated {
            self.analyze_materialized().await;
        }
        Ok(outcome)
    }

    /// Re-evaluates every row of a relation whose membership contract changed, in one
    /// transaction at the worker's current position, and records the generation evaluated.
    pub(super) async fn reevaluate(&self, reg: &Registered) -> Result<()> {
        let m = reg.membership.as_ref().context("no membership function")?;
        let eval = self
            .functions
            .membership(&self.materialize, &m.function, &m.key_type)
            .await?;
        let db = &self.materialize;
        in_transaction(db, async {
            let at = confirmed_lsn(db).await?;
            let diff = reevaluate_relation(db, &self.statements, &eval, reg, at).await?;
            // Only scopes whose edge set changed get a new membership generation.
            db.execute(
                BUMP_GENERATIONS,
                &[&diff.changed.iter().collect::<Vec<_>>()],
            )
            .await?;
            db.execute(
                "UPDATE synchro.relation_capture SET membership_evaluated = $2, updated_at = now()
                  WHERE relation_id = $1",
                &[&reg.relation_id, &reg.contract.current],
            )
            .await?;
            if diff.effects > 0 {
                db.batch_execute("NOTIFY synchro_effects").await?;
            }
            db.batch_execute("COMMIT").await?;
            tracing::info!(
                effects = diff.effects,
                "membership re-evaluated under a changed contract"
            );
            Ok::<_, anyhow::Error>(())
        })
        .await?;
        self.analyze_materialized().await;
        Ok(())
    }
}

/// The position the worker has applied through.
async fn confirmed_lsn(db: &Client) -> Result<u64> {
    let at: PgLsn = db
        .query_one("SELECT confirmed_lsn FROM synchro.capture_state", &[])
        .await?
        .get(0);
    Ok(u64::from(at))
}

/// Replaces the staged edges of these rows with the pending rule's result over their
/// current projected state (rows that no longer exist get none).
pub(super) async fn stage_rows(
    db: &Client,
    eval: &Eval,
    reg: &Registered,
    fanout: i64,
    rows: &[&EvalRow],
) -> Result<()> {
    let pks: Vec<&str> = rows.iter().map(|r| r.pk.as_str()).collect();
    let scopes = evaluate(db, eval, rows.iter().copied(), fanout).await?;
    let (mut s_pks, mut s_scopes) = (Vec::new(), Vec::new());
    for (pk, set) in &scopes {
        for s in set {
            s_pks.push(*pk);
            s_scopes.push(s.as_str());
        }
    }
    db.execute(
        "DELETE FROM synchro.membership_staged_edges WHERE relation_id = $1 AND pk = ANY($2::text[])",
        &[&reg.relation_id, &pks],
    )
    .await?;
    db.execute(
        "INSERT INTO synchro.membership_staged_edges (relation_id, pk, scope_id)
         SELECT $1, k, s FROM unnest($2::text[], $3::text[]) AS a(k, s)",
        &[&reg.relation_id, &s_pks, &s_scopes],
    )
    .await?;
    // Rows evaluated to no scope are recorded as such: with the edges they account for
    // every staged row.
    let unscoped: Vec<&str> = scopes
        .iter()
        .filter(|(_, set)| set.is_empty())
        .map(|(pk, _)| *pk)
        .collect();
    db.execute(
        "DELETE FROM synchro.membership_staged_unscoped WHERE relation_id = $1 AND pk = ANY($2::text[])",
        &[&reg.relation_id, &pks],
    )
    .await?;
    if !unscoped.is_empty() {
        db.execute(
            "INSERT INTO synchro.membership_staged_unscoped (relation_id, pk)
             SELECT $1, k FROM unnest($2::text[]) AS k",
            &[&reg.relation_id, &unscoped],
        )
        .await?;
    }
    Ok(())
}

/// An edge the activation changes.
struct EdgeChange {
    /// `delete` (live, not staged) or `upsert` (staged, not live).
    kind: String,
    scope: String,
    pk: String,
}

/// Activates a fully staged rule: the live edges become the staged ones through a diff
/// (deletes then upserts per row, with each row's current version), the scopes that changed
/// get a new membership generation, and the pending function becomes the live one.
/// Returns the scope effects written.
pub(super) async fn activate(
    db: &Client,
    statements: &Statements,
    reg: &Registered,
    at: u64,
) -> Result<usize> {
    let diff = staged_diff(db, reg).await?;
    let changed = write_activation(db, statements, reg, &diff, at).await?;
    db.execute(BUMP_GENERATIONS, &[&changed]).await?;
    db.execute(
        "UPDATE synchro.membership_functions
            SET function_oid = pending_function_oid, function_signature = pending_signature,
                definition_sha256 = pending_sha256, membership_generation = membership_generation + 1,
                pending_function_oid = NULL, pending_signature = NULL, pending_sha256 = NULL,
                staged_through = NULL, staging_started_at = NULL, live = true
          WHERE relation_id = $1",
        &[&reg.relation_id],
    )
    .await?;
    db.execute(
        // Every row was just accounted for (the activation's precondition).
        "UPDATE synchro.relation_capture
            SET membership_evaluated = $2, updated_at = now(), uncovered_rows = 0, coverage_checked_at = now()
          WHERE relation_id = $1",
        &[&reg.relation_id, &(reg.contract.current + 1)],
    )
    .await?;
    // The staged in-no-scope records become the live ones.
    for sql in [
        "DELETE FROM synchro.membership_unscoped WHERE relation_id = $1",
        "INSERT INTO synchro.membership_unscoped (relation_id, pk)
         SELECT relation_id, pk FROM synchro.membership_staged_unscoped WHERE relation_id = $1",
        "DELETE FROM synchro.membership_staged_unscoped WHERE relation_id = $1",
        "DELETE FROM synchro.membership_staged_edges WHERE relation_id = $1",
    ] {
        db.execute(sql, &[&reg.relation_id]).await?;
    }
    Ok(diff.len())
}

/// The live edges against the staged ones, ordered by key, deletes first, then scope
/// (byte order).
async fn staged_diff(db: &Client, reg: &Registered) -> Result<Vec<EdgeChange>> {
    let mut diff: Vec<EdgeChange> = db
        .query(
            "(SELECT 'delete', scope_id, pk FROM synchro.membership_edges WHERE relation_id = $1
              EXCEPT SELECT 'delete', scope_id, pk FROM synchro.membership_staged_edges WHERE relation_id = $1)
             UNION ALL
             (SELECT 'upsert', scope_id, pk FROM synchro.membership_staged_edges WHERE relation_id = $1
              EXCEPT SELECT 'upsert', scope_id, pk FROM synchro.membership_edges WHERE relation_id = $1)",
            &[&reg.relation_id],
        )
        .await?
        .iter()
        .map(|r| EdgeChange {
            kind: r.get(0),
            scope: r.get(1),
            pk: r.get(2),
        })
        .collect();
    diff.sort_by(|a, b| {
        (a.pk.as_bytes(), a.kind != "delete", a.scope.as_bytes()).cmp(&(
            b.pk.as_bytes(),
            b.kind != "delete",
            b.scope.as_bytes(),
        ))
    });
    Ok(diff)
}

/// Writes the activation's edges and scope effects (each at its row's current version, or
/// a rowless version); returns the scopes that changed (sorted, distinct).
async fn write_activation<'a>(
    db: &Client,
    statements: &Statements,
    reg: &Registered,
    diff: &'a [EdgeChange],
    at: u64,
) -> Result<Vec<&'a str>> {
    let pks: Vec<&str> = diff.iter().map(|c| c.pk.as_str()).collect();
    let versions: HashMap<String, String> = db
        .query(&statements.versions, &[&reg.relation_id, &pks])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (mut removed_scopes, mut removed_pks, mut added_scopes, mut added_pks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut e_scopes, mut e_pks, mut e_kinds, mut e_versions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, c) in diff.iter().enumerate() {
        if c.kind == "delete" {
            removed_scopes.push(c.scope.as_str());
            removed_pks.push(c.pk.as_str());
        } else {
            added_scopes.push(c.scope.as_str());
            added_pks.push(c.pk.as_str());
        }
        e_scopes.push(c.scope.as_str());
        e_pks.push(c.pk.as_str());
        e_kinds.push(c.kind.as_str());
        e_versions.push(
            versions
                .get(&c.pk)
                .cloned()
                .unwrap_or_else(|| rowless_version(at, i + 1)),
        );
    }
    db.execute(
        &statements.delete_edges,
        &[&reg.relation_id, &removed_scopes, &removed_pks],
    )
    .await?;
    db.execute(
        &statements.insert_edges,
        &[&reg.relation_id, &added_scopes, &added_pks],
    )
    .await?;
    db.execute(
        &statements.insert_effects,
        &[&reg.relation_id, &e_scopes, &e_pks, &e_kinds, &e_versions],
    )
    .await?;
    let mut changed = e_scopes;
    changed.sort_unstable();
    changed.dedup();
    Ok(changed)
}
