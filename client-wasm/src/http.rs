//! The native [`Transport`]: HTTP/1.1 through reqwest, with a bearer token from a provider
//! that is asked on every request (so it can refresh).

use synchro_protocol::json::Json;

use crate::transport::{Response, Transport, TransportError};

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

impl Transport for HttpTransport {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", (self.token)()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| TransportError(without_url(&e)))?;
        let status = r.status().as_u16();
        let text = r
            .text()
            .await
            .map_err(|e| TransportError(without_url(&e)))?;
        let body = Json::parse(&text)
            .map_err(|_| TransportError(format!("HTTP {status} with a body that is not JSON")))?;
        Ok(Response { status, body })
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
