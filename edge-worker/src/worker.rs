//! The Worker's fetch handler: the I/O around the pure modules. It reads the body (bounded
//! by the limit as it arrives), runs [`crate::gate::check`], forwards the request to the
//! origin with the correlation ID, and streams the origin's answer back unbuffered (the
//! events stream among them); only 4xx and 5xx answers, which are small error bodies, are
//! read to judge them and to log their code. Seed files go through the edge cache
//! (`seeds.rs`).

mod keys;
mod seeds;

use futures_util::StreamExt;
use synchro_protocol::wire::cors::CorsAnswer;
use synchro_protocol::wire::{ErrorBody, ErrorCode, Message};
use wasm_bindgen::{JsCast, JsValue};
use worker::{
    event, Context, Date, Env, Fetch, Headers, Method, Request, RequestInit, Response,
    ResponseBuilder, Result,
};

use crate::config::Config;
use crate::gate::{self, Endpoint, Refusal};
use crate::log::Line;
use crate::origin::{self, REQUEST_ID_HEADER};

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let request_id = origin::request_id(random_bytes());
    let mut line = Line {
        request_id: request_id.clone(),
        endpoint: "none",
        status: 0,
        code: None,
        outcome: "forwarded",
        cache: None,
        origin_ms: None,
    };
    // Cross-origin policy first (a preflight has no route of its own); a configuration
    // error is answered by `handle`.
    let cors = match Config::from_env(|name| binding(&env, name)) {
        Ok(config) => {
            let origin = req.headers().get("origin").ok().flatten();
            let preflight = req.method() == Method::Options
                && req
                    .headers()
                    .has("access-control-request-method")
                    .unwrap_or(false);
            config.cors.answer(origin.as_deref(), preflight)
        }
        Err(_) => CorsAnswer::None,
    };
    let (response, add) = match cors {
        CorsAnswer::Refused => {
            line.outcome = "cors_refused";
            (ResponseBuilder::new().with_status(403).empty(), Vec::new())
        }
        CorsAnswer::Preflight(headers) => {
            line.outcome = "cors_preflight";
            (ResponseBuilder::new().with_status(204).empty(), headers)
        }
        CorsAnswer::None | CorsAnswer::Respond(_) => {
            let add = match cors {
                CorsAnswer::Respond(headers) => headers,
                _ => Vec::new(),
            };
            let response = match handle(req, &env, &request_id, &mut line).await {
                Ok(r) => r,
                Err(_) => {
                    line.outcome = "internal";
                    line.code = Some(ErrorCode::TemporaryUnavailable);
                    error_response(&origin::opaque(), &request_id)?
                }
            };
            (response, add)
        }
    };
    let mut response = response;
    for (name, value) in add {
        response.headers_mut().append(name, &value)?;
    }
    line.status = response.status_code();
    worker::console_log!("{line}");
    Ok(response)
}

async fn handle(mut req: Request, env: &Env, rid: &str, line: &mut Line) -> Result<Response> {
    let endpoint = match Endpoint::route(req.method().as_ref(), &req.path()) {
        Ok(e) => e,
        Err(no_route) => {
            line.outcome = "no_route";
            let mut r = ResponseBuilder::new().with_status(no_route.status());
            if let gate::NoRoute::MethodNotAllowed(allow) = no_route {
                r = r.with_header("allow", allow)?;
            }
            return Ok(r.with_header(REQUEST_ID_HEADER, rid)?.empty());
        }
    };
    line.endpoint = endpoint.name();
    let config = match Config::from_env(|name| binding(env, name)) {
        Ok(c) => c,
        Err(e) => {
            // The error names the setting, never its value.
            worker::console_error!("synchro-edge request_id={rid} configuration error: {e}");
            line.outcome = "config";
            line.code = Some(ErrorCode::TemporaryUnavailable);
            return error_response(&origin::opaque(), rid);
        }
    };
    match endpoint {
        Endpoint::Ready => return ready(&config, rid, line).await,
        Endpoint::Seed => return seeds::serve(&req, &config, rid, line).await,
        _ => {}
    }
    let declared = req.headers().get("content-length")?;
    if gate::declared_too_large(declared.as_deref(), config.max_body_bytes) {
        return refuse(Refusal::body_too_large(), rid, line);
    }
    let Some(body) = read_bounded(&mut req, config.max_body_bytes).await? else {
        return refuse(Refusal::body_too_large(), rid, line);
    };
    let authorization = req.headers().get("authorization")?;
    let verifier = keys::verifier(&config, authorization.as_deref()).await;
    if let Err(refusal) = gate::check(
        endpoint,
        &body,
        authorization.as_deref(),
        &verifier,
        now_secs(),
    ) {
        return refuse(refusal, rid, line);
    }
    forward(&config, endpoint, authorization.as_deref(), body, rid, line).await
}

