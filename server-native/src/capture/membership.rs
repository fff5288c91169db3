//! Membership evaluation for the capture worker: the prepared membership and impact
//! functions and the owner each runs as, evaluating rows into validated scope sets, diffing
//! edges into scope effects, and re-evaluating a whole relation.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use synchro_protocol::types::PortableType;
use tokio_postgres::{Client, Statement};

use super::block::{BlockDetail, BlockReason, Blocked, EvaluationFailed, InRelation};
use super::registry::{Evaluators, Impact, Registered};
use super::statements::Statements;

/// A row to (re-)evaluate.
pub(super) struct EvalRow {
    /// Key (canonical wire text).
    pub(super) pk: String,
    /// Version of its last change (the version of its scope effects).
    pub(super) version: String,
    /// Whether it exists now (a row that does not is in no scope).
    pub(super) exists: bool,
}

/// What an edge diff recorded.
pub(super) struct Diff {
    /// Scope effects written.
    pub(super) effects: usize,
    /// Scopes whose edge set changed.
    pub(super) changed: BTreeSet<String>,
}

/// The version of an effect for a row that no longer exists, found at `lsn`: `<LSN>:d<n>`.
pub(super) fn rowless_version(lsn: u64, n: usize) -> String {
    format!("{:X}/{:X}:d{n}", lsn >> 32, lsn & 0xffff_ffff)
}

/// Re-evaluates the membership of every row of a synced relation (and of every row that
/// still has edges), in batches.
pub(super) async fn reevaluate_relation(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    commit: u64,
) -> Result<Diff> {
    let fanout = reg.membership.as_ref().map_or(0, |m| m.fanout);
    let rows: Vec<EvalRow> = db
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
        .enumerate()
        .map(|(i, r)| {
            let version: Option<String> = r.get(1);
            EvalRow {
                pk: r.get(0),
                exists: version.is_some(),
                version: version.unwrap_or_else(|| rowless_version(commit, i + 1)),
            }
        })
        .collect();
    let mut total = Diff {
        effects: 0,
        changed: BTreeSet::new(),
    };
    for chunk in rows.chunks(1000) {
        let diff = membership_diff(db, statements, eval, reg, fanout, chunk)
            .await
            .map_err(|e| e.context(InRelation(reg.relation_id.clone())))?;
        total.effects += diff.effects;
        total.changed.extend(diff.changed);
    }
    Ok(total)
}

/// Evaluates a rule for the rows that exist now and returns each one's validated scope set
/// (a row that no longer exists is in no scope and is not evaluated).
pub(super) async fn evaluate<'a>(
    db: &Client,
    eval: &Eval,
    rows: impl Iterator<Item = &'a EvalRow>,
    fanout: i64,
) -> Result<HashMap<&'a str, Vec<String>>> {
    let existing: Vec<&str> = rows.filter(|r| r.exists).map(|r| r.pk.as_str()).collect();
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
fn scope_sets<'a>(
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
            _ => bail!(EvaluationFailed::new(BlockDetail::InvalidScope)),
        }
    }
    if sets.values().any(|s| s.len() as i64 > fanout) {
        bail!(EvaluationFailed::new(BlockDetail::FanoutExceeded));
    }
    Ok(sets)
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
fn key_argument(pk_wire: &str) -> Result<String> {
    Ok(match Json::parse(pk_wire)? {
        Json::String(s) => s,
        Json::Number(t) => t,
        _ => bail!(Blocked(BlockReason::UnrepresentableValue)),
    })
}

/// Re-evaluates the membership of rows of one relation, in the given order, diffs their
/// edges and records scope effects: per row, a delete for every scope it left, then an
/// upsert for every scope it is in (at the row's version). Two pipelined round trips:
/// evaluation with the old edges, then the writes. Returns the effects written.
pub(super) async fn membership_round(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    fanout: i64,
    rows: &[EvalRow],
) -> Result<usize> {
    Ok(membership_diff(db, statements, eval, reg, fanout, rows)
        .await?
        .effects)
}

/// The edge and effect writes of one diff, as parallel arrays for `unnest`.
#[derive(Default)]
struct EdgeWrites<'a> {
    removed_scopes: Vec<String>,
    removed_pks: Vec<&'a str>,
    added_scopes: Vec<String>,
    added_pks: Vec<&'a str>,
    e_scopes: Vec<String>,
    e_pks: Vec<&'a str>,
    e_kinds: Vec<&'static str>,
    e_versions: Vec<&'a str>,
}

