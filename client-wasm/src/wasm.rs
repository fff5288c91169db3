//! The browser build: SQLite on the OPFS sync-access-handle pool VFS (in a dedicated
//! worker), a `fetch` transport, and the JavaScript API.
//!
//! ```js
//! const db = await SynchroClient.open("app.db", "https://sync.example.com", async () => token, [],
//!   { clientVersion: "2.4.0" });             // optional; the default is the crate's version
//! db.subscribe((tables) => render(tables));
//! db.onProgress((p) => console.log(p.phase, p.rows));
//! const report = await db.sync();           // connect, migrate, rebuild, pull — all verified
//! const rows = db.query("SELECT * FROM docs WHERE id = ?", [1n]);
//!
//! // Or stay connected: pull when the server's events stream (streaming fetch) names a
//! // changed scope, push when a write is queued. While live, the session owns the database.
//! const live = db.startLive({ safetyPollMs: 30000 }, (s) => show(s.status, s.error?.code));
//! await live.write("docs", "update", "1", { title: "hi" });   // durable, then pushed
//! const same = await live.query("SELECT * FROM docs", []);
//! live.stop();
//! const { end, client } = await live.done;   // end: "stopped" | "upgrade_required" | "error"
//! ```
//!
//! Every failure is thrown as an `Error` with a stable `code` (`network_error`,
//! `sync_integrity_failure`, `upgrade_required`, `local_state_inconsistent`, a server error
//! code such as `unauthorized`, ...) and `retryable`; an `upgrade_required` error also has a
//! `reason` (`client_runtime`: the server's minimum client version is above this client's;
//! `schema_history`: the schema crossed an incompatible change). A `clientVersion` that is
//! not SemVer 2.0.0 is refused by `open` with `invalid_client_version`. Messages never carry
//! values, keys, tokens or identifiers.

use js_sys::{Array, Function, Object, Promise, Reflect, Uint8Array};
use rusqlite::types::ValueRef;
use sqlite_wasm_vfs::sahpool::{install, OpfsSAHPoolCfgBuilder, OpfsSAHPoolUtil};
use synchro_protocol::jcs::to_output_string;
use synchro_protocol::json::Json;
use synchro_protocol::wire::Column;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

mod live;
pub use live::LiveSession;

use crate::engine::{Client, ClientConfig};
use crate::error::{ClientError, StorageError};
use crate::store::{LocalWrite, Operation, Storage};
use crate::transport::{EventStream, EventTransport, Opened, Response, Transport, TransportError};
use synchro_protocol::value::TypedValue;

thread_local! {
    /// The installed pool and its directory.
    static OPFS: std::cell::RefCell<Option<(OpfsSAHPoolUtil, String)>> = const { std::cell::RefCell::new(None) };
}

/// The pool directory of [`install_opfs`].
const DEFAULT_OPFS_DIRECTORY: &str = ".synchro";

/// Installs the OPFS pool VFS (in `.synchro`) as SQLite's default (once per worker). Must
/// run in a dedicated worker of a secure context.
pub async fn install_opfs() -> Result<(), StorageError> {
    install_opfs_in(DEFAULT_OPFS_DIRECTORY).await
}

/// [`install_opfs`] with the pool in `directory`. One worker holds a pool directory at a
/// time (its files' sync access handles are exclusive), so workers that run at once (two
/// databases of one origin, each in its own worker) need their own directories. A worker
/// installs one pool: asking for another directory afterwards is an error.
pub async fn install_opfs_in(directory: &str) -> Result<(), StorageError> {
    match OPFS.with(|o| o.borrow().as_ref().map(|(_, d)| d == directory)) {
        Some(true) => return Ok(()),
        Some(false) => {
            return Err(StorageError::Schema(
                "this worker already holds another OPFS storage directory".into(),
            ))
        }
        None => {}
    }
    let cfg = OpfsSAHPoolCfgBuilder::new().directory(directory).build();
    let util = install::<sqlite_wasm_rs::WasmOsCallback>(&cfg, true)
        .await
        .map_err(|_| opfs_unavailable())?;
    OPFS.with(|o| *o.borrow_mut() = Some((util, directory.to_owned())));
    Ok(())
}

fn opfs_unavailable() -> StorageError {
    StorageError::Schema("the OPFS storage could not be opened".into())
}

