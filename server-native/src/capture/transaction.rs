//! Decoding: slot messages grouped into complete source transactions, and one transaction's
//! messages reduced to [`TxChanges`], the final image of every row it touched (with the
//! version its writer's fence allocated) and the bootstraps it completes. Nothing is
//! written here; unchanged TOAST values are read from the projection.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use synchro_protocol::json::Json;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::{BlockReason, Blocked, Drifted, InRelation};
use super::pgoutput::{Message, Value};
use super::registry::{Registered, Relations, Status};
use super::row::{key_text, raw_key_text, row_json, Column, RelationShape};
use super::statements::Statements;

/// One complete source transaction.
pub(super) struct Transaction {
    /// The source transaction's (32-bit) ID, as its Begin message gives it.
    pub(super) xid: u32,
    pub(super) commit_lsn: PgLsn,
    pub(super) end_lsn: PgLsn,
    /// Its commit time, in microseconds since 2000-01-01 UTC (PostgreSQL's epoch).
    pub(super) commit_time: i64,
    pub(super) messages: Vec<Message>,
}

/// The source's relation shapes by OID, as the stream last described them.
pub(super) type Shapes = HashMap<u32, RelationShape>;

/// Records the Relation messages of a transaction.
pub(super) fn record_shapes(tx: &Transaction, shapes: &mut Shapes) {
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
                            type_modifier: c.type_modifier,
                        })
                        .collect(),
                },
            );
        }
    }
}

/// A row of a registered relation, by physical OID and key (canonical wire text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RowKey {
    pub(super) relation: u32,
    pub(super) pk: String,
}

/// A row's final state in a source transaction (or a batch of them).
pub(super) struct FinalRow {
    /// Sequence of its last change in the transaction or batch (1, 2, …).
    pub(super) seq: usize,
    /// The version of that change.
    pub(super) version: String,
    /// The row JSON, or `None` when deleted (or moved to another key).
    pub(super) row: Option<String>,
}

/// What a source transaction — or a batch of consecutive ones — changed.
#[derive(Default)]
pub(super) struct TxChanges {
    /// Every touched row of an active relation, in its final state.
    pub(super) finals: HashMap<RowKey, FinalRow>,
    /// The last change sequence number given out (the batch's changes so far).
    pub(super) seq: usize,
    /// Relation IDs whose bootstrap message this transaction carries.
    pub(super) bootstrapped: Vec<String>,
    /// Registry generations whose staged reconfiguration this transaction activates.
    pub(super) reconfigured: Vec<i64>,
}

/// A fence's key: the relation ID and the key text as the source trigger recorded it.
#[derive(PartialEq, Eq, Hash)]
struct FenceKey {
    relation_id: String,
    key: String,
}

/// A row change of a relation: the old key (or old row) and the new row, as sent.
struct Change<'a> {
    relation: u32,
    key: Option<&'a Vec<Value>>,
    new: Option<&'a Vec<Value>>,
}

impl TxChanges {
    /// Whether the transaction carries a bootstrap or an activation: work that is applied
    /// in a materialization transaction of its own, never batched with others.
    pub(super) fn is_milestone(&self) -> bool {
        !self.bootstrapped.is_empty() || !self.reconfigured.is_empty()
    }

    /// Appends the changes of the next transaction of the batch (`later`, decoded with
    /// this batch as its [`decode_changes`] `earlier`): a row it touched takes its final
    /// state from it.
    pub(super) fn extend(&mut self, later: TxChanges) {
        self.finals.extend(later.finals);
        self.seq = later.seq;
        self.bootstrapped.extend(later.bootstrapped);
        self.reconfigured.extend(later.reconfigured);
    }
}

/// Decoding state within one transaction.
struct Decoder<'b> {
    /// Versions the source trigger allocated, consumed by the change that follows each
    /// fence (left-over fences are ignored).
    fences: HashMap<FenceKey, String>,
    /// Changes of active relations so far in this transaction.
    ordinal: usize,
    /// The batch's earlier transactions, not yet written to the projection.
    earlier: &'b TxChanges,
    changes: TxChanges,
}

