//! Step: connect (spec 003 `POST /sync/connect`). Presents the identity, generation, schema,
//! installed cursors and the client's runtime version (`client_version`, which the server
//! holds against its `--min-client-version`); records the generation the server returns;
//! for an unchanged schema records the scope updates, and for a migration verifies the
//! announced target manifest and hands it on. A 426 or the `unsupported` action enters
//! `upgrade_required`, durably: a 426 records the refused client version (a client opened
//! with a higher one connects again), `unsupported` the flag only the explicit reset clears.
//! Neither touches the queue or local data. A fresh client whose first connect reached the
//! server but whose answer was lost is known there while nothing was installed here; its fresh
//! sentinel is then refused (400 `invalid_schema_reference`, spec 000), so it takes a new client
//! ID (it holds nothing under the old one) and connects again, once.

use std::collections::BTreeSet;

use synchro_protocol::manifest::Manifest;
use synchro_protocol::wire::{ConnectRequest, ConnectResponse, Message};

use super::{
    Client, ClientError, Connected, Migration, SchemaActionKind, Transport, UpgradeReason,
};
use crate::store::Phase;

impl<T: Transport> Client<T> {
    /// The connect exchange: returns the server's action, the affected scopes it names and
    /// what to do next.
    pub(super) async fn exchange(
        &mut self,
    ) -> Result<(SchemaActionKind, BTreeSet<String>, Connected), ClientError> {
        if let Some(j) = self.storage.journal()? {
            if j.phase != Phase::Committed {
                return Err(ClientError::Blocked(
                    "a pending migration must finish before connecting",
                ));
            }
        }
        let reset = self.storage.reset_requested()?;
        let generation = self.storage.generation()?;
        // Two tries at most: the second with a new ID after a lost first answer (module doc).
        let mut fresh_retry = self.manifest.is_none() && generation.is_none();
        let r = loop {
            // A seed's receipts go with the first connect under its schema (each once).
            let seed_receipts = if self.manifest.is_some() {
                self.storage.seed_receipts()?.into_iter().collect()
            } else {
                Default::default()
            };
            let request = ConnectRequest {
                client_id: self.client_id.clone(),
                client_generation: generation,
                schema: self.schema_json(),
                schema_reset: reset,
                client_version: Some(self.client_version.clone()),
                scope_cursors: self
                    .scopes()?
                    .into_iter()
                    .filter_map(|(s, (c, _))| c.map(|c| (s, Some(c))))
                    .collect(),
                seed_receipts,
            };
            let r = self.post("/sync/connect", &request).await?;
            if std::mem::take(&mut fresh_retry)
                && r.status == 400
                && ClientError::from_response(&r).is_server("invalid_schema_reference")
            {
                let id = super::hex(&(self.random)());
                if self.storage.replace_fresh_client_id(&id)? {
                    self.client_id = id;
                    continue;
                }
            }
            break r;
        };
        if r.status == 426 {
            // The runtime (its version, or its protocol version) is refused: only an upgraded
            // application can continue, and the schema is not at fault.
            self.storage
                .set_refused_client_version(&self.client_version)?;
            return Err(ClientError::UpgradeRequired(UpgradeReason::ClientRuntime));
        }
        if r.status != 200 {
            return Err(ClientError::from_response(&r));
        }
        let b =
            ConnectResponse::from_json(&r.body).map_err(|e| ClientError::Malformed(e.message))?;
        let generation = i64::try_from(b.client_generation)
            .map_err(|_| ClientError::Malformed("client_generation is out of range"))?;
        let scope_set_version = i64::try_from(b.scope_set_version).ok();
        let added: BTreeSet<String> = b.scope_updates.added.iter().cloned().collect();
        let removed: BTreeSet<String> = b.scope_updates.removed.iter().cloned().collect();
        let affected: BTreeSet<String> = b.affected_scopes.iter().flatten().cloned().collect();
        // The generation is recorded with what came with it (its null cursors, the scope
        // changes), in one transaction: by `apply_connect`, or by the migration's journal.
        let client = (generation, scope_set_version);
        let action = b.schema.action;
        let connected = match action {
            SchemaActionKind::None => {
                let manifest = self
                    .manifest
                    .clone()
                    .ok_or(ClientError::Malformed("action none without a schema"))?;
                // Scope updates for an unchanged schema.
                let gone: Vec<String> = removed.iter().cloned().collect();
                self.storage.apply_connect(
                    &manifest,
                    client,
                    &gone,
                    &added,
                    &b.scope_cursor_updates,
                )?;
                Connected::Unchanged
            }
            SchemaActionKind::Replace | SchemaActionKind::RebuildLocal => {
                let definition = b.schema_definition.as_ref().ok_or(ClientError::Malformed(
                    "a migration without schema_definition",
                ))?;
                let target = Manifest::from_json(definition)
                    .map_err(|_| ClientError::Malformed("schema_definition does not verify"))?;
                if (b.schema.version, b.schema.hash.as_str())
                    != (target.schema_version, target.schema_hash_hex().as_str())
                {
                    return Err(ClientError::Malformed(
                        "schema_definition is not the announced schema",
                    ));
                }
                if action == SchemaActionKind::RebuildLocal && affected.is_empty() {
                    return Err(ClientError::Malformed(
                        "rebuild_local without affected_scopes",
                    ));
                }
                // A seed of another schema than the target: its scopes rebuild.
                self.storage.forget_seed_receipts()?;
                Connected::Migrate(Box::new(Migration {
                    target,
                    affected: affected.clone(),
                    added,
                    removed,
                    cursor_updates: b.scope_cursor_updates.clone(),
                    reset,
                    client,
                }))
            }
            SchemaActionKind::Unsupported => {
                self.storage.record_connect(generation, scope_set_version)?;
                self.storage.set_upgrade_required()?;
                return Err(ClientError::UpgradeRequired(UpgradeReason::SchemaHistory));
            }
        };
        Ok((action, affected, connected))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use synchro_protocol::json::Json;
    use synchro_protocol::wire::{ConnectRequest, Message};

    use crate::engine::{Client, ClientConfig, Response, Transport, TransportError};
    use crate::store::Storage;

    /// Keeps every body it is given and answers nothing (a network failure).
    #[derive(Clone, Default)]
    struct Recorder(Rc<RefCell<Vec<String>>>);

    impl Transport for Recorder {
        async fn post(&self, _: &str, body: String) -> Result<Response, TransportError> {
            self.0.borrow_mut().push(body);
            Err(TransportError("recorded".into()))
        }
    }

    /// The `client_version` of the one connect `config`'s client sends.
    async fn sent_version(config: ClientConfig) -> Option<String> {
        let recorder = Recorder::default();
        let storage = Storage::open_in_memory().unwrap();
        let mut c = Client::open_with(storage, recorder.clone(), || [3; 16], config).unwrap();
        assert_eq!(c.connect().await.unwrap_err().code(), "network_error");
        let bodies = recorder.0.borrow();
        assert_eq!(bodies.len(), 1);
        ConnectRequest::from_json(&Json::parse(&bodies[0]).unwrap())
            .unwrap()
            .client_version
    }

    #[cfg_attr(not(target_arch = "wasm32"), tokio::test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    async fn connect_sends_the_crate_version_unless_the_application_sets_one() {
        assert_eq!(
            sent_version(ClientConfig::new()).await.as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            sent_version(ClientConfig::new().with_client_version("3.1.4-rc.1+sha.5")).await,
            Some("3.1.4-rc.1+sha.5".to_owned())
        );
    }
}
