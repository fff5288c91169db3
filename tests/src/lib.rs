//! # synchro-tests
//!
//! Scenarios that need the client and the server together, against real PostgreSQL:
//! `tests/whole_stack.rs` (the client engine against the server binary: scopes, restarts,
//! tampering, Class 2/3/4 upgrades, offline writes) and `examples/items_bench/` (the
//! end-to-end items workload). Nothing depends on this crate.
