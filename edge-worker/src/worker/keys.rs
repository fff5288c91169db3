//! The identity provider's key set (`JWKS_URL`), kept per isolate: fetched on the first
//! request that needs it, again once older than [`jwks::REFRESH_SECS`], and when a token
//! names a `kid` the set does not hold, at most once per [`jwks::MIN_REFETCH_SECS`] (a
//! rotated-in key is accepted within that bound; made-up `kid`s cost the provider at most one
//! request per interval per isolate). A failed fetch keeps the keys already held and is
//! logged without the URL.

use std::cell::RefCell;
use std::sync::Arc;

use futures_util::StreamExt;
use synchro_protocol::jwt::jwks::{self, KeySet};
use synchro_protocol::jwt::{Refusal, Verifier};
use worker::{Fetch, Headers, Method, Request, RequestInit};

use super::now_secs;
use crate::config::Config;

#[derive(Default)]
struct Cache {
    keys: Option<(Arc<KeySet>, u64)>,
    last_attempt: Option<u64>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The configured verifier with the current key set (when `JWKS_URL` is set), fetching it
/// first when needed for this `Authorization` value.
pub(super) async fn verifier(config: &Config, authorization: Option<&str>) -> Verifier {
    let Some(url) = &config.jwks_url else {
        return config.verifier.clone();
    };
    let now = now_secs();
    let (held, may_fetch) = CACHE.with_borrow(|c| {
        (
            c.keys.clone(),
            c.last_attempt
                .is_none_or(|t| now.saturating_sub(t) >= jwks::MIN_REFETCH_SECS),
        )
    });
    let stale = held
        .as_ref()
        .is_none_or(|(_, at)| now.saturating_sub(*at) >= jwks::REFRESH_SECS);
    let with = |keys: Option<Arc<KeySet>>| match keys {
        Some(keys) => config.verifier.with_keys(keys),
        None => config.verifier.clone(),
    };
    let verifier = with(held.map(|(k, _)| k));
    let unknown = jwks::wants_key_set(authorization)
        && matches!(
            verifier.check(authorization, now),
            Err(Refusal::UnknownKey | Refusal::Algorithm)
        );
    if !(may_fetch && (stale || unknown)) {
        return verifier;
    }
    CACHE.with_borrow_mut(|c| c.last_attempt = Some(now));
    match fetch(url).await {
        Ok(keys) => {
            let keys = Arc::new(keys);
            CACHE.with_borrow_mut(|c| c.keys = Some((keys.clone(), now)));
            with(Some(keys))
        }
        Err(e) => {
            worker::console_error!(
                "synchro-edge the key set at JWKS_URL could not be used ({e}); tokens signed by keys not already held are refused until it can"
            );
            verifier
        }
    }
}

async fn fetch(url: &str) -> Result<KeySet, String> {
    let headers = Headers::new();
    headers
        .set("accept", "application/json")
        .map_err(|_| "the request could not be made".to_owned())?;
    let mut init = RequestInit::new();
    init.with_method(Method::Get).with_headers(headers);
    let request = Request::new_with_init(url, &init)
        .map_err(|_| "the request could not be made".to_owned())?;
    let mut response = Fetch::Request(request)
        .send()
        .await
        .map_err(|_| "the request failed".to_owned())?;
    let status = response.status_code();
    if !(200..300).contains(&status) {
        return Err(format!("it answered HTTP {status}"));
    }
    let mut stream = response
        .stream()
        .map_err(|_| "its body could not be read".to_owned())?;
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| "its body could not be read".to_owned())?;
        if body.len() + chunk.len() > jwks::MAX_JWKS_BYTES {
            return Err(jwks::JwksError::TooLarge.to_string());
        }
        body.extend_from_slice(&chunk);
    }
    KeySet::parse(&body).map_err(|e| e.to_string())
}