/// The whole body, or `None` once more than `limit` bytes arrived.
async fn read_bounded(req: &mut Request, limit: usize) -> Result<Option<Vec<u8>>> {
    if req.inner().body().is_none() {
        return Ok(Some(Vec::new()));
    }
    let mut stream = req.stream()?;
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

fn refuse(refusal: Refusal, rid: &str, line: &mut Line) -> Result<Response> {
    line.outcome = refusal.reason.as_str();
    line.code = Some(refusal.body.code);
    error_response(&refusal.body, rid)
}

async fn forward(
    config: &Config,
    endpoint: Endpoint,
    authorization: Option<&str>,
    body: Vec<u8>,
    rid: &str,
    line: &mut Line,
) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", "application/json")?;
    if let Some(a) = authorization {
        headers.set("authorization", a)?;
    }
    headers.set(REQUEST_ID_HEADER, rid)?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(js_sys::Uint8Array::from(&body[..]).into()));
    let url = format!("{}{}", config.origin, endpoint.path());
    let Some(resp) = ask_origin(Request::new_with_init(&url, &init)?, line).await else {
        return error_response(&origin::opaque(), rid);
    };
    let out = passed_headers(&resp, rid)?;
    relay(resp, out, rid, line).await
}

/// The origin's answer `resp` to the client with the headers `out`: below 400 streamed
/// through, a 4xx as it is, a 5xx only as a spec error body of its status.
async fn relay(mut resp: Response, out: Headers, rid: &str, line: &mut Line) -> Result<Response> {
    let status = resp.status_code();
    if status < 400 {
        // Streamed through as it arrives (the events stream lasts minutes; its events pass
        // unread).
        let (_, body) = resp.into_parts();
        return Ok(ResponseBuilder::new()
            .with_status(status)
            .with_headers(out)
            .body(body));
    }
    // An error answer is a small body: read it to judge a 5xx and to log its code.
    let text = resp.text().await.unwrap_or_default();
    let text = if status >= 500 {
        match origin::server_error_body(status, &text) {
            Some(text) => text,
            None => {
                line.outcome = "origin_error";
                line.code = Some(ErrorCode::TemporaryUnavailable);
                return error_response(&origin::opaque(), rid);
            }
        }
    } else {
        text
    };
    line.code = ErrorBody::parse(&text).ok().map(|b| b.code);
    Ok(ResponseBuilder::new()
        .with_status(status)
        .with_headers(out)
        .fixed(text.into_bytes()))
}

/// The origin's answer, timing it; `None` when it could not be had.
async fn ask_origin(request: Request, line: &mut Line) -> Option<Response> {
    let started = Date::now().as_millis();
    let sent = Fetch::Request(request).send().await;
    line.origin_ms = Some(Date::now().as_millis().saturating_sub(started));
    match sent {
        Ok(r) => Some(r),
        Err(_) => {
            line.outcome = "origin_unreachable";
            line.code = Some(ErrorCode::TemporaryUnavailable);
            None
        }
    }
}

async fn ready(config: &Config, rid: &str, line: &mut Line) -> Result<Response> {
    let headers = Headers::new();
    headers.set(REQUEST_ID_HEADER, rid)?;
    let mut init = RequestInit::new();
    init.with_method(Method::Get).with_headers(headers);
    let url = format!("{}{}", config.origin, Endpoint::Ready.path());
    let answer = match ask_origin(Request::new_with_init(&url, &init)?, line).await {
        Some(mut r) => {
            let status = r.status_code();
            Some((status, r.text().await.unwrap_or_default()))
        }
        None => None,
    };
    let (status, body) = origin::ready_answer(answer.as_ref().map(|(s, t)| (*s, t.as_str())));
    Ok(ResponseBuilder::new()
        .with_status(status)
        .with_header("content-type", "application/json")?
        .with_header(REQUEST_ID_HEADER, rid)?
        .fixed(body.as_bytes().to_vec()))
}

fn passed_headers(resp: &Response, rid: &str) -> Result<Headers> {
    let out = Headers::new();
    for name in origin::PASSED_HEADERS {
        if let Some(v) = resp.headers().get(name)? {
            out.set(name, &v)?;
        }
    }
    out.set(REQUEST_ID_HEADER, rid)?;
    Ok(out)
}

fn error_response(body: &ErrorBody, rid: &str) -> Result<Response> {
    Ok(ResponseBuilder::new()
        .with_status(body.code.status())
        .with_header("content-type", "application/json")?
        .with_header(REQUEST_ID_HEADER, rid)?
        .fixed(body.to_json_string().into_bytes()))
}

/// A string binding (`[vars]` or a secret); a number in `[vars]` is read as its decimal text
/// and a boolean as `true` or `false`.
fn binding(env: &Env, name: &str) -> Option<String> {
    let target: &JsValue = env.as_ref();
    let v = js_sys::Reflect::get(target, &JsValue::from_str(name)).ok()?;
    v.as_string()
        .or_else(|| {
            v.as_f64()
                .filter(|n| n.fract() == 0.0 && *n >= 0.0)
                .map(|n| format!("{n:.0}"))
        })
        .or_else(|| v.as_bool().map(|b| b.to_string()))
}

fn now_secs() -> u64 {
    Date::now().as_millis() / 1000
}

/// 16 bytes from the runtime's CSPRNG (`crypto.getRandomValues`); zeros if it is missing,
/// which only makes correlation IDs collide.
fn random_bytes() -> [u8; 16] {
    let mut out = [0u8; 16];
    let crypto = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("crypto"));
    let fill = crypto.as_ref().ok().and_then(|c| {
        js_sys::Reflect::get(c, &JsValue::from_str("getRandomValues"))
            .ok()?
            .dyn_into::<js_sys::Function>()
            .ok()
    });
    if let (Ok(crypto), Some(fill)) = (crypto, fill) {
        let array = js_sys::Uint8Array::new_with_length(16);
        if fill.call1(&crypto, &array).is_ok() {
            array.copy_to(&mut out);
        }
    }
    out
}
