//! Manifest publication: build the child manifest from the registry, classify it against
//! the current manifest with facts read from the source rows, and insert one immutable
//! record, staging the reconfigurations it carries. Runs in one READ COMMITTED transaction as
//! synchro_operator (see [`publish`]).

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use synchro_protocol::classify::{classify, ChangeClass, TransitionFacts};
use synchro_protocol::lineage::Lineage;
use synchro_protocol::manifest::Manifest;
use tokio_postgres::{Client, GenericClient};

/// What a publish run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The registry matches the current manifest (Class 1): nothing published.
    Unchanged {
        /// The current version.
        version: u64,
    },
    /// A new manifest was published (and every pending reconfiguration staged with it).
    Published {
        /// Its version.
        version: u64,
        /// Its hash.
        hash: String,
        /// Its transition class.
        class: String,
    },
}

impl PublishOutcome {
    /// The outcome as JSON: `{"published":false,"version"}` or
    /// `{"published":true,"version","hash","class"}`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            PublishOutcome::Unchanged { version } => {
                serde_json::json!({"published": false, "version": version})
            }
            PublishOutcome::Published {
                version,
                hash,
                class,
            } => {
                serde_json::json!({"published": true, "version": version, "hash": hash, "class": class})
            }
        }
    }
}

/// The manifest history last read and the lineage it validated into, kept by a server (in
/// its state) so that parsing, hashing and validating the history is done once per distinct
/// history read, not at every request (every request reads it). Manifest records are
/// immutable (11_manifests), but the cache is keyed by the rows' whole text, so it can only
/// answer for the very same rows.
#[derive(Default)]
pub struct LineageCache {
    last: std::sync::Mutex<Option<std::sync::Arc<LineageRead>>>,
}

/// Stored (body, recorded hash) rows of a manifest history, and the lineage they validated
/// into.
type LineageRead = (Vec<(String, String)>, Lineage);

impl LineageCache {
    /// Reads the whole manifest history; the rows equal to the last ones read give that
    /// lineage again.
    pub async fn lineage(&self, db: &impl GenericClient) -> Result<Lineage> {
        let rows = history_rows(db).await?;
        let cached = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(c) = cached {
            if c.0 == rows {
                return Ok(c.1.clone());
            }
        }
        let lineage = validate_lineage(&rows)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::sync::Arc::new((rows, lineage.clone())));
        Ok(lineage)
    }

    /// The history clients are served (see [`load_serving_lineage`]), its manifests read
    /// through this cache.
    pub async fn serving_lineage(&self, db: &impl GenericClient) -> Result<Lineage> {
        serving(db, self.lineage(db)).await
    }
}

