//! Bootstrap of a newly registered relation: its rows are copied into the projection in a
//! transaction that holds a SHARE lock on the source (see migration 0007) and emits a
//! bootstrap message; when the stream reaches that message, the copied rows' membership is
//! evaluated and the relation becomes active (changes committed before the copy are covered
//! by it, changes after it apply).

use anyhow::{Context, Result};
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, Transaction};

use super::block::{BlockReason, Blocked};
use super::membership::{reevaluate_relation, Eval};
use super::pgoutput::Value;
use super::registry::{by_id, Registered, Relations};
use super::row::{key_text, row_json, Column, RelationShape};
use super::statements::Statements;
use super::Worker;

impl Worker {
    /// Copies one pending relation into its projection and emits the bootstrap message, in
    /// one transaction. A lock that cannot be taken within the timeout leaves the relation
    /// pending for the next step.
    pub(super) async fn bootstrap(
        &mut self,
        registry: &Relations,
        relation_id: &str,
    ) -> Result<()> {
        let reg = by_id(registry, relation_id).context("bootstrap of an unknown relation")?;
        let columns: Vec<Column> = self
            .materialize
            .query(
                "SELECT column_name, type_oid, type_modifier FROM synchro.synchro_bootstrap_columns($1)",
                &[&relation_id],
            )
            .await?
            .iter()
            .map(|r| Column {
                name: r.get(0),
                type_oid: r.get(1),
                type_modifier: r.get(2),
            })
            .collect();
        let shape = RelationShape {
            namespace: reg.schema.clone(),
            name: reg.relation.clone(),
            replica_identity: reg.replica_identity,
            columns,
        };
        let db = self.materialize.transaction().await?;
        db.batch_execute("SET LOCAL lock_timeout = '10s'").await?;
        if let Err(e) = db
            .execute("SELECT synchro.synchro_bootstrap_lock($1)", &[&relation_id])
            .await
        {
            return match e.code().map(|c| c.code()) {
                Some("55P03") => {
                    tracing::warn!("bootstrap lock not available; retrying later");
                    Ok(())
                }
                Some("55000") => Err(Blocked(BlockReason::RegisteredRelationDrift).into()),
                _ => Err(e.into()),
            };
        }
        let copied = copy_rows(&db, reg, &shape).await?;
        db.execute(
            "UPDATE synchro.relation_capture SET status = 'copied', rows_copied = $2, updated_at = now()
              WHERE relation_id = $1",
            &[&relation_id, &copied],
        )
        .await?;
        db.execute("SELECT synchro.synchro_emit_bootstrap($1)", &[&relation_id])
            .await?;
        db.commit().await?;
        tracing::info!(rows = copied, "relation bootstrapped");
        self.analyze_materialized().await;
        Ok(())
    }

    /// Completes the bootstraps whose messages a transaction carries (inside its
    /// materialization transaction), then re-evaluates every dependent target, which was
    /// evaluated without the copied rows. Returns the scope effects written.
    pub(super) async fn finish_bootstraps(
        &self,
        registry: &Relations,
        bootstrapped: &[String],
        commit: u64,
    ) -> Result<usize> {
        let db = &self.materialize;
        let mut effects = 0;
        for relation_id in bootstrapped {
            let copied = by_id(registry, relation_id);
            let eval = match copied.and_then(Registered::live_membership) {
                Some(m) => Some(
                    self.functions
                        .membership(db, &m.function, &m.key_type)
                        .await?,
                ),
                None => None,
            };
            effects += finish_bootstrap(
                db,
                &self.statements,
                eval.as_ref(),
                registry,
                relation_id,
                commit,
            )
            .await?;
            // Its dependents were evaluated without its rows: re-evaluate all of them.
            for impact in copied.map(|r| r.impacts.clone()).unwrap_or_default() {
                let target = &registry[&impact.target];
                if let Some(m) = target.live_membership() {
                    let eval = self
                        .functions
                        .membership(db, &m.function, &m.key_type)
                        .await?;
                    effects += reevaluate_relation(db, &self.statements, &eval, target, commit)
                        .await?
                        .effects;
                }
            }
        }
        Ok(effects)
    }
}

/// Copies every source row through `synchro_bootstrap_rows` in batches of 5000, at versions
/// `<WAL insert LSN>:b<n>`, replacing the projection; each batch goes in through a binary
/// `COPY` (cheaper per row than `INSERT … unnest`). Returns the rows copied.
async fn copy_rows(db: &Transaction<'_>, reg: &Registered, shape: &RelationShape) -> Result<i64> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;

    let relation_id = &reg.relation_id;
    let lsn: String = db
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    db.execute(
        "DELETE FROM synchro.projection_rows WHERE relation_id = $1",
        &[relation_id],
    )
    .await?;
    let literal = relation_id.replace('\'', "''");
    db.batch_execute(&format!(
        "DECLARE synchro_bootstrap NO SCROLL CURSOR FOR SELECT * FROM synchro.synchro_bootstrap_rows('{literal}')"
    ))
    .await?;
    let mut copied: i64 = 0;
    loop {
        let rows = db.query("FETCH 5000 FROM synchro_bootstrap", &[]).await?;
        if rows.is_empty() {
            break;
        }
        // A session in COPY takes no other command: one COPY per fetched batch.
        let sink = db
            .copy_in(
                "COPY synchro.projection_rows (relation_id, pk, row_json, server_version) FROM STDIN BINARY",
            )
            .await?;
        let writer =
            BinaryCopyInWriter::new(sink, &[Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT]);
        futures_util::pin_mut!(writer);
        for r in &rows {
            let values: Vec<Value> = r
                .get::<_, Vec<Option<String>>>(0)
                .into_iter()
                .map(|v| v.map_or(Value::Null, |t| Value::Text(t.into_bytes())))
                .collect();
            copied += 1;
            let pk = key_text(reg, shape, &values)?;
            let json = row_json(reg, shape, &values, None)?;
            let version = format!("{lsn}:b{copied}");
            writer
                .as_mut()
                .write(&[relation_id, &pk, &json, &version])
                .await?;
        }
        writer.as_mut().finish().await?;
    }
    db.batch_execute("CLOSE synchro_bootstrap").await?;
    Ok(copied)
}

/// Completes a bootstrap when the stream reaches its message: evaluates membership of every
/// copied row (and of every row that still has edges) and marks the relation active.
async fn finish_bootstrap(
    db: &Client,
    statements: &Statements,
    eval: Option<&Eval>,
    registry: &Relations,
    relation_id: &str,
    commit: u64,
) -> Result<usize> {
    let mut effects = 0;
    if let (Some(reg), Some(eval)) = (by_id(registry, relation_id), eval) {
        effects += reevaluate_relation(db, statements, eval, reg, commit)
            .await?
            .effects;
    }
    let contract = by_id(registry, relation_id).map_or(0, |r| r.contract.current);
    db.execute(
        "UPDATE synchro.relation_capture SET status = 'active', bootstrap_lsn = $2,
                membership_evaluated = $3, updated_at = now()
          WHERE relation_id = $1",
        &[&relation_id, &PgLsn::from(commit), &contract],
    )
    .await?;
    Ok(effects)
}
