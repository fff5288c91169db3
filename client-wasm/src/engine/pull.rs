//! Step 10: pull (spec 003 `POST /sync/pull`). Pages through every assigned scope that is
//! not rebuilding until the terminal page; the store verifies and applies each page, then
//! checks a terminal page's scope digests before installing its cursors.

use std::collections::BTreeSet;

use synchro_protocol::wire::{PullRequest, PullResponse};

use super::{Client, ClientError, Progress, SyncReport, Transport};
use crate::store::StorageError;

impl<T: Transport> Client<T> {
    /// Pulls every assigned scope to the terminal page.
    pub(super) async fn pull(&mut self, report: &mut SyncReport) -> Result<(), ClientError> {
        let manifest = self.active()?;
        let generation = self.connected_generation()?;
        let mut progress = Progress {
            phase: "pull",
            scope: None,
            pages: 0,
            rows: 0,
            total_rows: None,
        };
        loop {
            let scopes = self.scopes()?;
            let request = PullRequest {
                client_id: self.client_id.clone(),
                client_generation: generation,
                schema: self.schema_json(),
                scope_cursors: scopes
                    .iter()
                    .filter(|(_, (_, rebuild))| !rebuild)
                    .map(|(s, (c, _))| (s.clone(), c.clone()))
                    .collect(),
                limit: self.page_limit as u64,
            };
            let r = self.post("/sync/pull", &request).await?;
            if r.status != 200 {
                return Err(ClientError::from_response(&r));
            }
            let page = PullResponse::from_json_owned(r.body)
                .map_err(|e| StorageError::Verification(e.message))?;
            let mut assigned: BTreeSet<String> = scopes.keys().cloned().collect();
            assigned.extend(page.scope_updates.added.iter().cloned());
            for s in &page.scope_updates.removed {
                assigned.remove(s);
            }
            let tables: BTreeSet<String> = page
                .changes
                .iter()
                .filter_map(|c| manifest.table(&c.table_id).map(|t| t.name.clone()))
                .collect();
            let has_more = page.has_more;
            // The page's rows are visible (and listeners told) as soon as they are applied;
            // a terminal page's digests are checked next, before any cursor is installed.
            let (mut applied, terminal) =
                self.storage.apply_pull_rows(&manifest, page, &assigned)?;
            self.notify(tables);
            self.storage
                .verify_terminal(&manifest, terminal, &mut applied)?;
            progress.pages += 1;
            progress.rows += applied.changes as u64;
            report.pull_pages += 1;
            report.pulled_changes += applied.changes as u64;
            report.verified.extend(applied.verified);
            self.report(progress.clone());
            if !has_more {
                return Ok(());
            }
        }
    }
}