impl<'a> EdgeWrites<'a> {
    /// One row's diff: deletes for the scopes it left (byte order), then upserts for every
    /// scope it is in (byte order).
    fn row(&mut self, row: &'a EvalRow, mut old: Vec<String>, mut new: Vec<String>) {
        new.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        old.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let (pk, version) = (row.pk.as_str(), row.version.as_str());
        for s in old.iter().filter(|s| !new.contains(s)) {
            self.removed_scopes.push(s.clone());
            self.removed_pks.push(pk);
            self.effect(s.clone(), pk, "delete", version);
        }
        for s in new {
            if !old.contains(&s) {
                self.added_scopes.push(s.clone());
                self.added_pks.push(pk);
            }
            self.effect(s, pk, "upsert", version);
        }
    }

    fn effect(&mut self, scope: String, pk: &'a str, kind: &'static str, version: &'a str) {
        self.e_scopes.push(scope);
        self.e_pks.push(pk);
        self.e_kinds.push(kind);
        self.e_versions.push(version);
    }
}

/// [`membership_round`], also returning the scopes whose edge set changed.
pub(super) async fn membership_diff(
    db: &Client,
    statements: &Statements,
    eval: &Eval,
    reg: &Registered,
    fanout: i64,
    rows: &[EvalRow],
) -> Result<Diff> {
    let pks: Vec<&str> = rows.iter().map(|r| r.pk.as_str()).collect();
    let mut new_scopes = evaluate(db, eval, rows.iter(), fanout).await?;
    let old_edges = db
        .query(&statements.old_edges, &[&reg.relation_id, &pks])
        .await?;
    let mut old_scopes: HashMap<String, Vec<String>> = HashMap::new();
    for r in &old_edges {
        old_scopes.entry(r.get(0)).or_default().push(r.get(1));
    }
    let mut w = EdgeWrites::default();
    let mut unscoped: Vec<&str> = Vec::new();
    for row in rows {
        let new = new_scopes.remove(row.pk.as_str()).unwrap_or_default();
        if row.exists && new.is_empty() {
            unscoped.push(&row.pk);
        }
        let old = old_scopes.remove(&row.pk).unwrap_or_default();
        w.row(row, old, new);
    }
    let delete_edges = async {
        db.execute(
            &statements.delete_edges,
            &[&reg.relation_id, &w.removed_scopes, &w.removed_pks],
        )
        .await
    };
    let insert_edges = async {
        db.execute(
            &statements.insert_edges,
            &[&reg.relation_id, &w.added_scopes, &w.added_pks],
        )
        .await
    };
    let insert_effects = async {
        db.execute(
            &statements.insert_effects,
            &[
                &reg.relation_id,
                &w.e_scopes,
                &w.e_pks,
                &w.e_kinds,
                &w.e_versions,
            ],
        )
        .await
    };
    // Rows in no scope are recorded as such (the others' records go): with the edges they
    // account for every evaluated row (health check membership_coverage).
    let record_unscoped = async {
        db.execute(&statements.unscoped, &[&reg.relation_id, &pks, &unscoped])
            .await
    };
    futures_util::try_join!(delete_edges, insert_edges, insert_effects, record_unscoped)?;
    let changed = w
        .removed_scopes
        .iter()
        .chain(w.added_scopes.iter())
        .cloned()
        .collect();
    Ok(Diff {
        effects: w.e_scopes.len(),
        changed,
    })
}

/// A prepared membership evaluation (through the function's evaluator, which runs it as
/// its owner).
pub(super) struct Eval {
    pub(super) statement: Statement,
    /// The function's `name(argument types)` and the prepared [`UNUSABLE`] check.
    signature: String,
    check: Statement,
}

impl Eval {
    /// `(pk, scope)` rows for these keys (canonical text) and SQL arguments.
    pub(super) async fn run(
        &self,
        db: &Client,
        keys: &[&str],
        args: &[String],
    ) -> Result<Vec<tokio_postgres::Row>> {
        as_owner(
            db,
            (&self.check, &self.signature),
            &self.statement,
            &[&keys, &args],
        )
        .await
    }
}