/// The stored (body, recorded hash) rows of the whole manifest history.
async fn history_rows(db: &impl GenericClient) -> Result<Vec<(String, String)>> {
    let rows = db
        .query(
            "SELECT body, schema_hash FROM synchro.synchro_manifest_history()",
            &[],
        )
        .await
        .context("reading manifest history")?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Reads and validates the whole manifest history (each body parsed, its hash checked).
/// A server's requests read it through their [`LineageCache`].
pub async fn load_lineage(db: &impl GenericClient) -> Result<Lineage> {
    validate_lineage(&history_rows(db).await?)
}

/// The lineage of stored (body, recorded hash) rows, each body validated and its hash
/// checked.
fn validate_lineage(rows: &[(String, String)]) -> Result<Lineage> {
    let mut manifests = Vec::with_capacity(rows.len());
    for (body, hash) in rows {
        let m = Manifest::parse(body).context("a stored manifest body does not validate")?;
        if m.schema_hash_hex() != *hash {
            bail!(
                "stored manifest {} does not match its recorded hash",
                m.schema_version
            );
        }
        manifests.push(m);
    }
    Ok(Lineage::from_history(manifests)?)
}

/// The history clients are served: it ends before the first Class 3 manifest that has a
/// table not yet materialized (bootstrap copy or first membership rule still pending), so
/// connect never asks a client to rebuild from projections that lack that table's rows. The
/// manifest becomes current with the worker commit that completes it.
pub async fn load_serving_lineage(db: &impl GenericClient) -> Result<Lineage> {
    serving(db, load_lineage(db)).await
}

/// The served prefix of the history `lineage` reads (see [`load_serving_lineage`]).
async fn serving(
    db: &impl GenericClient,
    lineage: impl std::future::Future<Output = Result<Lineage>>,
) -> Result<Lineage> {
    // The three reads go out together (one round trip).
    let (lineage, unactivated, unready) = futures_util::join!(
        lineage,
        db.query("SELECT * FROM synchro.synchro_unactivated_manifests()", &[]),
        db.query("SELECT * FROM synchro.synchro_unready_tables()", &[]),
    );
    let lineage = lineage?;
    // A manifest whose registry generation is not active yet (33_reconfigure), and all after it.
    let unactivated: std::collections::BTreeSet<i64> = unactivated
        .context("reading reconfigurations in flight")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let first_unactivated = lineage
        .manifests()
        .position(|m| unactivated.contains(&(m.schema_version as i64)));
    let lineage = match first_unactivated {
        Some(i) => Lineage::from_history(lineage.manifests().take(i).cloned().collect::<Vec<_>>())?,
        None => lineage,
    };
    let unready: std::collections::BTreeSet<String> = unready
        .context("reading table readiness")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if unready.is_empty() {
        return Ok(lineage);
    }
    let history: Vec<Manifest> = lineage.manifests().cloned().collect();
    let stop = history.iter().enumerate().skip(1).find_map(|(i, m)| {
        (m.transition_class == synchro_protocol::manifest::TransitionClass::Class3
            && m.tables.iter().any(|t| unready.contains(&t.table_id)))
        .then_some(i)
    });
    match stop {
        Some(i) => Ok(Lineage::from_history(history[..i].to_vec())?),
        None => Ok(lineage),
    }
}

fn table_json(t: &Value) -> Result<Value> {
    let fields = t["fields"]
        .as_array()
        .context("registry table without fields")?;
    let pk = fields
        .iter()
        .find(|f| f["is_key"] == json!(true))
        .context("registry table without a key field")?;
    let fields: Vec<Value> = fields
        .iter()
        .map(|f| {
            let mut o = json!({
                "field_id": f["field_id"], "name": f["name"], "type": f["type"],
                "nullable": f["nullable"], "writable": f["writable"],
            });
            if f["type"] == json!("decimal") {
                o["precision"] = f["precision"].clone();
                o["scale"] = f["scale"].clone();
            }
            o
        })
        .collect();
    Ok(json!({
        "table_id": t["table_id"], "relation_id": t["relation_id"], "name": t["name"],
        "composition": t["composition"], "primary_key_field_id": pk["field_id"],
        "lifecycle": {
            "created_at_field_id": t["lifecycle"]["created_at_field_id"],
            "updated_at_field_id": t["lifecycle"]["updated_at_field_id"],
            "deleted_at_field_id": t["lifecycle"]["deleted_at_field_id"],
        },
        "fields": fields, "indexes": t["indexes"].as_array().cloned().unwrap_or_default(),
    }))
}

fn manifest_text(
    version: u64,
    parent: Option<&Manifest>,
    class: &str,
    floor: u64,
    tables: &[Value],
) -> String {
    let parent = parent.map(|p| json!({"version": p.schema_version, "hash": p.schema_hash_hex()}));
    json!({
        "schema_version": version, "parent_schema": parent, "transition_class": class,
        "compatibility_floor": floor, "tables": tables,
    })
    .to_string()
}

/// Publishes the registry as a new manifest when it differs from the current one.
///
/// The transaction is READ COMMITTED: staging a reconfiguration copies the table under a SHARE
/// lock taken inside it, and only a statement snapshot taken after that lock sees every write
/// committed before it (a REPEATABLE READ snapshot from the first query would not). The
/// manifest insert serializes publishers (lock and parent check).
pub async fn publish(db: &mut Client) -> Result<PublishOutcome> {
    let tx = db.transaction().await?;
    let outcome = publish_in(&tx, true).await?;
    tx.commit().await?;
    Ok(outcome)
}

/// [`publish`] inside the caller's READ COMMITTED transaction (which must commit for it to
/// take effect); with `stage` false pending reconfigurations are classified but not staged
/// (a dry run: no copy, no lock held for it).
pub async fn publish_in(
    tx: &tokio_postgres::Transaction<'_>,
    stage_pending: bool,
) -> Result<PublishOutcome> {
    let lineage = load_lineage(tx).await?;
    let snapshot: Value = serde_json::from_str(
        &tx.query_one("SELECT synchro.synchro_registry_snapshot()::text", &[])
            .await?
            .get::<_, String>(0),
    )?;
    let registry: Vec<Value> = snapshot.as_array().cloned().unwrap_or_default();
    let tables = registry
        .iter()
        .map(table_json)
        .collect::<Result<Vec<_>>>()?;
    let pending = pending_generations(tx).await?;
    let outcome = match lineage.current() {
        None => {
            let child = Manifest::parse(&manifest_text(1, None, "initial", 1, &tables))?;
            insert(tx, &child).await?;
            if stage_pending {
                stage(tx, &pending, Some(1), false).await?;
            }
            PublishOutcome::Published {
                version: 1,
                hash: child.schema_hash_hex(),
                class: "initial".into(),
            }
        }
        Some(parent) => {
            let version = parent.schema_version + 1;
            // Classify a draft first; its own class and floor do not affect the tables.
            let draft = Manifest::parse(&manifest_text(
                version,
                Some(parent),
                "class_4",
                version,
                &tables,
            ))?;
            let facts = read_facts(tx, parent, &draft, &registry, &pending).await?;
            let c = classify(parent, &draft, &facts)?;
            let Some(class) = c.class.transition_class() else {
                // Class 1: a reconfiguration that clients do not see still stages.
                if stage_pending {
                    stage(tx, &pending, None, false).await?;
                }
                return Ok(PublishOutcome::Unchanged {
                    version: parent.schema_version,
                });
            };
            let floor = if c.class == ChangeClass::Class2 {
                parent.compatibility_floor
            } else {
                version
            };
            let child = Manifest::parse(&manifest_text(
                version,
                Some(parent),
                class.as_str(),
                floor,
                &tables,
            ))?;
            // The pure lineage validates class, floor and parent exactly as clients will.
            let mut check = lineage.clone();
            check.append(child.clone(), &facts)?;
            insert(tx, &child).await?;
            if stage_pending {
                // The reconfigurations' affected scopes stand for the whole transition only
                // when every table the manifest changes is one of theirs.
                let theirs: std::collections::BTreeSet<&str> = pending
                    .iter()
                    .filter_map(|g| {
                        registry
                            .iter()
                            .find(|t| t["relation_id"] == json!(g.relation_id))
                            .and_then(|t| t["table_id"].as_str())
                    })
                    .collect();
                let record = changed_tables(parent, &child)
                    .iter()
                    .all(|t| theirs.contains(t.as_str()));
                stage(tx, &pending, Some(version), record).await?;
            }
            PublishOutcome::Published {
                version,
                hash: child.schema_hash_hex(),
                class: class.as_str().into(),
            }
        }
    };
    Ok(outcome)
}

/// The recorded affected scopes of the Class 3 manifests in a history (a manifest without a
/// recorded set is absent: it affects every assigned scope).
pub async fn transition_scopes(
    db: &impl GenericClient,
    lineage: &Lineage,
) -> Result<
    std::collections::BTreeMap<
        synchro_protocol::manifest::SchemaRef,
        std::collections::BTreeSet<String>,
    >,
> {
    let class3: Vec<&Manifest> = lineage
        .manifests()
        .filter(|m| m.transition_class == synchro_protocol::manifest::TransitionClass::Class3)
        .collect();
    let mut out = std::collections::BTreeMap::new();
    if class3.is_empty() {
        return Ok(out);
    }
    let versions: Vec<i64> = class3.iter().map(|m| m.schema_version as i64).collect();
    for r in db
        .query(
            "SELECT schema_version, scope_id FROM synchro.synchro_transition_scopes($1)",
            &[&versions],
        )
        .await
        .context("reading affected scopes")?
    {
        let version: i64 = r.get(0);
        let Some(m) = class3.iter().find(|m| m.schema_version as i64 == version) else {
            continue;
        };
        let set: &mut std::collections::BTreeSet<String> = out.entry(m.schema_ref()).or_default();
        if let Some(scope) = r.get::<_, Option<String>>(1) {
            set.insert(scope);
        }
    }
    Ok(out)
}

/// A pending reconfiguration: its generation, relation and recorded historical nullness.
struct PendingGeneration {
    generation: i64,
    relation_id: String,
    added_without_history: std::collections::BTreeSet<String>,
}

async fn pending_generations(tx: &impl GenericClient) -> Result<Vec<PendingGeneration>> {
    let text: String = tx
        .query_one("SELECT synchro.synchro_pending_generations()::text", &[])
        .await?
        .get(0);
    let list: Vec<Value> = serde_json::from_str(&text)?;
    list.iter()
        .map(|g| {
            Ok(PendingGeneration {
                generation: g["generation"].as_i64().context("a generation")?,
                relation_id: g["relation_id"].as_str().context("a relation")?.to_owned(),
                added_without_history: g["added_without_history"]
                    .as_array()
                    .context("recorded facts")?
                    .iter()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect(),
            })
        })
        .collect()
}

/// The IDs of the tables a child manifest adds, changes or removes against its parent.
fn changed_tables(parent: &Manifest, child: &Manifest) -> Vec<String> {
    let mut out: Vec<String> = child
        .tables
        .iter()
        .filter(|t| parent.table(&t.table_id) != Some(*t))
        .map(|t| t.table_id.clone())
        .collect();
    out.extend(
        parent
            .tables
            .iter()
            .filter(|t| child.table(&t.table_id).is_none())
            .map(|t| t.table_id.clone()),
    );
    out
}

/// Stages every pending reconfiguration with the manifest it activates with; `record`: its
/// affected scopes stand for that manifest's Class 3 transition.
async fn stage(
    tx: &impl GenericClient,
    pending: &[PendingGeneration],
    version: Option<u64>,
    record: bool,
) -> Result<()> {
    let version = version.map(|v| v as i64);
    for g in pending {
        tx.execute(
            "SELECT synchro.synchro_stage_generation($1, $2, $3)",
            &[&g.generation, &version, &record],
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "staging the reconfiguration: {}",
                crate::install::describe(&e)
            )
        })?;
    }
    Ok(())
}

