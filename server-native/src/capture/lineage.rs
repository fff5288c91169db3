//! The lineage of the stream the worker materializes (issue 38): which database system, and
//! which slot beginning where. Recorded when the worker first creates its slot, and checked
//! at every start and before every stream opens: the slot exists, is usable (`wal_status`
//! not `lost`), and begins no later than what was materialized, on the same database system.
//! Anything else blocks capture with a typed reason ([`BlockReason::SlotMissing`],
//! [`BlockReason::SlotInvalidated`], [`BlockReason::LineageChanged`]) instead of creating a
//! replacement slot at the current WAL position, which skipped (for good, and without a
//! word) every change written while no slot existed.
//!
//! Only the first start after `install` (a database that never applied a transaction)
//! creates the slot on its own. After that only a lineage reset the operator asked for
//! (`synchro-server lineage reset`, install file 35_lineage) replaces it: [`reset`] makes the
//! new slot with an exported snapshot, copies every registered relation as of that snapshot
//! and records the new lineage and stream generation; before the new stream is read the
//! copies are activated at its beginning ([`snapshot_copies`], `step.rs`), so the rows
//! written while no slot existed arrive as ordinary changes, and [`restage`] stages again what
//! was staged into the lost stream. A database with no lineage recorded but
//! a history (installed by an older binary) takes a usable slot as it is and blocks on a
//! missing or lost one like any other.

use anyhow::{Context, Result};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::{BlockReason, Blocked};

/// The system identifier recorded when `pg_control_system()` cannot be read (a managed
/// service may refuse it): the other checks still apply.
const UNKNOWN_SYSTEM: &str = "unknown";

/// The slot as `pg_replication_slots` shows it: where it is confirmed, and whether its WAL
/// is lost.
struct Slot {
    confirmed_flush: Option<PgLsn>,
    lost: bool,
}

async fn slot(control: &Client, name: &str) -> Result<Option<Slot>> {
    Ok(control
        .query_opt(
            "SELECT confirmed_flush_lsn, wal_status = 'lost' FROM pg_replication_slots
              WHERE slot_name = $1 AND database = current_database()
                AND slot_type = 'logical' AND plugin = 'pgoutput'",
            &[&name],
        )
        .await?
        .map(|r| Slot {
            confirmed_flush: r.get(0),
            lost: r.get::<_, Option<bool>>(1).unwrap_or(false),
        }))
}

/// This database system's identifier and timeline, when they can be read.
async fn system(control: &Client) -> (String, Option<i32>) {
    let id = control
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_else(|_| UNKNOWN_SYSTEM.to_owned());
    let timeline = control
        .query_one("SELECT timeline_id FROM pg_control_checkpoint()", &[])
        .await
        .ok()
        .map(|r| r.get::<_, i32>(0));
    (id, timeline)
}

/// Checks the lineage (creating the slot and recording it at a first start); the reason to
/// block, if any.
pub(super) async fn check(
    control: &Client,
    materialize: &Client,
    name: &str,
) -> Result<Option<BlockReason>> {
    let state = materialize
        .query_one(
            "SELECT lineage_system_identifier, acknowledged_lsn,
                    confirmed_lsn = '0/0'
               FROM synchro.capture_state",
            &[],
        )
        .await?;
    let recorded: Option<String> = state.get(0);
    let acknowledged: PgLsn = state.get(1);
    let may_replace: bool = state.get(2);
    let (system, timeline) = system(control).await;
    let found = slot(control, name).await?;
    let Some(recorded) = recorded else {
        match &found {
            None if !may_replace => return Ok(Some(BlockReason::SlotMissing)),
            Some(s) if s.lost && !may_replace => return Ok(Some(BlockReason::SlotInvalidated)),
            _ => {}
        }
        return begin(control, materialize, name, found, &system, timeline)
            .await
            .map(|()| None);
    };
    if recorded != UNKNOWN_SYSTEM && system != UNKNOWN_SYSTEM && recorded != system {
        return Ok(Some(BlockReason::LineageChanged));
    }
    let reason = match found {
        None => Some(BlockReason::SlotMissing),
        Some(s) if s.lost => Some(BlockReason::SlotInvalidated),
        // A slot confirmed past what was materialized is not the one the worker read: one
        // made anew under the same name (its changes before that position were never seen).
        Some(Slot {
            confirmed_flush: Some(at),
            ..
        }) if u64::from(at) > u64::from(acknowledged) => Some(BlockReason::LineageChanged),
        Some(_) => None,
    };
    if reason.is_none() {
        // A promoted standby (PostgreSQL 17 failover slots) continues on a new timeline.
        materialize
            .execute(
                "UPDATE synchro.capture_state SET lineage_timeline = $1
                  WHERE lineage_timeline IS DISTINCT FROM $1 AND $1 IS NOT NULL",
                &[&timeline],
            )
            .await?;
    }
    Ok(reason)
}

