//! What the gateway answers for what the origin answered. A 1xx–4xx answer is passed
//! through (status, body and its protocol headers); so is a 5xx answer whose body is a
//! protocol 3 error body for that status (`temporary_unavailable` with its `reason`, say).
//! Anything else from the origin — no answer, a 5xx page from a proxy, a 5xx body that is
//! not the spec's — becomes the spec's opaque `temporary_unavailable` body: nothing of an
//! origin failure leaks to the client.

use synchro_protocol::wire::{ErrorBody, Message};

/// Response headers copied from the origin (every other is dropped).
pub const PASSED_HEADERS: [&str; 4] = [
    "content-type",
    "cache-control",
    "retry-after",
    synchro_protocol::wire::SCOPE_ROWS_HEADER,
];

/// The correlation header: generated at the edge, sent to the origin and to the client.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The opaque answer for an origin failure: 503 `temporary_unavailable`, no reason.
pub fn opaque() -> ErrorBody {
    ErrorBody::unavailable(None)
}

/// The body to send for an origin 5xx answer with `status` and body `text`: the origin's
/// own when it is a spec error body of that status, otherwise `None` (send [`opaque`]).
pub fn server_error_body(status: u16, text: &str) -> Option<String> {
    let body = ErrorBody::parse(text).ok()?;
    (body.code.status() == status).then(|| body.to_json_string())
}

/// `GET /ready` through the edge: the origin's 200 `{"status":"ready"}` or 503
/// `{"status":"unready"}` as they are; anything else (the origin unreachable or answering
/// something else) is 503 `{"status":"unready"}`.
pub fn ready_answer(origin: Option<(u16, &str)>) -> (u16, &'static str) {
    const READY: &str = r#"{"status":"ready"}"#;
    const UNREADY: &str = r#"{"status":"unready"}"#;
    match origin {
        Some((200, text)) if text == READY => (200, READY),
        _ => (503, UNREADY),
    }
}

/// A correlation ID from 16 random bytes: 32 lowercase hex digits.
pub fn request_id(random: [u8; 16]) -> String {
    random.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_spec_error_body_of_its_status_passes() {
        let busy = r#"{"error":{"code":"temporary_unavailable","message":"the service is temporarily unavailable","reason":"push_busy","retryable":true}}"#;
        assert_eq!(server_error_body(503, busy).as_deref(), Some(busy));
        assert_eq!(
            server_error_body(500, busy),
            None,
            "status and code disagree"
        );
        assert_eq!(server_error_body(502, "<html>bad gateway</html>"), None);
        assert_eq!(server_error_body(503, r#"{"error":{"code":"x"}}"#), None);
        assert_eq!(opaque().code.status(), 503);
        assert_eq!(
            opaque().to_json_string(),
            r#"{"error":{"code":"temporary_unavailable","message":"the service is temporarily unavailable","retryable":true}}"#
        );
    }

    #[test]
    fn ready_is_ready_only_when_the_origin_says_so() {
        assert_eq!(ready_answer(Some((200, r#"{"status":"ready"}"#))).0, 200);
        assert_eq!(ready_answer(Some((503, r#"{"status":"unready"}"#))).0, 503);
        assert_eq!(ready_answer(Some((200, "ok"))).0, 503);
        assert_eq!(ready_answer(None), (503, r#"{"status":"unready"}"#));
    }

    #[test]
    fn request_ids_are_hex() {
        assert_eq!(request_id([0xab; 16]), "ab".repeat(16));
    }
}
