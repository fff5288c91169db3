//! What the gateway checks before any origin request, in the server's order
//! (`synchro_protocol::wire::gate`, the code the server runs): the route, the body size, the
//! body as a protocol 3 JSON object (426 before anything else), the bearer token (401), then
//! the request's members through the endpoint's typed wire message (400). A seed file
//! (`GET /seeds/{name}`) has no body: only its token is checked ([`check_seed`]), before the
//! edge cache is consulted. A refusal carries exactly the body the server would send and a
//! bounded reason for the log.

use synchro_protocol::jwt::Verifier;
use synchro_protocol::wire::{
    gate, ConnectRequest, ErrorBody, ErrorCode, EventsRequest, PullRequest, PushRequest,
    RebuildRequest,
};

/// An endpoint the gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /sync/connect`
    Connect,
    /// `POST /sync/pull`
    Pull,
    /// `POST /sync/push`
    Push,
    /// `POST /sync/rebuild`
    Rebuild,
    /// `POST /sync/events` (a server-sent-events stream)
    Events,
    /// `GET /ready`
    Ready,
    /// `GET /seeds/{name}`: a seed artifact or its evidence, answered from the edge cache.
    Seed,
}

/// A request for no endpoint, answered as the server's router answers it (no body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoute {
    /// 404: no such path.
    NotFound,
    /// 405: a known path with another method (`allow` names the one it takes).
    MethodNotAllowed(&'static str),
}

impl NoRoute {
    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            NoRoute::NotFound => 404,
            NoRoute::MethodNotAllowed(_) => 405,
        }
    }
}

impl Endpoint {
    /// Every endpoint.
    pub const ALL: [Endpoint; 7] = [
        Endpoint::Connect,
        Endpoint::Pull,
        Endpoint::Push,
        Endpoint::Rebuild,
        Endpoint::Events,
        Endpoint::Ready,
        Endpoint::Seed,
    ];

    /// The endpoint of `method` and `path` (the path without query). A seed path is
    /// `/seeds/` and one nonempty segment, as the server's router takes it; which names
    /// exist is the origin's to say.
    pub fn route(method: &str, path: &str) -> Result<Endpoint, NoRoute> {
        let e = match path.strip_prefix(Endpoint::Seed.path()) {
            Some(name) if !name.is_empty() && !name.contains('/') => Endpoint::Seed,
            Some(_) => return Err(NoRoute::NotFound),
            None => Endpoint::ALL
                .into_iter()
                .find(|e| e.path() == path)
                .ok_or(NoRoute::NotFound)?,
        };
        // The server's router (axum) answers HEAD on a GET route too.
        let ok = match e.method() {
            "GET" => method == "GET" || method == "HEAD",
            m => method == m,
        };
        ok.then_some(e).ok_or(NoRoute::MethodNotAllowed(e.allow()))
    }

    /// The path, the same at the edge and at the origin; for [`Endpoint::Seed`] the prefix
    /// before the file name.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Connect => "/sync/connect",
            Endpoint::Pull => "/sync/pull",
            Endpoint::Push => "/sync/push",
            Endpoint::Rebuild => "/sync/rebuild",
            Endpoint::Events => "/sync/events",
            Endpoint::Ready => "/ready",
            Endpoint::Seed => "/seeds/",
        }
    }

    /// The method.
    pub fn method(self) -> &'static str {
        match self {
            Endpoint::Ready | Endpoint::Seed => "GET",
            _ => "POST",
        }
    }

    fn allow(self) -> &'static str {
        match self.method() {
            "GET" => "GET,HEAD",
            _ => "POST",
        }
    }

    /// The name in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Connect => "connect",
            Endpoint::Pull => "pull",
            Endpoint::Push => "push",
            Endpoint::Rebuild => "rebuild",
            Endpoint::Events => "events",
            Endpoint::Ready => "ready",
            Endpoint::Seed => "seed",
        }
    }
}