/// Reduces a transaction's messages to its final row images. `earlier` are the changes
/// of the batch's transactions before it (not yet in the projection: a row they touched
/// has its previous state there), empty for a transaction of its own. Drift of a
/// registered relation, a value its type cannot hold, a change without its fence, a
/// TRUNCATE of a registered relation and an undecodable fence block capture.
pub(super) async fn decode_changes(
    db: &Client,
    statements: &Statements,
    tx: &Transaction,
    registry: &Relations,
    shapes: &Shapes,
    earlier: &TxChanges,
) -> Result<TxChanges> {
    let mut decoder = Decoder {
        fences: HashMap::new(),
        ordinal: 0,
        earlier,
        changes: TxChanges {
            seq: earlier.seq,
            ..TxChanges::default()
        },
    };
    for m in &tx.messages {
        if let Some(change) = decoder.message(m, registry)? {
            let relation = registry
                .get(&change.relation)
                .map(|r| InRelation(r.relation_id.clone()));
            let done = decoder
                .change(db, statements, change, registry, shapes)
                .await;
            match (done, relation) {
                (Err(e), Some(r)) => return Err(e.context(r)),
                (done, _) => done?,
            }
        }
    }
    Ok(decoder.changes)
}

impl Decoder<'_> {
    /// Takes in fences and bootstrap markers; returns the row change a message carries.
    fn message<'a>(&mut self, m: &'a Message, registry: &Relations) -> Result<Option<Change<'a>>> {
        Ok(match m {
            Message::LogicalMessage {
                transactional: true,
                prefix,
                content,
                ..
            } if prefix == "synchro.fence" => {
                let fence = Fence::decode(content)?;
                self.fences.insert(fence.key, fence.version);
                None
            }
            Message::LogicalMessage {
                transactional: true,
                prefix,
                content,
                ..
            } if prefix == "synchro" => {
                if let Some(id) = content.strip_prefix(b"bootstrap:") {
                    let id = String::from_utf8_lossy(id).into_owned();
                    self.changes.bootstrapped.push(id);
                } else if let Some(generation) = content.strip_prefix(b"reconfigure:") {
                    let generation = std::str::from_utf8(generation)
                        .ok()
                        .and_then(|g| g.parse::<i64>().ok())
                        .ok_or(Blocked(BlockReason::DecodeError))?;
                    self.changes.reconfigured.push(generation);
                }
                None
            }
            Message::Insert { relation, new } => Some(Change {
                relation: *relation,
                key: None,
                new: Some(new),
            }),
            Message::Update {
                relation,
                key,
                old,
                new,
            } => Some(Change {
                relation: *relation,
                key: key.as_ref().or(old.as_ref()),
                new: Some(new),
            }),
            Message::Delete { relation, key, old } => Some(Change {
                relation: *relation,
                key: key.as_ref().or(old.as_ref()),
                new: None,
            }),
            Message::Truncate { relations, .. } => {
                // (A relation whose copy is pending, or not reached yet, has it covered.)
                if let Some(reg) = relations
                    .iter()
                    .find_map(|r| registry.get(r).filter(|reg| reg.status == Status::Active))
                {
                    return Err(
                        anyhow::Error::from(Blocked(BlockReason::TruncateUnsupported))
                            .context(InRelation(reg.relation_id.clone())),
                    );
                }
                None
            }
            _ => None,
        })
    }

    /// Records the final state of the row (or rows, when its key changed) a change of a
    /// registered relation leaves.
    async fn change(
        &mut self,
        db: &Client,
        statements: &Statements,
        change: Change<'_>,
        registry: &Relations,
        shapes: &Shapes,
    ) -> Result<()> {
        let Some(reg) = registry.get(&change.relation) else {
            return Ok(());
        };
        if reg.status != Status::Active {
            return Ok(()); // its bootstrap copy (pending, or committed later in the stream) has it
        }
        let shape = shapes
            .get(&change.relation)
            .context("a change arrived before its relation message")?;
        if let Some(detail) = shape.drift(reg) {
            bail!(Drifted {
                relation_id: reg.relation_id.clone(),
                detail,
                ordinal: i32::try_from(self.ordinal + 1).ok(),
            });
        }
        self.ordinal += 1;
        self.changes.seq += 1;
        let seq = self.changes.seq;
        // The version its fence allocated before the row changed.
        let key_values = change
            .key
            .or(change.new)
            .ok_or(Blocked(BlockReason::DecodeError))?;
        let raw_key = raw_key_text(reg, shape, key_values)
            .ok_or(Blocked(BlockReason::RegisteredRelationDrift))?;
        let version = self
            .fences
            .remove(&FenceKey {
                relation_id: reg.relation_id.clone(),
                key: raw_key,
            })
            .ok_or(Blocked(BlockReason::MissingFence))?;
        let old_pk = match change.key {
            Some(k) => Some(key_text(reg, shape, k)?),
            None => None,
        };
        let relation = change.relation;
        let Some(values) = change.new else {
            let pk = old_pk.context("a delete without its key")?;
            self.finish(relation, pk, seq, version, None);
            return Ok(());
        };
        let new_pk = key_text(reg, shape, values)?;
        let source_pk = old_pk.unwrap_or_else(|| new_pk.clone());
        let previous = self
            .previous(db, statements, reg, relation, &source_pk, values)
            .await?;
        let row = row_json(reg, shape, values, previous.as_deref())?;
        if source_pk != new_pk {
            self.finish(relation, source_pk, seq, version.clone(), None);
        }
        self.finish(relation, new_pk, seq, version, Some(row));
        Ok(())
    }

    /// When unchanged TOAST values are among `values`, the row's previous state: from
    /// earlier in this transaction or batch, or from the projection.
    async fn previous(
        &self,
        db: &Client,
        statements: &Statements,
        reg: &Registered,
        relation: u32,
        source_pk: &str,
        values: &[Value],
    ) -> Result<Option<String>> {
        if !values.iter().any(|v| matches!(v, Value::Unchanged)) {
            return Ok(None);
        }
        let key = RowKey {
            relation,
            pk: source_pk.to_owned(),
        };
        let earlier = self
            .changes
            .finals
            .get(&key)
            .or_else(|| self.earlier.finals.get(&key));
        Ok(match earlier {
            Some(earlier) => earlier.row.clone(),
            None => db
                .query_opt(&statements.previous, &[&reg.relation_id, &source_pk])
                .await?
                .map(|r| r.get(0)),
        })
    }

    fn finish(
        &mut self,
        relation: u32,
        pk: String,
        seq: usize,
        version: String,
        row: Option<String>,
    ) {
        self.changes
            .finals
            .insert(RowKey { relation, pk }, FinalRow { seq, version, row });
    }
}

/// A `synchro.fence` message: the version the source trigger allocated for a row.
struct Fence {
    key: FenceKey,
    version: String,
}

impl Fence {
    /// Decodes `{"relation_id", "key", "version", …}`.
    fn decode(content: &[u8]) -> Result<Fence> {
        let fence = std::str::from_utf8(content)
            .ok()
            .and_then(|t| Json::parse(t).ok())
            .ok_or(Blocked(BlockReason::DecodeError))?;
        let text = |k: &str| fence.get(k).and_then(Json::as_str).map(str::to_owned);
        match (text("relation_id"), text("key"), text("version")) {
            (Some(relation_id), Some(key), Some(version)) => Ok(Fence {
                key: FenceKey { relation_id, key },
                version,
            }),
            _ => bail!(Blocked(BlockReason::DecodeError)),
        }
    }
}
