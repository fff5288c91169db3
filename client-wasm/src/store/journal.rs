//! The durable migration journal (spec 000 "Durable Migration State", one row of
//! `_synchro_journal`) and the migration's DDL transaction.
//!
//! A journal is written [`Phase::Pending`] with both manifests, the action, the affected
//! scopes, the cursor replacements and the plan with its hash, before any DDL runs. The DDL
//! transaction ([`Storage::commit_migration`]) then runs the plan, digests the kept rows
//! again, installs cursor replacements and rebuild markers and sets the phase
//! [`Phase::Committed`], all at once. The journal is cleared when its rebuilds are done.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, OptionalExtension};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::{MigrationPlan, MIGRATION_PLAN_VERSION};

use super::client::clear_reset;
use super::enums::{MigrationAction, Phase};
use super::rows::redigest_rows;
use super::scopes::{clear_pending_cursors, mark_rebuild, replace_cursor};
use super::{hex, Storage};
use crate::error::StorageError;

/// The journal layout this engine writes and reads.
pub const JOURNAL_VERSION: i64 = 1;

/// The persisted journal, read back and verified.
#[derive(Debug, Clone)]
pub(crate) struct Journal {
    /// The schema migrated from (none for a first install).
    pub source: Option<Manifest>,
    /// The schema migrated to.
    pub target: Manifest,
    /// The scopes that rebuild (non-empty exactly for [`MigrationAction::RebuildLocal`]).
    pub affected: BTreeSet<String>,
    /// Server-issued cursor replacements (none: rebuild).
    pub cursor_updates: BTreeMap<String, Option<String>>,
    /// The plan's hash, lowercase hex.
    pub plan_hash: String,
    /// Pending or committed.
    pub phase: Phase,
    /// An explicit incompatible-schema reset.
    pub reset: bool,
}

/// What a new journal records.
pub(crate) struct NewJournal<'a> {
    /// The active schema (none before the first install).
    pub source: Option<&'a Manifest>,
    /// The schema to migrate to.
    pub target: &'a Manifest,
    /// What the migration does to the scopes.
    pub action: MigrationAction,
    /// The scopes that rebuild.
    pub affected: &'a BTreeSet<String>,
    /// Server-issued cursor replacements.
    pub cursor_updates: &'a BTreeMap<String, Option<String>>,
    /// The derived plan.
    pub plan: &'a MigrationPlan,
    /// The client generation and scope set version of the connect that asked for it,
    /// recorded in the journal's transaction.
    pub client: (i64, Option<i64>),
    /// An explicit incompatible-schema reset.
    pub reset: bool,
}

/// Why a journal could not be read.
#[derive(Debug)]
pub(crate) enum JournalError {
    /// The database failed.
    Storage(StorageError),
    /// A journal is there but does not verify (the reason, bounded).
    Invalid(&'static str),
}

impl From<StorageError> for JournalError {
    fn from(e: StorageError) -> JournalError {
        JournalError::Storage(e)
    }
}

impl From<rusqlite::Error> for JournalError {
    fn from(e: rusqlite::Error) -> JournalError {
        JournalError::Storage(e.into())
    }
}

/// Where the DDL transaction lets its caller interrupt it (crash injection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DdlPoint {
    /// After the plan's first statement.
    AfterFirstStatement,
    /// After everything, before the commit.
    BeforeCommit,
}

const DOES_NOT_VERIFY: &str = "the migration journal does not verify";

fn string_set(j: &Json) -> Option<BTreeSet<String>> {
    match j {
        Json::Null => Some(BTreeSet::new()),
        Json::Array(a) => a.iter().map(|s| s.as_str().map(str::to_owned)).collect(),
        _ => None,
    }
}

fn cursor_map(j: &Json) -> Option<BTreeMap<String, Option<String>>> {
    match j {
        Json::Null => Some(BTreeMap::new()),
        Json::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Json::Null => Some((k.clone(), None)),
                Json::String(s) => Some((k.clone(), Some(s.clone()))),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn cursor_json(m: &BTreeMap<String, Option<String>>) -> String {
    to_output_string(&Json::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(Json::Null, Json::String)))
            .collect(),
    ))
}

