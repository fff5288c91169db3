//! One step of the worker: the leader lock, the durable blocked state, pending bootstraps,
//! changed membership contracts and staged rules, then peeks of the slot applied in commit
//! order within a time budget, each followed by the slot advance; an idle leader records
//! its heartbeat.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use futures_util::FutureExt;
use synchro_protocol::json::Json;
use tokio_postgres::types::PgLsn;

use super::membership::{column_image, membership_round, EvalRow};
use super::staging::stage_rows;

use super::block::{block_reason, BlockReason, Blocked};
use super::pgoutput::{decode, Message, Value};
use super::registry::{self, Pending, Relations, Status};
use super::row::{key_text, raw_key_text, row_json, Column, RelationShape};
use super::{Failpoint, StepOutcome, Worker};

/// Advisory lock key of the capture leader ("synchro" in ASCII).
pub const LEADER_LOCK: i64 = 0x73796e6368726f;

/// Changes read per peek (whole transactions are always returned).
const PEEK_CHANGES: i32 = 10_000;

/// How long one step keeps applying once it has applied something.
const STEP_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// How often an idle leader records its heartbeat.
pub(super) const HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl Worker {
    /// Loads the registry and records its function owners.
    async fn registry(&self) -> Result<Relations> {
        let loaded = registry::load(&self.materialize).await?;
        self.functions.record_owners(loaded.owners);
        Ok(loaded.relations)
    }

    /// Applies the complete transactions available, in commit order, until caught up (then
    /// `Applied(0)` when nothing was applied), blocked, or — once something was applied — a
    /// time budget of about a second is spent, so bootstraps and heartbeats are never
    /// starved by a sustained write load.
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
        let mut registry = self.registry().await?;
        let pending: Vec<String> = registry
            .values()
            .filter(|r| r.status == Status::Pending)
            .map(|r| r.relation_id.clone())
            .collect();
        for relation_id in pending {
            match self.bootstrap(&registry, &relation_id).await {
                Ok(()) => {}
                Err(e) => match block_reason(&e) {
                    Some(reason) => return self.block(reason).await,
                    None => return Err(e),
                },
            }
        }
        if !registry.values().all(|r| r.status != Status::Pending) {
            registry = self.registry().await?;
        }
        // A changed membership contract: re-evaluate every row under the new rule.
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
            if let Err(e) = self.reevaluate(&registry[&oid]).await {
                return match block_reason(&e) {
                    Some(reason) => self.block(reason).await,
                    None => Err(e),
                };
            }
            let reg = registry.get_mut(&oid).expect("listed");
            reg.contract.evaluated = reg.contract.current;
        }
        // Work done this step: source transactions applied plus staging batches, so
        // `Applied(0)` means caught up with both.
        let mut applied = 0;
        // Staged rule changes: one bounded batch each per step (activation when complete).
        let staging: Vec<u32> = registry
            .iter()
            .filter(|(_, r)| r.status == Status::Active && r.pending.is_some())
            .map(|(oid, _)| *oid)
            .collect();
        for oid in staging {
            match self.stage_batch(&registry[&oid]).await {
                Ok(through) => {
                    applied += 1;
                    let reg = registry.get_mut(&oid).expect("listed");
                    match through {
                        Some(t) => reg.pending.as_mut().expect("pending").staged_through = Some(t),
                        None => {
                            // Activated: reload the registry for the new live rule.
                            registry = self.registry().await?;
                        }
                    }
                }
                Err(e) => {
                    return match block_reason(&e) {
                        Some(reason) => self.block(reason).await,
                        None => Err(e),
                    }
                }
            }
        }
        let started = std::time::Instant::now();
        while applied == 0 || started.elapsed() < STEP_BUDGET {
            // Everything committed before this point is decoded by the peek below.
            let horizon: PgLsn = self
                .replication
                .query_one("SELECT pg_current_wal_lsn()", &[])
                .await?
                .get(0);
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
                    Err(_) => return self.block(BlockReason::DecodeError).await,
                }
            }
            let transactions = complete_transactions(messages);
            if transactions.is_empty() {
                if rows.is_empty() {
                    // Nothing published committed before the horizon: confirm up to it so
                    // the slot does not retain unrelated WAL (which readiness bounds).
                    self.replication
                        .query(
                            "SELECT pg_replication_slot_advance(slot_name, $2) FROM pg_replication_slots
                              WHERE slot_name = $1 AND confirmed_flush_lsn < $2",
                            &[&self.slot, &horizon],
                        )
                        .await?;
                }
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
                                    .map(|c| Column {
                                        name: c.name.clone(),
                                        type_oid: c.type_oid,
                                    })
                                    .collect(),
                            },
                        );
                    }
                }
                if u64::from(tx.end_lsn) <= u64::from(confirmed) {
                    last_end = Some(tx.end_lsn);
                    continue; // applied before a crash; the slot was not advanced yet
                }
                match self.apply(tx, &mut registry, &shapes).await {
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
        if applied > 0 {
            self.last_heartbeat = std::time::Instant::now(); // each apply wrote it
        } else if self.last_heartbeat.elapsed() >= HEARTBEAT_INTERVAL {
            self.materialize
                .execute("UPDATE synchro.capture_state SET heartbeat_at = now()", &[])
                .await?;
            self.last_heartbeat = std::time::Instant::now();
        }
        Ok(StepOutcome::Applied(applied))
    }

    async fn block(&self, reason: BlockReason) -> Result<StepOutcome> {
        self.materialize
            .execute(
                "UPDATE synchro.capture_state SET blocked_reason = $1, blocked_at = now()",
                &[&reason.as_str()],
            )
            .await?;
        tracing::error!(reason = reason.as_str(), "capture blocked");
        Ok(StepOutcome::Blocked(reason.as_str().to_owned()))
    }

    async fn apply(
        &mut self,
        tx: &Transaction,
        registry: &mut Relations,
        shapes: &HashMap<u32, RelationShape>,
    ) -> Result<()> {
        let commit = u64::from(tx.commit_lsn);
        let mut ordinal = 0u64;
        // The transaction's final state per row, in memory: (relation, pk) -> (sequence of
        // its last change, version, row JSON or None when deleted).
        let mut finals: HashMap<(u32, String), (usize, String, Option<String>)> = HashMap::new();
        let mut bootstrapped: Vec<String> = Vec::new();
        // Versions the source trigger allocated, by (relation ID, key text), consumed by the
        // change that follows each fence.
        let mut fences: HashMap<(String, String), String> = HashMap::new();
        for m in &tx.messages {
            let (relation, key, new) = match m {
                Message::LogicalMessage {
                    transactional: true,
                    prefix,
                    content,
                    ..
                } if prefix == "synchro.fence" => {
                    let fence = std::str::from_utf8(content)
                        .ok()
                        .and_then(|t| Json::parse(t).ok())
                        .ok_or(Blocked(BlockReason::DecodeError))?;
                    let text = |k: &str| fence.get(k).and_then(Json::as_str).map(str::to_owned);
                    match (text("relation_id"), text("key"), text("version")) {
                        (Some(r), Some(k), Some(v)) => {
                            fences.insert((r, k), v);
                        }
                        _ => bail!(Blocked(BlockReason::DecodeError)),
                    }
                    continue;
                }
                Message::LogicalMessage {
                    transactional: true,
                    prefix,
                    content,
                    ..
                } if prefix == "synchro" => {
                    if let Some(id) = content.strip_prefix(b"bootstrap:") {
                        bootstrapped.push(String::from_utf8_lossy(id).into_owned());
                    }
                    continue;
                }
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
                        bail!(Blocked(BlockReason::TruncateUnsupported));
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(reg) = registry.get(&relation) else {
                continue;
            };
            if reg.status != Status::Active {
                continue; // its bootstrap copy (pending, or committed later in the stream) has it
            }
            let shape = shapes
                .get(&relation)
                .context("a change arrived before its relation message")?;
            if !shape.matches(reg) {
                bail!(Blocked(BlockReason::RegisteredRelationDrift));
            }
            ordinal += 1;
            let seq = ordinal as usize;
            // The version its fence allocated before the row changed.
            let key_values = key.or(new).ok_or(Blocked(BlockReason::DecodeError))?;
            let raw_key = raw_key_text(reg, shape, key_values)
                .ok_or(Blocked(BlockReason::RegisteredRelationDrift))?;
            let version = fences
                .remove(&(reg.relation_id.clone(), raw_key))
                .ok_or(Blocked(BlockReason::MissingFence))?;
            let old_pk = match key {
                Some(k) => Some(key_text(reg, shape, k)?),
                None => None,
            };
            match new {
                None => {
                    let pk = old_pk.context("a delete without its key")?;
                    finals.insert((relation, pk), (seq, version, None));
                }
                Some(values) => {
                    let new_pk = key_text(reg, shape, values)?;
                    let source_pk = old_pk.clone().unwrap_or_else(|| new_pk.clone());
                    // Unchanged TOAST values come from the row's previous state: earlier in
                    // this transaction, or the projection.
                    let previous = if values.iter().any(|v| matches!(v, Value::Unchanged)) {
                        match finals.get(&(relation, source_pk.clone())) {
                            Some((_, _, row)) => row.clone(),
                            None => self
                                .materialize
                                .query_opt(
                                    &self.statements.previous,
                                    &[&reg.relation_id, &source_pk],
                                )
                                .await?
                                .map(|r| r.get(0)),
                        }
                    } else {
                        None
                    };
                    let row = row_json(reg, shape, values, previous.as_deref())?;
                    if source_pk != new_pk {
                        finals.insert((relation, source_pk), (seq, version.clone(), None));
                    }
                    finals.insert((relation, new_pk), (seq, version, Some(row)));
                }
            }
        }
        let db = &self.materialize;
        db.batch_execute("BEGIN").await?;
        let result = async {
            // Dependency rows' state at the start of the transaction, for impact functions.
            let mut old_images: HashMap<(u32, String), Option<String>> = HashMap::new();
            for (rel, pk) in finals.keys() {
                if !registry[rel].impacts.is_empty() {
                    old_images.insert((*rel, pk.clone()), None);
                }
            }
            for rel in old_images
                .keys()
                .map(|(r, _)| *r)
                .collect::<std::collections::HashSet<_>>()
            {
                let pks: Vec<&str> = old_images
                    .keys()
                    .filter(|(r, _)| *r == rel)
                    .map(|(_, pk)| pk.as_str())
                    .collect();
                let rows = db
                    .query(
                        &self.statements.current_rows,
                        &[&registry[&rel].relation_id, &pks],
                    )
                    .await?;
                for r in rows {
                    old_images.insert((rel, r.get(0)), Some(r.get(1)));
                }
            }
            // Projections: one delete and one upsert per relation, pipelined.
            let mut by_relation: HashMap<u32, Vec<FinalRow>> = HashMap::new();
            for ((rel, pk), (seq, version, row)) in finals {
                by_relation
                    .entry(rel)
                    .or_default()
                    .push((seq, pk, version, row));
            }
            let mut relations: Vec<u32> = by_relation.keys().copied().collect();
            relations.sort_by_key(|r| by_relation[r].iter().map(|(seq, ..)| *seq).min());
            type Batch<'a> = (
                &'a String,
                Vec<&'a str>,
                Vec<&'a str>,
                Vec<&'a str>,
                Vec<&'a str>,
            );
            for rows in by_relation.values_mut() {
                rows.sort_by_key(|(seq, ..)| *seq);
            }
            let batches: Vec<Batch> = relations
                .iter()
                .map(|rel| {
                    let rows = &by_relation[rel];
                    let mut batch: Batch = (
                        &registry[rel].relation_id,
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                    );
                    for (_, pk, version, row) in rows {
                        match row {
                            None => batch.1.push(pk),
                            Some(row) => {
                                batch.2.push(pk);
                                batch.3.push(row);
                                batch.4.push(version);
                            }
                        }
                    }
                    batch
                })
                .collect();
            let mut writes = Vec::new();
            for (relation_id, deleted, pks, jsons, versions) in &batches {
                let statements = &self.statements;
                writes.push(
                    async move {
                        db.execute(&statements.delete, &[*relation_id, deleted])
                            .await
                    }
                    .boxed(),
                );
                writes.push(
                    async move {
                        db.execute(&statements.upsert, &[*relation_id, pks, jsons, versions])
                            .await
                    }
                    .boxed(),
                );
            }
            futures_util::future::try_join_all(writes).await?;
            // Membership against the transaction's final projected state: each touched row
            // once, with the version of its last change, in change order; then every target
            // row an impact function named (old and new state), at its current version.
            let mut targets: Vec<(u32, Vec<EvalRow>)> = Vec::new();
            for rel in &relations {
                let rows = by_relation[rel]
                    .iter()
                    .map(|(_, pk, version, row)| EvalRow {
                        pk: pk.clone(),
                        version: version.clone(),
                        exists: row.is_some(),
                    })
                    .collect();
                targets.push((*rel, rows));
            }
            for rel in &relations {
                let reg = &registry[rel];
                for impact in &reg.impacts {
                    let (mut olds, mut news) = (Vec::new(), Vec::new());
                    for (_, pk, _, row) in &by_relation[rel] {
                        let old = old_images.get(&(*rel, pk.clone())).cloned().flatten();
                        olds.push(old.map(|o| column_image(reg, &o)).transpose()?);
                        news.push(row.as_ref().map(|n| column_image(reg, n)).transpose()?);
                    }
                    let target = &registry[&impact.target];
                    let named = self
                        .functions
                        .impacted(db, impact, target, &olds, &news)
                        .await?;
                    let entry = match targets.iter().position(|(t, _)| *t == impact.target) {
                        Some(i) => i,
                        None => {
                            targets.push((impact.target, Vec::new()));
                            targets.len() - 1
                        }
                    };
                    let fresh: Vec<&str> = named
                        .iter()
                        .filter(|pk| !targets[entry].1.iter().any(|r| &r.pk == *pk))
                        .map(String::as_str)
                        .collect();
                    for r in db
                        .query(&self.statements.versions, &[&target.relation_id, &fresh])
                        .await?
                    {
                        targets[entry].1.push(EvalRow {
                            pk: r.get(0),
                            version: r.get(1),
                            exists: true,
                        });
                    }
                }
            }
            let mut effects = 0;
            for (rel, rows) in &targets {
                let reg = &registry[rel];
                if let Some(m) = reg.live_membership() {
                    let eval = self
                        .functions
                        .membership(db, &m.function, &m.key_type)
                        .await?;
                    effects +=
                        membership_round(db, &self.statements, &eval, reg, m.fanout, rows).await?;
                }
                // A staged rule: rows already staged are re-staged from this final state.
                if let (
                    Some(m),
                    Some(Pending {
                        function: pending,
                        staged_through: Some(through),
                    }),
                ) = (&reg.membership, &reg.pending)
                {
                    let staged: Vec<&EvalRow> = rows
                        .iter()
                        .filter(|r| r.pk.as_bytes() <= through.as_bytes())
                        .collect();
                    if !staged.is_empty() {
                        let eval = self.functions.membership(db, pending, &m.key_type).await?;
                        stage_rows(db, &eval, reg, m.fanout, &staged).await?;
                    }
                }
            }
            effects += self
                .finish_bootstraps(registry, &bootstrapped, commit)
                .await?;
            let notify = async {
                if effects > 0 {
                    // Wakes change-notification streams at commit; carries no data.
                    db.batch_execute("NOTIFY synchro_effects").await?;
                }
                Ok::<_, tokio_postgres::Error>(())
            };
            let progress = async { db.execute(&self.statements.progress, &[&tx.end_lsn]).await };
            let commit = db.batch_execute("COMMIT");
            futures_util::try_join!(notify, progress, commit)?;
            Ok::<_, anyhow::Error>(())
        }
        .await;
        if let Err(e) = result {
            let _ = db.batch_execute("ROLLBACK").await;
            return Err(e);
        }
        for reg in registry.values_mut() {
            if bootstrapped.contains(&reg.relation_id) {
                reg.status = Status::Active;
            }
        }
        Ok(())
    }
}

/// A row's final state in a source transaction: (sequence of its last change, pk, version,
/// row JSON or `None` when deleted).
type FinalRow = (usize, String, String, Option<String>);

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
