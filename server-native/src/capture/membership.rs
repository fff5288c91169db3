//! Membership evaluation for the capture worker: running membership and impact functions
//! as their owners, diffing edges into scope effects, staging a pending rule and activating
//! it, and re-evaluating a whole relation.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use tokio_postgres::{Client, Statement};

use super::block::{BlockReason, Blocked};
use super::registry::Registered;
use super::statements::Statements;
use super::step::EvalRow;

/// Re-evaluates the membership of every row of a synced relation (and of every row that
/// still has edges), in batches.
pub(super) async fn reevaluate_relation(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    commit: u64,
) -> Result<(usize, std::collections::BTreeSet<String>)> {
    let fanout = reg.membership.as_ref().map_or(0, |m| m.fanout);
    let rows: Vec<(String, Option<String>)> = db
        .query(
            "SELECT pk, max(server_version) FROM (
                SELECT pk, server_version FROM synchro.projection_rows WHERE relation_id = $1
                UNION ALL
                SELECT pk, NULL FROM synchro.membership_edges WHERE relation_id = $1) k
             GROUP BY pk ORDER BY pk",
            &[&reg.relation_id],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let lsn = format!("{:X}/{:X}", commit >> 32, commit & 0xffff_ffff);
    let rows: Vec<(String, String, bool)> = rows
        .into_iter()
        .enumerate()
        .map(|(i, (pk, v))| {
            let exists = v.is_some();
            (pk, v.unwrap_or_else(|| format!("{lsn}:d{}", i + 1)), exists)
        })
        .collect();
    let mut effects = 0;
    let mut changed = std::collections::BTreeSet::new();
    for chunk in rows.chunks(1000) {
        let (n, scopes) = membership_diff(db, statements, eval, reg, fanout, chunk).await?;
        effects += n;
        changed.extend(scopes);
    }
    Ok((effects, changed))
}

/// Evaluates a rule for the rows that exist now and returns each one's validated scope set
/// (a row that no longer exists is in no scope and is not evaluated).
async fn evaluate<'a>(
    db: &Client,
    eval: &Eval,
    rows: impl Iterator<Item = &'a EvalRow>,
    fanout: i64,
) -> Result<HashMap<&'a str, Vec<String>>> {
    let existing: Vec<&str> = rows
        .filter(|(_, _, exists)| *exists)
        .map(|(pk, ..)| pk.as_str())
        .collect();
    let args = existing
        .iter()
        .map(|pk| key_argument(pk))
        .collect::<Result<Vec<_>>>()?;
    let evaluated = eval.run(db, &existing, &args).await?;
    scope_sets(&existing, &evaluated, fanout)
}

/// Each evaluated row's scope set from `(pk, scope)` result rows: a null, empty or blank
/// scope, a row that was not asked for, or more scopes than the fanout bound fails the
/// evaluation (never an empty or truncated set). Duplicates count once.
pub(super) fn scope_sets<'a>(
    existing: &[&'a str],
    evaluated: &[tokio_postgres::Row],
    fanout: i64,
) -> Result<HashMap<&'a str, Vec<String>>> {
    let mut sets: HashMap<&str, Vec<String>> =
        existing.iter().map(|pk| (*pk, Vec::new())).collect();
    for r in evaluated {
        let pk: &str = r.get(0);
        match (sets.get_mut(pk), r.get::<_, Option<String>>(1)) {
            (Some(set), Some(s)) if !s.trim().is_empty() => {
                if !set.contains(&s) {
                    set.push(s);
                }
            }
            _ => bail!(Blocked(BlockReason::ScopeEvaluationFailed)),
        }
    }
    if sets.values().any(|s| s.len() as i64 > fanout) {
        bail!(Blocked(BlockReason::ScopeEvaluationFailed));
    }
    Ok(sets)
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
    let pks: Vec<&str> = rows.iter().map(|(pk, ..)| pk.as_str()).collect();
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
    Ok(())
}

