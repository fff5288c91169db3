//! The registered relations as the worker sees them, loaded once per step by prepared
//! queries: identity, fields, bootstrap status, the membership rule (live and staged) with its
//! contract generations, the dependencies whose changes can move rows of a target, and the
//! evaluator of every function the worker runs.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use synchro_protocol::types::{DecimalSpec, FieldSpec, PortableType};

use super::values::ValueSource;
use tokio_postgres::{Client, Statement};

/// A registered field, by its source column.
#[derive(Clone)]
pub(super) struct Field {
    pub(super) field_id: String,
    pub(super) spec: FieldSpec,
    pub(super) is_key: bool,
    /// The column's SQL type and modifier as registered (another one in the stream is drift).
    pub(super) type_oid: u32,
    pub(super) type_modifier: i32,
    /// How its values' text is read (`synchro_value_source`).
    pub(super) source: ValueSource,
}

/// Bootstrap status of a relation (`synchro.relation_capture.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Not copied yet.
    Pending,
    /// Copied; active once the stream reaches its bootstrap message.
    Copied,
    /// Changes apply (the others are covered by their bootstrap copy).
    Active,
}

impl Status {
    fn parse(text: &str) -> Result<Status> {
        Ok(match text {
            "pending" => Status::Pending,
            "copied" => Status::Copied,
            "active" => Status::Active,
            _ => bail!("registry holds an unknown capture status"),
        })
    }
}

/// A relation's membership function.
#[derive(Clone)]
pub(super) struct Membership {
    /// The function (regproc text).
    pub(super) function: String,
    /// The key's SQL type (regtype text), the function's argument.
    pub(super) key_type: String,
    /// Most scopes one row may be in.
    pub(super) fanout: i64,
}

/// A staged rule change.
pub(super) struct Pending {
    /// The pending function (regproc text).
    pub(super) function: String,
    /// The last key staged (byte order); `None` before the first batch.
    pub(super) staged_through: Option<String>,
    /// The staging epoch this state belongs to (`membership_functions.staging_epoch`,
    /// raised by every restart of the staging).
    pub(super) epoch: i64,
    /// Its staging stopped on a failed evaluation (until the operator retries, skips or
    /// re-registers it): nothing stages it.
    pub(super) failed: bool,
}

/// Generations of a relation's membership contract (its function and dependencies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Contract {
    /// The registered generation.
    pub(super) current: i64,
    /// The generation last evaluated over every row.
    pub(super) evaluated: i64,
}

/// A registered dependency, seen from the dependency relation.
#[derive(Clone)]
pub(super) struct Impact {
    /// Physical OID of the synced target relation.
    pub(super) target: u32,
    /// The impact function (regproc text).
    pub(super) function: String,
    /// Most target rows one event may name.
    pub(super) max_rows: i64,
}

/// One registered relation.
pub(super) struct Registered {
    pub(super) relation_id: String,
    pub(super) schema: String,
    pub(super) relation: String,
    pub(super) replica_identity: u8,
    pub(super) fields_by_column: HashMap<String, Field>,
    /// Whether clients see it (a capture dependency's other columns are simply not captured).
    pub(super) synced: bool,
    /// Columns the stream may carry that are not fields: declared server-only, or declared
    /// by a reconfiguration in flight (its stage covers their values).
    pub(super) expected_columns: std::collections::HashSet<String>,
    /// The membership function, when the relation has one.
    pub(super) membership: Option<Membership>,
    /// Bootstrap status.
    pub(super) status: Status,
    /// Client-visible table ID (synced relations).
    pub(super) table_id: Option<String>,
    /// Targets whose membership a change of this relation can affect.
    pub(super) impacts: Vec<Impact>,
    pub(super) contract: Contract,
    /// A staged rule change.
    pub(super) pending: Option<Pending>,
    /// Whether `membership` is live (a first rule is not, until its staging activates).
    pub(super) live: bool,
}

impl Registered {
    /// The live membership function (none while a first rule is staged).
    pub(super) fn live_membership(&self) -> Option<&Membership> {
        self.membership.as_ref().filter(|_| self.live)
    }
}

/// The registered relations by physical OID.
pub(super) type Relations = HashMap<u32, Registered>;

/// A registered relation by its relation ID.
pub(super) fn by_id<'a>(relations: &'a Relations, relation_id: &str) -> Option<&'a Registered> {
    relations.values().find(|r| r.relation_id == relation_id)
}

/// The evaluator (`synchro_eval.m_<oid>` or `i_<oid>`, 40_membership) of each registered
/// function, by the function's `name(argument types)`: it runs the function as its owner.
/// (Whether a function may be evaluated, its definition and the grants it needs, is asked
/// in the transaction that evaluates it: `membership.rs`, `UNUSABLE`.)
pub(super) type Evaluators = HashMap<String, String>;