/// A first start: the slot is created (one whose WAL is lost is dropped first; a usable one
/// left by an earlier install is taken as it is) and the lineage recorded, with the slot's
/// beginning as acknowledgeable (readiness: the slot is never acknowledged past what the
/// worker recorded).
async fn begin(
    control: &Client,
    materialize: &Client,
    name: &str,
    found: Option<Slot>,
    system: &str,
    timeline: Option<i32>,
) -> Result<()> {
    let began = match found {
        Some(Slot {
            confirmed_flush: Some(at),
            lost: false,
        }) => at,
        found => {
            if found.is_some() {
                control
                    .execute("SELECT pg_drop_replication_slot($1)", &[&name])
                    .await
                    .context("dropping the invalidated capture slot")?;
            }
            let created = create_slot(control, name).await?;
            tracing::info!("capture slot created; its lineage is recorded");
            created
        }
    };
    materialize
        .execute(
            "UPDATE synchro.capture_state
                SET lineage_system_identifier = $1, lineage_timeline = $2, lineage_slot_began_lsn = $3,
                    lineage_recorded_at = now(),
                    acknowledged_lsn = greatest(acknowledged_lsn, $3)",
            &[&system, &timeline, &began],
        )
        .await?;
    Ok(())
}

/// Creates the logical slot; where it begins. On PostgreSQL 17 and later with failover
/// enabled, so that a standby configured to synchronize it (docs/operator.md "Failover")
/// holds it when promoted and capture continues there without a reset.
async fn create_slot(control: &Client, name: &str) -> Result<PgLsn> {
    let version: i32 = control
        .query_one("SELECT current_setting('server_version_num')::integer", &[])
        .await?
        .get(0);
    let create = if version >= 170_000 {
        "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')"
    };
    Ok(control
        .query_one(create, &[&name])
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "creating the capture slot: {}",
                crate::install::describe(&e)
            )
        })?
        .get(0))
}

