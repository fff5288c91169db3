//! The end-state checks, against PostgreSQL read directly (not through the server): each
//! client's rows equal the source rows of the scopes it holds, every queued mutation has
//! exactly one outcome and none is pending, and the audit trigger saw each applied write
//! exactly once and no other.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use tokio_postgres::Client as Db;

use crate::client::Report;

/// The outcome counts of the whole run.
#[derive(Default)]
pub struct Outcomes {
    /// Mutations queued.
    pub queued: u64,
    /// By state (`applied`, `conflict`, `rejected_terminal`, `pending`, or `missing` when the
    /// queue lost one).
    pub by_state: BTreeMap<String, u64>,
    /// Writes placing a row in another user's scope, and how many of those were rejected.
    pub forbidden: (u64, u64),
    /// Conflicts of writes to the client's own scope (no other client writes there).
    pub private_conflicts: u64,
}

/// Runs every check; returns the outcome counts and one line per failed check.
pub async fn run(db: &Db, reports: &[Report]) -> Result<(Outcomes, Vec<String>)> {
    let mut failed = Vec::new();
    let mut outcomes = Outcomes::default();

    for r in reports {
        if let Some(e) = &r.fatal {
            failed.push(format!("{}: ended early: {e}", r.name));
        }
        if !r.drained {
            failed.push(format!("{}: its queue never drained", r.name));
        }
        if !r.converged {
            failed.push(format!(
                "{}: never reached quiescence (the sentinels did not arrive)",
                r.name
            ));
        }
        for scope in ["shared".to_owned(), format!("user:{}", r.name)] {
            if !r.verified.contains(&scope) {
                failed.push(format!(
                    "{}: the last round did not verify the terminal digest of {scope}",
                    r.name
                ));
            }
        }
        if !r.unexpected.is_empty() {
            failed.push(format!(
                "{}: rounds failed with errors that are neither retryable nor a reconnect: {:?}",
                r.name, r.unexpected
            ));
        }
    }

    // Every queued mutation has exactly one outcome, and none is left pending.
    for r in reports {
        let mut seen = std::collections::BTreeSet::new();
        for w in &r.writes {
            outcomes.queued += 1;
            let (state, outcome) = r
                .queue
                .get(&w.mutation_id)
                .map_or(("missing", None), |(s, o)| (s.as_str(), o.as_deref()));
            let expected = (state != "pending" && state != "missing").then_some(state);
            if outcome != expected {
                failed.push(format!(
                    "{}: mutation {} ({} of row {}) is {state} but its stored outcome is {outcome:?}",
                    r.name, w.mutation_id, w.op, w.id
                ));
            }
            *outcomes.by_state.entry(state.to_owned()).or_default() += 1;
            seen.insert(w.mutation_id.as_str());
            if w.forbidden {
                outcomes.forbidden.0 += 1;
                if state == "rejected_terminal" {
                    outcomes.forbidden.1 += 1;
                } else if state == "applied" {
                    failed.push(format!(
                        "{}: mutation {} ({} of row {}) placed a row in another user's scope and was applied",
                        r.name, w.mutation_id, w.op, w.id
                    ));
                }
            } else if w.private && state == "conflict" {
                outcomes.private_conflicts += 1;
            }
            match state {
                "applied" | "conflict" | "rejected_terminal" => {}
                other => failed.push(format!(
                    "{}: mutation {} ({} of row {}) has no outcome: {other}",
                    r.name, w.mutation_id, w.op, w.id
                )),
            }
        }
        let extra: Vec<&String> = r
            .queue
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .collect();
        if !extra.is_empty() {
            failed.push(format!(
                "{}: the queue holds mutations no write made: {extra:?}",
                r.name
            ));
        }
    }

    // Nothing applied twice, nothing applied without an `applied` outcome, and every
    // `applied` outcome applied: the audit trigger's rows against the outcomes.
    let audit = db
        .query(
            "SELECT op, id, tag FROM app.items_audit
              WHERE NOT (op = 'I' AND (tag LIKE 'seed-%' OR tag = 'sentinel'))",
            &[],
        )
        .await?;
    let mut by_tag: BTreeMap<String, u64> = BTreeMap::new();
    let mut deletes: BTreeMap<i64, u64> = BTreeMap::new();
    for row in &audit {
        let (op, id, tag): (String, i64, String) = (row.get(0), row.get(1), row.get(2));
        if op == "D" {
            *deletes.entry(id).or_default() += 1;
        } else {
            *by_tag.entry(tag).or_default() += 1;
        }
    }
    let mut applied_deletes: BTreeMap<i64, u64> = BTreeMap::new();
    for r in reports {
        for w in &r.writes {
            let state = r.queue.get(&w.mutation_id).map(|(s, _)| s.as_str());
            let applied = state == Some("applied");
            match &w.tag {
                Some(tag) => {
                    let times = by_tag.remove(tag).unwrap_or(0);
                    if times != u64::from(applied) {
                        failed.push(format!(
                            "{}: mutation {} ({} of row {}, tag {tag}): outcome {}, applied in PostgreSQL {times} times",
                            r.name,
                            w.mutation_id,
                            w.op,
                            w.id,
                            state.unwrap_or("missing")
                        ));
                    }
                }
                None => {
                    if applied {
                        *applied_deletes.entry(w.id).or_default() += 1;
                    }
                }
            }
        }
    }
    for (tag, times) in &by_tag {
        failed.push(format!(
            "a write tagged {tag} was applied {times} times in PostgreSQL but no client has it as a queued mutation"
        ));
    }
    let mut ids: Vec<i64> = deletes
        .keys()
        .chain(applied_deletes.keys())
        .copied()
        .collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        let (done, told) = (
            deletes.get(&id).copied().unwrap_or(0),
            applied_deletes.get(&id).copied().unwrap_or(0),
        );
        if done != told || done > 1 {
            failed.push(format!(
                "row {id}: deleted {done} times in PostgreSQL, {told} delete outcomes applied"
            ));
        }
    }

    // Each client's rows equal the source rows of its scopes.
    for r in reports {
        let source: Vec<(i64, String, i64, String)> = db
            .query(
                "SELECT id, owner, val, tag FROM app.items WHERE owner IN ('shared', $1) ORDER BY id",
                &[&r.name],
            )
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
            .collect();
        if source != r.rows {
            let local: BTreeMap<i64, &(i64, String, i64, String)> =
                r.rows.iter().map(|x| (x.0, x)).collect();
            let pg: BTreeMap<i64, &(i64, String, i64, String)> =
                source.iter().map(|x| (x.0, x)).collect();
            let only_local: Vec<i64> = local
                .keys()
                .filter(|k| !pg.contains_key(k))
                .copied()
                .collect();
            let only_pg: Vec<i64> = pg
                .keys()
                .filter(|k| !local.contains_key(k))
                .copied()
                .collect();
            let differ: Vec<i64> = local
                .iter()
                .filter(|(k, v)| pg.get(k).is_some_and(|p| p != *v))
                .map(|(k, _)| *k)
                .collect();
            failed.push(format!(
                "{}: local rows differ from PostgreSQL ({} local, {} in PostgreSQL): only local {}, only in PostgreSQL {}, different {}",
                r.name,
                r.rows.len(),
                source.len(),
                some(&only_local),
                some(&only_pg),
                some(&differ)
            ));
        }
    }

    let blocked: Option<String> = db
        .query_one("SELECT blocked_reason FROM synchro.capture_state", &[])
        .await?
        .get(0);
    if let Some(reason) = blocked {
        failed.push(format!("capture is blocked: {reason}"));
    }
    Ok((outcomes, failed))
}

