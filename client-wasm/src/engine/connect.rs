//! Step: connect (spec 003 `POST /sync/connect`). Presents the identity, generation, schema
//! and installed cursors; records the generation the server returns; for an unchanged schema
//! records the scope updates, and for a migration verifies the announced target manifest and
//! hands it on. A 426 or the `unsupported` action enters `upgrade_required`, durably.

use std::collections::BTreeSet;

use synchro_protocol::manifest::Manifest;
use synchro_protocol::wire::{ConnectRequest, ConnectResponse, Message};

use super::{Client, ClientError, Connected, Migration, SchemaAction, Transport};
use crate::store::Phase;

impl<T: Transport> Client<T> {
    /// The connect exchange: returns the server's action, the affected scopes it names and
    /// what to do next.
    pub(super) async fn exchange(
        &mut self,
    ) -> Result<(SchemaAction, BTreeSet<String>, Connected), ClientError> {
        if let Some(j) = self.storage.journal()? {
            if j.phase != Phase::Committed {
                return Err(ClientError::Blocked(
                    "a pending migration must finish before connecting",
                ));
            }
        }
        let reset = self.storage.reset_requested()?;
        let request = ConnectRequest {
            client_id: self.client_id.clone(),
            client_generation: self.storage.generation()?,
            schema: self.schema_json(),
            schema_reset: reset,
            client_version: None,
            scope_cursors: self
                .scopes()?
                .into_iter()
                .filter_map(|(s, (c, _))| c.map(|c| (s, Some(c))))
                .collect(),
        };
        let r = self.post("/sync/connect", &request).await?;
        if r.status == 426 {
            self.storage.set_upgrade_required()?;
            return Err(ClientError::UpgradeRequired(
                "the server requires an upgrade",
            ));
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
        self.storage.record_connect(generation, scope_set_version)?;
        let action = SchemaAction::parse(&b.schema.action)
            .ok_or(ClientError::Malformed("an unknown schema action"))?;
        let connected = match action {
            SchemaAction::None => {
                let manifest = self
                    .manifest
                    .clone()
                    .ok_or(ClientError::Malformed("action none without a schema"))?;
                // Scope updates for an unchanged schema.
                let gone: Vec<String> = removed.iter().cloned().collect();
                self.storage.release_scopes(&manifest, &gone)?;
                self.storage.add_scopes(&added)?;
                Connected::Unchanged
            }
            SchemaAction::Replace | SchemaAction::RebuildLocal => {
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
                if action == SchemaAction::RebuildLocal && affected.is_empty() {
                    return Err(ClientError::Malformed(
                        "rebuild_local without affected_scopes",
                    ));
                }
                Connected::Migrate(Box::new(Migration {
                    target,
                    affected: affected.clone(),
                    added,
                    removed,
                    cursor_updates: b.scope_cursor_updates.clone(),
                    reset,
                }))
            }
            SchemaAction::Unsupported => {
                self.storage.set_upgrade_required()?;
                return Err(ClientError::UpgradeRequired(
                    "the schema history crossed an incompatible change",
                ));
            }
        };
        Ok((action, affected, connected))
    }
}