/// Makes room for at least `files` OPFS files (each database takes two: itself and its
/// rollback journal). The pool starts with six.
pub async fn ensure_opfs_capacity(files: usize) -> Result<(), StorageError> {
    install_opfs().await?;
    let util = OPFS
        .with(|o| o.borrow().as_ref().map(|(u, _)| u.clone()))
        .ok_or_else(opfs_unavailable)?;
    util.ensure_capacity(files)
        .await
        .map_err(|_| opfs_unavailable())
}

/// Opens (or creates) the database `name` on OPFS.
pub async fn open_opfs(name: &str) -> Result<Storage, StorageError> {
    install_opfs().await?;
    Storage::open(name)
}

/// `fetch` from the worker, with a bearer token from a JS provider (a function returning a
/// string or a promise of one) asked on every request.
pub struct FetchTransport {
    base: String,
    token: Function,
}

async fn js_await(v: JsValue) -> Result<JsValue, JsValue> {
    if v.is_instance_of::<Promise>() {
        JsFuture::from(v.unchecked_into::<Promise>()).await
    } else {
        Ok(v)
    }
}

impl FetchTransport {
    /// A transport to `base` with `token` as the provider.
    pub fn new(base: &str, token: Function) -> FetchTransport {
        FetchTransport {
            base: base.trim_end_matches('/').to_owned(),
            token,
        }
    }

    async fn send(&self, path: &str, body: String) -> Result<(u16, String), JsValue> {
        let response = self.fetch(path, body).await?;
        let text = JsFuture::from(response.text()?).await?;
        Ok((response.status(), text.as_string().unwrap_or_default()))
    }

    async fn fetch(&self, path: &str, body: String) -> Result<web_sys::Response, JsValue> {
        let token = js_await(self.token.call0(&JsValue::NULL)?).await?;
        let token = token
            .as_string()
            .ok_or_else(|| JsValue::from_str("the token provider must return a string"))?;
        let init = web_sys::RequestInit::new();
        init.set_method("POST");
        init.set_body(&JsValue::from_str(&body));
        let headers = web_sys::Headers::new()?;
        headers.set("content-type", "application/json")?;
        headers.set("authorization", &format!("Bearer {token}"))?;
        init.set_headers(&headers);
        let request =
            web_sys::Request::new_with_str_and_init(&format!("{}{path}", self.base), &init)?;
        let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
        Ok(JsFuture::from(global.fetch_with_request(&request))
            .await?
            .unchecked_into())
    }
}

/// An open events stream: the `fetch` response body's `ReadableStream` reader. Dropping it
/// cancels the stream (which closes the connection).
pub struct FetchEventStream {
    reader: web_sys::ReadableStreamDefaultReader,
    /// A read not yet answered. The session drops `next_chunk` whenever the application
    /// calls in while it waits; the read's promise still resolves with the next chunk, so it
    /// is kept and awaited again (a new `read()` would skip that chunk: a lost `changed`).
    pending: Option<JsFuture>,
}

impl Drop for FetchEventStream {
    fn drop(&mut self) {
        let _ = self.reader.cancel();
    }
}

impl EventStream for FetchEventStream {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, TransportError> {
        let failed = |_| TransportError("the events stream failed".into());
        let reader = &self.reader;
        let read = self
            .pending
            .get_or_insert_with(|| JsFuture::from(reader.read()))
            .await;
        self.pending = None;
        let read = read.map_err(failed)?;
        if Reflect::get(&read, &"done".into())
            .map_err(failed)?
            .is_truthy()
        {
            return Ok(None);
        }
        let value = Reflect::get(&read, &"value".into()).map_err(failed)?;
        Ok(Some(
            value.dyn_into::<Uint8Array>().map_err(failed)?.to_vec(),
        ))
    }
}

impl EventTransport for FetchTransport {
    type Stream = FetchEventStream;

    async fn open_events(&self, body: String) -> Result<Opened<FetchEventStream>, TransportError> {
        let response = self
            .fetch("/sync/events", body)
            .await
            .map_err(|_| TransportError("fetch failed".into()))?;
        let status = response.status();
        if status != 200 {
            let text = JsFuture::from(
                response
                    .text()
                    .map_err(|_| TransportError("fetch failed".into()))?,
            )
            .await
            .map_err(|_| TransportError("fetch failed".into()))?;
            let body = Json::parse(&text.as_string().unwrap_or_default()).map_err(|_| {
                TransportError(format!("HTTP {status} with a body that is not JSON"))
            })?;
            return Ok(Opened::Refused(Response { status, body }));
        }
        let stream = response
            .body()
            .ok_or_else(|| TransportError("the events response has no body".into()))?;
        Ok(Opened::Stream(FetchEventStream {
            reader: stream.get_reader().unchecked_into(),
            pending: None,
        }))
    }