/// Which check refused a request (bounded, for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The body is larger than the limit.
    BodyTooLarge,
    /// The body is not UTF-8 JSON object, or holds NUL.
    Body,
    /// The protocol version is not 3.
    Protocol,
    /// No valid bearer token.
    Unauthorized,
    /// A member is missing, unknown, of the wrong type or out of range.
    Request,
}

impl Reason {
    /// The log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BodyTooLarge => "body_too_large",
            Reason::Body => "body",
            Reason::Protocol => "protocol",
            Reason::Unauthorized => "unauthorized",
            Reason::Request => "request",
        }
    }
}

/// A request refused at the edge: the server's body for it, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Exactly the body (and so the status) the server would answer.
    pub body: ErrorBody,
    /// Which check refused it.
    pub reason: Reason,
}

impl Refusal {
    /// The body too large refusal.
    pub fn body_too_large() -> Refusal {
        Refusal {
            body: gate::body_too_large(),
            reason: Reason::BodyTooLarge,
        }
    }
}

/// Whether a declared `content-length` already exceeds `limit` (the server refuses it
/// before reading; an unparsable one is judged by the bytes read).
pub fn declared_too_large(content_length: Option<&str>, limit: usize) -> bool {
    content_length
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > limit)
}

/// Checks one POST request's whole body (already within the size limit) and its
/// `Authorization` value at `now_secs`, as the server's preamble does, and a push's bounds
/// (the server's default [`gate::PushLimits`]) as its push handler does first.
pub fn check(
    endpoint: Endpoint,
    body: &[u8],
    authorization: Option<&str>,
    verifier: &Verifier,
    now_secs: u64,
) -> Result<(), Refusal> {
    let req = gate::read_request(body).map_err(|body| Refusal {
        reason: if body.code == ErrorCode::UpgradeRequired {
            Reason::Protocol
        } else {
            Reason::Body
        },
        body,
    })?;
    if verifier.user_id(authorization, now_secs).is_none() {
        return Err(Refusal {
            body: gate::unauthorized(),
            reason: Reason::Unauthorized,
        });
    }
    let parsed = match endpoint {
        Endpoint::Connect => gate::parse_request::<ConnectRequest>(&req).map(drop),
        Endpoint::Pull => gate::parse_request::<PullRequest>(&req).map(drop),
        Endpoint::Push => gate::parse_request::<PushRequest>(&req)
            .and_then(|push| gate::PushLimits::default().check(&push)),
        Endpoint::Rebuild => gate::parse_request::<RebuildRequest>(&req).map(drop),
        Endpoint::Events => gate::parse_request::<EventsRequest>(&req).map(drop),
        Endpoint::Ready | Endpoint::Seed => Ok(()),
    };
    parsed.map_err(|body| Refusal {
        body,
        reason: Reason::Request,
    })
}

