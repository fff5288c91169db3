//! The lineage of the stream the worker materializes (issue 38): which database system, and
//! which slot beginning where. Recorded when the worker first creates its slot, and checked
//! at every start and before every stream opens: the slot exists, is usable (`wal_status`
//! not `lost`), and begins no later than what was materialized, on the same database system.
//! Anything else blocks capture with a typed reason ([`BlockReason::SlotMissing`],
//! [`BlockReason::SlotInvalidated`], [`BlockReason::LineageChanged`]) instead of creating a
//! replacement slot at the current WAL position, which skipped (for good, and without a
//! word) every change written while no slot existed.
//!
//! Only a start with no lineage recorded creates (or replaces) the slot, and only in a
//! database that never applied a transaction (the first start after `install`) or after the
//! operator accepted a lineage block (`synchro-server capture unblock`, which forgets the
//! recorded lineage; docs/operator.md "When capture blocks"). A database with no lineage
//! recorded but a history (installed by an older binary) takes a usable slot as it is and
//! blocks on a missing or lost one like any other.

use anyhow::{Context, Result};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::BlockReason;

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
                    lineage_accepted_at IS NOT NULL OR confirmed_lsn = '0/0'
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
            let created: PgLsn = control
                .query_one(
                    "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&name],
                )
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "creating the capture slot: {}",
                        crate::install::describe(&e)
                    )
                })?
                .get(0);
            tracing::info!("capture slot created; its lineage is recorded");
            created
        }
    };
    materialize
        .execute(
            "UPDATE synchro.capture_state
                SET lineage_system_identifier = $1, lineage_timeline = $2, lineage_slot_began_lsn = $3,
                    lineage_recorded_at = now(), lineage_accepted_at = NULL,
                    acknowledged_lsn = greatest(acknowledged_lsn, $3)",
            &[&system, &timeline, &began],
        )
        .await?;
    Ok(())
}