    async fn sleep(&self, ms: u64) {
        let ms = ms.min(i32::MAX as u64) as i32;
        let promise = Promise::new(&mut |resolve, _| {
            let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
            let _ = global.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        });
        let _ = JsFuture::from(promise).await;
    }
}

impl Transport for FetchTransport {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let (status, text) = self
            .send(path, body)
            .await
            .map_err(|_| TransportError("fetch failed".into()))?;
        let body = Json::parse(&text)
            .map_err(|_| TransportError(format!("HTTP {status} with a body that is not JSON")))?;
        Ok(Response { status, body })
    }
}

fn js_error(code: &str, message: &str, retryable: bool) -> JsValue {
    let e = js_sys::Error::new(message);
    let _ = Reflect::set(&e, &"code".into(), &code.into());
    let _ = Reflect::set(&e, &"retryable".into(), &retryable.into());
    e.into()
}

fn client_error(e: ClientError) -> JsValue {
    let error = js_error(e.code(), &e.to_string(), e.retryable());
    if let Some(reason) = e.upgrade_reason() {
        let _ = Reflect::set(&error, &"reason".into(), &reason.as_str().into());
    }
    error
}

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

/// The `options` of `SynchroClient.open`: `{ clientVersion?: string }`, checked before
/// anything is opened.
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
    }
    config.validate().map_err(client_error)?;
    Ok(config)
}

fn storage_error(e: StorageError) -> JsValue {
    js_error(e.code(), &e.to_string(), false)
}

fn random16() -> [u8; 16] {
    let mut out = [0u8; 16];
    let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    if let Ok(crypto) = global.crypto() {
        let _ = crypto.get_random_values_with_u8_array(&mut out);
    }
    out
}

fn set(o: &Object, k: &str, v: JsValue) {
    let _ = Reflect::set(o, &k.into(), &v);
}

/// A wire value as the JS value `JSON.parse` gives for its text.
fn json_to_js(v: &Json) -> JsValue {
    js_sys::JSON::parse(&to_output_string(v)).unwrap_or(JsValue::NULL)
}

fn strings(items: impl IntoIterator<Item = String>) -> Array {
    items.into_iter().map(JsValue::from).collect()
}

/// A synchro database in the browser.
#[wasm_bindgen]
pub struct SynchroClient {
    inner: Client<FetchTransport>,
}

#[wasm_bindgen]
impl SynchroClient {
    /// Opens the database `name` on OPFS, evolves the application's local-only tables with
    /// `localMigrations` (SQL per version, 1..N), reads the durable migration journal, and
    /// returns a client for the server at `url` whose bearer tokens come from `tokenProvider`.
    /// `options.clientVersion` is the runtime version presented on connect (SemVer 2.0.0;
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
        let config = client_config(options)?;
        install_opfs_in(&directory).await.map_err(storage_error)?;
        let mut storage = Storage::open(&name).map_err(storage_error)?;
        let ladder = local_migrations.unwrap_or_default();
        let ladder: Vec<&str> = ladder.iter().map(String::as_str).collect();
        storage.migrate_local(&ladder).map_err(storage_error)?;
        let inner = Client::open_with(
            storage,
            FetchTransport::new(&url, token_provider),
            random16,
            config,
        )
        .map_err(client_error)?;
        Ok(SynchroClient { inner })
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
            let _ = callback.call1(&JsValue::NULL, &o);
        });
    }
}

