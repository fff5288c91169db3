//! The capture worker: decodes the publication through the logical slot in commit order and
//! applies each complete source transaction to the synced projections, together with its
//! progress row, in one transaction; only after that commit does it advance the slot.
//!
//! Exactly once: a crash after the commit but before the slot advance replays transactions
//! whose end LSN is at or below the recorded `confirmed_lsn`; they are skipped. A crash
//! before the commit leaves nothing applied. One worker per database holds an advisory
//! lock. Drift of a registered relation (renamed, moved, recreated, other replica identity)
//! or a value its portable type cannot hold blocks capture durably with a bounded reason;
//! the transaction is neither applied nor acknowledged.
//!
//! Two sessions: `replication` (the worker login, which has REPLICATION) peeks and advances
//! the slot; `materialize` runs `SET ROLE synchro_worker` and writes projections. Row
//! versions are `<commit LSN>:<ordinal>` strings, opaque to clients. (Versions allocated by
//! a source-trigger fence before the row changes arrive with push.)

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use synchro_protocol::types::{DecimalSpec, FieldSpec, PortableType};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::pgoutput::{decode, Message, Value};
use super::values::{text_to_wire, SESSION_SETTINGS};

/// Advisory lock key of the capture leader ("synchro" in ASCII).
pub const LEADER_LOCK: i64 = 0x73796e6368726f;

/// Changes read per peek.
const PEEK_CHANGES: i32 = 10_000;

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Another worker is the leader.
    NotLeader,
    /// Capture is blocked (bounded reason).
    Blocked(String),
    /// Applied this many source transactions (0 when caught up).
    Applied(usize),
}

/// A fault to inject in tests, standing in for a crash at a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// None.
    None,
    /// Stop after committing the first transaction, before advancing the slot.
    AfterCommitBeforeAdvance,
}

struct Field {
    field_id: String,
    spec: FieldSpec,
    is_key: bool,
}

struct Registered {
    relation_id: String,
    schema: String,
    relation: String,
    replica_identity: u8,
    fields_by_column: HashMap<String, Field>,
    /// `(function as regproc text, key type as regtype text, fanout bound)` when the
    /// relation has a membership function.
    membership: Option<(String, String, i64)>,
}

struct RelationShape {
    namespace: String,
    name: String,
    replica_identity: u8,
    columns: Vec<(String, u32)>,
}

/// The capture worker of one database.
pub struct Worker {
    replication: Client,
    materialize: Client,
    slot: String,
}

fn block_reason(e: &anyhow::Error) -> Option<&'static str> {
    e.chain()
        .find_map(|c| c.downcast_ref::<Blocked>())
        .map(|b| b.0)
}