/// What [`load`] read.
pub(super) struct Registry {
    pub(super) relations: Relations,
    /// The evaluator of every registered membership (live or pending) and impact function.
    pub(super) evaluators: Evaluators,
    /// The registry generation loaded (the highest active one; 0 before any).
    pub(super) generation: i64,
}

/// Reads the registry (four queries, in the materialization session).
pub(super) async fn load(db: &Client, queries: &Queries) -> Result<Registry> {
    // The queries go out together (one round trip on the session).
    let (relations, memberships, impacts, generation) = futures_util::try_join!(
        db.query(&queries.relations, &[]),
        db.query(&queries.memberships, &[]),
        db.query(&queries.impacts, &[]),
        db.query_one(&queries.generation, &[]),
    )?;
    let mut relations = load_relations(relations)?;
    let mut evaluators = Evaluators::new();
    load_memberships(memberships, &mut relations, &mut evaluators)?;
    load_impacts(impacts, &mut relations, &mut evaluators)?;
    Ok(Registry {
        relations,
        evaluators,
        generation: generation.get(0),
    })
}

/// The registry's queries, prepared once per session (a step loads the registry each time:
/// parsing and planning them was most of a step's cost before a transaction applied).
pub(super) struct Queries {
    relations: Statement,
    memberships: Statement,
    impacts: Statement,
    generation: Statement,
}

impl Queries {
    /// Prepares them on `db`.
    pub(super) async fn prepare(db: &Client) -> Result<Queries> {
        Ok(Queries {
            relations: db.prepare(RELATIONS).await?,
            memberships: db.prepare(MEMBERSHIPS).await?,
            impacts: db.prepare(IMPACTS).await?,
            generation: db
                .prepare(
                    "SELECT coalesce(max(generation), 0)::bigint FROM synchro.registry_generations
                      WHERE state = 'active'",
                )
                .await?,
        })
    }
}

const RELATIONS: &str = "SELECT r.relation_id, r.physical_schema::text, r.physical_relation::text, r.physical_relation_oid,
                    r.replica_identity::text, f.field_id, f.column_name::text, f.portable_type, f.nullable,
                    f.is_key, f.decimal_precision, f.decimal_scale, c.status, r.table_id,
                    c.membership_evaluated, f.type_oid, f.type_modifier, r.kind = 'synced',
                    r.server_only_columns::text[] || ARRAY(
                        SELECT p.column_name::text FROM synchro.pending_fields p
                          JOIN synchro.registry_generations g USING (generation)
                         WHERE p.relation_id = r.relation_id AND g.state IN ('pending', 'staged')),
                    synchro.synchro_value_source(f.type_oid, f.type_modifier,
                        synchro.synchro_column_zone(r.timestamp_zones, f.column_name))
               FROM synchro.relations r JOIN synchro.fields f USING (relation_id)
               JOIN synchro.relation_capture c USING (relation_id)";

const MEMBERSHIPS: &str = "SELECT r.physical_relation_oid, m.function_oid::regproc::text, r.primary_key_type::regtype::text,
                    r.fanout_bound::bigint, m.pending_function_oid::regproc::text, m.staged_through,
                    m.membership_generation + coalesce((SELECT sum(d.generation) FROM synchro.membership_dependencies d
                                                         WHERE d.target_relation_id = m.relation_id), 0)::bigint,
                    CASE WHEN lf.oid IS NOT NULL THEN 'synchro_eval.m_' || m.function_oid END,
                    CASE WHEN pf.oid IS NOT NULL THEN 'synchro_eval.m_' || m.pending_function_oid END,
                    m.live, m.staging_epoch, m.staging_failed_at IS NOT NULL
               FROM synchro.membership_functions m JOIN synchro.relations r USING (relation_id)
               LEFT JOIN pg_catalog.pg_proc lf ON lf.oid = m.function_oid
               LEFT JOIN pg_catalog.pg_proc pf ON pf.oid = m.pending_function_oid";

const IMPACTS: &str =
    "SELECT d.physical_relation_oid, t.physical_relation_oid, m.impact_function_oid::regproc::text,
                    m.max_impact_rows::bigint,
                    (SELECT 'synchro_eval.i_' || p.oid FROM pg_catalog.pg_proc p
                      WHERE p.oid = m.impact_function_oid)
               FROM synchro.membership_dependencies m
               JOIN synchro.relations d ON d.relation_id = m.dependency_relation_id
               JOIN synchro.relations t ON t.relation_id = m.target_relation_id";

