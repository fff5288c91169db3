//! Step 8: rebuild (spec 003 `POST /sync/rebuild`). Every scope marked for rebuild is paged
//! into the store's staging layer; the store verifies the final checksum before it installs
//! the final cursor. A `rebuild_restart_required` answer restarts the scope (three times at
//! most).

use std::future::Future;

use synchro_protocol::jcs::to_output_string;
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

    /// Rebuilds one scope from the server; returns the rows received. The next page is
    /// asked for before the current one is verified and applied (the server reads it while
    /// this client writes); pages are still applied one after the other, in order, and a
    /// page that fails leaves the answer to the next request unread.
    async fn rebuild_scope(&mut self, scope: &str) -> Result<u64, ClientError> {
        let manifest = self.active()?;
        let generation = self.connected_generation()?;
        let mut continuation: Option<String> = None;
        let mut progress = Progress {
            phase: "rebuild",
            scope: Some(scope.to_owned()),
            pages: 0,
            rows: 0,
            total_rows: None,
        };
        let mut restarts = 0;
        let (client_id, schema, limit) = (
            self.client_id.clone(),
            self.schema_json(),
            self.page_limit as u64,
        );
        let request = |continuation: Option<String>| RebuildRequest {
            client_id: client_id.clone(),
            client_generation: generation,
            schema: schema.clone(),
            scope_id: scope.to_owned(),
            limit,
            continuation,
        };
        let mut next = Some(request(None).to_json());
        let mut prefetched = None;
        loop {
            let r = match prefetched.take() {
                Some(r) => r,
                None => {
                    let body = next.take().expect("a request to send");
                    let asked = self.send("/sync/rebuild", to_output_string(&body));
                    self.awaiting(asked).await?
                }
            };
            if r.status != 200 {
                let e = ClientError::from_response(&r);
                if e.is_server("rebuild_restart_required") && restarts < 3 {
                    restarts += 1;
                    continuation = None;
                    next = Some(request(None).to_json());
                    continue;
                }
                return Err(e);
            }
            let first = continuation.is_none();
            progress.total_rows = r.scope_rows.or(progress.total_rows);
            let page = RebuildResponse::from_json(&r.body)
                .map_err(|e| StorageError::Verification(e.message))?;
            let following = match &page.end {
                RebuildEnd::More { continuation: c } => Some(c.clone()),
                RebuildEnd::Final { .. } => None,
            };
            let done = match &following {
                Some(c) => {
                    let body = to_output_string(&request(Some(c.clone())).to_json());
                    let mut asked = std::pin::pin!(self.send("/sync/rebuild", body));
                    // Polled once, the request is on its way while the page is applied
                    // (an answer ready at once is kept: a finished future is not polled again).
                    let early = asked
                        .as_mut()
                        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
                    let done = self
                        .storage
                        .apply_rebuild_page(&manifest, scope, &page, first)?;
                    prefetched = Some(match early {
                        std::task::Poll::Ready(answer) => answer?,
                        std::task::Poll::Pending => self.awaiting(asked).await?,
                    });
                    done
                }
                None => self
                    .storage
                    .apply_rebuild_page(&manifest, scope, &page, first)?,
            };
            progress.pages += 1;
            progress.rows += page.records.len() as u64;
            self.report(progress.clone());
            self.fail(Failpoint::InsideRebuild)?;
            match following {
                None => {
                    debug_assert!(done);
                    self.notify(Self::table_names(&manifest));
                    return Ok(progress.rows);
                }
                Some(c) => continuation = Some(c),
            }
        }
    }
}
