//! The gateway's one log line per request. It holds only bounded values — the correlation
//! ID the edge generated, the endpoint, the status, the error code and the check that
//! refused, whether the edge cache answered, the origin's answer time — and never a token,
//! header, body, seed file name, row value, key or a user, client or scope ID (the
//! whole-stack canary test reads `wrangler dev`'s output for them).

use std::fmt;

use synchro_protocol::wire::ErrorCode;

/// One request's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The correlation ID.
    pub request_id: String,
    /// The endpoint name, or `none` for an unrouted path.
    pub endpoint: &'static str,
    /// The answered status.
    pub status: u16,
    /// The error code answered, if any.
    pub code: Option<ErrorCode>,
    /// What decided the answer: a [`crate::gate::Reason`], `forwarded`, `cached` (a seed
    /// from the edge cache), `uncached` (a seed the cache did not keep, asked of the origin
    /// again as the client asked it), `origin_unreachable`, `origin_error`, `no_route` or
    /// `config`.
    pub outcome: &'static str,
    /// Whether the edge cache held the answer, when it was consulted (seed files).
    pub cache: Option<CacheUse>,
    /// Milliseconds the origin took, when it was asked.
    pub origin_ms: Option<u64>,
}

/// What the edge cache did for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// Answered from the cache, without an origin request.
    Hit,
    /// Not in the cache: the origin was asked.
    Miss,
}

impl CacheUse {
    /// The log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheUse::Hit => "hit",
            CacheUse::Miss => "miss",
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "synchro-edge request_id={} endpoint={} status={} code={} outcome={}",
            self.request_id,
            self.endpoint,
            self.status,
            self.code.map_or("-", ErrorCode::as_str),
            self.outcome
        )?;
        if let Some(c) = self.cache {
            write!(f, " cache={}", c.as_str())?;
        }
        if let Some(ms) = self.origin_ms {
            write!(f, " origin_ms={ms}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_bounded_fields_only() {
        let l = Line {
            request_id: "ab".repeat(16),
            endpoint: "pull",
            status: 401,
            code: Some(ErrorCode::Unauthorized),
            outcome: "unauthorized",
            cache: None,
            origin_ms: None,
        };
        assert_eq!(
            l.to_string(),
            format!("synchro-edge request_id={} endpoint=pull status=401 code=unauthorized outcome=unauthorized", "ab".repeat(16))
        );
        let miss = Line {
            endpoint: "seed",
            status: 200,
            code: None,
            outcome: "forwarded",
            cache: Some(CacheUse::Miss),
            origin_ms: Some(12),
            ..l.clone()
        };
        assert!(miss.to_string().ends_with(
            " endpoint=seed status=200 code=- outcome=forwarded cache=miss origin_ms=12"
        ));
        let hit = Line {
            outcome: "cached",
            cache: Some(CacheUse::Hit),
            origin_ms: None,
            ..miss
        };
        assert!(hit.to_string().ends_with(" outcome=cached cache=hit"));
    }
}
