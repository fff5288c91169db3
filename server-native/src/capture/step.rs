//! One step of the worker: the leader lock, the durable blocked state, pending bootstraps,
//! changed membership contracts and staged rules, then peeks of the slot applied in commit
//! order within a time budget, each followed by the slot advance; an idle leader records
//! its heartbeat.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use futures_util::FutureExt;
use synchro_protocol::json::Json;
use synchro_protocol::types::PortableType;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::membership::{
    activate, as_owner, column_image, membership_round, reevaluate_relation, stage_rows, Eval,
};

use super::block::{block_reason, BlockReason, Blocked};
use super::pgoutput::{decode, Message, Value};
use super::registry::{self, by_id, Impact, Pending, Registered, Relations, Status};
use super::row::{key_text, raw_key_text, row_json, Column, RelationShape};
use super::statements::Statements;
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
        self.owners.lock().expect("owners").extend(loaded.owners);
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
                    .map(|(_, pk, version, row)| (pk.clone(), version.clone(), row.is_some()))
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
                    let named = self.impacted(impact, target, &olds, &news).await?;
                    let entry = match targets.iter().position(|(t, _)| *t == impact.target) {
                        Some(i) => i,
                        None => {
                            targets.push((impact.target, Vec::new()));
                            targets.len() - 1
                        }
                    };
                    let fresh: Vec<&str> = named
                        .iter()
                        .filter(|pk| !targets[entry].1.iter().any(|(p, ..)| p == *pk))
                        .map(String::as_str)
                        .collect();
                    for r in db
                        .query(&self.statements.versions, &[&target.relation_id, &fresh])
                        .await?
                    {
                        targets[entry].1.push((r.get(0), r.get(1), true));
                    }
                }
            }
            let mut effects = 0;
            for (rel, rows) in &targets {
                let reg = &registry[rel];
                if let Some(m) = reg.live_membership() {
                    let eval = self.eval_statement(&m.function, &m.key_type).await?;
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
                        .filter(|(pk, ..)| pk.as_bytes() <= through.as_bytes())
                        .collect();
                    if !staged.is_empty() {
                        let eval = self.eval_statement(pending, &m.key_type).await?;
                        stage_rows(db, &eval, reg, m.fanout, &staged).await?;
                    }
                }
            }
            for relation_id in &bootstrapped {
                let copied = by_id(registry, relation_id);
                let eval = match copied.and_then(Registered::live_membership) {
                    Some(m) => Some(self.eval_statement(&m.function, &m.key_type).await?),
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
                        let eval = self.eval_statement(&m.function, &m.key_type).await?;
                        effects += reevaluate_relation(db, &self.statements, &eval, target, commit)
                            .await?
                            .0;
                    }
                }
            }
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

    /// Stages the next batch of a pending rule (rows after `staged_through`, byte order) in
    /// one transaction; when the batch is the last, activates the rule in that same
    /// transaction. Returns the new `staged_through`, or `None` once activated.
    async fn stage_batch(&self, reg: &Registered) -> Result<Option<String>> {
        let m = reg.membership.as_ref().context("no membership function")?;
        let pending = reg.pending.as_ref().context("nothing pending")?;
        let through = &pending.staged_through;
        let eval = self.eval_statement(&pending.function, &m.key_type).await?;
        let db = &self.materialize;
        db.batch_execute("BEGIN").await?;
        let result = async {
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
                    &[&reg.relation_id, through, &batch.max(1)],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let rows: Vec<EvalRow> = pks
                .iter()
                .map(|pk| (pk.clone(), String::new(), true))
                .collect();
            stage_rows(db, &eval, reg, m.fanout, &rows.iter().collect::<Vec<_>>()).await?;
            let outcome = if (pks.len() as i64) < batch.max(1) {
                let at: PgLsn = db
                    .query_one("SELECT confirmed_lsn FROM synchro.capture_state", &[])
                    .await?
                    .get(0);
                let effects = activate(db, &self.statements, reg, u64::from(at)).await?;
                if effects > 0 {
                    db.batch_execute("NOTIFY synchro_effects").await?;
                }
                tracing::info!(effects, "staged membership rule activated");
                None
            } else {
                let last = pks.last().cloned();
                db.execute(
                    "UPDATE synchro.membership_functions SET staged_through = $2 WHERE relation_id = $1",
                    &[&reg.relation_id, &last],
                )
                .await?;
                last
            };
            db.batch_execute("COMMIT").await?;
            Ok::<_, anyhow::Error>(outcome)
        }
        .await;
        if result.is_err() {
            let _ = db.batch_execute("ROLLBACK").await;
        }
        result
    }

    /// Re-evaluates every row of a relation whose membership contract changed, in one
    /// transaction at the worker's current position, and records the generation evaluated.
    async fn reevaluate(&self, reg: &Registered) -> Result<()> {
        let m = reg.membership.as_ref().context("no membership function")?;
        let eval = self.eval_statement(&m.function, &m.key_type).await?;
        let db = &self.materialize;
        db.batch_execute("BEGIN").await?;
        let result = async {
            let at: PgLsn = db
                .query_one("SELECT confirmed_lsn FROM synchro.capture_state", &[])
                .await?
                .get(0);
            let (effects, changed) =
                reevaluate_relation(db, &self.statements, &eval, reg, u64::from(at)).await?;
            // Only scopes whose edge set changed get a new membership generation: their
            // cursors and rebuild sessions are stale, every other scope stays resumable.
            db.execute(
                "INSERT INTO synchro.scope_retention AS r (scope_id, membership_generation)
                 SELECT s, 2 FROM unnest($1::text[]) AS s
                 ON CONFLICT (scope_id) DO UPDATE SET membership_generation = r.membership_generation + 1",
                &[&changed.iter().collect::<Vec<_>>()],
            )
            .await?;
            db.execute(
                "UPDATE synchro.relation_capture SET membership_evaluated = $2, updated_at = now()
                  WHERE relation_id = $1",
                &[&reg.relation_id, &reg.contract.current],
            )
            .await?;
            if effects > 0 {
                db.batch_execute("NOTIFY synchro_effects").await?;
            }
            db.batch_execute("COMMIT").await?;
            tracing::info!(effects, "membership re-evaluated under a changed contract");
            Ok::<_, anyhow::Error>(())
        }
        .await;
        if result.is_err() {
            let _ = db.batch_execute("ROLLBACK").await;
        }
        result
    }

    /// Calls an impact function once per dependency event (old and new column images) and
    /// returns the target keys it names as canonical wire text. Any failure, a reference to
    /// another table or key type, or more rows than the bound for one event blocks capture.
    async fn impacted(
        &self,
        impact: &Impact,
        target: &Registered,
        olds: &[Option<String>],
        news: &[Option<String>],
    ) -> Result<Vec<String>> {
        let key = format!("impact\u{0}{}", impact.function);
        let cached = self.eval.lock().expect("eval cache").get(&key).cloned();
        let statement = match cached {
            Some(s) => s,
            None => {
                let sql = format!(
                    "SELECT a.n, r.table_id, r.pk_type, r.pk_value
                       FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS a(o, nw, n),
                            LATERAL {}(a.o::jsonb, a.nw::jsonb) AS r",
                    impact.function
                );
                let s = self
                    .materialize
                    .prepare(&sql)
                    .await
                    .map_err(|_| Blocked(BlockReason::ScopeEvaluationFailed))?;
                self.eval.lock().expect("eval cache").insert(key, s.clone());
                s
            }
        };
        let owner = self
            .owners
            .lock()
            .expect("owners")
            .get(&impact.function)
            .cloned()
            .ok_or(Blocked(BlockReason::ScopeEvaluationFailed))?;
        let rows = as_owner(&self.materialize, &owner, &statement, &[&olds, &news]).await?;
        let key_spec = target
            .fields_by_column
            .values()
            .find(|f| f.is_key)
            .map(|f| f.spec)
            .context("a target without its key field")?;
        let mut per_event: HashMap<i64, i64> = HashMap::new();
        let mut out: Vec<String> = Vec::new();
        for r in rows {
            let (n, table_id, pk_type, pk_value): (
                i64,
                Option<String>,
                Option<String>,
                Option<String>,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3));
            let count = per_event.entry(n).or_default();
            *count += 1;
            if *count > impact.max_rows || table_id.is_none() || table_id != target.table_id {
                bail!(Blocked(BlockReason::ScopeEvaluationFailed));
            }
            let wire = match (pk_type.as_deref(), pk_value) {
                (Some("string"), Some(v)) if key_spec.ty == PortableType::String => Json::String(v),
                (Some("int"), Some(v)) if key_spec.ty == PortableType::Int => Json::Number(v),
                (Some("int64"), Some(v)) if key_spec.ty == PortableType::Int64 => Json::String(v),
                _ => bail!(Blocked(BlockReason::ScopeEvaluationFailed)),
            };
            let pk = synchro_protocol::value::TypedValue::from_wire(&key_spec, &wire)
                .map_err(|_| Blocked(BlockReason::ScopeEvaluationFailed))?
                .to_wire_text();
            if !out.contains(&pk) {
                out.push(pk);
            }
        }
        Ok(out)
    }

    /// The prepared evaluation statement of a membership function (cached).
    async fn eval_statement(&self, function: &str, key_type: &str) -> Result<Eval> {
        let owner = self
            .owners
            .lock()
            .expect("owners")
            .get(function)
            .cloned()
            .ok_or(Blocked(BlockReason::ScopeEvaluationFailed))?;
        let key = format!("{function}\u{0}{key_type}");
        let cached = self.eval.lock().expect("eval cache").get(&key).cloned();
        let statement = match cached {
            Some(s) => s,
            None => {
                let sql = format!(
                    "SELECT a.k, s FROM unnest($1::text[], $2::text[]) AS a(k, arg), \
                     LATERAL {function}(a.arg::{key_type}) AS s"
                );
                let s = self
                    .materialize
                    .prepare(&sql)
                    .await
                    .map_err(|_| Blocked(BlockReason::ScopeEvaluationFailed))?;
                self.eval.lock().expect("eval cache").insert(key, s.clone());
                s
            }
        };
        Ok(Eval { statement, owner })
    }

    /// Copies one pending relation into its projection in a transaction that holds a SHARE
    /// lock on the source (see migration 0007), and emits the bootstrap message. A lock
    /// that cannot be taken within the timeout leaves the relation pending for the next step.
    async fn bootstrap(&mut self, registry: &Relations, relation_id: &str) -> Result<()> {
        let reg = by_id(registry, relation_id).context("bootstrap of an unknown relation")?;
        let columns: Vec<Column> = self
            .materialize
            .query(
                "SELECT column_name, type_oid FROM synchro.synchro_bootstrap_columns($1)",
                &[&relation_id],
            )
            .await?
            .iter()
            .map(|r| Column {
                name: r.get(0),
                type_oid: r.get(1),
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
        let lsn: String = db
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?
            .get(0);
        db.execute(
            "DELETE FROM synchro.projection_rows WHERE relation_id = $1",
            &[&relation_id],
        )
        .await?;
        let literal = relation_id.replace('\'', "''");
        db.batch_execute(&format!(
            "DECLARE synchro_bootstrap NO SCROLL CURSOR FOR SELECT * FROM synchro.synchro_bootstrap_rows('{literal}')"
        ))
        .await?;
        let mut copied: i64 = 0;
        loop {
            let rows = db.query("FETCH 1000 FROM synchro_bootstrap", &[]).await?;
            if rows.is_empty() {
                break;
            }
            let (mut pks, mut jsons, mut versions) = (Vec::new(), Vec::new(), Vec::new());
            for r in &rows {
                let values: Vec<Value> = r
                    .get::<_, Vec<Option<String>>>(0)
                    .into_iter()
                    .map(|v| v.map_or(Value::Null, |t| Value::Text(t.into_bytes())))
                    .collect();
                copied += 1;
                pks.push(key_text(reg, &shape, &values)?);
                jsons.push(row_json(reg, &shape, &values, None)?);
                versions.push(format!("{lsn}:b{copied}"));
            }
            db.execute(
                "INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
                 SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[])",
                &[&relation_id, &pks, &jsons, &versions],
            )
            .await?;
        }
        db.batch_execute("CLOSE synchro_bootstrap").await?;
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
        Ok(())
    }
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
            .0;
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

/// A row to (re-)evaluate: (pk, version of its last change, whether it exists now).
pub(super) type EvalRow = (String, String, bool);

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
