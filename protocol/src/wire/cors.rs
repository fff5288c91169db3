//! Cross-origin requests from browsers: the one policy of the server (`serve --cors-origin`)
//! and the edge gateway (`CORS_ORIGINS`). An app served from another origin than the API
//! (Vite on :5173, the server on :8787) may call it when its origin is listed. A preflight
//! (`OPTIONS` with `Access-Control-Request-Method`) from a listed origin is answered 204 with
//! the methods and request headers the client uses; one from any other origin 403, without
//! CORS headers. Every response to a listed origin, errors included (so the app can read a
//! 401 or a 503 rather than see a network failure), carries `Access-Control-Allow-Origin`
//! and exposes `Retry-After` and the rebuild's `x-synchro-scope-rows`. Bearer tokens are not cookies: no credentials mode is involved,
//! so `*` (any origin) is allowed too.

/// The origins allowed to call the API from a browser.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsOrigins {
    any: bool,
    origins: Vec<String>,
}

/// What to answer a request, given its `Origin` and whether it is a preflight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsAnswer {
    /// Not a cross-origin request this policy concerns (no `Origin`, or no origin listed):
    /// handle it and add nothing.
    None,
    /// A preflight from a listed origin: answer 204 with these headers.
    Preflight(Vec<(&'static str, String)>),
    /// A preflight from an origin not listed: answer 403 without CORS headers.
    Refused,
    /// An actual request: handle it, then add these headers to its response (none when the
    /// origin is not listed).
    Respond(Vec<(&'static str, String)>),
}

/// The request headers the client sends.
pub const ALLOWED_HEADERS: &str = "authorization, content-type";

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

    /// Whether `origin` may call the API.
    pub fn allows(&self, origin: &str) -> bool {
        self.any || self.origins.iter().any(|o| o == origin)
    }

    /// The answer to a request with `origin` (its `Origin` header); `preflight` when it is
    /// `OPTIONS` with `Access-Control-Request-Method`.
    pub fn answer(&self, origin: Option<&str>, preflight: bool) -> CorsAnswer {
        let Some(origin) = origin.filter(|_| !self.is_empty()) else {
            return CorsAnswer::None;
        };
        let allowed = self.allows(origin);
        let mut headers = vec![
            ("access-control-allow-origin", origin.to_owned()),
            ("vary", "origin".to_owned()),
        ];
        match (preflight, allowed) {
            (true, false) => CorsAnswer::Refused,
            (true, true) => {
                headers.extend([
                    ("access-control-allow-methods", "GET, POST".to_owned()),
                    ("access-control-allow-headers", ALLOWED_HEADERS.to_owned()),
                    ("access-control-max-age", "600".to_owned()),
                ]);
                CorsAnswer::Preflight(headers)
            }
            (false, false) => CorsAnswer::Respond(Vec::new()),
            (false, true) => {
                headers.push((
                    "access-control-expose-headers",
                    format!("retry-after, {}", super::SCOPE_ROWS_HEADER),
                ));
                CorsAnswer::Respond(headers)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn answers_follow_the_origin_and_the_request_kind() {
        let app = "http://localhost:5173";
        let cors = CorsOrigins::parse([app]).unwrap();
        assert_eq!(cors.answer(None, true), CorsAnswer::None);
        assert_eq!(
            CorsOrigins::default().answer(Some(app), true),
            CorsAnswer::None
        );
        assert_eq!(
            cors.answer(Some("http://evil.example"), true),
            CorsAnswer::Refused
        );
        assert_eq!(
            cors.answer(Some("http://evil.example"), false),
            CorsAnswer::Respond(Vec::new())
        );
        let CorsAnswer::Preflight(h) = cors.answer(Some(app), true) else {
            panic!("a listed origin's preflight is answered")
        };
        assert!(h.contains(&("access-control-allow-origin", app.to_owned())));
        assert!(h.contains(&("access-control-allow-headers", ALLOWED_HEADERS.to_owned())));
        let CorsAnswer::Respond(h) = cors.answer(Some(app), false) else {
            panic!("a listed origin's request is answered with headers")
        };
        assert!(h.contains(&(
            "access-control-expose-headers",
            "retry-after, x-synchro-scope-rows".to_owned()
        )));
    }
}
