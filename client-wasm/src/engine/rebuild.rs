//! Step 8: rebuild (spec 003 `POST /sync/rebuild`). Every scope marked for rebuild is paged
//! into the store's staging layer; the store verifies the final checksum before it installs
//! the final cursor. A `rebuild_restart_required` answer restarts the scope (three times at
//! most).

use synchro_protocol::state::ClientState;
use synchro_protocol::wire::{Message, RebuildEnd, RebuildRequest, RebuildResponse};

use super::{Client, ClientError, Failpoint, Progress, SyncReport, Transport};
use crate::store::StorageError;

impl<T: Transport> Client<T> {
    /// Rebuilds every scope marked for rebuild; returns whether there was one.
    pub(super) async fn rebuild_marked(
        &mut self,
        report: &mut SyncReport,
    ) -> Result<bool, ClientError> {
        let marked: Vec<String> = self
            .scopes()?
            .into_iter()
            .filter(|(_, (_, rebuild))| *rebuild)
            .map(|(s, _)| s)
            .collect();
        if marked.is_empty() {
            return Ok(false);
        }
        self.go(ClientState::Rebuilding)?;
        for scope in marked {
            self.rebuild_scope(&scope).await?;
            report.rebuilt.insert(scope);
        }
        Ok(true)
    }

    /// Rebuilds one scope from the server; returns the rows received.
    async fn rebuild_scope(&mut self, scope: &str) -> Result<u64, ClientError> {
        let manifest = self.active()?;
        let generation = self.connected_generation()?;
        let mut continuation: Option<String> = None;
        let mut progress = Progress {
            phase: "rebuild",
            scope: Some(scope.to_owned()),
            pages: 0,
            rows: 0,
        };
        let mut restarts = 0;
        loop {
            let request = RebuildRequest {
                client_id: self.client_id.clone(),
                client_generation: generation,
                schema: self.schema_json(),
                scope_id: scope.to_owned(),
                limit: self.page_limit as u64,
                continuation: continuation.clone(),
            };
            let r = self.post("/sync/rebuild", &request).await?;
            if r.status != 200 {
                let e = ClientError::from_response(&r);
                if e.is_server("rebuild_restart_required") && restarts < 3 {
                    restarts += 1;
                    continuation = None;
                    continue;
                }
                return Err(e);
            }
            let first = continuation.is_none();
            let page = RebuildResponse::from_json(&r.body)
                .map_err(|e| StorageError::Verification(e.message))?;
            let done = self
                .storage
                .apply_rebuild_page(&manifest, scope, &page, first)?;
            progress.pages += 1;
            progress.rows += page.records.len() as u64;
            self.report(progress.clone());
            self.fail(Failpoint::InsideRebuild)?;
            match page.end {
                RebuildEnd::Final { .. } => {
                    debug_assert!(done);
                    self.notify(Self::table_names(&manifest));
                    return Ok(progress.rows);
                }
                RebuildEnd::More { continuation: next } => continuation = Some(next),
            }
        }
    }
}
