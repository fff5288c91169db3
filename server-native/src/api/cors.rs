//! Cross-origin requests (`serve --cors-origin`): an app served from another origin than the
//! server (Vite on :5173, the server on :8787) may call it when its origin is listed. A
//! preflight (`OPTIONS` with `Access-Control-Request-Method`) from a listed origin is answered
//! 204 with the methods and request headers the client uses; one from any other origin 403,
//! without CORS headers. Every response to a listed origin, errors included (so the app can
//! read a 401 or a 503 rather than see a network failure), carries
//! `Access-Control-Allow-Origin` and exposes `Retry-After`. Bearer tokens are not cookies: no
//! credentials mode is involved, so `*` (any origin) is allowed too.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The origins allowed to call the server from a browser.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsOrigins {
    any: bool,
    origins: Vec<String>,
}

impl CorsOrigins {
    /// `*`, or origins as browsers send them (`scheme://host[:port]`, http or https, no path,
    /// lower case); anything else is refused with what is wrong with it.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<CorsOrigins, String> {
        let mut out = CorsOrigins::default();
        for v in values {
            if v == "*" {
                out.any = true;
                continue;
            }
            let rest = v
                .strip_prefix("https://")
                .or_else(|| v.strip_prefix("http://"))
                .ok_or_else(|| {
                    format!("{v:?} is not an origin: it starts with http:// or https://")
                })?;
            let valid = !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:[]".contains(c));
            if !valid {
                return Err(format!(
                    "{v:?} is not an origin: scheme://host[:port] in lower case, no path or trailing slash"
                ));
            }
            out.origins.push(v.to_owned());
        }
        Ok(out)
    }

    /// Whether none is allowed (no CORS headers at all).
    pub fn is_empty(&self) -> bool {
        !self.any && self.origins.is_empty()
    }

    fn allows(&self, origin: &str) -> bool {
        self.any || self.origins.iter().any(|o| o == origin)
    }
}

/// The request headers the client sends.
const ALLOWED_HEADERS: &str = "authorization, content-type";

/// The middleware (a no-op without allowed origins).
pub(super) async fn cors(
    State(origins): State<Arc<CorsOrigins>>,
    request: Request,
    next: Next,
) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let Some(origin) = origin.filter(|_| !origins.is_empty()) else {
        return next.run(request).await;
    };
    let allowed = origins.allows(&origin);
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        if !allowed {
            return StatusCode::FORBIDDEN.into_response();
        }
        let mut response = StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        allow(&mut response, &origin);
        return response;
    }
    let mut response = next.run(request).await;
    if allowed {
        allow(&mut response, &origin);
        response.headers_mut().insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
    }
    response
}

fn allow(response: &mut Response, origin: &str) {
    if let Ok(value) = HeaderValue::from_str(origin) {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::CorsOrigins;

    #[test]
    fn origins_are_parsed_strictly() {
        let ok = CorsOrigins::parse(["http://localhost:5173", "https://app.example.com"]).unwrap();
        assert!(ok.allows("http://localhost:5173") && ok.allows("https://app.example.com"));
        assert!(!ok.allows("http://localhost:5174") && !ok.allows("https://evil.example"));
        assert!(CorsOrigins::parse(["*"])
            .unwrap()
            .allows("https://any.example"));
        for bad in [
            "localhost:5173",
            "http://localhost:5173/",
            "https://App.example.com",
            "ftp://x",
            "http://",
            "http://a b",
        ] {
            assert!(CorsOrigins::parse([bad]).is_err(), "{bad}");
        }
        assert!(CorsOrigins::parse([]).unwrap().is_empty());
    }
}
