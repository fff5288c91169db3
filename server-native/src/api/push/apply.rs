//! A batch's writes and their authorization (spec-gaps "ADR 002"; issue 12.6).
//!
//! The rule, per mutation in order: the compare-and-swap write through
//! `synchro_push_write_batch`; then the row's scopes before the write (when it existed) and after
//! it (an applied insert or update). A row that shares no scope with the user before the
//! write is answered exactly like a missing row (`conflict` without row members), so a push
//! never reveals whether an invisible row exists; a write that adds the row to any scope
//! the user does not hold (a scope of the after-image the before-image lacked), or a new
//! row the user could not see, is undone (`forbidden`). Any other outcome that is not
//! `applied` is undone too, as a savepoint rollback would.
//!
//! [`apply`] gets exactly those outcomes in a few round trips per batch instead of a dozen
//! per mutation: every write in one call (`synchro_push_write_batch`, each in its own
//! subtransaction, undoing those it is told to), then every row image's scopes in one call
//! ([`super::scopes`]). When the writes it kept are exactly the ones authorization keeps,
//! that run is the sequential execution and its outcomes are final. Otherwise (a
//! forbidden or invisible applied write it kept, or one it undid that authorization keeps)
//! it rolls the call back and runs the batch again, undoing the writes the last run's
//! authorization refused; images already evaluated are not evaluated again. After
//! [`ATTEMPTS`] runs, or on any error, it rolls back and runs [`sequential`]: one mutation at
//! a time in a savepoint, evaluating the before-image, then the after-image only when
//! needed — the rule above executed literally, which also yields any error exactly where
//! one-by-one execution meets it.

use std::collections::{BTreeSet, HashMap};

use synchro_protocol::checksum::Checksum;
use synchro_protocol::digest::row_digest;
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::{Manifest, Table};
use synchro_protocol::types::PortableType;
use synchro_protocol::wire::{Outcome, OutcomeRow};

use crate::capture::values::ValueSource;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use super::checks::Prepared;
use super::scopes::{evaluate, Probe};
use super::{missing_row_conflict, rejected};
use crate::api::{ApiError, Integrity};

/// Optimistic runs of a batch before it is executed one mutation at a time.
const ATTEMPTS: usize = 3;

/// A source row's fields as text (null for SQL NULL), in attnum order.
type Image = Vec<Option<String>>;

/// The synced fields of a relation with how their text is read, in attnum order.
type ImageFields = Vec<(String, ValueSource)>;

/// What the batch shares.
pub(super) struct Context<'a> {
    /// The current manifest.
    pub(super) current: &'a Manifest,
    /// The user's assigned scopes.
    pub(super) assigned: &'a BTreeSet<String>,
}

/// What the database reported for one write.
struct Written {
    status: String,
    version: Option<String>,
    pre: Option<Image>,
    post: Option<Image>,
}

/// A written row by field ID, and its canonical JSON text (the projection's form).
struct Row {
    json: Json,
    text: String,
}

/// Authorization's answer for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The row existed and shares no scope with the user: answered like a missing row.
    Invisible,
    /// The write adds a scope the user does not hold, or makes a row they cannot see.
    Forbidden,
    /// Authorization does not stand in the way.
    Allowed,
}

/// The outcomes of `writes`, in order, as one-by-one execution gives them.
pub(super) async fn apply(
    tx: &Transaction<'_>,
    membership: &mut Client,
    cx: &Context<'_>,
    writes: &[Prepared<'_>],
) -> Result<Vec<Outcome>, ApiError> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    // The relations' fields, and the savepoint the whole-batch runs return to, in one
    // round trip.
    let relations: BTreeSet<&str> = writes
        .iter()
        .map(|p| p.table.relation_id.as_str())
        .collect();
    let (loaded, read, savepoint) = futures_util::join!(
        futures_util::future::try_join_all(relations.iter().map(|relation| async move {
            tx.query_typed(
                "SELECT field_id, source FROM synchro.synchro_push_fields($1)",
                &[(relation, Type::TEXT)],
            )
            .await
        })),
        futures_util::future::try_join_all(relations.iter().map(|relation| async move {
            tx.query_typed_one(
                "SELECT synchro.synchro_push_rule_reads($1)",
                &[(relation, Type::TEXT)],
            )
            .await
        })),
        tx.batch_execute("SAVEPOINT synchro_batch")
    );
    let (loaded, read) = (loaded?, read?);
    savepoint?;
    let fields: HashMap<&str, ImageFields> = relations
        .iter()
        .zip(loaded)
        .map(|(relation, rows)| {
            let image = rows
                .iter()
                .map(|r| {
                    let source = ValueSource::parse(r.get(1))
                        .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
                    Ok((r.get(0), source))
                })
                .collect::<Result<_, ApiError>>()?;
            Ok((*relation, image))
        })
        .collect::<Result<_, ApiError>>()?;
    let reads: Reads = relations
        .into_iter()
        .zip(read)
        .map(|(relation, row)| (relation, row.get(0)))
        .collect();
    if let Some(outcomes) = optimistic(tx, membership, cx, writes, &fields, &reads).await? {
        return Ok(outcomes);
    }
    sequential(tx, membership, cx, writes, &fields).await
}

