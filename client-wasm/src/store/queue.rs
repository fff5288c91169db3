//! The durable mutation queue (spec 000 "Authored-Schema Queued Mutations"): every local
//! write to a synced table changes the visible row and appends the mutation that records the
//! intent, in one SQLite transaction, so a crash can never keep one without the other.
//!
//! A mutation keeps, for its whole life: batch_id, mutation_id (UUIDv7 from injected clock
//! and randomness), table_id, typed primary key, operation, base_version (the server version
//! the intent was made against), client_version (a per-row local counter), the ordered
//! `(field_id, value)` columns the application gave (an absent field is absent, a null is
//! present), the authored schema reference and its local order (a counter of the client).
//! Both counters are kept apart from the queue and never go back. Mutations collect in the
//! open batch; sealing fixes a batch's request content for ever. Before sealing, only the
//! server-owned base_version of a mutation may be refreshed (when a predecessor for the same
//! row is accepted); nothing changes after.
//!
//! Rows with unresolved intent are protected (see `rows`): pull and rebuild keep updating the
//! server layer but leave the visible row alone.

use std::collections::HashSet;

use rusqlite::{params, Connection, OptionalExtension};
use synchro_protocol::digest::row_digest;
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::manifest::Table;
use synchro_protocol::migration::quote_ident;
use synchro_protocol::value::TypedValue;
use synchro_protocol::wire::gate::PushLimits;
use synchro_protocol::wire::{self, AuthoredSchema, Column, Message, Outcome, PushResponse};

use super::enums::{MutationState, OutcomeStatus};
use super::rows::{
    delete_row, drop_shadow, has_shadow, pending_keys, restore_visible, row_exists, server_version,
    set_shadow, shadow, table_of, visible_row,
};
use super::values::to_sql;
use super::{run, Storage};
use crate::error::StorageError;
/// A local write's kind: the wire's operation.
pub use synchro_protocol::wire::Operation;

/// Most mutations sealed into one batch (the server's default limit, `PushLimits`).
pub const MAX_BATCH: i64 = 1000;

/// Most bytes of canonical mutation JSON sealed into one batch: half the server's default
/// request body limit (1 MiB), so a batch with its envelope always fits. A batch is cut
/// before the mutation that would pass it (a batch holds at least one mutation, and one
/// mutation is at most `PushLimits::mutation_bytes`, checked when it is written).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// What a queued mutation adds to its columns and key in canonical JSON, at most: member
/// names, IDs (mutation, table: at most 256 bytes each), the operation, a base version,
/// counters and the authored schema reference.
const MUTATION_ENVELOPE_BYTES: usize = 1024;

/// One local write through the engine.
#[derive(Debug, Clone, Copy)]
pub struct LocalWrite<'a> {
    /// Logical table ID.
    pub table_id: &'a str,
    /// Insert, update or delete.
    pub operation: Operation,
    /// The row's key.
    pub pk: &'a TypedValue,
    /// `(field_id, value)` in the application's order, the key field excluded.
    pub columns: &'a [(String, TypedValue)],
}

/// One queued mutation as stored (for inspection): the mutation as it is pushed, with what
/// only the queue knows of it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedMutation {
    /// The batch it is (or will be) sent in.
    pub batch_id: String,
    /// Pending until its outcome is stored, then the outcome's status.
    pub state: MutationState,
    /// The mutation as pushed: its ID (UUIDv7), table, key, operation, the server version
    /// the intent was made against (none for a row the server never sent), the per-row
    /// client version, the position in the local write order, the columns in the order
    /// given and the schema the intent was authored under. Only `base_version` may change,
    /// and only until the batch is sealed.
    pub mutation: wire::Mutation,
}

impl QueuedMutation {
    /// The key's wire JSON text, as the queue, the shadow and the row tables key the row.
    pub fn pk_text(&self) -> String {
        to_output_string(&self.mutation.pk)
    }
}