/// Runs a read-only query; rows come back as objects keyed by column name (INTEGER as a
/// number when it is a safe integer, otherwise a BigInt; BLOB as Uint8Array). Writes to
/// synced tables go through the engine, never through this.
fn query(
    client: &Client<FetchTransport>,
    sql: &str,
    params: Option<Array>,
) -> Result<Array, JsValue> {
    let conn = client.storage().connection();
    let mut statement = conn
        .prepare(sql)
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?;
    if !statement.readonly() {
        return Err(js_error(
            "invalid_request",
            "query runs read-only statements only",
            false,
        ));
    }
    let mut values = Vec::new();
    for p in params.map(|a| a.to_vec()).unwrap_or_default() {
        values.push(if p.is_null() || p.is_undefined() {
            rusqlite::types::Value::Null
        } else if let Some(b) = p.as_bool() {
            rusqlite::types::Value::Integer(i64::from(b))
        } else if let Some(s) = p.as_string() {
            rusqlite::types::Value::Text(s)
        } else if p.is_bigint() {
            let v = i64::try_from(p.unchecked_into::<js_sys::BigInt>()).map_err(|_| {
                js_error("invalid_value", "a BigInt parameter is out of range", false)
            })?;
            rusqlite::types::Value::Integer(v)
        } else if let Some(f) = p.as_f64() {
            rusqlite::types::Value::Real(f)
        } else if p.is_instance_of::<Uint8Array>() {
            rusqlite::types::Value::Blob(p.unchecked_into::<Uint8Array>().to_vec())
        } else {
            return Err(js_error(
                "invalid_value",
                "an unsupported parameter type",
                false,
            ));
        });
    }
    let names: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let mut rows = statement
        .query(rusqlite::params_from_iter(values))
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?;
    let out = Array::new();
    while let Some(r) = rows
        .next()
        .map_err(|e| storage_error(StorageError::Sqlite(e)))?
    {
        let o = Object::new();
        for (i, name) in names.iter().enumerate() {
            let v = match r
                .get_ref(i)
                .map_err(|e| storage_error(StorageError::Sqlite(e)))?
            {
                ValueRef::Null => JsValue::NULL,
                ValueRef::Integer(i) if i.unsigned_abs() < (1 << 53) => (i as f64).into(),
                ValueRef::Integer(i) => js_sys::BigInt::from(i).into(),
                ValueRef::Real(f) => f.into(),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
                ValueRef::Blob(b) => Uint8Array::from(b).into(),
            };
            set(&o, name, v);
        }
        out.push(&o);
    }
    Ok(out)
}

/// See [`SynchroClient::read_tables`].
fn read_tables(client: &Client<FetchTransport>, sql: &str) -> Result<JsValue, JsValue> {
    let sqlite = |e| storage_error(StorageError::Sqlite(e));
    let conn = client.storage().connection();
    if !conn.prepare(sql).map_err(sqlite)?.readonly() {
        return Err(js_error(
            "invalid_request",
            "query runs read-only statements only",
            false,
        ));
    }
    let mut roots = std::collections::HashMap::new();
    let mut schema = conn
        .prepare("SELECT rootpage, tbl_name FROM main.sqlite_schema WHERE rootpage > 0")
        .map_err(sqlite)?;
    let mut rows = schema.query([]).map_err(sqlite)?;
    while let Some(r) = rows.next().map_err(sqlite)? {
        roots.insert(
            r.get::<_, i64>(0).map_err(sqlite)?,
            r.get::<_, String>(1).map_err(sqlite)?,
        );
    }
    roots.insert(1, "sqlite_schema".to_owned());
    // EXPLAIN's columns: addr, opcode, p1, p2, p3, p4, p5, comment.
    let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).map_err(sqlite)?;
    // The program does not depend on the parameters' values: bind NULL to each.
    for i in 1..=explain.parameter_count() {
        explain
            .raw_bind_parameter(i, rusqlite::types::Null)
            .map_err(sqlite)?;
    }
    let mut ops = explain.raw_query();
    let mut tables = std::collections::BTreeSet::new();
    while let Some(r) = ops.next().map_err(sqlite)? {
        let opcode: String = r.get(1).map_err(sqlite)?;
        match opcode.as_str() {
            "OpenRead" | "ReopenIdx" => {
                let (root, db): (i64, i64) = (r.get(3).map_err(sqlite)?, r.get(4).map_err(sqlite)?);
                match roots.get(&root) {
                    Some(name) if db == 0 => {
                        tables.insert(name.clone());
                    }
                    // Another attached database, or a table the schema does not name.
                    _ => return Ok(JsValue::NULL),
                }
            }
            "VOpen" => return Ok(JsValue::NULL),
            _ => {}
        }
    }
    Ok(strings(tables).into())
}

/// See [`SynchroClient::schema`].
fn schema(client: &Client<FetchTransport>) -> JsValue {
    let o = Object::new();
    set(&o, "state", client.state().as_str().into());
    set(
        &o,
        "version",
        (client.manifest().map_or(0, |m| m.schema_version) as f64).into(),
    );
    set(
        &o,
        "action",
        client
            .last_action()
            .map_or(JsValue::NULL, |a| JsValue::from(a.as_str())),
    );
    o.into()
}

