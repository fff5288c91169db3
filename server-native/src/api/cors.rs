//! Cross-origin requests (`serve --cors-origin`): the policy of
//! [`synchro_protocol::wire::cors`] (the edge gateway's too) as an axum middleware.

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use synchro_protocol::wire::cors::CorsAnswer;

pub use synchro_protocol::wire::cors::CorsOrigins;

/// The middleware (a no-op without allowed origins).
pub(super) async fn cors(
    State(origins): State<Arc<CorsOrigins>>,
    request: Request,
    next: Next,
) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok());
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    match origins.answer(origin, preflight) {
        CorsAnswer::None => next.run(request).await,
        CorsAnswer::Refused => StatusCode::FORBIDDEN.into_response(),
        CorsAnswer::Preflight(headers) => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            add(&mut response, headers);
            response
        }
        CorsAnswer::Respond(headers) => {
            let mut response = next.run(request).await;
            add(&mut response, headers);
            response
        }
    }
}

fn add(response: &mut Response, headers: Vec<(&'static str, String)>) {
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .append(HeaderName::from_static(name), value);
        }
    }
}
