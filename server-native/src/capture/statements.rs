//! The SQL the worker prepares once per session, and the explicit transaction it wraps
//! each unit of work in.

use std::future::Future;

use anyhow::Result;
use tokio_postgres::{Client, Statement};

/// Statements the worker prepares once per session.
pub(super) struct Statements {
    /// A row's projected JSON (unchanged TOAST values come from it).
    pub(super) previous: Statement,
    /// Projected JSON of some rows of a relation (impact functions' old images).
    pub(super) current_rows: Statement,
    /// Current versions of some rows of a relation, in key order.
    pub(super) versions: Statement,
    /// Deletes projection rows.
    pub(super) delete: Statement,
    /// Writes projection rows with their versions.
    pub(super) upsert: Statement,
    /// The membership edges of some rows.
    pub(super) old_edges: Statement,
    /// Removes `(scope, pk)` edges.
    pub(super) delete_edges: Statement,
    /// Adds `(scope, pk)` edges.
    pub(super) insert_edges: Statement,
    /// Records scope effects in the order given.
    pub(super) insert_effects: Statement,
    /// Replaces the in-no-scope records of some rows (`$2`) with those of `$3`.
    pub(super) unscoped: Statement,
    /// Records the end LSN of the last applied transaction, how many were applied, and the
    /// heartbeat.
    pub(super) progress: Statement,
}

impl Statements {
    /// Prepares every statement on `db`.
    pub(super) async fn prepare(db: &Client) -> Result<Statements> {
        Ok(Statements {
            previous: db
                .prepare("SELECT row_json FROM synchro.projection_rows WHERE relation_id = $1 AND pk = $2")
                .await?,
            current_rows: db
                .prepare(
                    "SELECT pk, row_json FROM synchro.projection_rows
                      WHERE relation_id = $1 AND pk = ANY($2::text[])",
                )
                .await?,
            versions: db
                .prepare(
                    "SELECT pk, server_version FROM synchro.projection_rows
                      WHERE relation_id = $1 AND pk = ANY($2::text[]) ORDER BY pk",
                )
                .await?,
            delete: db
                .prepare("DELETE FROM synchro.projection_rows WHERE relation_id = $1 AND pk = ANY($2::text[])")
                .await?,
            upsert: db
                .prepare(
                    "INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
                     SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[])
                     ON CONFLICT (relation_id, pk) DO UPDATE SET row_json = EXCLUDED.row_json,
                         server_version = EXCLUDED.server_version",
                )
                .await?,
            old_edges: db
                .prepare(
                    "SELECT pk, scope_id FROM synchro.membership_edges
                      WHERE relation_id = $1 AND pk = ANY($2::text[])",
                )
                .await?,
            delete_edges: db
                .prepare(
                    // `pk = ANY` keeps the plan an index probe (a join on the relation
                    // alone scans all of its edges: measured linear growth).
                    "DELETE FROM synchro.membership_edges e
                      WHERE e.relation_id = $1 AND e.pk = ANY($3::text[])
                        AND (e.scope_id, e.pk) IN (SELECT * FROM unnest($2::text[], $3::text[]))",
                )
                .await?,
            insert_edges: db
                .prepare(
                    "INSERT INTO synchro.membership_edges (scope_id, relation_id, pk)
                     SELECT s, $1, k FROM unnest($2::text[], $3::text[]) AS a(s, k)",
                )
                .await?,
            insert_effects: db
                .prepare(
                    "INSERT INTO synchro.scope_effects (scope_id, relation_id, pk, kind, server_version)
                     SELECT s, $1, k, kind, v FROM unnest($2::text[], $3::text[], $4::text[], $5::text[])
                            WITH ORDINALITY AS a(s, k, kind, v, n)
                      ORDER BY n",
                )
                .await?,
            unscoped: db
                .prepare(
                    "WITH gone AS (
                         DELETE FROM synchro.membership_unscoped
                          WHERE relation_id = $1 AND pk = ANY($2::text[]) AND pk <> ALL($3::text[]))
                     INSERT INTO synchro.membership_unscoped (relation_id, pk)
                     SELECT $1, k FROM unnest($3::text[]) AS k
                     ON CONFLICT DO NOTHING",
                )
                .await?,
            progress: db
                .prepare(
                    "UPDATE synchro.capture_state SET confirmed_lsn = $1,
                            acknowledged_lsn = greatest(acknowledged_lsn, $1),
                            materialized_commit_at = timestamptz '2000-01-01 00:00:00+00'
                                                     + $3::bigint * interval '1 microsecond',
                            applied_transactions = applied_transactions + $2::bigint, heartbeat_at = now()",
                )
                .await?,
        })
    }
}

/// Runs `body` inside `BEGIN` on the materialization session; `body` commits. On an error
/// the transaction is rolled back (a failed rollback is ignored: the session is then
/// unusable and the step fails anyway).
pub(super) async fn in_transaction<T>(
    db: &Client,
    body: impl Future<Output = Result<T>>,
) -> Result<T> {
    db.batch_execute("BEGIN").await?;
    let result = body.await;
    if result.is_err() {
        let _ = db.batch_execute("ROLLBACK").await;
    }
    result
}