fn invalid(field_id: &str) -> StorageError {
    StorageError::InvalidValue {
        field_id: field_id.to_owned(),
    }
}

/// How many of the latest local orders a cleared mutation's ID is remembered for.
pub(crate) const CLEARED_KEPT: i64 = 10_000;

/// The open batch, if there is one.
fn open_batch(conn: &Connection) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        r#"SELECT "batch_id" FROM "_synchro_batches" WHERE "sealed" = 0"#,
        [],
        |r| r.get(0),
    )
    .optional()
}

/// Creates a new batch after every existing one (it is the open batch: there is none).
fn new_batch(conn: &Connection, batch_id: &str) -> rusqlite::Result<()> {
    run(
        conn,
        r#"INSERT INTO "_synchro_batches" ("batch_id", "seq") VALUES (?, (SELECT coalesce(max("seq"), 0) + 1 FROM "_synchro_batches"))"#,
        [batch_id],
    )?;
    Ok(())
}

/// A batch is done: every mutation in it has its outcome, or moved to a successor.
fn complete_batch(conn: &Connection, batch_id: &str) -> rusqlite::Result<()> {
    run(
        conn,
        r#"UPDATE "_synchro_batches" SET "completed" = 1 WHERE "batch_id" = ?"#,
        [batch_id],
    )?;
    Ok(())
}

/// The write's first phase, before anything is written: the key and every value checked
/// against their types, each field writable and given once, no columns for a delete, and the
/// server's strict limits, which would refuse the whole batch carrying this intent every time
/// it is sent (the write is refused now instead). Returns the intent's columns as queued.
fn validate_write(
    table: &Table,
    write: &LocalWrite<'_>,
    pk_text: &str,
) -> Result<Vec<Column>, StorageError> {
    let key_field = table.primary_key();
    write
        .pk
        .check(&key_field.spec)
        .map_err(|_| invalid(&key_field.field_id))?;
    if write.operation == Operation::Delete && !write.columns.is_empty() {
        return Err(invalid("(columns of a delete)"));
    }
    let mut seen = HashSet::new();
    for (field_id, value) in write.columns {
        let field = table
            .field(field_id)
            .filter(|f| f.field_id != table.primary_key_field_id)
            .ok_or_else(|| invalid(field_id))?;
        if !field.writable || !seen.insert(field_id.as_str()) {
            return Err(invalid(field_id));
        }
        value.check(&field.spec).map_err(|_| invalid(field_id))?;
    }
    let limits = PushLimits::default();
    if write.columns.len() > limits.columns {
        return Err(StorageError::TooLarge(
            "more columns than a mutation may carry",
        ));
    }
    let columns: Vec<Column> = write
        .columns
        .iter()
        .map(|(field_id, v)| Column {
            field_id: field_id.clone(),
            value: v.to_wire(),
        })
        .collect();
    let columns_bytes = to_output_string(&Column::list_to_json(&columns)).len();
    if columns_bytes + pk_text.len() + MUTATION_ENVELOPE_BYTES > limits.mutation_bytes {
        return Err(StorageError::TooLarge(
            "the mutation's values are larger than a push may carry",
        ));
    }
    Ok(columns)
}

/// The write's second phase: the intent as it will be pushed, made against the server
/// version of the row (none: the server never sent it), with the row's next client version
/// and the client's next local order. The counters live apart from the queue, which may be
/// cleared of resolved mutations: neither number is ever handed out twice.
fn build_intent(
    tx: &Connection,
    manifest: &Manifest,
    write: &LocalWrite<'_>,
    pk_text: &str,
    mutation_id: String,
    columns: Vec<Column>,
) -> Result<wire::Mutation, StorageError> {
    let base_version = server_version(tx, write.table_id, pk_text)?;
    let client_version: i64 = tx.query_row(
        r#"INSERT INTO "_synchro_row_counters" VALUES (?, ?, 1)
           ON CONFLICT ("table_id", "pk") DO UPDATE SET "client_version" = "client_version" + 1
           RETURNING "client_version""#,
        params![write.table_id, pk_text],
        |r| r.get(0),
    )?;
    let local_order: i64 = tx.query_row(
        r#"UPDATE "_synchro_client" SET "last_local_order" = "last_local_order" + 1 WHERE "id" = 1
           RETURNING "last_local_order""#,
        [],
        |r| r.get(0),
    )?;
    Ok(wire::Mutation {
        mutation_id,
        table_id: write.table_id.to_owned(),
        pk: write.pk.to_wire(),
        operation: write.operation,
        base_version,
        client_version: client_version as u64,
        local_order: local_order as u64,
        columns,
        authored_schema: manifest.schema_ref().into(),
    })
}

