//! The browser's transport: `fetch` from the worker with a bearer token from a JS provider,
//! and the events stream read through the response body's reader. A request that gets no
//! response fails with a bounded reason ([`FetchFailure`]): never a URL, a token or a body.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use synchro_protocol::json::Json;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use super::opfs::SeedSource;
use crate::error::StorageError;
use crate::transport::{EventStream, EventTransport, Opened, Response, Transport, TransportError};

/// Why a request got no response (the browser tells a network error from a CORS refusal to
/// no script, so they are one reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchFailure {
    /// The token provider threw, rejected, or gave something other than a string.
    Token,
    /// The request could not be built (a malformed server URL, a header value the browser
    /// refuses).
    Build,
    /// `fetch` rejected: the network failed or the browser refused the answer (CORS).
    Network,
    /// The request or the reading of its body was aborted or timed out.
    Aborted,
    /// The response arrived but its body could not be read.
    Body,
}

impl FetchFailure {
    fn message(self) -> &'static str {
        match self {
            FetchFailure::Token => "the token provider failed or did not return a string",
            FetchFailure::Build => "the request could not be built",
            FetchFailure::Network => "fetch failed (network error or CORS refusal)",
            FetchFailure::Aborted => "the request timed out or was aborted",
            FetchFailure::Body => "reading the response body failed",
        }
    }

    /// The failure a rejection `e` of `fetch` or of a body read stands for: an `AbortError`
    /// or `TimeoutError` is [`FetchFailure::Aborted`], anything else `otherwise`. Only the
    /// error's name is read, never its message (it may name the URL).
    fn of_rejection(e: &JsValue, otherwise: FetchFailure) -> FetchFailure {
        let name = Reflect::get(e, &"name".into())
            .ok()
            .and_then(|n| n.as_string());
        match name.as_deref() {
            Some("AbortError" | "TimeoutError") => FetchFailure::Aborted,
            _ => otherwise,
        }
    }
}

impl From<FetchFailure> for TransportError {
    fn from(f: FetchFailure) -> TransportError {
        TransportError(f.message().into())
    }
}

/// `fetch` from the worker, with a bearer token from a JS provider (a function returning a
/// string or a promise of one) asked on every request.
pub struct FetchTransport {
    base: String,
    token: Function,
}

async fn js_await(v: JsValue) -> Result<JsValue, JsValue> {
    if v.is_instance_of::<Promise>() {
        JsFuture::from(v.unchecked_into::<Promise>()).await
    } else {
        Ok(v)
    }
}

impl FetchTransport {
    /// A transport to `base` with `token` as the provider.
    pub fn new(base: &str, token: Function) -> FetchTransport {
        FetchTransport {
            base: base.trim_end_matches('/').to_owned(),
            token,
        }
    }

    /// A bearer token from the provider.
    async fn token(&self) -> Result<String, FetchFailure> {
        let token = self
            .token
            .call0(&JsValue::NULL)
            .map_err(|_| FetchFailure::Token)?;
        let token = js_await(token).await.map_err(|_| FetchFailure::Token)?;
        token.as_string().ok_or(FetchFailure::Token)
    }

    async fn fetch(&self, path: &str, body: String) -> Result<web_sys::Response, FetchFailure> {
        let token = self.token().await?;
        let request = self
            .request(path, body, &token)
            .map_err(|_| FetchFailure::Build)?;
        let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
        let response = JsFuture::from(global.fetch_with_request(&request))
            .await
            .map_err(|e| FetchFailure::of_rejection(&e, FetchFailure::Network))?;
        Ok(response.unchecked_into())
    }

    /// The POST of `body` to `path` with the bearer `token`.
    fn request(&self, path: &str, body: String, token: &str) -> Result<web_sys::Request, JsValue> {
        let init = web_sys::RequestInit::new();
        init.set_method("POST");
        init.set_body(&JsValue::from_str(&body));
        let headers = web_sys::Headers::new()?;
        headers.set("content-type", "application/json")?;
        headers.set("authorization", &format!("Bearer {token}"))?;
        init.set_headers(&headers);
        web_sys::Request::new_with_str_and_init(&format!("{}{path}", self.base), &init)
    }
}

/// The scheme, host and port of an absolute URL (`https://example.com:8443`).
fn origin(url: &str) -> &str {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url;
    };
    url[start..]
        .find('/')
        .map_or(url, |end| &url[..start + end])
}

/// A body reader's `read()` result: the chunk, or `None` at the end of the body.
fn chunk(read: Result<JsValue, JsValue>) -> Result<Option<Vec<u8>>, ()> {
    let read = read.map_err(|_| ())?;
    if Reflect::get(&read, &"done".into())
        .map_err(|_| ())?
        .is_truthy()
    {
        return Ok(None);
    }
    let value = Reflect::get(&read, &"value".into()).map_err(|_| ())?;
    Ok(Some(
        value.dyn_into::<Uint8Array>().map_err(|_| ())?.to_vec(),
    ))
}

/// A portable seed being downloaded: the response body's reader.
pub struct SeedDownload {
    length: Option<u64>,
    reader: web_sys::ReadableStreamDefaultReader,
}

