//! # synchro-testkit
//!
//! Test helpers shared by synchro's crates, so no test reaches into another crate's files:
//!
//! | module | feature | holds |
//! |---|---|---|
//! | [`manifests`] | — | manifest builders (a base table set and small edits of it) |
//! | `fake_server` | `client` | a scripted server on `synchro_protocol::wire` for the client's durability tests |
//! | `target` | `client` | fresh database locations natively and on OPFS in Chromium |
//! | `pg` | `server` | throwaway PostgreSQL clusters with synchro installed, the server binary, the docs fixtures |
//! | `edge` | `server` | the edge gateway under `wrangler dev` (real workerd) in front of an origin |
//! | `idp` | `server` | a stand-in identity provider: signing keys, tokens, a JWKS endpoint |
//! | `certs` | `server` | certificate authorities and the certificates they issue, for TLS to PostgreSQL |

pub mod manifests;

#[cfg(feature = "client")]
pub mod fake_server;
#[cfg(feature = "client")]
pub mod target;

#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub mod certs;
#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub mod edge;
#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub mod idp;
#[cfg(all(feature = "server", not(target_arch = "wasm32")))]
pub mod pg;