/// A blocking condition (bounded reason code).
#[derive(Debug, thiserror::Error)]
#[error("capture blocked: {0}")]
struct Blocked(&'static str);

impl Worker {
    /// Connects both sessions (`url` is the worker login) and ensures the slot exists.
    pub async fn connect(url: &str) -> Result<Worker> {
        let replication = crate::connect_db(url).await?;
        let materialize = crate::connect_db(url).await?;
        materialize.batch_execute("SET ROLE synchro_worker").await?;
        replication.batch_execute(SESSION_SETTINGS).await?;
        let slot: String = materialize
            .query_one("SELECT slot_name::text FROM synchro.capture_state", &[])
            .await?
            .get(0);
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
        Ok(Worker {
            replication,
            materialize,
            slot,
        })
    }

    async fn registry(&self) -> Result<HashMap<u32, Registered>> {
        let rows = self
            .materialize
            .query(
                "SELECT r.relation_id, r.physical_schema::text, r.physical_relation::text, r.physical_relation_oid,
                        r.replica_identity::text, f.field_id, f.column_name::text, f.portable_type, f.nullable,
                        f.is_key, f.decimal_precision, f.decimal_scale
                   FROM synchro.relations r JOIN synchro.fields f USING (relation_id)
                  WHERE r.kind = 'synced'",
                &[],
            )
            .await?;
        let mut out: HashMap<u32, Registered> = HashMap::new();
        for r in rows {
            let oid: u32 = r.get(3);
            let entry = out.entry(oid).or_insert_with(|| Registered {
                relation_id: r.get(0),
                schema: r.get(1),
                relation: r.get(2),
                replica_identity: r.get::<_, String>(4).bytes().next().unwrap_or(b'?'),
                fields_by_column: HashMap::new(),
                membership: None,
            });
            let ty = PortableType::parse(&r.get::<_, String>(7))
                .context("registry holds an unknown type")?;
            let nullable: bool = r.get(8);
            let spec = match ty {
                PortableType::Decimal => FieldSpec {
                    ty,
                    nullable,
                    decimal: Some(DecimalSpec::new(
                        r.get::<_, i32>(10) as u32,
                        r.get::<_, i32>(11) as u32,
                    )?),
                },
                _ => FieldSpec::new(ty, nullable)?,
            };
            entry.fields_by_column.insert(
                r.get(6),
                Field {
                    field_id: r.get(5),
                    spec,
                    is_key: r.get(9),
                },
            );
        }
        for r in self
            .materialize
            .query(
                "SELECT r.physical_relation_oid, m.function_oid::regproc::text, r.primary_key_type::regtype::text,
                        r.fanout_bound::bigint
                   FROM synchro.membership_functions m JOIN synchro.relations r USING (relation_id)",
                &[],
            )
            .await?
        {
            if let Some(reg) = out.get_mut(&r.get::<_, u32>(0)) {
                reg.membership = Some((r.get(1), r.get(2), r.get(3)));
            }
        }
        Ok(out)
    }

    /// Runs until caught up (or blocked), applying every complete transaction available.
    pub async fn step(&mut self, failpoint: Failpoint) -> Result<StepOutcome> {
        let leader: bool = self
            .replication
            .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK])
            .await?
            .get(0);
        if !leader {
            return Ok(StepOutcome::NotLeader);
        }
        let state = self
            .materialize
            .query_one(
                "SELECT confirmed_lsn, blocked_reason FROM synchro.capture_state",
                &[],
            )
            .await?;
        let confirmed: PgLsn = state.get(0);
        if let Some(reason) = state.get::<_, Option<String>>(1) {
            return Ok(StepOutcome::Blocked(reason));
        }
        let registry = self.registry().await?;
        let mut applied = 0;
        loop {
            let rows = self
                .replication
                .query(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2,
                       'proto_version', '1', 'publication_names', 'synchro_publication', 'messages', 'true')",
                    &[&self.slot, &PEEK_CHANGES],
                )
                .await
                .map_err(|e| anyhow::anyhow!("peeking the capture slot: {}", crate::install::describe(&e)))?;
            let mut messages = Vec::with_capacity(rows.len());
            for r in &rows {
                match decode(r.get::<_, &[u8]>(0)) {
                    Ok(m) => messages.push(m),
                    Err(_) => return self.block("decode_error").await,
                }
            }
            let transactions = complete_transactions(messages);
            if transactions.is_empty() {
                break;
            }
            let mut shapes: HashMap<u32, RelationShape> = HashMap::new();
            let mut last_end = None;
            for tx in &transactions {
                for m in &tx.messages {
                    if let Message::Relation {
                        oid,
                        namespace,
                        name,
                        replica_identity,
                        columns,
                    } = m
                    {
                        shapes.insert(
                            *oid,
                            RelationShape {
                                namespace: namespace.clone(),
                                name: name.clone(),
                                replica_identity: *replica_identity,
                                columns: columns
                                    .iter()
                                    .map(|c| (c.name.clone(), c.type_oid))
                                    .collect(),
                            },
                        );
                    }
                }
                if u64::from(tx.end_lsn) <= u64::from(confirmed) {
                    last_end = Some(tx.end_lsn);
                    continue; // applied before a crash; the slot was not advanced yet
                }
                match self.apply(tx, &registry, &shapes).await {
                    Ok(()) => {}
                    Err(e) => match block_reason(&e) {
                        Some(reason) => return self.block(reason).await,
                        None => return Err(e),
                    },
                }
                applied += 1;
                last_end = Some(tx.end_lsn);
                if failpoint == Failpoint::AfterCommitBeforeAdvance {
                    return Ok(StepOutcome::Applied(applied));
                }
            }
            if let Some(end) = last_end {
                self.replication
                    .query(
                        "SELECT pg_replication_slot_advance($1, $2)",
                        &[&self.slot, &end],
                    )
                    .await?;
            }
        }
        self.materialize
            .execute("UPDATE synchro.capture_state SET heartbeat_at = now()", &[])
            .await?;
        Ok(StepOutcome::Applied(applied))
    }

    async fn block(&self, reason: &'static str) -> Result<StepOutcome> {
        self.materialize
            .execute(
                "UPDATE synchro.capture_state SET blocked_reason = $1, blocked_at = now()",
                &[&reason],
            )
            .await?;
        tracing::error!(reason, "capture blocked");
        Ok(StepOutcome::Blocked(reason.to_owned()))
    }

    async fn apply(
        &mut self,
        tx: &Transaction,
        registry: &HashMap<u32, Registered>,
        shapes: &HashMap<u32, RelationShape>,
    ) -> Result<()> {
        let db = self.materialize.transaction().await?;
        let commit = u64::from(tx.commit_lsn);
        let mut ordinal = 0u64;
        // (relation OID, pk, version of this change), in change order.
        let mut touched: Vec<(u32, String, String)> = Vec::new();
        for m in &tx.messages {
            let (relation, key, new) = match m {
                Message::Insert { relation, new } => (*relation, None, Some(new)),
                Message::Update {
                    relation,
                    key,
                    old,
                    new,
                } => (*relation, key.as_ref().or(old.as_ref()), Some(new)),
                Message::Delete { relation, key, old } => {
                    (*relation, key.as_ref().or(old.as_ref()), None)
                }
                Message::Truncate { relations, .. } => {
                    if relations.iter().any(|r| registry.contains_key(r)) {
                        bail!(Blocked("truncate_unsupported"));
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(reg) = registry.get(&relation) else {
                continue;
            };
            let shape = shapes
                .get(&relation)
                .context("a change arrived before its relation message")?;
            if shape.namespace != reg.schema
                || shape.name != reg.relation
                || shape.replica_identity != reg.replica_identity
            {
                bail!(Blocked("registered_relation_drift"));
            }
            ordinal += 1;
            let version = format!("{:X}/{:X}:{ordinal}", commit >> 32, commit & 0xffff_ffff);
            let old_pk = match key {
                Some(k) => Some(key_text(reg, shape, k)?),
                None => None,
            };
            match new {
                None => {
                    let pk = old_pk.context("a delete without its key")?;
                    db.execute(
                        "DELETE FROM synchro.projection_rows WHERE relation_id = $1 AND pk = $2",
                        &[&reg.relation_id, &pk],
                    )
                    .await?;
                    touched.push((relation, pk, version.clone()));
                }
                Some(values) => {
                    let new_pk = key_text(reg, shape, values)?;
                    let previous: Option<String> = db
                        .query_opt(
                            "SELECT row_json FROM synchro.projection_rows WHERE relation_id = $1 AND pk = $2",
                            &[&reg.relation_id, old_pk.as_ref().unwrap_or(&new_pk)],
                        )
                        .await?
                        .map(|r| r.get(0));
                    let row = row_json(reg, shape, values, previous.as_deref())?;
                    if let Some(old) = old_pk.as_ref().filter(|o| **o != new_pk) {
                        db.execute(
                            "DELETE FROM synchro.projection_rows WHERE relation_id = $1 AND pk = $2",
                            &[&reg.relation_id, old],
                        )
                        .await?;
                        touched.push((relation, old.clone(), version.clone()));
                    }
                    touched.push((relation, new_pk.clone(), version.clone()));
                    db.execute(
                        "INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
                         VALUES ($1, $2, $3, $4)
                         ON CONFLICT (relation_id, pk) DO UPDATE SET row_json = EXCLUDED.row_json,
                             server_version = EXCLUDED.server_version",
                        &[&reg.relation_id, &new_pk, &row, &version],
                    )
                    .await?;
                }
            }
        }
        // Membership against the transaction's final projected state: each touched row once,
        // with the version of its last change.
        let mut last: Vec<(u32, String, String)> = Vec::new();
        for (rel, pk, version) in touched.into_iter().rev() {
            if !last.iter().any(|(r, p, _)| *r == rel && *p == pk) {
                last.push((rel, pk, version));
            }
        }
        last.reverse();
        for (rel, pk, version) in &last {
            let reg = &registry[rel];
            if let Some(m) = &reg.membership {
                membership_effects(&db, reg, m, pk, version).await?;
            }
        }
        db.execute(
            "UPDATE synchro.capture_state SET confirmed_lsn = $1, applied_transactions = applied_transactions + 1,
                    heartbeat_at = now()",
            &[&tx.end_lsn],
        )
        .await?;
        db.commit().await?;
        Ok(())
    }
}

/// The SQL literal argument for a key given as its canonical wire text.
fn key_argument(pk_wire: &str) -> Result<String> {
    Ok(match Json::parse(pk_wire)? {
        Json::String(s) => s,
        Json::Number(t) => t,
        _ => bail!(Blocked("unrepresentable_value")),
    })
}

/// Re-evaluates one row's membership, diffs its edges and records scope effects: an upsert
/// for every scope it is in, a delete for every scope it left.
async fn membership_effects(
    db: &tokio_postgres::Transaction<'_>,
    reg: &Registered,
    (function, key_type, fanout): &(String, String, i64),
    pk: &str,
    version: &str,
) -> Result<()> {
    let exists = db
        .query_opt(
            "SELECT 1 FROM synchro.projection_rows WHERE relation_id = $1 AND pk = $2",
            &[&reg.relation_id, &pk],
        )
        .await?
        .is_some();
    let mut new_scopes: Vec<String> = Vec::new();
    if exists {
        let sql = format!("SELECT DISTINCT s FROM {function}($1::text::{key_type}) AS s");
        let rows = db
            .query(&sql, &[&key_argument(pk)?])
            .await
            .map_err(|_| Blocked("membership_evaluation_failed"))?;
        for r in rows {
            match r.get::<_, Option<String>>(0) {
                Some(s) if !s.is_empty() => new_scopes.push(s),
                _ => bail!(Blocked("membership_evaluation_failed")),
            }
        }
        if new_scopes.len() as i64 > *fanout {
            bail!(Blocked("membership_bound_exceeded"));
        }
    }
    new_scopes.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let old_scopes: Vec<String> = db
        .query(
            "SELECT scope_id FROM synchro.membership_edges WHERE relation_id = $1 AND pk = $2",
            &[&reg.relation_id, &pk],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for s in old_scopes.iter().filter(|s| !new_scopes.contains(s)) {
        db.execute(
            "DELETE FROM synchro.membership_edges WHERE scope_id = $1 AND relation_id = $2 AND pk = $3",
            &[s, &reg.relation_id, &pk],
        )
        .await?;
        db.execute(
            "INSERT INTO synchro.scope_effects (scope_id, relation_id, pk, kind, server_version)
             VALUES ($1, $2, $3, 'delete', $4)",
            &[s, &reg.relation_id, &pk, &version],
        )
        .await?;
    }
    for s in &new_scopes {
        if !old_scopes.contains(s) {
            db.execute(
                "INSERT INTO synchro.membership_edges (scope_id, relation_id, pk) VALUES ($1, $2, $3)",
                &[s, &reg.relation_id, &pk],
            )
            .await?;
        }
        db.execute(
            "INSERT INTO synchro.scope_effects (scope_id, relation_id, pk, kind, server_version)
             VALUES ($1, $2, $3, 'upsert', $4)",
            &[s, &reg.relation_id, &pk, &version],
        )
        .await?;
    }
    Ok(())
}

/// One complete source transaction.
struct Transaction {
    commit_lsn: PgLsn,
    end_lsn: PgLsn,
    messages: Vec<Message>,
}

/// Groups decoded messages into complete transactions; a trailing incomplete one is left
/// for the next peek.
fn complete_transactions(messages: Vec<Message>) -> Vec<Transaction> {
    let mut out = Vec::new();
    let mut current: Option<Vec<Message>> = None;
    for m in messages {
        match m {
            Message::Begin { .. } => current = Some(Vec::new()),
            Message::Commit {
                commit_lsn,
                end_lsn,
                ..
            } => {
                if let Some(messages) = current.take() {
                    out.push(Transaction {
                        commit_lsn: PgLsn::from(commit_lsn),
                        end_lsn: PgLsn::from(end_lsn),
                        messages,
                    });
                }
            }
            // Relation messages may precede Begin's contents; keep them with the transaction.
            other => {
                if let Some(c) = current.as_mut() {
                    c.push(other);
                }
            }
        }
    }
    out
}

fn field_of<'a>(reg: &'a Registered, shape: &RelationShape, i: usize) -> Option<(&'a Field, u32)> {
    let (name, oid) = shape.columns.get(i)?;
    reg.fields_by_column.get(name).map(|f| (f, *oid))
}

fn key_text(reg: &Registered, shape: &RelationShape, values: &[Value]) -> Result<String> {
    for (i, v) in values.iter().enumerate() {
        if let Some((f, oid)) = field_of(reg, shape, i).filter(|(f, _)| f.is_key) {
            let Value::Text(t) = v else {
                bail!(Blocked("unrepresentable_value"))
            };
            let tv = text_to_wire(&f.spec, oid, t).map_err(|_| Blocked("unrepresentable_value"))?;
            return Ok(tv.to_wire_text());
        }
    }
    bail!(Blocked("registered_relation_drift"))
}

/// The canonical wire row (object keyed by field ID), taking unchanged TOAST values from
/// the previous projection row.
fn row_json(
    reg: &Registered,
    shape: &RelationShape,
    values: &[Value],
    previous: Option<&str>,
) -> Result<String> {
    let previous = previous.map(Json::parse).transpose().ok().flatten();
    let mut members = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let Some((f, oid)) = field_of(reg, shape, i) else {
            continue;
        };
        let wire = match v {
            Value::Null if f.spec.nullable => Json::Null,
            Value::Null => bail!(Blocked("unrepresentable_value")),
            Value::Text(t) => text_to_wire(&f.spec, oid, t)
                .map_err(|_| Blocked("unrepresentable_value"))?
                .to_wire(),
            Value::Unchanged => previous
                .as_ref()
                .and_then(|p| p.get(&f.field_id).cloned())
                .ok_or(Blocked("unrepresentable_value"))?,
        };
        members.push((f.field_id.clone(), wire));
    }
    if members.len() != reg.fields_by_column.len() {
        bail!(Blocked("registered_relation_drift"));
    }
    Ok(jcs::to_output_string(&Json::Object(members)))
}

/// Runs the worker forever: reconnects after errors, idles while blocked or not leader.
/// Logs carry no row data (a failed step logs only that it failed).
pub async fn run_forever(url: String, interval: std::time::Duration) {
    loop {
        match Worker::connect(&url).await {
            Ok(mut worker) => loop {
                match worker.step(Failpoint::None).await {
                    Ok(StepOutcome::Applied(_)) => tokio::time::sleep(interval).await,
                    Ok(StepOutcome::NotLeader | StepOutcome::Blocked(_)) => {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await
                    }
                    Err(_) => {
                        tracing::warn!("capture step failed; reconnecting");
                        break;
                    }
                }
            },
            Err(_) => tracing::warn!("capture worker cannot connect; retrying"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
