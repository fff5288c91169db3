//! Manifest builders, shared by every crate's tests (synchro-testkit).
#![allow(unused_imports)]
pub use synchro_testkit::manifests::*;
