//! How requests reach the server: the [`Transport`] trait the engine is written against, one
//! HTTP exchange's [`Response`], and the [`TransportError`] of a network failure. The native
//! implementation is `crate::http` (reqwest), the browser one `crate::wasm` (`fetch`); tests
//! use an in-process fake server. [`EventTransport`] extends a transport with the events
//! stream and a timer, for a live session.

use synchro_protocol::json::Json;

/// One HTTP exchange's result.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// The parsed body.
    pub body: Json,
    /// A rebuild page's `x-synchro-scope-rows` header: the session's row count (progress).
    pub scope_rows: Option<u64>,
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

/// What opening the events stream gave: the stream, or the server's refusal (any non-200
/// answer, its JSON error body parsed as for [`Transport::post`]).
pub enum Opened<S> {
    /// HTTP 200: the `text/event-stream` body, to be read chunk by chunk.
    Stream(S),
    /// The server refused (401, 409, 426, 503, ...).
    Refused(Response),
}

/// The body of an open events stream, read as it arrives.
#[allow(async_fn_in_trait)]
pub trait EventStream {
    /// The next bytes of the body; `None` when the server closed it.
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, TransportError>;
}

/// A [`Transport`] that can also hold the change-notification stream open and wait: what a
/// live session ([`crate::engine::Client::run_live`]) needs. Natively reqwest's streaming
/// body and tokio's timer; in the browser `fetch` with a `ReadableStream` reader and
/// `setTimeout`.
#[allow(async_fn_in_trait)]
pub trait EventTransport: Transport {
    /// The open stream's body.
    type Stream: EventStream;

    /// POSTs `body` to `/sync/events` (with the same authorization as [`Transport::post`]).
    async fn open_events(&self, body: String) -> Result<Opened<Self::Stream>, TransportError>;

    /// Resolves after `ms` milliseconds.
    async fn sleep(&self, ms: u64);
}
