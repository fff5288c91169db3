//! # synchro-client
//!
//! The client engine: a local SQLite database materialized from the server's schema
//! manifest, kept in sync through verified pulls. This first part is the storage layer
//! (issue 6, item 1): every value is bound and read by the manifest's logical type exactly as
//! spec 000 "Portable To SQLite Mapping" says, and a database is installed from a manifest
//! through the hash-bound migration plan of `synchro-protocol` in one transaction.
//!
//! It builds natively over rusqlite today; the browser build (the same rusqlite code over
//! sqlite-wasm-rs and the OPFS VFS) comes next.
#![warn(missing_docs)]

#[cfg(not(target_arch = "wasm32"))]
pub mod apply;
#[cfg(not(target_arch = "wasm32"))]
pub mod storage;