/// Up to 20 row IDs, and how many more.
fn some(ids: &[i64]) -> String {
    let shown: Vec<String> = ids.iter().take(20).map(i64::to_string).collect();
    match ids.len().saturating_sub(20) {
        0 => format!("[{}]", shown.join(", ")),
        more => format!("[{}, ... {more} more]", shown.join(", ")),
    }
}

/// The negative controls (`--tamper KIND`): a change to the end state, made directly in
/// PostgreSQL after the clients finished, that one of the checks must catch.
pub fn tamper(kind: &str) -> Result<&'static str> {
    Ok(match kind {
        // A client write applied a second time.
        "double-apply" => {
            "INSERT INTO app.items_audit (op, id, tag)
               SELECT op, id, tag FROM app.items_audit WHERE op = 'U' AND tag LIKE 'c%' LIMIT 1"
        }
        // An applied write that never reached the table.
        "lost-write" => {
            "DELETE FROM app.items_audit
              WHERE seq = (SELECT min(seq) FROM app.items_audit WHERE op = 'I' AND tag LIKE 'c%')"
        }
        // A source row the clients never received (written without the triggers).
        "diverged-row" => {
            "BEGIN; SET LOCAL session_replication_role = replica;
             UPDATE app.items SET val = val + 1000 WHERE id = -1; COMMIT;"
        }
        other => bail!("unknown --tamper {other} (double-apply, lost-write, diverged-row)"),
    })
}