/// The batch in whole-batch runs, from the savepoint `synchro_batch` (which a successful
/// run leaves in place: the commit releases it); `None` when it must run one mutation at a
/// time (the transaction is then as it was before the savepoint).
async fn optimistic(
    tx: &Transaction<'_>,
    membership: &mut Client,
    cx: &Context<'_>,
    writes: &[Prepared<'_>],
    fields: &HashMap<&str, ImageFields>,
    reads: &Reads<'_>,
) -> Result<Option<Vec<Outcome>>, ApiError> {
    let mut discard = vec![false; writes.len()];
    let mut scopes: HashMap<(String, String, String), BTreeSet<String>> = HashMap::new();
    for _ in 0..ATTEMPTS {
        match run(
            tx,
            membership,
            cx,
            writes,
            fields,
            reads,
            &discard,
            &mut scopes,
        )
        .await
        {
            Ok(Ok(outcomes)) => return Ok(Some(outcomes)),
            Ok(Err(next)) => discard = next,
            Err(_) => break,
        }
        tx.batch_execute("ROLLBACK TO SAVEPOINT synchro_batch")
            .await?;
    }
    tx.batch_execute("ROLLBACK TO SAVEPOINT synchro_batch; RELEASE SAVEPOINT synchro_batch")
        .await?;
    Ok(None)
}

/// One whole-batch run undoing the writes `discard` names: the outcomes when the run kept
/// exactly the writes authorization keeps, otherwise the writes to undo in the next run.
/// An after-image equal to its before-image in every field the rule reads has the
/// before-image's scopes without an evaluation of its own.
#[allow(clippy::too_many_arguments)]
async fn run(
    tx: &Transaction<'_>,
    membership: &mut Client,
    cx: &Context<'_>,
    writes: &[Prepared<'_>],
    fields: &HashMap<&str, ImageFields>,
    reads: &Reads<'_>,
    discard: &[bool],
    scopes: &mut HashMap<(String, String, String), BTreeSet<String>>,
) -> Result<Result<Vec<Outcome>, Vec<bool>>, ApiError> {
    let written = write_batch(tx, writes, discard).await?;
    // The rows of every image authorization reads.
    let mut rows = Vec::with_capacity(writes.len());
    for (p, w) in writes.iter().zip(&written) {
        let f = &fields[p.table.relation_id.as_str()];
        let pre = w.pre.as_ref().map(|i| row(p.table, f, i)).transpose()?;
        let post = match (&w.post, w.status == "applied") {
            (Some(i), true) => Some(row(p.table, f, i)?),
            _ => None,
        };
        rows.push((pre, post));
    }
    let key = |p: &Prepared<'_>, r: &Row| {
        (
            p.table.relation_id.clone(),
            p.pk_wire.clone(),
            r.text.clone(),
        )
    };
    let mut probes = Vec::new();
    let mut probed = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // (after-image, before-image) pairs with the same scopes.
    let mut alike = Vec::new();
    for (p, (pre, post)) in writes.iter().zip(&rows) {
        let mut images = vec![pre.as_ref()];
        match (pre, post) {
            (Some(before), Some(after))
                if agree(reads.get(p.table.relation_id.as_str()), before, after) =>
            {
                alike.push((key(p, after), key(p, before)));
            }
            _ => images.push(post.as_ref()),
        }
        for r in images.into_iter().flatten() {
            let k = key(p, r);
            if !scopes.contains_key(&k) && seen.insert(k.clone()) {
                probes.push(Probe {
                    relation_id: &p.table.relation_id,
                    pk_wire: &p.pk_wire,
                    key: &p.key,
                    row: &r.text,
                });
                probed.push(k);
            }
        }
    }
    // A rule that fails on one of the rows: the batch runs one mutation at a time, which
    // finds which (the caller falls back to it on any error of a run).
    let evaluated = evaluate(membership, &probes)
        .await?
        .ok_or_else(|| ApiError::unavailable_because("rule_failed"))?;
    scopes.extend(probed.into_iter().zip(evaluated));
    for (after, before) in alike {
        let same = scopes
            .get(&before)
            .cloned()
            .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
        scopes.insert(after, same);
    }

    let mut outcomes = Vec::with_capacity(writes.len());
    // Whether authorization keeps each write, and whether the database did.
    let mut keep = Vec::with_capacity(writes.len());
    let mut consistent = true;
    for (((p, w), (pre, post)), discarded) in writes.iter().zip(written).zip(rows).zip(discard) {
        let pre_scopes = pre.as_ref().map(|r| &scopes[&key(p, r)]);
        let post_scopes = post.as_ref().map(|r| &scopes[&key(p, r)]);
        let verdict = verdict(cx.assigned, pre_scopes, post_scopes);
        let applied = w.status == "applied";
        let kept = applied && verdict == Verdict::Allowed;
        consistent &= kept == (applied && !discarded);
        keep.push(kept);
        outcomes.push(outcome(cx.current, p, w, pre, post, verdict)?);
    }
    if consistent {
        Ok(Ok(outcomes))
    } else {
        Ok(Err(keep.iter().map(|k| !k).collect()))
    }
}

/// The batch one mutation at a time, each in a savepoint: the rule executed literally.
async fn sequential(
    tx: &Transaction<'_>,
    membership: &mut Client,
    cx: &Context<'_>,
    writes: &[Prepared<'_>],
    fields: &HashMap<&str, ImageFields>,
) -> Result<Vec<Outcome>, ApiError> {
    let mut outcomes = Vec::with_capacity(writes.len());
    for p in writes {
        let f = &fields[p.table.relation_id.as_str()];
        tx.batch_execute("SAVEPOINT synchro_mutation").await?;
        let w = write_batch(tx, std::slice::from_ref(p), &[false])
            .await?
            .pop()
            .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
        fn probe<'a>(p: &'a Prepared<'_>, r: &'a Row) -> Probe<'a> {
            Probe {
                relation_id: &p.table.relation_id,
                pk_wire: &p.pk_wire,
                key: &p.key,
                row: &r.text,
            }
        }
        let pre = w.pre.as_ref().map(|i| row(p.table, f, i)).transpose()?;
        let mut pre_scopes = None;
        let mut failed = false;
        if let Some(r) = &pre {
            match evaluate(membership, &[probe(p, r)]).await? {
                Some(mut s) => pre_scopes = s.pop(),
                None => failed = true,
            }
        }
        let mut post = None;
        let mut post_scopes = None;
        if !failed
            && verdict(cx.assigned, pre_scopes.as_ref(), None) == Verdict::Allowed
            && w.status == "applied"
        {
            if let Some(i) = &w.post {
                let r = row(p.table, f, i)?;
                match evaluate(membership, &[probe(p, &r)]).await? {
                    Some(mut s) => post_scopes = s.pop(),
                    None => failed = true,
                }
                post = Some(r);
            }
        }
        if failed {
            // The table's membership rule fails on this row (as a CHECK constraint would):
            // this write is refused for good and the rest of the batch goes on.
            tx.batch_execute(
                "ROLLBACK TO SAVEPOINT synchro_mutation; RELEASE SAVEPOINT synchro_mutation",
            )
            .await?;
            outcomes.push(super::rejected(
                &p.m.mutation_id,
                "constraint_violation",
                "the table's membership rule failed on this row",
            ));
            continue;
        }
        let verdict = verdict(cx.assigned, pre_scopes.as_ref(), post_scopes.as_ref());
        let kept = w.status == "applied" && verdict == Verdict::Allowed;
        let o = outcome(cx.current, p, w, pre, post, verdict)?;
        tx.batch_execute(if kept {
            "RELEASE SAVEPOINT synchro_mutation"
        } else {
            "ROLLBACK TO SAVEPOINT synchro_mutation; RELEASE SAVEPOINT synchro_mutation"
        })
        .await?;
        outcomes.push(o);
    }
    Ok(outcomes)
}

