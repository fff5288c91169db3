//! # synchro-edge
//!
//! The Cloudflare Workers gateway in front of `synchro-server`: it stops bad traffic before
//! it reaches the origin and the database, and forwards the rest over HTTP. Before any
//! origin request it checks, in the server's own order and with the server's own code
//! (`synchro_protocol::wire::gate` and `synchro_protocol::jwt`): the body size, the body as
//! a protocol 3 JSON object (426 `upgrade_required` before anything else), the HS256 bearer
//! token (401), and the request's members through the endpoint's typed wire message (400).
//! A refusal is exactly the body the server would send. The server still checks everything
//! itself: the edge is never the only check. Seed files (`GET /seeds/{name}`) are answered
//! from the Workers cache after the token check, the origin asked only on a miss
//! ([`seeds`]).
//!
//! Every request gets a correlation ID (`x-request-id`, sent to the origin and back to the
//! client). Origin failures become the spec's opaque 503 body. The one log line per request
//! ([`log::Line`]) holds no token, value, key or user, client or scope ID.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the settings from `wrangler.toml` vars and secrets |
//! | [`gate`] | routes and the checks before any origin request |
//! | [`origin`] | what is answered for what the origin answered |
//! | [`seeds`] | the edge cache of seed files: keys, what is stored for how long, headers |
//! | [`log`] | the log line |
//! | `worker` (wasm32 only) | the fetch handler: reading, forwarding, streaming |
//!
//! The pure modules build and test natively; the handler exists only in the wasm32 build
//! (`worker-build`, see `edge-worker/wrangler.toml`).
//!
//! ```
//! use synchro_edge::gate::{check, Endpoint};
//! use synchro_protocol::jwt::Verifier;
//!
//! let verifier = Verifier::hs256(b"a-shared-secret-of-16+-bytes", 3600).unwrap();
//! let refusal = check(Endpoint::Pull, br#"{"protocol_version":2}"#, None, &verifier, 0)
//!     .unwrap_err();
//! assert_eq!(refusal.body.code.status(), 426);
//! ```
#![warn(missing_docs)]

pub mod config;
pub mod gate;
pub mod log;
pub mod origin;
pub mod seeds;

#[cfg(target_arch = "wasm32")]
mod worker;