/// Why a registered membership or impact function (`$1`: its `name(argument types)`, as the
/// worker's session renders it) or its evaluator must not be evaluated, or NULL: asked in the transaction
/// that evaluates it, so a definition replaced, or a grant revoked, before the source
/// transaction committed is always seen (the registry load at the start of a step may
/// precede it).
const UNUSABLE: &str = "SELECT CASE WHEN count(*) = 0 THEN 'function_unavailable'
                   ELSE min(synchro.synchro_rule_unusable(r.fn, r.sha256, r.kind, 'synchro_worker')) END
       FROM (SELECT function_oid, definition_sha256, 'm' FROM synchro.membership_functions
             UNION ALL SELECT pending_function_oid, pending_sha256, 'm' FROM synchro.membership_functions
             UNION ALL SELECT impact_function_oid, definition_sha256, 'i' FROM synchro.membership_dependencies)
            AS r (fn, sha256, kind)
      WHERE r.fn = pg_catalog.to_regprocedure($1)";

/// Runs a membership or impact evaluation as its function's owner (spec 003: never with
/// the worker's own privileges, which reach synchro's internal tables): `statement` calls
/// the function's evaluator (`synchro_eval`, 40_membership), a security-definer function of
/// the owner's, inside the materialization transaction so it sees this transaction's
/// projections. The worker needs no membership in the owner's role. Any failure, a revoked
/// privilege included, blocks capture.
async fn as_owner(
    db: &Client,
    (check, signature): (&Statement, &str),
    statement: &Statement,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>> {
    let failed = |e| EvaluationFailed::from_db(e, BlockDetail::FunctionError);
    // Pipelined (sent together, run in order in this transaction): the check costs no
    // round trip, and what it finds is the cause reported (the evaluation it discards
    // never commits, and may have failed for the same reason).
    let check_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&signature];
    let (unusable, rows) = futures_util::join!(
        db.query_one(check, &check_params),
        db.query(statement, params),
    );
    match unusable.map_err(failed)?.get::<_, Option<&str>>(0) {
        None => Ok(rows.map_err(failed)?),
        Some("insufficient_privilege") => bail!(EvaluationFailed {
            detail: BlockDetail::InsufficientPrivilege,
            sqlstate: Some("42501".into()),
        }),
        Some("definition_changed") => bail!(EvaluationFailed::new(BlockDetail::DefinitionChanged)),
        Some(_) => bail!(EvaluationFailed::new(BlockDetail::FunctionUnavailable)),
    }
}

/// The worker's prepared membership and impact evaluations (one per function, prepared on
/// first use in the materialization session) and the evaluator each function runs through.
#[derive(Default)]
pub(super) struct Functions {
    /// Prepared evaluations by function (and key type).
    prepared: Mutex<HashMap<String, Statement>>,
    /// The evaluator of every registered function seen so far.
    evaluators: Mutex<Evaluators>,
}

/// One `synchro.synchro_row_ref` an impact function returned for an event.
struct RowRef {
    /// The event (1-based position in the call's input).
    event: i64,
    table_id: Option<String>,
    pk_type: Option<String>,
    pk_value: Option<String>,
}

impl Functions {
    /// Forgets every prepared evaluation (after a block: a function the operator replaced
    /// or re-created is prepared afresh when capture resumes).
    pub(super) fn forget_prepared(&self) {
        self.prepared.lock().expect("eval cache").clear();
    }

    /// Records the evaluators a registry load read.
    pub(super) fn record_evaluators(&self, evaluators: Evaluators) {
        self.evaluators
            .lock()
            .expect("evaluators")
            .extend(evaluators);
    }

    /// The evaluator of `function` (its `signature`: `name(argument types)`). Whether it
    /// may be evaluated is asked where it is evaluated ([`UNUSABLE`]).
    fn evaluator(&self, signature: &str) -> Result<String> {
        let evaluator = self
            .evaluators
            .lock()
            .expect("evaluators")
            .get(signature)
            .cloned();
        evaluator.ok_or_else(|| EvaluationFailed::new(BlockDetail::FunctionUnavailable).into())
    }

    /// The statement cached under `key`, prepared from `sql()` on first use; a function that
    /// cannot be prepared blocks capture.
    async fn prepared(
        &self,
        db: &Client,
        key: String,
        sql: impl FnOnce() -> String,
    ) -> Result<Statement> {
        let cached = self.prepared.lock().expect("eval cache").get(&key).cloned();
        if let Some(s) = cached {
            return Ok(s);
        }
        let s = db
            .prepare(&sql())
            .await
            .map_err(|e| EvaluationFailed::from_db(e, BlockDetail::FunctionUnavailable))?;
        self.prepared
            .lock()
            .expect("eval cache")
            .insert(key, s.clone());
        Ok(s)
    }