/// The fields each relation's live rule reads (`synchro_push_rule_reads`; `None`: any).
type Reads<'a> = HashMap<&'a str, Option<Vec<String>>>;

/// Whether two images of a row agree in every field of `read` (the fields the relation's
/// rule reads; `None` when unknown, then they never agree).
fn agree<'a>(read: Option<&Option<Vec<String>>>, a: &'a Row, b: &'a Row) -> bool {
    let Some(Some(read)) = read else {
        return false;
    };
    let (Json::Object(a), Json::Object(b)) = (&a.json, &b.json) else {
        return false;
    };
    let value = |fields: &'a [(String, Json)], id: &str| {
        fields.iter().find(|(f, _)| f == id).map(|(_, v)| v)
    };
    read.iter().all(|id| value(a, id) == value(b, id))
}

/// Authorization of one write from the scopes of its before-image (when the row existed)
/// and after-image (an applied insert or update).
fn verdict(
    assigned: &BTreeSet<String>,
    pre: Option<&BTreeSet<String>>,
    post: Option<&BTreeSet<String>>,
) -> Verdict {
    if let Some(pre) = pre {
        if pre.is_disjoint(assigned) {
            return Verdict::Invisible;
        }
    }
    if let Some(post) = post {
        let none = BTreeSet::new();
        let adds_foreign_scope = post
            .difference(pre.unwrap_or(&none))
            .any(|scope| !assigned.contains(scope));
        let invisible_new_row = pre.is_none() && post.is_disjoint(assigned);
        if adds_foreign_scope || invisible_new_row {
            return Verdict::Forbidden;
        }
    }
    Verdict::Allowed
}