/// Carries out a lineage reset the operator asked for (35_lineage.sql): whatever slot has
/// the name goes; every relation is put up for a fresh copy; the new slot is created with an
/// exported snapshot, and every relation is copied as of exactly that snapshot (no write
/// gate); then the new lineage and stream generation are recorded. The copies are activated
/// at the slot's beginning before the stream is read ([`snapshot_copies`]). A crash in
/// between leaves the request standing, and the next step does it all again.
pub(super) async fn reset(
    url: &str,
    control: &Client,
    materialize: &Client,
    name: &str,
) -> Result<i64> {
    let (system, timeline) = system(control).await;
    if slot(control, name).await?.is_some() {
        control
            .execute("SELECT pg_drop_replication_slot($1)", &[&name])
            .await
            .context("dropping the capture slot of the old lineage")?;
    }
    let generations: Vec<i64> = materialize
        .query("SELECT synchro.synchro_lineage_reset_prepare()", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The slot and its snapshot, on a replication session that stays open (idle) until the
    // copies are made: the snapshot lives only as long as that.
    let version: i32 = control
        .query_one("SELECT current_setting('server_version_num')::integer", &[])
        .await?
        .get(0);
    let mut replication =
        pgwire_replication::ReplicationClient::connect_gated(super::stream::config(url, name)?)
            .await?;
    let created = replication
        .simple_query(&format!(
            "CREATE_REPLICATION_SLOT \"{}\" LOGICAL pgoutput (SNAPSHOT 'export'{})",
            name.replace('"', "\"\""),
            if version >= 170_000 { ", FAILOVER" } else { "" }
        ))
        .await
        .context("creating the capture slot")?;
    let text = |i: usize| {
        created
            .first()
            .and_then(|row| row.get(i))
            .and_then(|v| v.as_ref())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .context("CREATE_REPLICATION_SLOT answered no row")
    };
    let began: PgLsn = text(1)?
        .parse()
        .map_err(|_| anyhow::anyhow!("CREATE_REPLICATION_SLOT answered no position"))?;
    let snapshot = text(2)?;
    materialize
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '{}'",
            snapshot.replace('\'', "''")
        ))
        .await?;
    let copied = materialize
        .query_one("SELECT synchro.synchro_lineage_copy($1)", &[&generations])
        .await;
    let copied: i64 = match copied {
        Ok(row) => {
            materialize.batch_execute("COMMIT").await?;
            row.get(0)
        }
        Err(e) => {
            materialize.batch_execute("ROLLBACK").await?;
            return Err(e.into());
        }
    };
    drop(replication);
    let generation: i64 = materialize
        .query_one(
            "SELECT synchro.synchro_lineage_reset_begin($1, $2, $3, $4)",
            &[&system, &timeline, &began, &generations],
        )
        .await?
        .get(0);
    tracing::info!(
        relations = generations.len(),
        rows = copied,
        "lineage reset: a new capture slot; every relation copied from its snapshot, to be compared"
    );
    Ok(generation)
}

/// The copies a lineage reset made from the new slot's snapshot and not yet activated, and
/// where the stream begins (they are activated there, before the stream is read).
pub(super) async fn snapshot_copies(materialize: &Client) -> Result<Option<(PgLsn, Vec<i64>)>> {
    let rows = materialize
        .query(
            "SELECT generation, at FROM synchro.synchro_lineage_snapshot_copies()",
            &[],
        )
        .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let at: PgLsn = first.get(1);
    Ok(Some((at, rows.iter().map(|r| r.get(0)).collect())))
}

/// Stages the generations a lineage reset put back to pending (a reconfiguration or reset
/// staged into the lost stream), each under its write gate with its message in the new
/// slot's stream, before that stream is read. `false` when a table's lock could not be had
/// in time: the stream waits for the next step.
pub(super) async fn restage(materialize: &Client) -> Result<bool> {
    let pending = materialize
        .query(
            "SELECT generation, schema_version, record_scopes FROM synchro.synchro_lineage_restage()",
            &[],
        )
        .await?;
    if pending.is_empty() {
        return Ok(true);
    }
    materialize
        .batch_execute("SET lock_timeout = '10s'")
        .await?;
    let mut done = true;
    for r in &pending {
        let (generation, version, scopes): (i64, Option<i64>, bool) =
            (r.get(0), r.get(1), r.get(2));
        let staged = materialize
            .execute(
                "SELECT synchro.synchro_stage_generation($1, $2, $3)",
                &[&generation, &version, &scopes],
            )
            .await;
        match staged.as_ref().map_err(|e| e.code().map(|c| c.code())) {
            Ok(_) => {}
            Err(Some("55P03")) => {
                tracing::warn!("lineage reset: a table's lock is not available; copying it later");
                done = false;
                break;
            }
            // The table changed shape since it was registered: drift, as anywhere else.
            Err(Some("40001")) => {
                materialize.batch_execute("RESET lock_timeout").await?;
                return Err(Blocked(BlockReason::RegisteredRelationDrift).into());
            }
            Err(_) => {
                materialize.batch_execute("RESET lock_timeout").await?;
                staged?;
            }
        }
    }
    materialize.batch_execute("RESET lock_timeout").await?;
    if done {
        tracing::info!(
            relations = pending.len(),
            "lineage reset: every relation copied"
        );
    }
    Ok(done)
}
