//! Activation of a staged reconfiguration (install file 33_reconfigure) when the stream
//! reaches its message: the relation's fields become the generation's, and its projection
//! becomes the staged copy. A staged row whose content differs from the projected one —
//! beyond the null members of added fields, which are rewritten in place at the same version
//! — is a change at this boundary with its effects (at the version of its last source
//! write); a projected row the stage lacks is deleted. The scopes of rows that gained values in an added field are recorded for the
//! generation's manifest (connect rebuilds only those under a Class 3 transition).

use std::collections::HashMap;

use anyhow::{Context, Result};
use synchro_protocol::jcs;
use synchro_protocol::json::Json;
use tokio_postgres::Client;

use super::pgoutput::Value;
use super::registry::{generation_fields, Field, Relations};
use super::row::{key_text, row_json, Column, RelationShape};
use super::transaction::{FinalRow, RowKey};

/// A staged generation the current source transaction activates.
pub(super) struct Activation {
    pub(super) generation: i64,
    pub(super) relation: u32,
    pub(super) relation_id: String,
    schema_version: Option<i64>,
    /// The generation's fields with their columns, in column order.
    fields: Vec<(String, Field)>,
    server_only: Vec<String>,
    added: Vec<String>,
    /// A table retirement: every projected row goes, then the relation.
    pub(super) retirement: bool,
    /// A stream reset: every scope that held or holds the relation's rows rebuilds.
    reset: bool,
}

/// What activating a stage writes besides the finals.
#[derive(Default)]
pub(super) struct StageDiff {
    /// A reset's scopes holding the relation's rows before the boundary.
    pub(super) scopes_before: Vec<String>,
    /// Rows whose JSON only gains null members: (pk, row JSON), version unchanged.
    pub(super) rewrites: Vec<(String, String)>,
    /// Keys of rows that hold a value in an added field.
    pub(super) with_history: Vec<String>,
}

/// Loads the activations a transaction carries (generations that are not staged, e.g.
/// already active after a crash between commit and slot advance, are skipped).
pub(super) async fn load(
    db: &Client,
    registry: &Relations,
    generations: &[i64],
) -> Result<Vec<Activation>> {
    let mut out = Vec::new();
    for &generation in generations {
        let Some(row) = db
            .query_opt(
                "SELECT relation_id, schema_version, server_only_columns::text[], added_fields,
                        change = 'retirement', change = 'reset'
                   FROM synchro.registry_generations WHERE generation = $1 AND state = 'staged'",
                &[&generation],
            )
            .await?
        else {
            continue;
        };
        let relation_id: String = row.get(0);
        let relation = *registry
            .iter()
            .find(|(_, r)| r.relation_id == relation_id)
            .context("a reconfiguration of an unknown relation")?
            .0;
        out.push(Activation {
            generation,
            relation,
            relation_id,
            schema_version: row.get(1),
            fields: generation_fields(db, generation).await?,
            server_only: row.get(2),
            added: row.get(3),
            retirement: row.get(4),
            reset: row.get(5),
        });
    }
    Ok(out)
}

impl Activation {
    /// Puts the generation's fields into the registry the transaction is applied with.
    pub(super) fn install(&self, registry: &mut Relations) {
        if let Some(reg) = registry.get_mut(&self.relation) {
            reg.fields_by_column = self.fields.iter().cloned().collect();
            reg.expected_columns = self.server_only.iter().cloned().collect();
        }
    }

