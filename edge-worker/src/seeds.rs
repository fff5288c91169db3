//! The edge cache of seed files (`GET /seeds/{name}`, issue 30): what is stored, under which
//! key, for how long, and which headers a client gets. The I/O (the Workers Cache API,
//! `caches.default`) is the handler's; this module decides.
//!
//! - The token is checked before the cache is consulted ([`crate::gate::check_seed`]): every
//!   valid token gets the same bytes (a seed holds only declared shared scopes' rows), so one
//!   cached copy serves them all, and no client without a token ever reads it unless seeds
//!   are public.
//! - The key is the edge URL's origin, the path and the `v` query member (nothing else of
//!   the query): `https://edge.example.com/seeds/board.seed.sqlite?v=<sha256>`.
//! - Only a full 200 answer with an ETag is stored ([`storable`]); with `?v=` its ETag must
//!   be that version. A 4xx, 5xx, 206 or 304 answer never is.
//! - The stored copy's `Cache-Control` is the edge's ([`stored_cache_control`]): a year for a
//!   `?v=` version (content-addressed, immutable), `SEED_CACHE_SECS` for a bare name (it may
//!   be exported again). The origin's own `Cache-Control` (`private`/`public`, `no-cache` or
//!   immutable) is kept beside it ([`ORIGIN_CACHE_CONTROL`]) and is what clients receive.
//! - Range and If-None-Match are answered by the cache itself (`cache.match` on the stored
//!   full answer: 206 with `Content-Range`, 416, 304), on a hit and on a miss alike (a miss
//!   is stored first, then matched).

/// The header of a stored copy that keeps the origin's `Cache-Control` (clients receive it
/// as `cache-control`; the cache itself obeys the edge's).
pub const ORIGIN_CACHE_CONTROL: &str = "x-synchro-origin-cache-control";

/// The headers of a seed answer passed to the client (besides `cache-control` and the
/// correlation ID); every other header is dropped.
pub const ANSWER_HEADERS: [&str; 5] = [
    "content-type",
    "content-length",
    "content-range",
    "accept-ranges",
    "etag",
];

/// The request headers the cache evaluates for a client (everything else of the client's
/// request stays out of the lookup).
pub const CONDITIONAL_HEADERS: [&str; 2] = ["range", "if-none-match"];

/// How long a `?v=` version is kept: a year, as the origin's immutable answer says.
pub const VERSIONED_SECS: u64 = 31_536_000;

/// The cache key of a seed file: `base` (the edge URL's scheme and host), the path
/// `/seeds/{name}` (`name` as it arrived, percent-encoded) and `?v=` when a version was
/// asked for.
pub fn cache_key(base: &str, name: &str, version: Option<&str>) -> String {
    with_version(format!("{base}/seeds/{name}"), version)
}

/// The origin URL of a seed file (`origin` without a trailing slash).
pub fn origin_url(origin: &str, name: &str, version: Option<&str>) -> String {
    with_version(format!("{origin}/seeds/{name}"), version)
}

fn with_version(mut url: String, version: Option<&str>) -> String {
    if let Some(v) = version {
        url.push_str("?v=");
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                url.push(char::from(b));
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
    }
    url
}

/// Whether an origin answer to a full `GET` (no `Range`, no `If-None-Match`) is stored: a
/// 200 with an ETag, and with a `version` the ETag of that version.
pub fn storable(status: u16, etag: Option<&str>, version: Option<&str>) -> bool {
    let Some(etag) = etag else {
        return false;
    };
    status == 200 && version.is_none_or(|v| etag == format!("\"{v}\""))
}

/// The `Cache-Control` the cache obeys for a stored copy.
pub fn stored_cache_control(version: Option<&str>, seed_cache_secs: u64) -> String {
    let secs = if version.is_some() {
        VERSIONED_SECS
    } else {
        seed_cache_secs
    };
    format!("max-age={secs}")
}

