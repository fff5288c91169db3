//! The `SynchroClient` class: opening a database by name with its options, and the calls of
//! an engine that is not live (`startLive` hands it to a `LiveSession`, `live.rs`).

use js_sys::{Array, Function, Object, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use super::convert::{client_error, js_error, js_to_json, set, storage_error, strings};
use super::fetch::FetchTransport;
use super::opfs::{install_opfs_in, open_opfs_from_seed, DEFAULT_OPFS_DIRECTORY};
use super::ops::{clear_resolved, mutations, query, read_tables, schema, write};
use crate::engine::{Client, ClientConfig, SeedOutcome};
use crate::store::Storage;
use synchro_protocol::manifest::Manifest;

/// `options.opfsDirectory` of `SynchroClient.open` (default `.synchro`): the OPFS pool
/// directory, one per worker that runs at once (see [`install_opfs_in`]).
fn opfs_directory(options: &Option<Object>) -> Result<String, JsValue> {
    let v = options
        .as_ref()
        .map(|o| Reflect::get(o, &"opfsDirectory".into()).unwrap_or(JsValue::UNDEFINED))
        .unwrap_or(JsValue::UNDEFINED);
    if v.is_undefined() || v.is_null() {
        return Ok(DEFAULT_OPFS_DIRECTORY.to_owned());
    }
    match v.as_string() {
        Some(d) if !d.is_empty() && !d.contains('/') => Ok(d),
        _ => Err(js_error(
            "invalid_request",
            "opfsDirectory must be a non-empty name without '/'",
            false,
        )),
    }
}

/// `options.seed` of `SynchroClient.open`: the absolute URL of a portable seed, if any.
fn seed_url(options: &Option<Object>) -> Result<Option<String>, JsValue> {
    let v = options
        .as_ref()
        .map(|o| Reflect::get(o, &"seed".into()).unwrap_or(JsValue::UNDEFINED))
        .unwrap_or(JsValue::UNDEFINED);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    match v.as_string() {
        Some(u) if u.contains("://") => Ok(Some(u)),
        _ => Err(js_error(
            "invalid_request",
            "seed must be the absolute URL of a portable seed",
            false,
        )),
    }
}

/// `options.schema` of `SynchroClient.open`: a manifest bundled with the app (`synchro-server
/// codegen manifest`), installed into a new database so a first visit offline can write.
fn bundled_schema(options: &Option<Object>) -> Result<Option<Manifest>, JsValue> {
    let v = options
        .as_ref()
        .map(|o| Reflect::get(o, &"schema".into()).unwrap_or(JsValue::UNDEFINED))
        .unwrap_or(JsValue::UNDEFINED);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    let refused = || {
        js_error(
            "invalid_schema",
            "schema is not a manifest that verifies (write it with synchro-server codegen manifest)",
            false,
        )
    };
    let json = js_to_json(&v).map_err(|_| refused())?;
    Manifest::from_json(&json).map(Some).map_err(|_| refused())
}

/// What opening with a seed did, as `seedOutcome()` gives it: `{status: "installed",
/// scopes: [{scope, rows}]}`, `{status: "skipped"}` or `{status: "refused", code, message}`.
fn seed_outcome(outcome: &SeedOutcome) -> JsValue {
    let o = Object::new();
    match outcome {
        SeedOutcome::Installed(summary) => {
            set(&o, "status", "installed".into());
            let scopes: Array = summary
                .scopes
                .iter()
                .map(|(scope, rows, _)| {
                    let s = Object::new();
                    set(&s, "scope", scope.as_str().into());
                    set(&s, "rows", (*rows as f64).into());
                    JsValue::from(s)
                })
                .collect();
            set(&o, "scopes", scopes.into());
        }
        SeedOutcome::Skipped => set(&o, "status", "skipped".into()),
        SeedOutcome::Refused(e) => {
            set(&o, "status", "refused".into());
            set(&o, "code", e.code().into());
            set(&o, "message", e.to_string().into());
        }
    }
    o.into()
}

/// The `options` of `SynchroClient.open`: `{ clientVersion?: string, conflicts?: "keep" |
/// "rebase_disjoint" }`, checked before anything is opened.
fn client_config(options: Option<Object>) -> Result<ClientConfig, JsValue> {
    let mut config = ClientConfig::new();
    if let Some(options) = options {
        let v = Reflect::get(&options, &"clientVersion".into()).unwrap_or(JsValue::UNDEFINED);
        if !v.is_undefined() && !v.is_null() {
            let v = v.as_string().ok_or_else(|| {
                js_error(
                    "invalid_client_version",
                    "clientVersion must be a string",
                    false,
                )
            })?;
            config = config.with_client_version(v);
        }
        // `conflicts`: "keep" (the default: the server's row stands) or "rebase_disjoint".
        let v = Reflect::get(&options, &"conflicts".into()).unwrap_or(JsValue::UNDEFINED);
        match v.as_string().as_deref() {
            _ if v.is_undefined() || v.is_null() => {}
            Some("keep") => {}
            Some("rebase_disjoint") => config = config.with_conflict_rebase(true),
            _ => {
                return Err(js_error(
                    "invalid_request",
                    "conflicts must be \"keep\" or \"rebase_disjoint\"",
                    false,
                ))
            }
        }
    }
    config.validate().map_err(client_error)?;
    Ok(config)
}

fn random16() -> [u8; 16] {
    let mut out = [0u8; 16];
    let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    if let Ok(crypto) = global.crypto() {
        let _ = crypto.get_random_values_with_u8_array(&mut out);
    }
    out
}

/// A synchro database in the browser.
#[wasm_bindgen]
pub struct SynchroClient {
    pub(super) inner: Client<FetchTransport>,
    /// What opening with a seed did (`null` without one).
    pub(super) seed: JsValue,
}

#[wasm_bindgen]
impl SynchroClient {
    /// Opens the database `name` on OPFS, evolves the application's local-only tables with
    /// `localMigrations` (SQL per version, 1..N), reads the durable migration journal, and
    /// returns a client for the server at `url` whose bearer tokens come from `tokenProvider`.
    /// `options.seed` (an absolute URL) creates a new database from that portable seed
    /// (verified before it is used; see `seedOutcome()`). `options.schema` (a manifest,
    /// `synchro-server codegen manifest`) is installed into a new database, so writes work
    /// before the first connect. `options.clientVersion` is the
    /// runtime version presented on connect (SemVer 2.0.0;
    /// the default is this package's version); a malformed one throws
    /// `invalid_client_version` before the database is opened. `options.opfsDirectory`
    /// (default `.synchro`) is the OPFS pool directory: workers that run at once need
    /// their own.
    pub async fn open(
        name: String,
        url: String,
        #[wasm_bindgen(js_name = tokenProvider)] token_provider: Function,
        #[wasm_bindgen(js_name = localMigrations)] local_migrations: Option<Vec<String>>,
        options: Option<Object>,
    ) -> Result<SynchroClient, JsValue> {
        let directory = opfs_directory(&options)?;
        let seed = seed_url(&options)?;
        let bundled = bundled_schema(&options)?;
        let config = client_config(options)?;
        install_opfs_in(&directory).await.map_err(storage_error)?;
        let transport = FetchTransport::new(&url, token_provider);
        let (mut storage, seed) = match seed {
            None => (Storage::open(&name).map_err(storage_error)?, JsValue::NULL),
            Some(seed) => {
                let (storage, outcome) = open_opfs_from_seed(&name, &transport, &seed)
                    .await
                    .map_err(storage_error)?;
                (storage, seed_outcome(&outcome))
            }
        };
        if let Some(manifest) = bundled {
            // A new database starts with the bundled schema (one from a seed or an earlier
            // visit is kept; connect moves it to the server's current one as usual).
            if storage.active_schema().map_err(storage_error)?.is_none() {
                storage.install(&manifest).map_err(storage_error)?;
            }
        }
        let ladder = local_migrations.unwrap_or_default();
        let ladder: Vec<&str> = ladder.iter().map(String::as_str).collect();
        storage.migrate_local(&ladder).map_err(storage_error)?;
        let inner =
            Client::open_with(storage, transport, random16, config).map_err(client_error)?;
        Ok(SynchroClient { inner, seed })
    }

    /// What opening with `options.seed` did: `{status: "installed", scopes: [{scope,
    /// rows}]}` (the database was created from the seed, which verified), `{status:
    /// "skipped"}` (the database existed) or `{status: "refused", code: "seed_invalid",
    /// message}` (nothing of it was used; the scopes rebuild as usual); `null` without a
    /// seed.
    #[wasm_bindgen(js_name = seedOutcome)]
    pub fn seed_outcome(&self) -> JsValue {
        self.seed.clone()
    }

    /// The runtime version presented as `client_version` on connect.
    #[wasm_bindgen(js_name = clientVersion)]
    pub fn client_version(&self) -> String {
        self.inner.client_version().to_owned()
    }

    /// The engine state (`fresh`, `idle`, `upgrade_required`, ...).
    pub fn state(&self) -> String {
        self.inner.state().as_str().to_owned()
    }

    /// One verified round: connect, migrate, rebuild, pull. Resolves to
    /// `{action, affected, rebuilt, pullPages, pulledChanges, verified}`.
    pub async fn sync(&mut self) -> Result<JsValue, JsValue> {
        let r = self.inner.sync_once().await.map_err(client_error)?;
        let o = Object::new();
        set(&o, "action", r.action.as_str().into());
        set(&o, "affected", strings(r.affected).into());
        set(&o, "rebuilt", strings(r.rebuilt).into());
        set(&o, "pullPages", (r.pull_pages as f64).into());
        set(&o, "pulledChanges", (r.pulled_changes as f64).into());
        set(&o, "verified", strings(r.verified).into());
        Ok(o.into())
    }

    /// Runs a read-only query; rows come back as objects keyed by column name (INTEGER as a
    /// number when it is a safe integer, otherwise a BigInt; BLOB as Uint8Array). Writes to
    /// synced tables go through the engine, never through this.
    pub fn query(&self, sql: String, params: Option<Array>) -> Result<Array, JsValue> {
        query(&self.inner, &sql, params)
    }

    /// The tables a read-only statement reads (from its compiled program: every b-tree it
    /// opens, an index counted as its table), or `null` when that cannot be known (a virtual
    /// table). A live query re-runs only when one of them changed.
    #[wasm_bindgen(js_name = readTables)]
    pub fn read_tables(&self, sql: String) -> Result<JsValue, JsValue> {
        read_tables(&self.inner, &sql)
    }

    /// `{state, version, action}`: the engine state, the installed schema version (0 before
    /// one is installed) and the schema action of this engine's last connect (`none`,
    /// `replace`, `rebuild_local`, ...; `null` before it connected).
    pub fn schema(&self) -> JsValue {
        schema(&self.inner)
    }

    /// Writes to the synced table `table` and queues the intent in one transaction.
    /// `operation` is `insert`, `update` or `delete`; `pk` and the values of `columns` (an
    /// object keyed by field name, in the order the fields should be recorded; a `null` is
    /// a present null) are wire values (int64 and decimal as strings). Resolves to the
    /// mutation ID. With `mutationId` (a canonical lowercase UUID) the write is queued at
    /// most once under that ID: when the queue holds it already, nothing is written.
    pub fn write(
        &mut self,
        table: String,
        operation: String,
        pk: JsValue,
        columns: JsValue,
        #[wasm_bindgen(js_name = mutationId)] mutation_id: Option<String>,
    ) -> Result<String, JsValue> {
        write(
            &mut self.inner,
            &table,
            &operation,
            &pk,
            &columns,
            mutation_id.as_deref(),
        )
    }

    /// Every queued mutation in local order with its state (`pending`, `applied`,
    /// `conflict`, `rejected_terminal`), for inspection.
    pub fn mutations(&self) -> Result<Array, JsValue> {
        mutations(&self.inner)
    }

    /// Clears every resolved mutation (with its outcome) from the queue; returns them (as
    /// `mutations()` gave them just before). Pending ones stay.
    #[wasm_bindgen(js_name = clearResolved)]
    pub fn clear_resolved(&mut self) -> Result<Array, JsValue> {
        clear_resolved(&mut self.inner)
    }

    /// After an application upgrade, while `state()` is `upgrade_required`: the next
    /// `sync()` connects with `schema_reset`, installs the current schema and rebuilds,
    /// keeping local-only tables and every queued mutation.
    #[wasm_bindgen(js_name = requestSchemaReset)]
    pub fn request_schema_reset(&mut self) -> Result<(), JsValue> {
        self.inner.request_schema_reset().map_err(client_error)
    }

    /// Calls `callback(tables)` with the names of the synced tables each committed page
    /// changed.
    pub fn subscribe(&mut self, callback: Function) {
        self.inner.subscribe(move |tables| {
            let _ = callback.call1(&JsValue::NULL, &strings(tables.iter().cloned()));
        });
    }

    /// Calls `callback({phase, scope, pages, rows})` after every page of a pull or rebuild.
    #[wasm_bindgen(js_name = onProgress)]
    pub fn on_progress(&mut self, callback: Function) {
        self.inner.on_progress(move |p| {
            let o = Object::new();
            set(&o, "phase", p.phase.into());
            set(
                &o,
                "scope",
                p.scope.clone().map_or(JsValue::NULL, JsValue::from),
            );
            set(&o, "pages", (p.pages as f64).into());
            set(&o, "rows", (p.rows as f64).into());
            if let Some(total) = p.total_rows {
                set(&o, "totalRows", (total as f64).into());
            }
            let _ = callback.call1(&JsValue::NULL, &o);
        });
    }
}
