//! The native [`Transport`]: HTTP/1.1 through reqwest, with a bearer token from a provider
//! that is asked on every request (so it can refresh). As an [`EventTransport`] it reads the
//! events stream from reqwest's streaming body and waits on tokio's timer (it runs inside a
//! tokio runtime, as reqwest does).

use synchro_protocol::json::Json;

use crate::transport::{EventStream, EventTransport, Opened, Response, Transport, TransportError};

type TokenProvider = Box<dyn Fn() -> String + Send + Sync>;

/// POSTs JSON to `{base}{path}` with `Authorization: Bearer <token>`.
pub struct HttpTransport {
    base: String,
    http: reqwest::Client,
    token: TokenProvider,
}

impl HttpTransport {
    /// A transport to the server at `base` (such as `http://127.0.0.1:8080`).
    pub fn new(
        base: impl Into<String>,
        token: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        HttpTransport {
            base: base.into().trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            token: Box::new(token),
        }
    }
}

impl HttpTransport {
    async fn send(&self, path: &str, body: String) -> Result<reqwest::Response, TransportError> {
        self.http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", (self.token)()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| TransportError(without_url(&e)))
    }
}

async fn json_response(r: reqwest::Response) -> Result<Response, TransportError> {
    let status = r.status().as_u16();
    let scope_rows = r
        .headers()
        .get(synchro_protocol::wire::SCOPE_ROWS_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let text = r
        .text()
        .await
        .map_err(|e| TransportError(without_url(&e)))?;
    let body = Json::parse(&text)
        .map_err(|_| TransportError(format!("HTTP {status} with a body that is not JSON")))?;
    Ok(Response {
        status,
        body,
        scope_rows,
    })
}

impl Transport for HttpTransport {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        json_response(self.send(path, body).await?).await
    }
}

/// An open events stream: reqwest's body, read chunk by chunk (dropping it closes the
/// connection).
pub struct HttpEventStream(reqwest::Response);

impl EventStream for HttpEventStream {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, TransportError> {
        self.0
            .chunk()
            .await
            .map(|c| c.map(|b| b.to_vec()))
            .map_err(|e| TransportError(without_url(&e)))
    }
}

impl EventTransport for HttpTransport {
    type Stream = HttpEventStream;

    async fn open_events(&self, body: String) -> Result<Opened<HttpEventStream>, TransportError> {
        let r = self.send("/sync/events", body).await?;
        if r.status().as_u16() == 200 {
            Ok(Opened::Stream(HttpEventStream(r)))
        } else {
            Ok(Opened::Refused(json_response(r).await?))
        }
    }

    async fn sleep(&self, ms: u64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// reqwest's message without the URL (which could name a user's server path).
fn without_url(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        "request failed".into()
    }
}