/// The write's third phase: the visible row changed as the write says, after the server
/// state to return to if the intent fails is kept (from the first unresolved intent on the
/// row; `server_sent` says whether the server ever sent the row, whose visible state is then
/// that server state).
fn apply_visible(
    tx: &Connection,
    table: &Table,
    write: &LocalWrite<'_>,
    pk_text: &str,
    server_sent: bool,
) -> Result<(), StorageError> {
    let LocalWrite {
        table_id,
        operation,
        pk,
        columns,
    } = *write;
    let key_field = table.primary_key();
    match (operation, row_exists(tx, table, pk)?) {
        (Operation::Insert, true) => {
            return Err(StorageError::RowState(
                "a row with this key exists already: update it",
            ))
        }
        (Operation::Update | Operation::Delete, false) => {
            return Err(StorageError::RowState("no row has this key"))
        }
        _ => {}
    }
    if !has_shadow(tx, table_id, pk_text)? {
        let row = if server_sent {
            visible_row(tx, table, pk)?
        } else {
            None
        };
        set_shadow(tx, table_id, pk_text, row.as_deref())?;
    }
    match operation {
        Operation::Insert => {
            let mut names = vec![quote_ident(&key_field.name)];
            let mut values = vec![to_sql(pk)];
            for f in &table.fields {
                if f.field_id == table.primary_key_field_id {
                    continue;
                }
                match columns.iter().find(|(id, _)| *id == f.field_id) {
                    Some((_, v)) => {
                        names.push(quote_ident(&f.name));
                        values.push(to_sql(v));
                    }
                    None if f.spec.nullable => {}
                    None => {
                        return Err(StorageError::MissingValue {
                            field_id: f.field_id.clone(),
                        })
                    }
                }
            }
            run(
                tx,
                &format!(
                    "INSERT INTO {} ({}) VALUES ({})",
                    quote_ident(&table.name),
                    names.join(", "),
                    vec!["?"; names.len()].join(", ")
                ),
                rusqlite::params_from_iter(values),
            )?;
        }
        Operation::Update if !columns.is_empty() => {
            let sets: Vec<String> = columns
                .iter()
                .map(|(id, _)| {
                    format!(
                        "{} = ?",
                        quote_ident(&table.field(id).expect("checked").name)
                    )
                })
                .collect();
            let mut values: Vec<_> = columns.iter().map(|(_, v)| to_sql(v)).collect();
            values.push(to_sql(pk));
            run(
                tx,
                &format!(
                    "UPDATE {} SET {} WHERE {} = ?",
                    quote_ident(&table.name),
                    sets.join(", "),
                    quote_ident(&key_field.name)
                ),
                rusqlite::params_from_iter(values),
            )?;
        }
        Operation::Update => {}
        Operation::Delete => delete_row(tx, table, pk)?,
    }
    Ok(())
}

