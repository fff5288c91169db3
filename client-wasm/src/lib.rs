//! # synchro-client
//!
//! The client engine: a local SQLite database materialized from the server's schema
//! manifest, kept in sync through verified pulls and rebuilds, migrated through a durable
//! journal. One code path: rusqlite natively, and the same rusqlite over sqlite-wasm-rs with
//! the OPFS VFS in the browser.
//!
//! Layers, each depending only on the ones before it (`synchro_protocol` under all):
//!
//! - [`transport`]: the [`transport::Transport`] trait the engine is written against.
//! - [`error`]: [`error::StorageError`] and [`error::ClientError`].
//! - [`store`]: every SQL statement of the client — the versioned `_synchro_*` metadata
//!   tables, typed values, verified application of pull and rebuild pages, the mutation
//!   queue, the migration journal. No network.
//! - [`engine`]: the [`engine::Client`] facade and the steps of a round (connect, migrate,
//!   push, rebuild, pull). No SQL.
//! - `http` (native): the reqwest transport; `wasm` (browser): OPFS, the fetch transport and
//!   the JavaScript API (`SynchroClient`).
//!
//! The modules [`storage`], [`queue`] and [`apply`] keep the paths of the first layout.
#![warn(missing_docs)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod engine;
pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod http;
pub mod natural;
pub mod store;
pub mod transport;
#[cfg(target_arch = "wasm32")]
pub mod wasm;

/// The storage types under their first path (now [`store`] and [`error`]).
pub mod storage {
    pub use crate::error::StorageError;
    pub use crate::store::{from_sql, to_sql, Storage};
}

/// The queue types under their first path (now [`store`]).
pub mod queue {
    pub use crate::engine::uuid_v7;
    pub use crate::store::{
        LocalWrite, MutationState, Operation, OutcomeStatus, QueuedMutation, MAX_BATCH,
    };
}

/// Pull application's result under its first path (now [`store`]).
pub mod apply {
    pub use crate::store::Applied;
}
