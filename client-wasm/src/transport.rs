//! How requests reach the server: the [`Transport`] trait the engine is written against, one
//! HTTP exchange's [`Response`], and the [`TransportError`] of a network failure. The native
//! implementation is `crate::http` (reqwest), the browser one `crate::wasm` (`fetch`); tests
//! use an in-process fake server.

use synchro_protocol::json::Json;

/// One HTTP exchange's result.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// The parsed body.
    pub body: Json,
}

/// The network failed before a response arrived (always retryable). The message never
/// carries the token or the body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the server could not be reached: {0}")]
pub struct TransportError(pub String);

/// How requests reach the server: a native HTTP client in tests and tools, `fetch` in the
/// browser. The transport adds authorization (from its token provider) itself.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// POSTs a JSON `body` to `path` (such as `/sync/pull`).
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError>;
}