/// Activates a fully staged rule: the live edges become the staged ones through a diff
/// (deletes then upserts per row, with each row's current version), the scopes that changed
/// get a new membership generation, and the pending function becomes the live one.
pub(super) async fn activate(
    db: &Client,
    statements: &Statements,
    reg: &Registered,
    at: u64,
) -> Result<usize> {
    let diff: Vec<(String, String, String)> = db
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
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut diff = diff;
    diff.sort_by(|a, b| {
        (a.2.as_bytes(), a.0 != "delete", a.1.as_bytes()).cmp(&(
            b.2.as_bytes(),
            b.0 != "delete",
            b.1.as_bytes(),
        ))
    });
    let pks: Vec<&str> = diff.iter().map(|(_, _, pk)| pk.as_str()).collect();
    let versions: HashMap<String, String> = db
        .query(&statements.versions, &[&reg.relation_id, &pks])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let lsn = format!("{:X}/{:X}", at >> 32, at & 0xffff_ffff);
    let (mut removed_scopes, mut removed_pks, mut added_scopes, mut added_pks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut e_scopes, mut e_pks, mut e_kinds, mut e_versions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, (kind, scope, pk)) in diff.iter().enumerate() {
        if kind == "delete" {
            removed_scopes.push(scope.as_str());
            removed_pks.push(pk.as_str());
        } else {
            added_scopes.push(scope.as_str());
            added_pks.push(pk.as_str());
        }
        e_scopes.push(scope.as_str());
        e_pks.push(pk.as_str());
        e_kinds.push(kind.as_str());
        e_versions.push(
            versions
                .get(pk)
                .cloned()
                .unwrap_or_else(|| format!("{lsn}:d{}", i + 1)),
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
    let mut changed: Vec<&str> = e_scopes.clone();
    changed.sort_unstable();
    changed.dedup();
    db.execute(
        "INSERT INTO synchro.scope_retention AS r (scope_id, membership_generation)
         SELECT s, 2 FROM unnest($1::text[]) AS s
         ON CONFLICT (scope_id) DO UPDATE SET membership_generation = r.membership_generation + 1",
        &[&changed],
    )
    .await?;
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
        "UPDATE synchro.relation_capture SET membership_evaluated = $2, updated_at = now() WHERE relation_id = $1",
        &[&reg.relation_id, &(reg.contract.current + 1)],
    )
    .await?;
    db.execute(
        "DELETE FROM synchro.membership_staged_edges WHERE relation_id = $1",
        &[&reg.relation_id],
    )
    .await?;
    Ok(e_scopes.len())
}

/// A projected row (canonical wire JSON keyed by field ID) as the image impact functions
/// receive: an object keyed by column name, with the same wire values.
pub(super) fn column_image(reg: &Registered, row_json: &str) -> Result<String> {
    let row = Json::parse(row_json).context("a projected row is not JSON")?;
    let mut members = Vec::new();
    for (column, field) in &reg.fields_by_column {
        members.push((
            column.clone(),
            row.get(&field.field_id).cloned().unwrap_or(Json::Null),
        ));
    }
    members.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(jcs::to_output_string(&Json::Object(members)))
}

/// The SQL literal argument for a key given as its canonical wire text.
pub(super) fn key_argument(pk_wire: &str) -> Result<String> {
    Ok(match Json::parse(pk_wire)? {
        Json::String(s) => s,
        Json::Number(t) => t,
        _ => bail!(Blocked(BlockReason::UnrepresentableValue)),
    })
}

/// Re-evaluates the membership of rows of one relation, each `(pk, version of its last
/// change, whether it exists now)`, diffs their edges and records scope effects: per row, in
/// the given order, a delete for every scope it left, then an upsert for every scope it is
/// in. Two pipelined round trips: evaluation with the old edges, then the writes.
pub(super) async fn membership_round(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    fanout: i64,
    rows: &[(String, String, bool)],
) -> Result<usize> {
    Ok(membership_diff(db, statements, eval, reg, fanout, rows)
        .await?
        .0)
}

/// [`membership_round`], also returning the scopes whose edge set changed.
pub(super) async fn membership_diff(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    fanout: i64,
    rows: &[(String, String, bool)],
) -> Result<(usize, std::collections::BTreeSet<String>)> {
    let pks: Vec<&str> = rows.iter().map(|(pk, ..)| pk.as_str()).collect();
    let mut new_scopes = evaluate(db, eval, rows.iter(), fanout).await?;
    let old_edges = db
        .query(&statements.old_edges, &[&reg.relation_id, &pks])
        .await?;
    let mut old_scopes: HashMap<String, Vec<String>> = HashMap::new();
    for r in &old_edges {
        old_scopes.entry(r.get(0)).or_default().push(r.get(1));
    }
    let (mut removed_scopes, mut removed_pks) = (Vec::new(), Vec::new());
    let (mut added_scopes, mut added_pks) = (Vec::new(), Vec::new());
    let (mut e_scopes, mut e_pks, mut e_kinds, mut e_versions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (pk, version, _) in rows {
        let mut new = new_scopes.remove(pk.as_str()).unwrap_or_default();
        new.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut old = old_scopes.remove(pk).unwrap_or_default();
        old.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for s in old.iter().filter(|s| !new.contains(s)) {
            removed_scopes.push(s.clone());
            removed_pks.push(pk.as_str());
            e_scopes.push(s.clone());
            e_pks.push(pk.as_str());
            e_kinds.push("delete");
            e_versions.push(version.as_str());
        }
        for s in new {
            if !old.contains(&s) {
                added_scopes.push(s.clone());
                added_pks.push(pk.as_str());
            }
            e_scopes.push(s);
            e_pks.push(pk.as_str());
            e_kinds.push("upsert");
            e_versions.push(version.as_str());
        }
    }
    let delete_edges = async {
        db.execute(
            &statements.delete_edges,
            &[&reg.relation_id, &removed_scopes, &removed_pks],
        )
        .await
    };
    let insert_edges = async {
        db.execute(
            &statements.insert_edges,
            &[&reg.relation_id, &added_scopes, &added_pks],
        )
        .await
    };
    let insert_effects = async {
        db.execute(
            &statements.insert_effects,
            &[&reg.relation_id, &e_scopes, &e_pks, &e_kinds, &e_versions],
        )
        .await
    };
    futures_util::try_join!(delete_edges, insert_edges, insert_effects)?;
    let changed = removed_scopes
        .iter()
        .chain(added_scopes.iter())
        .cloned()
        .collect();
    Ok((e_scopes.len(), changed))
}

/// A prepared membership evaluation and the role it runs as: its function's owner.
pub(super) struct Eval {
    pub(super) statement: Statement,
    pub(super) owner: String,
}

impl Eval {
    /// `(pk, scope)` rows for these keys (canonical text) and SQL arguments.
    pub(super) async fn run(
        &self,
        db: &Client,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<tokio_postgres::Row>> {
        as_owner(db, &self.owner, &self.statement, &[&keys, &args]).await
    }
}

/// Runs a membership or impact evaluation as its function's owner (spec 003: never with
/// the worker's own privileges, which reach synchro's internal tables), inside the
/// materialization transaction so it sees this transaction's projections, then returns to
/// synchro_worker. The worker login must be a (NOINHERIT) member of the owner role; any
/// failure, including a missing membership or a revoked privilege, blocks capture.
pub(super) async fn as_owner(
    db: &Client,
    owner: &str,
    statement: &Statement,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    let failed = |_| anyhow::Error::from(Blocked(BlockReason::ScopeEvaluationFailed));
    db.batch_execute(&format!(
        "SET LOCAL ROLE {}",
        crate::install::quote_ident(owner)
    ))
    .await
    .map_err(failed)?;
    let rows = db.query(statement, params).await.map_err(failed)?;
    db.batch_execute("SET LOCAL ROLE synchro_worker")
        .await
        .map_err(failed)?;
    Ok(rows)
}