/// The write's last phase: the intent appended to the open batch (created as
/// `new_batch_id` when there is none). The columns are stored as the canonical JSON text of
/// the wire's `columns`, the key as its wire JSON text.
fn append_intent(
    tx: &Connection,
    mutation: &wire::Mutation,
    pk_text: &str,
    new_batch_id: String,
) -> Result<(), StorageError> {
    let batch_id = match open_batch(tx)? {
        Some(b) => b,
        None => {
            new_batch(tx, &new_batch_id)?;
            new_batch_id
        }
    };
    run(
        tx,
        r#"INSERT INTO "_synchro_mutations" ("mutation_id", "batch_id", "local_order", "table_id", "pk", "operation",
               "base_version", "client_version", "columns", "authored_version", "authored_hash")
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"#,
        params![
            mutation.mutation_id,
            batch_id,
            mutation.local_order as i64,
            mutation.table_id,
            pk_text,
            mutation.operation.as_str(),
            mutation.base_version,
            mutation.client_version as i64,
            to_output_string(&Column::list_to_json(&mutation.columns)),
            mutation.authored_schema.version as i64,
            mutation.authored_schema.hash,
        ],
    )?;
    Ok(())
}

/// Queues `m`'s columns again as a new update of its row on the server's `version`, applied
/// to the visible row (now the server's); the new mutation's ID, or `None` when the active
/// schema cannot hold the columns any more (the conflict then stands as it is).
fn rebase_one(
    tx: &Connection,
    manifest: &Manifest,
    m: &wire::Mutation,
    pk_text: &str,
    version: &str,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Option<String>, StorageError> {
    let Some(table) = manifest.table(&m.table_id) else {
        return Ok(None);
    };
    let typed = |spec, v| TypedValue::from_wire(spec, v).ok();
    let Some(pk) = typed(&table.primary_key().spec, &m.pk) else {
        return Ok(None);
    };
    let mut columns = Vec::new();
    for c in &m.columns {
        match table.field(&c.field_id).filter(|f| f.writable) {
            Some(f) => match typed(&f.spec, &c.value) {
                Some(v) => columns.push((c.field_id.clone(), v)),
                None => return Ok(None),
            },
            None => return Ok(None),
        }
    }
    let write = LocalWrite {
        table_id: &m.table_id,
        operation: wire::Operation::Update,
        pk: &pk,
        columns: &columns,
    };
    let mut intent = build_intent(tx, manifest, &write, pk_text, new_id(), m.columns.clone())?;
    intent.base_version = Some(version.to_owned());
    apply_visible(tx, table, &write, pk_text, true)?;
    append_intent(tx, &intent, pk_text, new_id())?;
    Ok(Some(intent.mutation_id))
}

impl Storage {
    /// Writes locally and queues the intent, in one transaction. `columns` are
    /// `(field_id, value)` in the application's order (the key field excluded: it is `pk`);
    /// a field not listed is absent (an insert stores NULL there, an update leaves it).
    /// Returns the mutation ID.
    pub(crate) fn write_local(
        &mut self,
        manifest: &Manifest,
        write: &LocalWrite<'_>,
        (mutation_id, new_batch_id): (String, String),
    ) -> Result<String, StorageError> {
        let table = table_of(manifest, write.table_id)?;
        let pk_text = write.pk.to_wire_text();
        let columns = validate_write(table, write, &pk_text)?;
        self.with_tx(|tx| {
            let intent = build_intent(tx, manifest, write, &pk_text, mutation_id, columns)?;
            apply_visible(tx, table, write, &pk_text, intent.base_version.is_some())?;
            append_intent(tx, &intent, &pk_text, new_batch_id)?;
            Ok(intent.mutation_id)
        })
    }

    /// Every queued mutation in local order (all states), for inspection.
    pub fn mutations(&self) -> Result<Vec<QueuedMutation>, StorageError> {
        batch_mutations(self.connection(), None)
    }

    /// Whether the queue holds the mutation `mutation_id` (in any state), or held it until
    /// [`Storage::clear_resolved`] cleared it within the last [`CLEARED_KEPT`] local orders
    /// (a re-send of a write comes within seconds of the write, not thousands of writes later).
    pub(crate) fn has_mutation(&self, mutation_id: &str) -> Result<bool, StorageError> {
        Ok(self
            .connection()
            .query_row(
                r#"SELECT 1 FROM "_synchro_mutations" WHERE "mutation_id" = ?1
                   UNION ALL SELECT 1 FROM "_synchro_cleared" WHERE "mutation_id" = ?1"#,
                [mutation_id],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// How many mutations wait for their outcome (counted by SQLite: the live session asks
    /// after every closure, and the queue keeps every resolved mutation).
    pub(crate) fn pending_count(&self) -> Result<usize, StorageError> {
        let n: i64 = self.connection().query_row(
            r#"SELECT count(*) FROM "_synchro_mutations" WHERE "state" = ?"#,
            [MutationState::Pending],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// The last local order handed out (0 before the first write).
    pub(crate) fn last_local_order(&self) -> Result<i64, StorageError> {
        Ok(self.connection().query_row(
            r#"SELECT coalesce((SELECT "last_local_order" FROM "_synchro_client" WHERE "id" = 1), 0)"#,
            [],
            |r| r.get(0),
        )?)
    }

    /// Whether a pending mutation of local order `mark` or below is still unsealed.
    pub(crate) fn unsealed_through(&self, mark: i64) -> Result<bool, StorageError> {
        Ok(self.connection().query_row(
            r#"SELECT EXISTS (SELECT 1 FROM "_synchro_mutations" m JOIN "_synchro_batches" b USING ("batch_id")
                 WHERE b."sealed" = 0 AND m."state" = ? AND m."local_order" <= ?)"#,
            params![MutationState::Pending, mark],
            |r| r.get(0),
        )?)
    }

    /// Seals the open batch (at most [`MAX_BATCH`] mutations, [`MAX_BATCH_BYTES`] of them,
    /// and one per row; later ones
    /// move to a new open batch `rest_batch_id`) under the request schema `schema`. From now
    /// on its request content never changes. Returns whether a batch was sealed.
    pub(crate) fn seal(
        &mut self,
        schema: &AuthoredSchema,
        rest_batch_id: &str,
    ) -> Result<bool, StorageError> {
        self.with_tx(|tx| {
            let Some(batch_id) = open_batch(tx)? else {
                return Ok(false);
            };
            let queued = batch_mutations(tx, Some(&batch_id))?;
            if queued.is_empty() {
                return Ok(false);
            }
            // A batch holds at most one mutation per row: a later intent on the same row
            // waits, unsealed, for its predecessor's outcome (which refreshes its
            // base_version).
            let mut rows = HashSet::new();
            let mut items: Vec<Json> = Vec::new();
            let mut bytes = 0;
            for q in queued.iter().take(MAX_BATCH as usize) {
                if !rows.insert((&q.mutation.table_id, q.pk_text())) {
                    break;
                }
                let item = q.mutation.to_json();
                bytes += to_output_string(&item).len() + 1;
                if !items.is_empty() && bytes > MAX_BATCH_BYTES {
                    break;
                }
                items.push(item);
            }
            let cut = items.len();
            if cut < queued.len() {
                new_batch(tx, rest_batch_id)?;
                for q in &queued[cut..] {
                    run(
                        tx,
                        r#"UPDATE "_synchro_mutations" SET "batch_id" = ? WHERE "mutation_id" = ?"#,
                        params![rest_batch_id, q.mutation.mutation_id],
                    )?;
                }
            }
            let request = Json::Object(vec![
                ("schema".into(), schema.to_json()),
                ("mutations".into(), Json::Array(items)),
            ]);
            run(
                tx,
                r#"UPDATE "_synchro_batches" SET "sealed" = 1, "request" = ? WHERE "batch_id" = ?"#,
                params![to_output_string(&request), batch_id],
            )?;
            Ok(true)
        })
    }

    /// Sealed batches still waiting for their outcomes, oldest first: (batch_id, request).
    pub(crate) fn sealed_batches(&self) -> Result<Vec<(String, Json)>, StorageError> {
        let mut q = self.connection().prepare(
            r#"SELECT "batch_id", "request" FROM "_synchro_batches" WHERE "sealed" = 1 AND "completed" = 0 ORDER BY "seq""#,
        )?;
        let rows: Vec<(String, String)> = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        rows.into_iter()
            .map(|(b, r)| {
                Json::parse(&r)
                    .map(|j| (b, j))
                    .map_err(|_| StorageError::Schema("a sealed batch does not parse".into()))
            })
            .collect()
    }

    /// After a request-level schema_mismatch: the sealed batch stays as it was (its request
    /// is kept), and its unresolved mutations move, unchanged and with their IDs, into the
    /// open batch (created as `successor` when there is none), to be sealed again under the
    /// then-current schema.
    pub(crate) fn supersede(
        &mut self,
        batch_id: &str,
        successor: &str,
    ) -> Result<(), StorageError> {
        self.with_tx(|tx| {
            let target = match open_batch(tx)? {
                Some(b) => b,
                None => {
                    new_batch(tx, successor)?;
                    successor.to_owned()
                }
            };
            run(
                tx,
                r#"UPDATE "_synchro_mutations" SET "batch_id" = ? WHERE "batch_id" = ? AND "state" = ?"#,
                params![target, batch_id, MutationState::Pending],
            )?;
            complete_batch(tx, batch_id)?;
            Ok(())
        })
    }

    /// Stores a push response's outcomes durably, in one transaction: every outcome as
    /// received, each mutation's state, the base_version of unsealed successors of an
    /// applied row refreshed, and every row whose intent is now resolved returned to the
    /// server's state when its last outcome was not applied. Row-bearing outcomes are
    /// verified first; a response that does not match its batch changes nothing.
    ///
    /// With `rebase` (the opt-in conflict policy: a source of new mutation IDs), an update
    /// that conflicted is written again in the same transaction, as a new mutation whose base
    /// is the server's current version, when the fields it wrote are ones the server did not
    /// change since the row it was made on (and the row has no other pending intent): the
    /// visible row becomes the server's with those fields, and the server still decides. The
    /// conflict's stored outcome then names it (`rebased_as`).
    pub(crate) fn record_outcomes(
        &mut self,
        manifest: &Manifest,
        batch_id: &str,
        response: &Json,
        mut rebase: Option<&mut dyn FnMut() -> String>,
    ) -> Result<usize, StorageError> {
        let integrity = StorageError::Verification;
        // The one parser of the wire: every outcome's shape and checksum object.
        let response = PushResponse::from_json(response).map_err(|e| integrity(e.message))?;
        if response.batch_id != batch_id {
            return Err(integrity("the response is for another batch"));
        }
        let outcomes = &response.outcomes;
        self.with_tx(|tx| {
            let batch = batch_mutations(tx, Some(batch_id))?;
            if outcomes.len() != batch.len() {
                return Err(integrity("the outcomes do not match the batch"));
            }
            let mut touched: Vec<(&str, String, OutcomeStatus)> = Vec::new();
            // Conflicts a rebase may take up: (the mutation, its outcome, the server's version).
            let mut rebases: Vec<(&QueuedMutation, &Outcome, &str)> = Vec::new();
            for (queued, o) in batch.iter().zip(outcomes) {
                let m = &queued.mutation;
                let pk_text = queued.pk_text();
                if o.mutation_id() != m.mutation_id {
                    return Err(integrity("the outcomes do not match the batch"));
                }
                let status = OutcomeStatus::of(o);
                debug_assert_eq!(status.as_str(), o.status());
                // A row-bearing outcome must carry the digest of its row.
                let mut server_row = None;
                if let Some((version, row, checksum)) = o.row() {
                    let d = row_digest(manifest, &m.table_id, &m.pk, row, version)
                        .map_err(|_| integrity("an outcome row does not match its table"))?;
                    if d.digest != checksum.0 {
                        return Err(integrity("an outcome row does not match its checksum"));
                    }
                    server_row = Some(to_output_string(row));
                }
                run(
                    tx,
                    r#"INSERT OR REPLACE INTO "_synchro_outcomes" VALUES (?, ?, ?, ?)"#,
                    params![
                        m.mutation_id,
                        status,
                        o.code(),
                        to_output_string(&o.to_json())
                    ],
                )?;
                run(
                    tx,
                    r#"UPDATE "_synchro_mutations" SET "state" = ? WHERE "mutation_id" = ?"#,
                    params![MutationState::from(status), m.mutation_id],
                )?;
                if let Outcome::Applied { server_version, .. } = o {
                    // Only the server-owned base of unsealed successors may change.
                    run(
                        tx,
                        r#"UPDATE "_synchro_mutations" SET "base_version" = ?
                            WHERE "table_id" = ? AND "pk" = ? AND "state" = ?
                              AND "batch_id" IN (SELECT "batch_id" FROM "_synchro_batches" WHERE "sealed" = 0)"#,
                        params![server_version, m.table_id, pk_text, MutationState::Pending],
                    )?;
                }
                if status == OutcomeStatus::Conflict {
                    if let (true, Some(Some(base)), Some((version, current, _))) = (
                        rebase.is_some() && m.operation == wire::Operation::Update,
                        shadow(tx, &m.table_id, &pk_text)?,
                        o.row(),
                    ) {
                        // The row the write was made on against the server's: the fields
                        // the server changed since.
                        let base = Json::parse(&base).ok();
                        let untouched = |c: &Column| {
                            base.as_ref()
                                .is_some_and(|b| b.get(&c.field_id) == current.get(&c.field_id))
                        };
                        if m.columns.iter().all(untouched) {
                            rebases.push((queued, o, version));
                        }
                    }
                    // The conflict names the server's current row (or none): that is the
                    // state to return to.
                    set_shadow(tx, &m.table_id, &pk_text, server_row.as_deref())?;
                }
                touched.push((&m.table_id, pk_text, status));
            }
            complete_batch(tx, batch_id)?;
            // Rows whose intent is now resolved.
            let pending = pending_keys(tx)?;
            for (table_id, pk, status) in touched.iter().rev() {
                let (table_id, pk, status) = (*table_id, pk.as_str(), *status);
                if pending.contains(&(table_id.to_owned(), pk.to_owned())) {
                    continue;
                }
                let Some(shadow) = shadow(tx, table_id, pk)? else {
                    continue;
                };
                // (A table the current manifest retired has no local rows to restore.)
                if let (true, Some(table)) =
                    (status != OutcomeStatus::Applied, manifest.table(table_id))
                {
                    let key = TypedValue::from_wire_text(&table.primary_key().spec, pk)
                        .map_err(|_| integrity("a queued key"))?;
                    restore_visible(tx, table, &key, shadow.as_deref())?;
                }
                drop_shadow(tx, table_id, pk)?;
            }
            if let Some(new_id) = rebase.as_mut() {
                let pending = pending_keys(tx)?;
                for (queued, o, version) in rebases {
                    let m = &queued.mutation;
                    let pk_text = queued.pk_text();
                    if pending.contains(&(m.table_id.clone(), pk_text.clone())) {
                        continue;
                    }
                    let Some(id) = rebase_one(tx, manifest, m, &pk_text, version, &mut **new_id)?
                    else {
                        continue;
                    };
                    let mut outcome = o.to_json();
                    if let Json::Object(members) = &mut outcome {
                        members.push(("rebased_as".into(), Json::String(id)));
                    }
                    run(
                        tx,
                        r#"UPDATE "_synchro_outcomes" SET "outcome" = ? WHERE "mutation_id" = ?"#,
                        params![to_output_string(&outcome), m.mutation_id],
                    )?;
                }
            }
            Ok(outcomes.len())
        })
    }

    /// The stored outcome of a mutation, as received.
    pub fn outcome(&self, mutation_id: &str) -> Result<Option<String>, StorageError> {
        Ok(self
            .connection()
            .query_row(
                r#"SELECT "outcome" FROM "_synchro_outcomes" WHERE "mutation_id" = ?"#,
                [mutation_id],
                |r| r.get(0),
            )
            .optional()?)
    }
}

impl Storage {
    /// Clears resolved intent from the queue, in one transaction: every mutation with its
    /// outcome (applied, conflict, rejected_terminal), that outcome, and every completed batch
    /// left without mutations. Unresolved intent, sealed or not, is never touched, nor are the
    /// counters (a later write never reuses a local order or a row's client_version). The
    /// IDs of the mutations cleared among the last [`CLEARED_KEPT`] local orders are kept
    /// (see [`Storage::has_mutation`]). Returns how many mutations were cleared.
    pub(crate) fn clear_resolved(&mut self) -> Result<usize, StorageError> {
        self.with_tx(|tx| {
            run(
                tx,
                r#"INSERT OR IGNORE INTO "_synchro_cleared"
                     SELECT "mutation_id", "local_order" FROM "_synchro_mutations" WHERE "state" <> ?"#,
                [MutationState::Pending],
            )?;
            run(
                tx,
                r#"DELETE FROM "_synchro_cleared" WHERE "local_order" <=
                     (SELECT "last_local_order" FROM "_synchro_client" WHERE "id" = 1) - ?"#,
                [CLEARED_KEPT],
            )?;
            run(
                tx,
                r#"DELETE FROM "_synchro_outcomes" WHERE "mutation_id" IN
                     (SELECT "mutation_id" FROM "_synchro_mutations" WHERE "state" <> ?)"#,
                [MutationState::Pending],
            )?;
            let cleared = run(
                tx,
                r#"DELETE FROM "_synchro_mutations" WHERE "state" <> ?"#,
                [MutationState::Pending],
            )?;
            run(
                tx,
                r#"DELETE FROM "_synchro_batches" WHERE "completed" = 1 AND NOT EXISTS
                     (SELECT 1 FROM "_synchro_mutations" m WHERE m."batch_id" = "_synchro_batches"."batch_id")"#,
                [],
            )?;
            Ok(cleared)
        })
    }
}

/// The mutations of `batch_id` (every one when `None`), in local order.
fn batch_mutations(
    conn: &Connection,
    batch_id: Option<&str>,
) -> Result<Vec<QueuedMutation>, StorageError> {
    let mut q = conn.prepare(
        r#"SELECT "mutation_id", "batch_id", "local_order", "table_id", "pk", "operation", "base_version",
                  "client_version", "columns", "authored_version", "authored_hash", "state"
             FROM "_synchro_mutations" WHERE ?1 IS NULL OR "batch_id" = ?1 ORDER BY "local_order""#,
    )?;
    // A stored text that does not read back as written.
    let unreadable = |column: usize, what: &'static str| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, what.into())
    };
    let json = |r: &rusqlite::Row<'_>, column: usize| {
        Json::parse(&r.get::<_, String>(column)?)
            .map_err(|_| unreadable(column, "a queued mutation does not parse"))
    };
    let out = q
        .query_map([batch_id], |r| {
            let operation: String = r.get(5)?;
            Ok(QueuedMutation {
                batch_id: r.get(1)?,
                state: r.get(11)?,
                mutation: wire::Mutation {
                    mutation_id: r.get(0)?,
                    table_id: r.get(3)?,
                    pk: json(r, 4)?,
                    operation: Operation::parse(&operation)
                        .ok_or_else(|| unreadable(5, "not a stored operation"))?,
                    base_version: r.get(6)?,
                    client_version: r.get::<_, i64>(7)? as u64,
                    local_order: r.get::<_, i64>(2)? as u64,
                    columns: Column::list_from_json(Some(&json(r, 8)?))
                        .map_err(|_| unreadable(8, "a queued mutation does not parse"))?,
                    authored_schema: AuthoredSchema {
                        version: r.get::<_, i64>(9)? as u64,
                        hash: r.get(10)?,
                    },
                },
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(out)
}
