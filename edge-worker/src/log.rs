//! The gateway's one log line per request. It holds only bounded values — the correlation
//! ID the edge generated, the endpoint, the status, the error code and the check that
//! refused, the origin's answer time — and never a token, header, body, row value, key or a
//! user, client or scope ID (the whole-stack canary test reads `wrangler dev`'s output for
//! them).

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
    /// What decided the answer: a [`crate::gate::Reason`], `forwarded`, `origin_unreachable`,
    /// `origin_error`, `no_route` or `config`.
    pub outcome: &'static str,
    /// Milliseconds the origin took, when it was asked.
    pub origin_ms: Option<u64>,
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
            origin_ms: None,
        };
        assert_eq!(
            l.to_string(),
            format!("synchro-edge request_id={} endpoint=pull status=401 code=unauthorized outcome=unauthorized", "ab".repeat(16))
        );
    }
}
