//! Step 7: push (spec 000 "Authored-Schema Queued Mutations", spec 003 `POST /sync/push`).
//! Seals the open batch under the active schema and sends every sealed batch, oldest first,
//! until each has its outcomes stored durably; a `schema_mismatch` moves the batch's
//! unresolved mutations, unchanged, into a successor.

use std::collections::BTreeSet;

use synchro_protocol::json::Json;
use synchro_protocol::manifest::SchemaRef;
use synchro_protocol::state::ClientState;
use synchro_protocol::wire::{Message, PushRequest};

use super::{Client, ClientError, Failpoint, Transport};
use crate::store::hex;

impl<T: Transport> Client<T> {
    /// Seals the open batch under the active schema and sends every sealed batch in order
    /// until each has its outcomes, stored durably. A 422 `schema_mismatch` moves the
    /// batch's unresolved mutations, unchanged, into a successor to be sealed after
    /// reconnecting; the error makes the round reconnect.
    pub(super) async fn push_pending(&mut self) -> Result<(), ClientError> {
        let Some(manifest) = self.manifest.clone() else {
            return Ok(());
        };
        let generation = self.connected_generation()?;
        // What was queued when the push began is pushed to the end; a write made while it
        // runs may ride along, but never keeps it going (a steady stream of writes would
        // hold the round in push for ever): the live session pushes those in its next round.
        let mark = self.storage.last_local_order()?;
        loop {
            // A batch is sealed only when none waits: sealed batches then go out in local
            // order, and one resealed after a schema change never overtakes a later one.
            let mut batches = self.storage.sealed_batches()?;
            if batches.is_empty() {
                let rest = self.new_id();
                self.storage.seal(&manifest.schema_ref().into(), &rest)?;
                batches = self.storage.sealed_batches()?;
            }
            if batches.is_empty() {
                return Ok(());
            }
            let mut resealed = false;
            for (i, (batch_id, request)) in batches.iter().enumerate() {
                let (batch_id, request) = (batch_id.clone(), request);
                // The sealed batch (its schema and mutations, kept as sealed) read back
                // through the wire type, so only a well-formed request is ever sent.
                let body = Json::Object(vec![
                    ("protocol_version".into(), Json::Number("3".into())),
                    ("client_id".into(), Json::String(self.client_id.clone())),
                    (
                        "client_generation".into(),
                        Json::Number(generation.to_string()),
                    ),
                    (
                        "schema".into(),
                        request.get("schema").cloned().unwrap_or(Json::Null),
                    ),
                    ("batch_id".into(), Json::String(batch_id.clone())),
                    (
                        "mutations".into(),
                        request.get("mutations").cloned().unwrap_or(Json::Null),
                    ),
                ]);
                let request_body = PushRequest::from_json(&body)
                    .map_err(|_| ClientError::Blocked("a sealed batch is not a valid request"))?;
                let r = self.post("/sync/push", &request_body).await?;
                if r.status == 200 {
                    self.fail(Failpoint::BeforeOutcomes)?;
                    let (clock, random) = (&mut self.clock, &mut self.random);
                    let mut new_id = || super::uuid_v7(clock(), random());
                    let rebase = self
                        .rebase_conflicts
                        .then_some(&mut new_id as &mut dyn FnMut() -> String);
                    self.storage
                        .record_outcomes(&manifest, &batch_id, &r.body, rebase)?;
                    // A conflict or a rejection put the server's row back: the tables the
                    // batch wrote changed for the application's queries.
                    let tables = match request.get("mutations") {
                        Some(Json::Array(ms)) => ms
                            .iter()
                            .filter_map(|m| match m.get("table_id") {
                                Some(Json::String(id)) => manifest.table(id),
                                _ => None,
                            })
                            .map(|t| t.name.clone())
                            .collect(),
                        _ => BTreeSet::new(),
                    };
                    self.notify(tables);
                    continue;
                }
                let e = ClientError::from_response(&r);
                if e.is_server("schema_mismatch") {
                    let successor = self.new_id();
                    self.storage.supersede(&batch_id, &successor)?;
                    if !sealed_under(request, &manifest.schema_ref()) {
                        // Sealed under an earlier schema: reseal under this one and go on.
                        // Every later sealed batch goes with it, in local order: left
                        // sealed, it would be sent before the resealed one, and a row's later
                        // intent would reach the server before its earlier one. (Only a queue
                        // sealed by an older engine holds several; a mutation the server has
                        // executed gets its stored outcome again under its new batch.)
                        for (later, _) in &batches[i + 1..] {
                            let successor = self.new_id();
                            self.storage.supersede(later, &successor)?;
                        }
                        resealed = true;
                        break;
                    }
                }
                // Refused under the client's own schema: the server serves a newer one;
                // the error makes the round connect.
                return Err(e);
            }
            if !resealed && !self.storage.unsealed_through(mark)? {
                return Ok(());
            }
        }
    }

    /// Pushes queued intent now, without a full round (the engine must be idle after a
    /// connect). Returns the number of mutations that got an outcome.
    pub async fn push(&mut self) -> Result<usize, ClientError> {
        let before = self.storage.pending_count()?;
        self.go(ClientState::Pushing)?;
        let result = self.push_pending().await;
        self.reset_to_idle();
        result?;
        let after = self.storage.pending_count()?;
        Ok(before.saturating_sub(after))
    }
}

/// Whether a sealed batch's request names `schema`. Its members are compared, not the
/// object: the stored request is canonical JSON, whose members are in another order than a
/// freshly built reference's (comparing the objects, every batch looked sealed under an
/// earlier schema, so a 422 under the current one resealed and resent it forever).
fn sealed_under(request: &Json, schema: &SchemaRef) -> bool {
    let sealed = request.get("schema");
    let member = |name| sealed.and_then(|s| s.get(name));
    member("version") == Some(&Json::Number(schema.version.to_string()))
        && member("hash").and_then(Json::as_str) == Some(hex(&schema.hash).as_str())
}