/// Checks a seed request's `Authorization` value at `now_secs` as the server's seeds route
/// does: a valid bearer token (401 otherwise), or nothing when seeds are `public`. It runs
/// before the edge cache is consulted, so a cached seed is never answered without it.
pub fn check_seed(
    authorization: Option<&str>,
    verifier: &Verifier,
    public: bool,
    now_secs: u64,
) -> Result<(), Refusal> {
    if public || verifier.user_id(authorization, now_secs).is_some() {
        return Ok(());
    }
    Err(Refusal {
        body: gate::unauthorized(),
        reason: Reason::Unauthorized,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use synchro_protocol::json::Json;
    use synchro_protocol::wire::Message;

    const SECRET: &[u8] = b"edge-gate-secret-0123456789";
    const NOW: u64 = 1_800_000_000;

    fn bearer() -> String {
        let claims = Json::parse(&format!(r#"{{"sub":"alice","exp":{}}}"#, NOW + 600)).unwrap();
        format!("Bearer {}", synchro_protocol::jwt::mint(SECRET, &claims))
    }

    fn verdict(endpoint: Endpoint, body: &str, auth: Option<&str>) -> Result<(), (u16, Reason)> {
        let v = Verifier::hs256(SECRET, 3600).unwrap();
        check(endpoint, body.as_bytes(), auth, &v, NOW)
            .map_err(|r| (r.body.code.status(), r.reason))
    }

    #[test]
    fn routes_like_the_server() {
        assert_eq!(Endpoint::route("POST", "/sync/pull"), Ok(Endpoint::Pull));
        assert_eq!(Endpoint::route("HEAD", "/ready"), Ok(Endpoint::Ready));
        assert_eq!(
            Endpoint::route("GET", "/sync/pull"),
            Err(NoRoute::MethodNotAllowed("POST"))
        );
        assert_eq!(
            Endpoint::route("POST", "/sync/other"),
            Err(NoRoute::NotFound)
        );
        assert_eq!(
            Endpoint::route("POST", "/sync/pull/"),
            Err(NoRoute::NotFound)
        );
        assert_eq!(
            Endpoint::route("GET", "/seeds/board.seed.sqlite"),
            Ok(Endpoint::Seed)
        );
        assert_eq!(
            Endpoint::route("HEAD", "/seeds/..%2Fx.json"),
            Ok(Endpoint::Seed)
        );
        assert_eq!(
            Endpoint::route("POST", "/seeds/board.seed.sqlite"),
            Err(NoRoute::MethodNotAllowed("GET,HEAD"))
        );
        for path in ["/seeds/", "/seeds", "/seeds/a/b", "/seeds//"] {
            assert_eq!(
                Endpoint::route("GET", path),
                Err(NoRoute::NotFound),
                "{path}"
            );
        }
    }

    #[test]
    fn a_seed_needs_a_valid_token_unless_public() {
        let v = Verifier::hs256(SECRET, 3600).unwrap();
        let auth = bearer();
        assert_eq!(check_seed(Some(&auth), &v, false, NOW), Ok(()));
        for bad in [None, Some("Bearer x.y.z"), Some(&auth[7..])] {
            let refusal = check_seed(bad, &v, false, NOW).unwrap_err();
            assert_eq!(refusal.body, gate::unauthorized());
            assert_eq!(refusal.reason, Reason::Unauthorized);
            assert_eq!(check_seed(bad, &v, true, NOW), Ok(()), "public");
        }
        let expired = check_seed(Some(&auth), &v, false, NOW + 3600);
        assert!(expired.is_err(), "an expired token");
    }

    #[test]
    fn refuses_in_the_server_order() {
        let auth = bearer();
        let auth = Some(auth.as_str());
        let pull = r#"{"protocol_version":3,"client_id":"c","client_generation":1,"schema":{"version":1,"hash":"00"},"cursors":{},"limit":10}"#;
        // Protocol before token, token before members.
        assert_eq!(
            verdict(Endpoint::Pull, r#"{"protocol_version":2}"#, None),
            Err((426, Reason::Protocol))
        );
        assert_eq!(verdict(Endpoint::Pull, "{", auth), Err((400, Reason::Body)));
        assert_eq!(
            verdict(Endpoint::Pull, r#"{"protocol_version":3}"#, None),
            Err((401, Reason::Unauthorized))
        );
        assert_eq!(
            verdict(Endpoint::Pull, r#"{"protocol_version":3}"#, auth),
            Err((400, Reason::Request))
        );
        assert_eq!(
            verdict(Endpoint::Pull, r#"{"protocol_version":3,"x":1}"#, auth),
            Err((400, Reason::Request))
        );
        let parsed = PullRequest::parse(pull);
        assert_eq!(verdict(Endpoint::Pull, pull, auth).is_ok(), parsed.is_ok());
    }

    #[test]
    fn a_declared_length_over_the_limit_is_refused_before_reading() {
        assert!(declared_too_large(Some("1025"), 1024));
        assert!(!declared_too_large(Some("1024"), 1024));
        assert!(!declared_too_large(Some("x"), 1024));
        assert!(!declared_too_large(None, 1024));
        assert_eq!(Refusal::body_too_large().body.code.status(), 400);
    }
}
