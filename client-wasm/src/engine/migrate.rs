//! Step: migrate (spec 000 "Client Migration Rules", steps 1-6 and 9, and "Durable
//! Migration State"). A migration is journaled before any DDL runs, then executed from the
//! journal in one DDL transaction; restart recovery reads the journal before anything is
//! sent; the journal is cleared once none of its scopes still rebuilds.

use synchro_protocol::manifest::Manifest;
use synchro_protocol::migration::MigrationPlan;
use synchro_protocol::state::ClientState;

use super::{Client, ClientError, Failpoint, Migration, Transport};
use crate::store::{hex, DdlPoint, MigrationAction, NewJournal, Phase, StorageError};

impl<T: Transport> Client<T> {
    /// Restart recovery (spec 000 "Durable Migration State"): never sends a request.
    pub(super) fn recover(&mut self) -> Result<(), ClientError> {
        let Some(journal) = self.storage.journal()? else {
            return Ok(());
        };
        let active = self.manifest.as_ref().map(Manifest::schema_ref);
        match journal.phase {
            Phase::Pending if active == journal.source.as_ref().map(Manifest::schema_ref) => {
                self.go(ClientState::Connecting)?;
                self.go(ClientState::Migrating)?;
                let result = self.execute_journal();
                // The journal stays durable either way; the next round continues from it.
                self.go(ClientState::Stopped)?;
                result
            }
            Phase::Committed if active == Some(journal.target.schema_ref()) => Ok(()),
            _ => {
                // Blocked where the state map allows it; either way nothing is sent (the
                // round stops here, and so does every later one: the journal stays).
                let _ = self.go(ClientState::Blocked);
                Err(ClientError::Blocked(
                    "the migration journal and the active schema disagree",
                ))
            }
        }
    }

    /// Steps 1-6 (the engine is `migrating`): releases the scopes the server no longer
    /// assigns, persists the journal, then executes it.
    pub(super) fn migrate(&mut self, m: Migration) -> Result<(), ClientError> {
        let Migration {
            target,
            mut affected,
            added,
            removed,
            mut cursor_updates,
            reset,
            client,
        } = m;
        let source = self.manifest.clone();
        if let Some(active) = &source {
            let gone: Vec<String> = removed.iter().cloned().collect();
            self.storage.release_scopes(active, &gone)?;
        }
        for s in &added {
            cursor_updates.entry(s.clone()).or_insert(None);
        }
        // A committed journal still waiting for rebuild carries its unfinished scopes over.
        if let Some(earlier) = self.storage.journal()? {
            if earlier.phase != Phase::Committed {
                return Err(ClientError::Blocked(
                    "an earlier migration has not committed its DDL",
                ));
            }
            let pending = self.scopes()?;
            affected.extend(
                earlier
                    .affected
                    .into_iter()
                    .filter(|s| pending.get(s).is_some_and(|(_, rebuild)| *rebuild)),
            );
        }
        let plan = MigrationPlan::derive(source.as_ref(), &target, reset)
            .map_err(StorageError::Protocol)?;
        let action = if affected.is_empty() {
            MigrationAction::Replace
        } else {
            MigrationAction::RebuildLocal
        };
        self.storage.write_journal(&NewJournal {
            source: source.as_ref(),
            target: &target,
            action,
            affected: &affected,
            cursor_updates: &cursor_updates,
            plan: &plan,
            reset,
            client,
        })?;
        self.fail(Failpoint::AfterJournal)?;
        self.execute_journal()
    }

    /// Steps 3-6: the plan (re-derived from the journaled manifests and checked against its
    /// journaled hash) executed in the store's DDL transaction; then the target is active.
    fn execute_journal(&mut self) -> Result<(), ClientError> {
        let journal = self
            .storage
            .journal()?
            .ok_or(ClientError::Blocked("the migration journal vanished"))?;
        let plan =
            MigrationPlan::derive(journal.source.as_ref(), &journal.target, journal.reset)
                .map_err(|_| ClientError::Blocked("the journaled plan cannot be derived again"))?;
        if hex(&plan.plan_hash()) != journal.plan_hash {
            return Err(ClientError::Blocked(
                "the journaled plan does not match its manifests",
            ));
        }
        let failpoint = self.failpoint;
        self.storage
            .commit_migration(&journal, &plan, |at| match (at, failpoint) {
                (DdlPoint::AfterFirstStatement, Failpoint::InsideDdl)
                | (DdlPoint::BeforeCommit, Failpoint::BeforeDdlCommit) => {
                    Err(ClientError::Injected)
                }
                _ => Ok(()),
            })?;
        let tables = Self::table_names(&journal.target);
        self.manifest = Some(journal.target);
        self.notify(tables);
        self.fail(Failpoint::AfterDdlCommit)
    }

    /// Step 9: clears a committed journal once none of its scopes still rebuilds.
    pub(super) fn finish_journal(&mut self) -> Result<(), ClientError> {
        let Some(journal) = self.storage.journal()? else {
            return Ok(());
        };
        if journal.phase != Phase::Committed {
            return Ok(());
        }
        let scopes = self.scopes()?;
        if journal
            .affected
            .iter()
            .any(|s| scopes.get(s).is_some_and(|(_, rebuild)| *rebuild))
        {
            return Ok(());
        }
        self.fail(Failpoint::BeforeJournalClear)?;
        self.storage.clear_journal()?;
        Ok(())
    }

    /// The phase of the durable migration journal, if there is one (pending, or committed
    /// and waiting for rebuild).
    pub fn journal_phase(&self) -> Result<Option<Phase>, ClientError> {
        Ok(self.storage.journal_phase()?)
    }

    /// After an application upgrade in `upgrade_required`: the next round connects with
    /// `schema_reset` (spec 000 "Explicit Incompatible-Schema Reset"), installs the current
    /// manifest with a reset plan (tables rebuilt in their new shape) and rebuilds every
    /// scope. Local-only tables and the whole queue are kept: queued intent authored under
    /// the old schema is pushed and gets its outcome (`schema_incompatible` when it writes
    /// what no longer exists).
    pub fn request_schema_reset(&mut self) -> Result<(), ClientError> {
        if self.machine.state() != ClientState::UpgradeRequired {
            return Err(ClientError::IllegalTransition(
                synchro_protocol::Error::IllegalTransition {
                    from: self.machine.state().as_str(),
                    to: "connecting (schema_reset)",
                },
            ));
        }
        self.storage.request_reset()?;
        Ok(())
    }
}