/// Relations and their fields.
fn load_relations(rows: Vec<tokio_postgres::Row>) -> Result<Relations> {
    let mut out = Relations::new();
    for r in rows {
        let oid: u32 = r.get(3);
        let entry = match out.entry(oid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Registered {
                relation_id: r.get(0),
                schema: r.get(1),
                relation: r.get(2),
                replica_identity: r.get::<_, String>(4).bytes().next().unwrap_or(b'?'),
                fields_by_column: HashMap::new(),
                synced: r.get(17),
                expected_columns: r.get::<_, Vec<String>>(18).into_iter().collect(),
                membership: None,
                status: Status::parse(r.get(12))?,
                table_id: r.get(13),
                impacts: Vec::new(),
                contract: Contract {
                    current: 0,
                    evaluated: r.get(14),
                },
                pending: None,
                live: false,
            }),
        };
        entry.fields_by_column.insert(r.get(6), field(&r, 5, 19)?);
    }
    Ok(out)
}

/// A field from `field_id, column_name, portable_type, nullable, is_key, decimal_precision,
/// decimal_scale` at `at`, `at + 2`, … and `type_oid, type_modifier` at `at + 10`, and its
/// value source at `base`.
fn field(r: &tokio_postgres::Row, at: usize, base: usize) -> Result<Field> {
    let ty = PortableType::parse(&r.get::<_, String>(at + 2))
        .context("registry holds an unknown type")?;
    let nullable: bool = r.get(at + 3);
    let spec = match ty {
        PortableType::Decimal => FieldSpec {
            ty,
            nullable,
            decimal: Some(DecimalSpec::new(
                r.get::<_, i32>(at + 5) as u32,
                r.get::<_, i32>(at + 6) as u32,
            )?),
        },
        _ => FieldSpec::new(ty, nullable)?,
    };
    Ok(Field {
        field_id: r.get(at),
        spec,
        is_key: r.get(at + 4),
        type_oid: r.get(at + 10),
        type_modifier: r.get(at + 11),
        source: ValueSource::parse(r.get(base))
            .context("registry holds an unknown value source")?,
    })
}

/// The fields of a staged registry generation with their columns, in column order.
pub(super) async fn generation_fields(
    db: &Client,
    generation: i64,
) -> Result<Vec<(String, Field)>> {
    let mut out = Vec::new();
    for r in db
        .query(
            "SELECT p.field_id, p.column_name::text, p.portable_type, p.nullable, p.is_key, p.decimal_precision,
                    p.decimal_scale, NULL, NULL, NULL, p.type_oid, p.type_modifier,
                    synchro.synchro_value_source(p.type_oid, p.type_modifier,
                        synchro.synchro_column_zone(r.timestamp_zones, p.column_name))
               FROM synchro.pending_fields p JOIN synchro.relations r USING (relation_id)
              WHERE p.generation = $1 ORDER BY p.attnum",
            &[&generation],
        )
        .await?
    {
        out.push((r.get(1), field(&r, 0, 12)?));
    }
    Ok(out)
}

/// Membership functions (live and pending), contract generations and their evaluators.
fn load_memberships(
    rows: Vec<tokio_postgres::Row>,
    relations: &mut Relations,
    evaluators: &mut Evaluators,
) -> Result<()> {
    for r in rows {
        if let Some(reg) = relations.get_mut(&r.get::<_, u32>(0)) {
            reg.membership = Some(Membership {
                function: r.get(1),
                key_type: r.get(2),
                fanout: r.get(3),
            });
            reg.pending = r.get::<_, Option<String>>(4).map(|function| Pending {
                function,
                staged_through: r.get(5),
                epoch: r.get(10),
                failed: r.get(11),
            });
            reg.contract.current = r.get(6);
            reg.live = r.get(9);
            // The live function and its evaluator, then the pending one and its evaluator.
            for (function, evaluator) in [(1, 7), (4, 8)] {
                if let (Some(f), Some(e)) = (
                    r.get::<_, Option<String>>(function),
                    r.get::<_, Option<String>>(evaluator),
                ) {
                    evaluators.insert(format!("{f}({})", r.get::<_, String>(2)), e);
                }
            }
        }
    }
    Ok(())
}

/// Dependencies (impact functions), seen from the dependency relation, and their evaluators.
fn load_impacts(
    rows: Vec<tokio_postgres::Row>,
    relations: &mut Relations,
    evaluators: &mut Evaluators,
) -> Result<()> {
    for r in rows {
        if let Some(evaluator) = r.get::<_, Option<String>>(4) {
            evaluators.insert(
                format!("{}(jsonb, jsonb)", r.get::<_, String>(2)),
                evaluator,
            );
        }
        if let Some(reg) = relations.get_mut(&r.get::<_, u32>(0)) {
            reg.impacts.push(Impact {
                target: r.get(1),
                function: r.get(2),
                max_rows: r.get(3),
            });
        }
    }
    Ok(())
}
