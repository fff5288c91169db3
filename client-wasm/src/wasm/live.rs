//! The browser's live session: `SynchroClient.startLive(options, onStatus)` hands the
//! database to a [`LiveSession`] running [`Client::run_live`] over streaming `fetch`
//! (`POST /sync/events` read through a `ReadableStream` reader). While it runs, the session
//! owns the database: `query`, `write` and `mutations` go through it (each runs between two
//! requests and resolves to the same result as on `SynchroClient`). `done` resolves when the
//! session ends, to `{end, reason?, error?, client}`, `client` being the `SynchroClient`
//! again.
//!
//! Status objects passed to `onStatus`: `{status}` with `status` one of `connecting`,
//! `syncing`, `live`, `offline` (then also `error: {code, status, retryable}`,
//! `retryInMs`, `failures`) and `stopped`. Options: `safetyPollMs`, `backoffMinMs`,
//! `backoffMaxMs`, `streamIdleMs` (all optional numbers).

use js_sys::{Array, Function, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::client::SynchroClient;
use super::convert::{client_error, js_error, set};
use super::fetch::FetchTransport;
use super::ops::{clear_resolved, mutations, query, read_tables, schema, write};
use crate::engine::{LiveConfig, LiveEnd, LiveHandle, LiveStatus};

/// A running live session (see the module documentation).
#[wasm_bindgen]
pub struct LiveSession {
    handle: LiveHandle<FetchTransport>,
    done: Promise,
}

fn number(options: &Option<Object>, name: &str) -> Result<Option<u64>, JsValue> {
    let Some(o) = options else { return Ok(None) };
    let v = Reflect::get(o, &name.into()).unwrap_or(JsValue::UNDEFINED);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    match v.as_f64() {
        Some(f) if f.is_finite() && f >= 0.0 => Ok(Some(f as u64)),
        _ => Err(js_error(
            "invalid_request",
            "a live option must be a nonnegative number",
            false,
        )),
    }
}

fn live_config(options: &Option<Object>) -> Result<LiveConfig, JsValue> {
    let mut c = LiveConfig::new();
    if let Some(ms) = number(options, "safetyPollMs")? {
        c = c.with_safety_poll_ms(ms);
    }
    let (min, max) = (
        number(options, "backoffMinMs")?,
        number(options, "backoffMaxMs")?,
    );
    if min.is_some() || max.is_some() {
        let (min, max) = (
            min.unwrap_or(c.backoff_min_ms()),
            max.unwrap_or(c.backoff_max_ms()),
        );
        c = c.with_backoff_ms(min, max);
    }
    if let Some(ms) = number(options, "streamIdleMs")? {
        c = c.with_stream_idle_ms(ms);
    }
    Ok(c)
}

fn status_object(s: &LiveStatus) -> Object {
    let o = Object::new();
    let name = match s {
        LiveStatus::Connecting => "connecting",
        LiveStatus::Syncing => "syncing",
        LiveStatus::Live => "live",
        LiveStatus::Offline { .. } => "offline",
        _ => "stopped",
    };
    set(&o, "status", name.into());
    if let LiveStatus::Offline {
        error,
        retry_in_ms,
        failures,
    } = s
    {
        let e = Object::new();
        set(&e, "code", error.code.clone().into());
        set(
            &e,
            "status",
            error.status.map_or(JsValue::NULL, |s| f64::from(s).into()),
        );
        set(&e, "retryable", error.retryable.into());
        set(&o, "error", e.into());
        set(&o, "retryInMs", (*retry_in_ms as f64).into());
        set(&o, "failures", f64::from(*failures).into());
    }
    o
}

#[wasm_bindgen]
impl SynchroClient {
    /// Starts a live session over this database (which it takes over until the session
    /// ends; `done` gives it back). `onStatus(status)` hears every status change.
    #[wasm_bindgen(js_name = startLive)]
    pub fn start_live(
        self,
        options: Option<Object>,
        #[wasm_bindgen(js_name = onStatus)] on_status: Option<Function>,
    ) -> Result<LiveSession, JsValue> {
        let config = live_config(&options)?;
        let handle = LiveHandle::new();
        let session = handle.clone();
        let mut client = self.inner;
        let done = future_to_promise(async move {
            let ended = client
                .run_live(&session, &config, |s| {
                    if let Some(f) = &on_status {
                        let _ = f.call1(&JsValue::NULL, &status_object(s));
                    }
                })
                .await;
            let o = Object::new();
            match ended {
                Ok(LiveEnd::UpgradeRequired(reason)) => {
                    set(&o, "end", "upgrade_required".into());
                    set(&o, "reason", reason.as_str().into());
                }
                Ok(_) => set(&o, "end", "stopped".into()),
                Err(e) => {
                    set(&o, "end", "error".into());
                    set(&o, "error", client_error(e));
                }
            }
            set(
                &o,
                "client",
                SynchroClient {
                    inner: client,
                    seed: JsValue::NULL,
                }
                .into(),
            );
            Ok(o.into())
        });
        Ok(LiveSession { handle, done })
    }
}

#[wasm_bindgen]
impl LiveSession {
    /// Resolves when the session has ended: `{end, reason?, error?, client}`.
    #[wasm_bindgen(getter)]
    pub fn done(&self) -> Promise {
        self.done.clone()
    }

    /// Ends the session at its next step (queued writes still complete).
    pub fn stop(&self) {
        self.handle.stop();
    }

    /// Asks for a round now.
    #[wasm_bindgen(js_name = syncNow)]
    pub fn sync_now(&self) {
        self.handle.sync_now();
    }

    /// `SynchroClient.query`, run as soon as the session waits (for a request or between
    /// rounds: no round holds it up).
    pub fn query(&self, sql: String, params: Option<Array>) -> Promise {
        let job = self
            .handle
            .with_client(move |c| query(c, &sql, params).map(JsValue::from));
        future_to_promise(async move { job.await.map_err(not_running)? })
    }

    /// `SynchroClient.write`, run as soon as the session waits; the write is durable when this
    /// resolves (to the mutation ID), and pushed right after.
    pub fn write(
        &self,
        table: String,
        operation: String,
        pk: JsValue,
        columns: JsValue,
        #[wasm_bindgen(js_name = mutationId)] mutation_id: Option<String>,
    ) -> Promise {
        let job = self.handle.with_client(move |c| {
            write(c, &table, &operation, &pk, &columns, mutation_id.as_deref()).map(JsValue::from)
        });
        future_to_promise(async move { job.await.map_err(not_running)? })
    }

    /// `SynchroClient.readTables`, run as soon as the session waits.
    #[wasm_bindgen(js_name = readTables)]
    pub fn read_tables(&self, sql: String) -> Promise {
        let job = self.handle.with_client(move |c| read_tables(c, &sql));
        future_to_promise(async move { job.await.map_err(not_running)? })
    }

    /// `SynchroClient.schema`, run as soon as the session waits.
    pub fn schema(&self) -> Promise {
        let job = self.handle.with_client(|c| Ok(schema(c)));
        future_to_promise(async move { job.await.map_err(not_running)? })
    }

    /// `SynchroClient.clearResolved`, run as soon as the session waits (a batch in flight
    /// is pending: it stays).
    #[wasm_bindgen(js_name = clearResolved)]
    pub fn clear_resolved(&self) -> Promise {
        let job = self
            .handle
            .with_client(|c| clear_resolved(c).map(JsValue::from));
        future_to_promise(async move { job.await.map_err(not_running)? })
    }

    /// `SynchroClient.mutations`, run as soon as the session waits.
    pub fn mutations(&self) -> Promise {
        let job = self.handle.with_client(|c| mutations(c).map(JsValue::from));
        future_to_promise(async move { job.await.map_err(not_running)? })
    }
}

fn not_running(_: crate::engine::NotRunning) -> JsValue {
    js_error("not_running", "the live session has ended", false)
}