/// The outcome of one write given its authorization.
fn outcome(
    current: &Manifest,
    p: &Prepared<'_>,
    w: Written,
    pre: Option<Row>,
    post: Option<Row>,
    verdict: Verdict,
) -> Result<Outcome, ApiError> {
    let id = p.m.mutation_id.as_str();
    let digest = |row: &Json, version: &str| -> Result<Checksum, ApiError> {
        row_digest(current, &p.table.table_id, &p.pk.to_wire(), row, version)
            .map(|d| Checksum(d.digest))
            .map_err(|_| ApiError::integrity(Integrity::Digest))
    };
    match verdict {
        Verdict::Invisible => return Ok(missing_row_conflict(id)),
        Verdict::Forbidden => {
            return Ok(rejected(
                id,
                "forbidden",
                "the write would place the row outside the user's scopes",
            ))
        }
        Verdict::Allowed => {}
    }
    Ok(match w.status.as_str() {
        "applied" => {
            let version = w
                .version
                .ok_or_else(|| ApiError::integrity(Integrity::Answer))?;
            let row = match post {
                Some(r) => {
                    let c = digest(&r.json, &version)?;
                    Some((r.json, c))
                }
                None => None,
            };
            Outcome::Applied {
                mutation_id: id.to_owned(),
                server_version: version,
                row,
            }
        }
        "conflict" => {
            let mut conflict = missing_row_conflict(id);
            if let (Some(r), Some(version)) = (pre, w.version) {
                if let Outcome::Conflict { current, .. } = &mut conflict {
                    *current = Some(OutcomeRow {
                        row_checksum: digest(&r.json, &version)?,
                        server_version: version,
                        row: r.json,
                    });
                }
            }
            conflict
        }
        "not_writable" => rejected(id, "not_writable", "the table or a field is not writable"),
        "invalid_value" => rejected(id, "invalid_value", "a value cannot be represented"),
        status if status.contains(':') => {
            // Values named by the manifest's field names (never the value): refused by their
            // column's type, enum or domain on their own, or (the fence) by no portable type.
            let (kind, ids) = status.split_once(':').unwrap_or_default();
            let names: Vec<&str> = ids
                .split(',')
                .map(|f| p.table.field(f).map_or(f, |f| f.name.as_str()))
                .collect();
            let message = if kind == "unrepresentable" {
                format!(
                    "the value of {} cannot be held by its portable type",
                    names.join(", ")
                )
            } else {
                format!(
                    "the database refuses the value of {} (outside its type, enum or domain)",
                    names.join(", ")
                )
            };
            rejected(id, "invalid_value", &message)
        }
        _ => rejected(id, "constraint_violation", "the database refused the write"),
    })
}