/// The headers of the copy to store, from the origin's 200 answer (`get` reads one of its
/// headers).
pub fn stored_headers(
    get: impl Fn(&str) -> Option<String>,
    version: Option<&str>,
    seed_cache_secs: u64,
) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = ANSWER_HEADERS
        .into_iter()
        .filter_map(|name| get(name).map(|v| (name, v)))
        .collect();
    out.push((
        "cache-control",
        stored_cache_control(version, seed_cache_secs),
    ));
    if let Some(cc) = get("cache-control") {
        out.push((ORIGIN_CACHE_CONTROL, cc));
    }
    out
}

/// The headers a client gets (`get` reads the cached copy's or the origin's answer): the
/// passed ones, and `cache-control` as the origin sent it.
pub fn answer_headers(get: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = ANSWER_HEADERS
        .into_iter()
        .filter_map(|name| get(name).map(|v| (name, v)))
        .collect();
    if let Some(cc) = get(ORIGIN_CACHE_CONTROL).or_else(|| get("cache-control")) {
        out.push(("cache-control", cc));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn headers(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn keys_hold_the_path_and_only_the_version() {
        assert_eq!(
            cache_key("https://edge.example.com", "board.seed.sqlite", None),
            "https://edge.example.com/seeds/board.seed.sqlite"
        );
        assert_eq!(
            cache_key("http://127.0.0.1:8787", "board.seed.sqlite", Some(SHA)),
            format!("http://127.0.0.1:8787/seeds/board.seed.sqlite?v={SHA}")
        );
        assert_eq!(
            origin_url("http://o", "a.json", Some("x y&z=1")),
            "http://o/seeds/a.json?v=x%20y%26z%3D1"
        );
    }

    #[test]
    fn only_a_full_answer_with_its_etag_is_stored() {
        let etag = format!("\"{SHA}\"");
        assert!(storable(200, Some(&etag), None));
        assert!(storable(200, Some(&etag), Some(SHA)));
        assert!(
            !storable(200, Some(&etag), Some(&"0".repeat(64))),
            "another version"
        );
        assert!(!storable(200, None, None), "no ETag");
        for status in [206, 304, 401, 404, 416, 500, 503] {
            assert!(!storable(status, Some(&etag), None), "{status}");
        }
    }

    #[test]
    fn the_cache_obeys_the_edge_and_clients_get_the_origins_cache_control() {
        let origin = headers(&[
            ("content-type", "application/vnd.sqlite3"),
            ("content-length", "4096"),
            ("accept-ranges", "bytes"),
            ("etag", "\"e\""),
            ("cache-control", "private, no-cache"),
            ("set-cookie", "a=b"),
            ("server", "x"),
        ]);
        let stored = stored_headers(&origin, None, 60);
        assert_eq!(
            stored,
            vec![
                ("content-type", "application/vnd.sqlite3".to_owned()),
                ("content-length", "4096".to_owned()),
                ("accept-ranges", "bytes".to_owned()),
                ("etag", "\"e\"".to_owned()),
                ("cache-control", "max-age=60".to_owned()),
                (ORIGIN_CACHE_CONTROL, "private, no-cache".to_owned()),
            ]
        );
        let versioned = stored_headers(&origin, Some(SHA), 60);
        assert!(versioned.contains(&("cache-control", "max-age=31536000".to_owned())));
        // What the cache answers (its own headers added) becomes the origin's answer again.
        let mut cached: Vec<(&str, &str)> = stored.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cached.push(("cf-cache-status", "HIT"));
        cached.push(("content-range", "bytes 0-9/4096"));
        let answer = answer_headers(headers(&cached));
        assert!(answer.contains(&("cache-control", "private, no-cache".to_owned())));
        assert!(answer.contains(&("content-range", "bytes 0-9/4096".to_owned())));
        assert!(!answer.iter().any(|(k, _)| *k == ORIGIN_CACHE_CONTROL));
        assert!(!answer.iter().any(|(k, _)| *k == "cf-cache-status"));
        assert_eq!(
            answer.iter().filter(|(k, _)| *k == "cache-control").count(),
            1
        );
        // An origin answer passed as it is keeps its own.
        let direct = answer_headers(&origin);
        assert!(direct.contains(&("cache-control", "private, no-cache".to_owned())));
        assert!(!direct.iter().any(|(k, _)| *k == "set-cookie"));
    }
}
