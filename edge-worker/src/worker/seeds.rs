//! `GET /seeds/{name}` through the Workers cache (`caches.default`; the policy is
//! [`crate::seeds`]). The token is checked first; then the cache is asked with the client's
//! `Range` and `If-None-Match`. A hit is answered without any origin request. On a miss the
//! whole file is asked of the origin (no range, no condition); a storable answer is put in
//! the cache and the client's request is then answered from it, so ranges and conditions
//! are the cache's on a miss too. An answer that is not storable (404, 401, 5xx) is passed
//! as the origin gave it and never stored; one the cache did not keep (too large for it,
//! say) is asked of the origin again with the client's range and condition.

use worker::{Cache, Headers, Method, Request, RequestInit, Response, ResponseBuilder, Result};

use super::{ask_origin, error_response, now_secs, refuse, relay};
use crate::config::Config;
use crate::gate::{self, Endpoint};
use crate::log::{CacheUse, Line};
use crate::origin::{self, REQUEST_ID_HEADER};
use crate::seeds;

pub(super) async fn serve(
    req: &Request,
    config: &Config,
    rid: &str,
    line: &mut Line,
) -> Result<Response> {
    let authorization = req.headers().get("authorization")?;
    let verifier = super::keys::verifier(config, authorization.as_deref()).await;
    if let Err(refusal) = gate::check_seed(
        authorization.as_deref(),
        &verifier,
        config.public_seeds,
        now_secs(),
    ) {
        return refuse(refusal, rid, line);
    }
    let url = req.url()?;
    let name = url
        .path()
        .strip_prefix(Endpoint::Seed.path())
        .unwrap_or_default();
    let version = url
        .query_pairs()
        .find(|(k, _)| k == "v")
        .map(|(_, v)| v.into_owned());
    let version = version.as_deref();
    let key = seeds::cache_key(&url.origin().ascii_serialization(), name, version);
    let cache = Cache::default();
    let lookup = get_request(&key, None, None, Some(req.headers()))?;
    if let Some(hit) = cache.get(&lookup, false).await? {
        line.cache = Some(CacheUse::Hit);
        line.outcome = "cached";
        return answer(hit, rid);
    }
    line.cache = Some(CacheUse::Miss);
    // The origin checks the token again; with public seeds none is sent, so what is stored
    // never depends on a client's token.
    let authorization = authorization.filter(|_| !config.public_seeds);
    let origin_url = seeds::origin_url(&config.origin, name, version);
    let full = get_request(&origin_url, authorization.as_deref(), Some(rid), None)?;
    let Some(resp) = ask_origin(full, line).await else {
        return error_response(&origin::opaque(), rid);
    };
    let etag = resp.headers().get("etag")?;
    if !seeds::storable(resp.status_code(), etag.as_deref(), version) {
        let out = headers(seeds::answer_headers(|n| resp.headers().get(n).ok()?), rid)?;
        return relay(resp, out, rid, line).await;
    }
    let stored = stored(resp, version, config.seed_cache_secs)?;
    if cache.put(key.as_str(), stored).await.is_ok() {
        if let Some(r) = cache.get(&lookup, false).await? {
            return answer(r, rid);
        }
    }
    // Not kept by the cache (on a workers.dev subdomain the Cache API keeps nothing; a file
    // over its size limit): the origin answers this request as the client asked it.
    line.outcome = "uncached";
    let again = get_request(
        &origin_url,
        authorization.as_deref(),
        Some(rid),
        Some(req.headers()),
    )?;
    let Some(resp) = ask_origin(again, line).await else {
        return error_response(&origin::opaque(), rid);
    };
    let out = headers(seeds::answer_headers(|n| resp.headers().get(n).ok()?), rid)?;
    relay(resp, out, rid, line).await
}

/// A `GET` of `url` with `authorization`, the correlation ID and the conditional headers of
/// `client` ([`seeds::CONDITIONAL_HEADERS`]), and nothing else.
fn get_request(
    url: &str,
    authorization: Option<&str>,
    rid: Option<&str>,
    client: Option<&Headers>,
) -> Result<Request> {
    let headers = Headers::new();
    if let Some(a) = authorization {
        headers.set("authorization", a)?;
    }
    if let Some(rid) = rid {
        headers.set(REQUEST_ID_HEADER, rid)?;
    }
    if let Some(client) = client {
        for name in seeds::CONDITIONAL_HEADERS {
            if let Some(v) = client.get(name)? {
                headers.set(name, &v)?;
            }
        }
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Get).with_headers(headers);
    Request::new_with_init(url, &init)
}

/// The copy of the origin's 200 answer the cache keeps: its body, unread.
fn stored(resp: Response, version: Option<&str>, seed_cache_secs: u64) -> Result<Response> {
    let out = Headers::new();
    for (name, value) in
        seeds::stored_headers(|n| resp.headers().get(n).ok()?, version, seed_cache_secs)
    {
        out.set(name, &value)?;
    }
    let (_, body) = resp.into_parts();
    Ok(ResponseBuilder::new()
        .with_status(200)
        .with_headers(out)
        .body(body))
}

/// The cache's answer (200, 206, 304 or 416) to the client, streamed.
fn answer(cached: Response, rid: &str) -> Result<Response> {
    let status = cached.status_code();
    let out = headers(
        seeds::answer_headers(|n| cached.headers().get(n).ok()?),
        rid,
    )?;
    let (_, body) = cached.into_parts();
    Ok(ResponseBuilder::new()
        .with_status(status)
        .with_headers(out)
        .body(body))
}

fn headers(pairs: Vec<(&'static str, String)>, rid: &str) -> Result<Headers> {
    let out = Headers::new();
    for (name, value) in pairs {
        out.set(name, &value)?;
    }
    out.set(REQUEST_ID_HEADER, rid)?;
    Ok(out)
}