impl Drop for SeedDownload {
    fn drop(&mut self) {
        let _ = self.reader.cancel();
    }
}

impl SeedSource for SeedDownload {
    fn length(&self) -> Option<u64> {
        self.length
    }

    async fn next(&mut self) -> Result<Option<Vec<u8>>, StorageError> {
        let read = JsFuture::from(self.reader.read()).await;
        chunk(read).map_err(|()| StorageError::Seed("the seed download failed"))
    }
}

impl FetchTransport {
    /// Starts downloading the seed at `url` (absolute): a GET that carries the bearer token
    /// only when `url` is on the server's own origin (a seed on a CDN gets no token).
    pub async fn download_seed(&self, url: &str) -> Result<SeedDownload, StorageError> {
        let failed = |_| StorageError::Seed("the seed could not be downloaded");
        let init = web_sys::RequestInit::new();
        init.set_method("GET");
        let headers = web_sys::Headers::new().map_err(failed)?;
        if origin(url) == origin(&self.base) {
            let token = self
                .token()
                .await
                .map_err(|_| StorageError::Seed("the token provider failed"))?;
            headers
                .set("authorization", &format!("Bearer {token}"))
                .map_err(failed)?;
        }
        init.set_headers(&headers);
        let request = web_sys::Request::new_with_str_and_init(url, &init).map_err(failed)?;
        let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
        let response: web_sys::Response = JsFuture::from(global.fetch_with_request(&request))
            .await
            .map_err(failed)?
            .unchecked_into();
        match response.status() {
            200 => {}
            401 | 403 => {
                return Err(StorageError::Seed(
                    "the seed download was refused (401/403)",
                ))
            }
            404 => return Err(StorageError::Seed("the seed was not found (404)")),
            _ => {
                return Err(StorageError::Seed(
                    "the seed could not be downloaded (HTTP error)",
                ))
            }
        }
        let length = response
            .headers()
            .get("content-length")
            .ok()
            .flatten()
            .and_then(|v| v.parse().ok());
        let body = response
            .body()
            .ok_or(StorageError::Seed("the seed response has no body"))?;
        Ok(SeedDownload {
            length,
            reader: body.get_reader().unchecked_into(),
        })
    }
}

/// The response's body as text.
async fn text(response: &web_sys::Response) -> Result<String, FetchFailure> {
    let read = response.text().map_err(|_| FetchFailure::Body)?;
    let text = JsFuture::from(read)
        .await
        .map_err(|e| FetchFailure::of_rejection(&e, FetchFailure::Body))?;
    Ok(text.as_string().unwrap_or_default())
}

/// The response's status and JSON body.
async fn json_response(response: &web_sys::Response) -> Result<Response, TransportError> {
    let status = response.status();
    let scope_rows = response
        .headers()
        .get(synchro_protocol::wire::SCOPE_ROWS_HEADER)
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok());
    let body = Json::parse(&text(response).await?)
        .map_err(|_| TransportError(format!("HTTP {status} with a body that is not JSON")))?;
    Ok(Response {
        status,
        body,
        scope_rows,
    })
}

/// An open events stream: the `fetch` response body's `ReadableStream` reader. Dropping it
/// cancels the stream (which closes the connection).
pub struct FetchEventStream {
    reader: web_sys::ReadableStreamDefaultReader,
    /// A read not yet answered. The session drops `next_chunk` whenever the application
    /// calls in while it waits; the read's promise still resolves with the next chunk, so it
    /// is kept and awaited again (a new `read()` would skip that chunk: a lost `changed`).
    pending: Option<JsFuture>,
}

impl Drop for FetchEventStream {
    fn drop(&mut self) {
        let _ = self.reader.cancel();
    }
}

impl EventStream for FetchEventStream {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, TransportError> {
        let failed = |()| TransportError("the events stream failed".into());
        let reader = &self.reader;
        let read = self
            .pending
            .get_or_insert_with(|| JsFuture::from(reader.read()))
            .await;
        self.pending = None;
        chunk(read).map_err(failed)
    }
}

impl EventTransport for FetchTransport {
    type Stream = FetchEventStream;

    async fn open_events(&self, body: String) -> Result<Opened<FetchEventStream>, TransportError> {
        let response = self.fetch("/sync/events", body).await?;
        if response.status() != 200 {
            return Ok(Opened::Refused(json_response(&response).await?));
        }
        let stream = response
            .body()
            .ok_or_else(|| TransportError("the events response has no body".into()))?;
        Ok(Opened::Stream(FetchEventStream {
            reader: stream.get_reader().unchecked_into(),
            pending: None,
        }))
    }

    async fn sleep(&self, ms: u64) {
        let ms = ms.min(i32::MAX as u64) as i32;
        let promise = Promise::new(&mut |resolve, _| {
            let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
            let _ = global.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        });
        let _ = JsFuture::from(promise).await;
    }
}

impl Transport for FetchTransport {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let response = self.fetch(path, body).await?;
        json_response(&response).await
    }
}