/// Every write in one call, in order, each in its own subtransaction; the database keeps an
/// applied write unless `discard` names it.
async fn write_batch(
    tx: &Transaction<'_>,
    writes: &[Prepared<'_>],
    discard: &[bool],
) -> Result<Vec<Written>, ApiError> {
    let relations: Vec<&str> = writes
        .iter()
        .map(|p| p.table.relation_id.as_str())
        .collect();
    let ops: Vec<&str> = writes.iter().map(|p| p.m.operation.as_str()).collect();
    let keys: Vec<&str> = writes.iter().map(|p| p.key.as_str()).collect();
    let pk_wires: Vec<&str> = writes.iter().map(|p| p.pk_wire.as_str()).collect();
    let bases: Vec<Option<&str>> = writes.iter().map(|p| p.m.base_version.as_deref()).collect();
    let counts: Vec<i32> = writes.iter().map(|p| p.field_ids.len() as i32).collect();
    let columns: Vec<&str> = writes
        .iter()
        .flat_map(|p| p.field_ids.iter().copied())
        .collect();
    let values: Vec<Option<&str>> = writes
        .iter()
        .flat_map(|p| p.values.iter().map(Option::as_deref))
        .collect();
    let rows = tx
        .query_typed(
            "SELECT status, version, pre_image, post_image
               FROM synchro.synchro_push_write_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                (&relations, Type::TEXT_ARRAY),
                (&ops, Type::TEXT_ARRAY),
                (&keys, Type::TEXT_ARRAY),
                (&pk_wires, Type::TEXT_ARRAY),
                (&bases, Type::TEXT_ARRAY),
                (&counts, Type::INT4_ARRAY),
                (&columns, Type::TEXT_ARRAY),
                (&values, Type::TEXT_ARRAY),
                (&discard, Type::BOOL_ARRAY),
            ],
        )
        .await?;
    if rows.len() != writes.len() {
        return Err(ApiError::integrity(Integrity::Answer));
    }
    Ok(rows
        .iter()
        .map(|r| Written {
            status: r.get(0),
            version: r.get(1),
            pre: r.get(2),
            post: r.get(3),
        })
        .collect())
}

/// A row (by field ID) from a text image of the table's fields in attnum order.
fn row(
    table: &Table,
    fields: &[(String, ValueSource)],
    image: &[Option<String>],
) -> Result<Row, ApiError> {
    if image.len() != fields.len() {
        return Err(ApiError::unavailable());
    }
    let mut row = Vec::with_capacity(fields.len());
    for ((field_id, source), text) in fields.iter().zip(image) {
        let Some(field) = table.field(field_id) else {
            continue;
        };
        // `::text` of a boolean is true/false where the output function (pgoutput's form)
        // gives t/f; every other synced type casts through its output function.
        let text = match (field.spec.ty, text.as_deref()) {
            (PortableType::Boolean, Some("true")) => Some("t"),
            (PortableType::Boolean, Some("false")) => Some("f"),
            (_, t) => t,
        };
        let value = match text {
            None => Json::Null,
            Some(t) => crate::capture::values::text_to_wire(&field.spec, source, t.as_bytes())
                .map_err(|_| ApiError::integrity(Integrity::StoredRow))?
                .to_wire(),
        };
        row.push((field_id.clone(), value));
    }
    let json = Json::Object(row);
    Ok(Row {
        text: to_output_string(&json),
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &[&str]) -> BTreeSet<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn verdicts_follow_the_before_and_after_scopes() {
        let assigned = set(&["user:alice", "team:red"]);
        let v = |pre: Option<&[&str]>, post: Option<&[&str]>| {
            verdict(&assigned, pre.map(set).as_ref(), post.map(set).as_ref())
        };
        // An existing row outside every scope of the user: invisible, whatever the write.
        assert_eq!(
            v(Some(&["user:bob"]), Some(&["team:red"])),
            Verdict::Invisible
        );
        assert_eq!(v(Some(&[]), None), Verdict::Invisible);
        // A scope the before-image lacked that the user does not hold.
        assert_eq!(
            v(Some(&["team:red"]), Some(&["team:red", "user:carol"])),
            Verdict::Forbidden
        );
        // A foreign scope the row already had is no addition.
        assert_eq!(
            v(
                Some(&["team:red", "user:bob"]),
                Some(&["team:red", "user:bob"])
            ),
            Verdict::Allowed
        );
        // A new row must be visible to its author, and add no foreign scope.
        assert_eq!(v(None, Some(&[])), Verdict::Forbidden);
        assert_eq!(v(None, Some(&["team:red", "user:bob"])), Verdict::Forbidden);
        assert_eq!(v(None, Some(&["team:red"])), Verdict::Allowed);
        // A delete of a visible row; a write of a row that does not exist (conflict).
        assert_eq!(v(Some(&["team:red"]), None), Verdict::Allowed);
        assert_eq!(v(None, None), Verdict::Allowed);
    }
}