/// Writes to the synced table `table` and queues the intent in one transaction.
/// `operation` is `insert`, `update` or `delete`; `pk` and the values of `columns` (an
/// object keyed by field name, in the order the fields should be recorded; a `null` is
/// a present null) are wire values (int64 and decimal as strings). Resolves to the
/// mutation ID; with `mutation_id`, at most once under it ([`Client::write_once`]).
fn write(
    client: &mut Client<FetchTransport>,
    table: &str,
    operation: &str,
    pk: &JsValue,
    columns: &JsValue,
    mutation_id: Option<&str>,
) -> Result<String, JsValue> {
    let bad = |what: &str| js_error("invalid_value", what, false);
    let manifest = client
        .manifest()
        .cloned()
        .ok_or_else(|| js_error("local_schema_error", "no schema is installed", false))?;
    let t = manifest
        .tables
        .iter()
        .find(|t| t.name == *table)
        .ok_or_else(|| js_error("unknown_table", "no such synced table", false))?;
    let to_json = |v: &JsValue| -> Result<Json, JsValue> {
        let text = js_sys::JSON::stringify(v)
            .map_err(|_| bad("a value is not JSON"))?
            .as_string()
            .ok_or_else(|| bad("a value is not JSON"))?;
        Json::parse(&text).map_err(|_| bad("a value is not JSON"))
    };
    let key = TypedValue::from_wire(&t.primary_key().spec, &to_json(pk)?)
        .map_err(|_| bad("the key does not match its type"))?;
    let mut values = Vec::new();
    if !columns.is_undefined() && !columns.is_null() {
        let Json::Object(members) = to_json(columns)? else {
            return Err(bad("columns must be an object"));
        };
        for (name, value) in members {
            let f = t
                .fields
                .iter()
                .find(|f| f.name == name)
                .ok_or_else(|| bad("no such field"))?;
            let v = TypedValue::from_wire(&f.spec, &value)
                .map_err(|_| bad("a value does not match its field"))?;
            values.push((f.field_id.clone(), v));
        }
    }
    let operation = Operation::parse(operation)
        .ok_or_else(|| bad("operation must be insert, update or delete"))?;
    let table_id = t.table_id.clone();
    let w = LocalWrite {
        table_id: &table_id,
        operation,
        pk: &key,
        columns: &values,
    };
    match mutation_id {
        Some(id) => client.write_once(&w, id),
        None => client.write(&w),
    }
    .map_err(client_error)
}

/// The resolved mutations, read (as `mutations` gives them) and cleared at one step, so a
/// caller that reports state changes learns the last state of each one it clears.
fn clear_resolved(client: &mut Client<FetchTransport>) -> Result<Array, JsValue> {
    let resolved: Array = mutations(client)?
        .iter()
        .filter(|m| {
            Reflect::get(m, &"state".into())
                .ok()
                .and_then(|s| s.as_string())
                .is_some_and(|s| s != "pending")
        })
        .collect();
    let n = client.clear_resolved().map_err(client_error)?;
    debug_assert_eq!(n, resolved.length() as usize);
    Ok(resolved)
}

/// Every queued mutation in local order with its state (`pending`, `applied`,
/// `conflict`, `rejected_terminal`), for inspection.
fn mutations(client: &Client<FetchTransport>) -> Result<Array, JsValue> {
    let out = Array::new();
    for q in client.storage().mutations().map_err(storage_error)? {
        let m = &q.mutation;
        let o = Object::new();
        set(&o, "mutationId", m.mutation_id.clone().into());
        set(&o, "batchId", q.batch_id.clone().into());
        set(&o, "localOrder", (m.local_order as f64).into());
        set(&o, "tableId", m.table_id.clone().into());
        set(&o, "pk", json_to_js(&m.pk));
        set(&o, "operation", m.operation.as_str().into());
        set(
            &o,
            "baseVersion",
            m.base_version.clone().map_or(JsValue::NULL, JsValue::from),
        );
        set(&o, "clientVersion", (m.client_version as f64).into());
        set(&o, "columns", json_to_js(&Column::list_to_json(&m.columns)));
        set(&o, "authoredSchema", {
            let a = Object::new();
            set(&a, "version", (m.authored_schema.version as f64).into());
            set(&a, "hash", m.authored_schema.hash.clone().into());
            a.into()
        });
        let outcome = client
            .storage()
            .outcome(&m.mutation_id)
            .map_err(storage_error)?;
        set(
            &o,
            "outcome",
            outcome
                .and_then(|t| js_sys::JSON::parse(&t).ok())
                .unwrap_or(JsValue::NULL),
        );
        set(&o, "state", q.state.as_str().into());
        out.push(&o);
    }
    Ok(out)
}