async fn read_facts(
    tx: &impl GenericClient,
    parent: &Manifest,
    child: &Manifest,
    registry: &[Value],
    pending: &[PendingGeneration],
) -> Result<TransitionFacts> {
    let relation_of = |table_id: &str| {
        registry
            .iter()
            .find(|t| t["table_id"] == json!(table_id))
            .and_then(|t| t["relation_id"].as_str())
            .map(str::to_owned)
    };
    let mut facts = TransitionFacts::default();
    for t in &child.tables {
        let rel = relation_of(&t.table_id).context("table without relation")?;
        match parent.table(&t.table_id) {
            None => {
                let has_rows: bool = tx
                    .query_one(
                        "SELECT synchro.synchro_column_has_values($1, NULL)",
                        &[&rel],
                    )
                    .await?
                    .get(0);
                if !has_rows {
                    facts.empty_added_tables.insert(t.table_id.clone());
                }
            }
            Some(p) => {
                // A reconfiguration's historical nullness was recorded once, under the write
                // gates, with its generation (spec 000, Class 2); it is never recomputed.
                if let Some(g) = pending.iter().find(|g| g.relation_id == rel) {
                    for f in t.fields.iter().filter(|f| p.field(&f.field_id).is_none()) {
                        if g.added_without_history.contains(&f.field_id) {
                            facts
                                .added_fields_without_history
                                .insert((t.table_id.clone(), f.field_id.clone()));
                        }
                    }
                    continue;
                }
                for f in t.fields.iter().filter(|f| p.field(&f.field_id).is_none()) {
                    let has_values: bool = tx
                        .query_one(
                            "SELECT synchro.synchro_column_has_values($1, $2)",
                            &[&rel, &f.name],
                        )
                        .await?
                        .get(0);
                    if !has_values {
                        facts
                            .added_fields_without_history
                            .insert((t.table_id.clone(), f.field_id.clone()));
                    }
                }
            }
        }
    }
    Ok(facts)
}

async fn insert(tx: &impl GenericClient, m: &Manifest) -> Result<()> {
    let version = m.schema_version as i64;
    let parent_version = m.parent_schema.map(|p| p.version as i64);
    let parent_hash = m.parent_schema.map(|p| hex::encode(p.hash));
    let body = m.canonical_body();
    tx.execute(
        "SELECT synchro.synchro_insert_manifest($1, $2, $3, $4, $5, $6, $7)",
        &[
            &version,
            &m.schema_hash_hex(),
            &body,
            &parent_version,
            &parent_hash,
            &m.transition_class.as_str(),
            &(m.compatibility_floor as i64),
        ],
    )
    .await
    .map_err(|e| anyhow::anyhow!("inserting the manifest: {}", crate::install::describe(&e)))?;
    // At commit, serving processes look at the served manifest, and when it changed end
    // their events streams so that clients connect now (api::events); carries no data.
    tx.batch_execute("NOTIFY synchro_schema").await?;
    Ok(())
}