    /// The prepared [`UNUSABLE`] check.
    async fn check(&self, db: &Client) -> Result<Statement> {
        self.prepared(db, "\u{0}unusable".to_owned(), || UNUSABLE.to_owned())
            .await
    }

    /// The prepared evaluation of a membership function over keys of `key_type`.
    pub(super) async fn membership(
        &self,
        db: &Client,
        function: &str,
        key_type: &str,
    ) -> Result<Eval> {
        let signature = format!("{function}({key_type})");
        let evaluator = self.evaluator(&signature)?;
        let statement = self
            .prepared(db, format!("{evaluator}\u{0}{key_type}"), || {
                // One call of the batch evaluator, which evaluates the rule once per key (a
                // parameterized loop: inlined into a join, a planner that underestimated the
                // projection scanned, parsed and sorted the whole relation per batch, 113 ms
                // against 1.3 ms for 1,000 keys of 20,000 rows) and numbers the results by
                // the key's position.
                format!(
                    "SELECT ($1::text[])[e.n], e.scope FROM {evaluator}($2::text[]::{key_type}[]) AS e"
                )
            })
            .await?;
        Ok(Eval {
            statement,
            signature,
            check: self.check(db).await?,
        })
    }

    /// Calls an impact function once per dependency event (old and new column images) and
    /// returns the target keys it names as canonical wire text. Any failure, a reference to
    /// another table or key type, or more rows than the bound for one event blocks capture.
    pub(super) async fn impacted(
        &self,
        db: &Client,
        impact: &Impact,
        target: &Registered,
        olds: &[Option<String>],
        news: &[Option<String>],
    ) -> Result<Vec<String>> {
        let signature = format!("{}(jsonb, jsonb)", impact.function);
        let evaluator = self.evaluator(&signature)?;
        let statement = self
            .prepared(db, format!("impact\u{0}{evaluator}"), || {
                // One call of the batch evaluator: the impact function once per event.
                format!(
                    "SELECT r.n, r.table_id, r.pk_type, r.pk_value
                       FROM {evaluator}($1::text[]::jsonb[], $2::text[]::jsonb[]) AS r"
                )
            })
            .await?;
        let check = self.check(db).await?;
        let rows = as_owner(db, (&check, &signature), &statement, &[&olds, &news]).await?;
        let refs = rows.iter().map(|r| RowRef {
            event: r.get(0),
            table_id: r.get(1),
            pk_type: r.get(2),
            pk_value: r.get(3),
        });
        named_keys(impact, target, refs)
    }
}

/// The distinct target keys (canonical wire text, first-named order) of an impact
/// function's result, validated: the target's table and key type, at most the bound per
/// event.
fn named_keys(
    impact: &Impact,
    target: &Registered,
    refs: impl Iterator<Item = RowRef>,
) -> Result<Vec<String>> {
    let key_spec = target
        .fields_by_column
        .values()
        .find(|f| f.is_key)
        .map(|f| f.spec)
        .context("a target without its key field")?;
    let mut per_event: HashMap<i64, i64> = HashMap::new();
    let mut out: Vec<String> = Vec::new();
    // (a set beside the list: 50,000 events naming 120,000 rows compared each new key with
    // every earlier one)
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    for r in refs {
        let count = per_event.entry(r.event).or_default();
        *count += 1;
        if *count > impact.max_rows {
            bail!(EvaluationFailed::new(BlockDetail::ImpactBoundExceeded));
        }
        if r.table_id.is_none() || r.table_id != target.table_id {
            bail!(EvaluationFailed::new(BlockDetail::ImpactInvalidRow));
        }
        let wire = match (r.pk_type.as_deref(), r.pk_value) {
            (Some("string"), Some(v)) if key_spec.ty == PortableType::String => Json::String(v),
            (Some("int"), Some(v)) if key_spec.ty == PortableType::Int => Json::Number(v),
            (Some("int64"), Some(v)) if key_spec.ty == PortableType::Int64 => Json::String(v),
            _ => bail!(EvaluationFailed::new(BlockDetail::ImpactInvalidRow)),
        };
        let pk = synchro_protocol::value::TypedValue::from_wire(&key_spec, &wire)
            .map_err(|_| EvaluationFailed::new(BlockDetail::ImpactInvalidRow))?
            .to_wire_text();
        if seen.insert(pk.clone()) {
            out.push(pk);
        }
    }
    Ok(out)
}
