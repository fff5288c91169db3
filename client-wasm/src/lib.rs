//! # synchro-client
//!
//! The client engine: a local SQLite database materialized from the server's schema
//! manifest, kept in sync through verified pulls and rebuilds, migrated through a durable
//! journal. One code path: rusqlite natively, and the same rusqlite over sqlite-wasm-rs with
//! the OPFS VFS in the browser.
//!
//! - [`storage`]: typed values per spec 000 "Portable To SQLite Mapping", install, the
//!   application's local-table ladder.
//! - [`apply`]: verified application of pull and rebuild pages.
//! - [`transport`]: the transport trait the engine is written against; [`error`]: the
//!   storage and client errors.
//! - [`engine`]: identity, the migration journal, the connect / rebuild / pull loop.
//! - `http` (native): the reqwest transport; `wasm` (browser): OPFS, the fetch transport and
//!   the JavaScript API (`SynchroClient`).
#![warn(missing_docs)]

pub mod apply;
#[cfg(feature = "bench")]
pub mod bench;
pub mod engine;
pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod http;
pub mod queue;
pub mod storage;
pub mod transport;
#[cfg(target_arch = "wasm32")]
pub mod wasm;