impl Storage {
    /// The journal, verified: its layout version, both manifests, and an action that agrees
    /// with its affected scopes. `None` when there is none.
    pub(crate) fn journal(&self) -> Result<Option<Journal>, JournalError> {
        type Row = (
            i64,
            Option<String>,
            String,
            String,
            String,
            String,
            i64,
            String,
            String,
            bool,
        );
        let row: Option<Row> = self
            .connection()
            .query_row(
                r#"SELECT "journal_version", "source_body", "target_body", "action", "affected_scopes",
                          "cursor_updates", "migration_plan_version", "plan_hash", "phase", "reset"
                     FROM "_synchro_journal" WHERE "id" = 1"#,
                [],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                    ))
                },
            )
            .optional()?;
        let Some((
            version,
            source,
            target,
            action,
            affected,
            cursors,
            plan_version,
            plan_hash,
            phase,
            reset,
        )) = row
        else {
            return Ok(None);
        };
        let bad = |_| JournalError::Invalid(DOES_NOT_VERIFY);
        if version != JOURNAL_VERSION || plan_version != MIGRATION_PLAN_VERSION as i64 {
            return Err(JournalError::Invalid(
                "the migration journal has an unknown version",
            ));
        }
        let affected = string_set(&Json::parse(&affected).map_err(bad)?)
            .ok_or(JournalError::Invalid(DOES_NOT_VERIFY))?;
        let action =
            MigrationAction::parse(&action).ok_or(JournalError::Invalid(DOES_NOT_VERIFY))?;
        if (action == MigrationAction::RebuildLocal) == affected.is_empty() {
            return Err(JournalError::Invalid(
                "the migration journal's action and affected scopes disagree",
            ));
        }
        Ok(Some(Journal {
            source: source
                .map(|b| Manifest::parse(&b))
                .transpose()
                .map_err(bad)?,
            target: Manifest::parse(&target).map_err(bad)?,
            affected,
            cursor_updates: cursor_map(&Json::parse(&cursors).map_err(bad)?)
                .ok_or(JournalError::Invalid(DOES_NOT_VERIFY))?,
            plan_hash,
            phase: Phase::parse(&phase).ok_or(JournalError::Invalid(DOES_NOT_VERIFY))?,
            reset,
        }))
    }

    /// The phase of the durable journal, if there is one.
    pub(crate) fn journal_phase(&self) -> Result<Option<Phase>, StorageError> {
        Ok(self
            .connection()
            .query_row(
                r#"SELECT "phase" FROM "_synchro_journal" WHERE "id" = 1"#,
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Replaces the journal with a new one, [`Phase::Pending`], in one transaction.
    pub(crate) fn write_journal(&mut self, j: &NewJournal<'_>) -> Result<(), StorageError> {
        self.with_tx(|tx| {
            tx.execute(r#"DELETE FROM "_synchro_journal""#, [])?;
            tx.execute(
                r#"INSERT INTO "_synchro_journal" ("id", "journal_version", "source_version", "source_hash",
                       "source_body", "target_version", "target_hash", "target_body", "action",
                       "affected_scopes", "cursor_updates", "migration_plan_version", "plan", "plan_hash",
                       "phase", "reset")
                   VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"#,
                params![
                    JOURNAL_VERSION,
                    j.source.map(|m| m.schema_version as i64),
                    j.source.map(Manifest::schema_hash_hex),
                    j.source.map(Manifest::canonical_body),
                    j.target.schema_version as i64,
                    j.target.schema_hash_hex(),
                    j.target.canonical_body(),
                    j.action,
                    to_output_string(&Json::Array(
                        j.affected.iter().cloned().map(Json::String).collect()
                    )),
                    cursor_json(j.cursor_updates),
                    MIGRATION_PLAN_VERSION as i64,
                    j.plan.to_json_string(),
                    hex(&j.plan.plan_hash()),
                    Phase::Pending,
                    j.reset,
                ],
            )?;
            super::client::record_client(tx, j.client.0, j.client.1)?;
            Ok(())
        })
    }

    /// The migration's DDL transaction (steps 3-6): the plan's statements, the rows kept
    /// in place digested again under the target schema, the server-issued cursor
    /// replacements for unaffected scopes (none: rebuild), the affected scopes marked, every
    /// waiting cursor dropped, the phase committed and, for a reset, the client allowed to
    /// sync again. `at` is called at each [`DdlPoint`]; an error from it (or anything else)
    /// rolls everything back.
    pub(crate) fn commit_migration<E: From<StorageError>>(
        &mut self,
        journal: &Journal,
        plan: &MigrationPlan,
        mut at: impl FnMut(DdlPoint) -> Result<(), E>,
    ) -> Result<(), E> {
        let db = |e: rusqlite::Error| E::from(StorageError::from(e));
        // The DDL and the digests rewritten under the target schema: the scope index is
        // built again from the tables (dropped before, so a failure leaves nothing stale).
        self.index.invalidate();
        let tx = self.conn_mut().transaction().map_err(db)?;
        for (i, statement) in plan.render().iter().enumerate() {
            tx.execute_batch(statement).map_err(db)?;
            if i == 0 {
                at(DdlPoint::AfterFirstStatement)?;
            }
        }
        // Row digests bind the schema hash: the rows kept in place are digested again.
        if journal.source.is_some() {
            redigest_rows(&tx, &journal.target)?;
        }
        for (scope, cursor) in &journal.cursor_updates {
            if journal.affected.contains(scope) {
                continue;
            }
            replace_cursor(&tx, scope, cursor.as_deref()).map_err(db)?;
        }
        for scope in &journal.affected {
            mark_rebuild(&tx, scope).map_err(db)?;
        }
        // A cursor under the source schema that got no replacement cannot continue.
        clear_pending_cursors(&tx).map_err(db)?;
        tx.execute(
            r#"UPDATE "_synchro_journal" SET "phase" = ? WHERE "id" = 1"#,
            [Phase::Committed],
        )
        .map_err(db)?;
        if journal.reset {
            clear_reset(&tx).map_err(db)?;
        }
        at(DdlPoint::BeforeCommit)?;
        tx.commit().map_err(db)?;
        Ok(())
    }

    /// Clears the journal (its migration is complete).
    pub(crate) fn clear_journal(&self) -> Result<(), StorageError> {
        self.neutral(|conn| {
            conn.execute(r#"DELETE FROM "_synchro_journal""#, [])?;
            Ok(())
        })
    }
}