    /// Reads the stage and the projection and returns the changed rows as finals (with
    /// sequence numbers after `seq`), and the in-place rewrites. Runs with the generation
    /// installed.
    pub(super) async fn diff(
        &self,
        db: &Client,
        registry: &Relations,
        commit: u64,
        finals: &mut HashMap<RowKey, FinalRow>,
        seq: &mut usize,
    ) -> Result<StageDiff> {
        let reg = &registry[&self.relation];
        let shape = RelationShape {
            namespace: reg.schema.clone(),
            name: reg.relation.clone(),
            replica_identity: reg.replica_identity,
            columns: self
                .fields
                .iter()
                .map(|(name, f)| Column {
                    name: name.clone(),
                    type_oid: f.type_oid,
                    type_modifier: f.type_modifier,
                })
                .collect(),
        };
        let mut projected: HashMap<String, (String, String)> = db
            .query(
                "SELECT pk, row_json, server_version FROM synchro.projection_rows WHERE relation_id = $1",
                &[&self.relation_id],
            )
            .await?
            .into_iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        let field_ids: Vec<&str> = self
            .fields
            .iter()
            .map(|(_, f)| f.field_id.as_str())
            .collect();
        let lsn = tokio_postgres::types::PgLsn::from(commit);
        let mut out = StageDiff::default();
        if self.reset {
            out.scopes_before = db
                .query(
                    "SELECT DISTINCT scope_id FROM synchro.membership_edges WHERE relation_id = $1",
                    &[&self.relation_id],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
        }
        let mut n = 0usize;
        for r in db
            .query(
                "SELECT row_values, source_version FROM synchro.projection_stage WHERE generation = $1 ORDER BY n",
                &[&self.generation],
            )
            .await?
        {
            let values: Vec<Value> = r
                .get::<_, Vec<Option<String>>>(0)
                .into_iter()
                .map(|v| v.map_or(Value::Null, |t| Value::Text(t.into_bytes())))
                .collect();
            let pk = key_text(reg, &shape, &values)?;
            let row = row_json(reg, &shape, &values, None)?;
            let parsed = Json::parse(&row).context("a staged row")?;
            if self
                .added
                .iter()
                .any(|id| !matches!(parsed.get(id), None | Some(Json::Null)))
            {
                out.with_history.push(pk.clone());
            }
            let previous = projected.remove(&pk);
            if let Some((old, _)) = &previous {
                if normalized(old, &field_ids)? == row {
                    if *old != row {
                        out.rewrites.push((pk, row));
                    }
                    continue;
                }
            }
            n += 1;
            *seq += 1;
            // The version of the row's last fenced write as the copy saw it; without one, a
            // row that only gained values in added fields (a populated default) keeps its
            // version — nobody wrote it, and a queued intent based on it still applies — and
            // any other change (written with the triggers bypassed, rounded by a type change)
            // gets a new one, so one version never names two contents.
            let version = match (r.get::<_, Option<String>>(1), previous) {
                (Some(v), _) => v,
                (None, Some((old, v))) if self.only_added_differ(&old, &parsed)? => v,
                _ => format!("{lsn}:r{n}"),
            };
            finals.insert(
                RowKey {
                    relation: self.relation,
                    pk,
                },
                FinalRow {
                    seq: *seq,
                    version,
                    row: Some(row),
                },
            );
        }
        // Projected rows the source no longer has.
        for pk in projected.into_keys() {
            n += 1;
            *seq += 1;
            let version = format!("{lsn}:r{n}");
            finals.insert(
                RowKey {
                    relation: self.relation,
                    pk,
                },
                FinalRow {
                    seq: *seq,
                    version,
                    row: None,
                },
            );
        }
        Ok(out)
    }

    /// Switches the registry to the generation (or removes a retired relation) and writes
    /// the rewrites; runs after the finals and their membership were written.
    pub(super) async fn activate(&self, db: &Client, commit: u64, diff: &StageDiff) -> Result<()> {
        db.execute(
            "SELECT synchro.synchro_activate_generation($1, $2)",
            &[
                &self.generation,
                &tokio_postgres::types::PgLsn::from(commit),
            ],
        )
        .await?;
        if !diff.rewrites.is_empty() {
            let (pks, rows): (Vec<&str>, Vec<&str>) = diff
                .rewrites
                .iter()
                .map(|(p, r)| (p.as_str(), r.as_str()))
                .unzip();
            db.execute(
                "UPDATE synchro.projection_rows p SET row_json = u.row_json
                   FROM unnest($2::text[], $3::text[]) u(pk, row_json)
                  WHERE p.relation_id = $1 AND p.pk = u.pk",
                &[&self.relation_id, &pks, &rows],
            )
            .await?;
        }
        Ok(())
    }

    /// Records the affected scopes (after membership was evaluated at this boundary); a
    /// reset invalidates every scope that held or holds the relation's rows.
    pub(super) async fn record_scopes(&self, db: &Client, diff: &StageDiff) -> Result<()> {
        if self.reset {
            let mut scopes: std::collections::BTreeSet<String> =
                diff.scopes_before.iter().cloned().collect();
            for r in db
                .query(
                    "SELECT DISTINCT scope_id FROM synchro.membership_edges WHERE relation_id = $1",
                    &[&self.relation_id],
                )
                .await?
            {
                scopes.insert(r.get(0));
            }
            let scopes: Vec<String> = scopes.into_iter().collect();
            db.execute(super::staging::BUMP_GENERATIONS, &[&scopes])
                .await?;
        }
        let Some(version) = self.schema_version else {
            return Ok(());
        };
        db.execute(
            "INSERT INTO synchro.manifest_affected_scopes (schema_version, scope_id)
             SELECT DISTINCT $1::bigint, e.scope_id FROM synchro.membership_edges e
              WHERE e.relation_id = $2 AND e.pk = ANY ($3::text[])
             ON CONFLICT DO NOTHING",
            &[&version, &self.relation_id, &diff.with_history],
        )
        .await?;
        Ok(())
    }
}

impl Activation {
    /// Whether a projected row and its staged image differ only in added fields.
    fn only_added_differ(&self, old: &str, new: &Json) -> Result<bool> {
        let Json::Object(mut members) = Json::parse(old).context("a projected row")? else {
            return Ok(false);
        };
        members.retain(|(id, _)| self.fields.iter().any(|(_, f)| &f.field_id == id));
        for id in &self.added {
            members.retain(|(m, _)| m != id);
            if let Some(v) = new.get(id) {
                members.push((id.clone(), v.clone()));
            }
        }
        Ok(jcs::to_output_string(&Json::Object(members)) == jcs::to_output_string(new))
    }
}

/// A projected row under the generation's fields: every field once, null where the row had
/// no member (an added field), without members of retired fields; canonical JSON.
fn normalized(old: &str, field_ids: &[&str]) -> Result<String> {
    let old = Json::parse(old).context("a projected row")?;
    let members = field_ids
        .iter()
        .map(|id| ((*id).to_owned(), old.get(id).cloned().unwrap_or(Json::Null)))
        .collect();
    Ok(jcs::to_output_string(&Json::Object(members)))
}
