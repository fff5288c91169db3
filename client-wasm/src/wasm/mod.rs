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

//!
//! The files: `opfs` opens the storage (the OPFS pool VFS), `fetch` is the transport,
//! `client` the `SynchroClient` class, `live` the `LiveSession` class, `ops` what both
//! classes do with a client (query, write, inspect the queue), and `convert` the
//! conversions between JS values and the crate's values and errors.

mod client;
mod convert;
mod fetch;
mod live;
mod opfs;
mod ops;

pub use client::SynchroClient;
pub use fetch::{FetchEventStream, FetchTransport};
pub use live::LiveSession;
pub use opfs::{
    ensure_opfs_capacity, install_opfs, install_opfs_in, open_opfs, open_opfs_from_seed,
};
