//! The request gate every endpoint runs first, in the spec's order, shared by the server and
//! the edge gateway so that both refuse a request with the same status, code and body:
//! body size ([`body_too_large`]), UTF-8 and JSON object, the protocol version (426 before
//! anything else), NUL characters ([`read_request`]), the bearer token ([`unauthorized`],
//! verified by the caller with [`crate::jwt`]), then the request's members through its
//! `wire` type ([`parse_request`]).

use super::{ErrorBody, ErrorCode, Message, PushRequest};
use crate::jcs::to_output_string;
use crate::json::Json;

/// 400 `invalid_request` with a bounded diagnostic.
pub fn invalid_request(message: &'static str) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

/// 400 `invalid_request`: the body is larger than the configured maximum.
pub fn body_too_large() -> ErrorBody {
    invalid_request("the request body exceeds the configured maximum")
}

/// 401 `unauthorized`.
pub fn unauthorized() -> ErrorBody {
    ErrorBody::new(ErrorCode::Unauthorized, "a valid bearer token is required")
}

/// 426 `upgrade_required`: the protocol version (`runtime` false), or the client runtime
/// (`runtime` true), is too old.
pub fn upgrade_required(received_protocol_version: Option<u64>, runtime: bool) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::UpgradeRequired,
        if runtime {
            "the client runtime is below the minimum supported version"
        } else {
            "protocol version 3 is required"
        },
    )
    .with(
        "required_protocol_version",
        Json::Number(crate::PROTOCOL_VERSION.to_string()),
    )
    .with(
        "received_protocol_version",
        received_protocol_version.map_or(Json::Null, |v| Json::Number(v.to_string())),
    )
}

/// A request body read up to the token check: UTF-8, one JSON object, protocol version 3
/// (426 otherwise), and no NUL in any string or member name except pushed row data (which
/// push refuses per mutation as `invalid_value`).
pub fn read_request(body: &[u8]) -> Result<Json, ErrorBody> {
    let text = std::str::from_utf8(body).map_err(|_| invalid_request("the body is not UTF-8"))?;
    let req = Json::parse(text)
        .ok()
        .filter(|j| matches!(j, Json::Object(_)))
        .ok_or(invalid_request("the body is not a valid JSON object"))?;
    // Protocol compatibility comes before everything else (spec 000).
    let protocol_version = super::protocol_version(&req);
    if protocol_version != Some(u64::from(crate::PROTOCOL_VERSION)) {
        return Err(upgrade_required(protocol_version, false));
    }
    // PostgreSQL text cannot hold NUL: refuse it here rather than fail a statement later
    // (which would look like an outage).
    if request_has_nul(&req) {
        return Err(invalid_request(
            "a string in the request contains a NUL character",
        ));
    }
    Ok(req)
}

/// The request's members read strictly as `R` (400 `invalid_request` naming the member).
pub fn parse_request<R: Message>(req: &Json) -> Result<R, ErrorBody> {
    R::from_json(req).map_err(|e| invalid_request(e.message))
}

/// Push bounds, checked right after the request is read (400 before any work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushLimits {
    /// Mutations per batch.
    pub mutations: usize,
    /// Bytes of one mutation in canonical JSON.
    pub mutation_bytes: usize,
    /// Columns per mutation.
    pub columns: usize,
}

impl Default for PushLimits {
    /// The original project's defaults (spec-gaps).
    fn default() -> Self {
        PushLimits {
            mutations: 1000,
            mutation_bytes: 65_536,
            columns: 256,
        }
    }
}

impl PushLimits {
    /// Refuses a batch over a bound (400 `invalid_request`): mutations, then each
    /// mutation's columns, then each mutation's canonical size.
    pub fn check(&self, r: &PushRequest) -> Result<(), ErrorBody> {
        if r.mutations.len() > self.mutations {
            return Err(invalid_request("the batch has too many or no mutations"));
        }
        if r.mutations.iter().any(|m| m.columns.len() > self.columns) {
            return Err(invalid_request("a mutation has too many columns"));
        }
        if r.mutations
            .iter()
            .any(|m| to_output_string(&m.to_json()).len() > self.mutation_bytes)
        {
            return Err(invalid_request("a mutation exceeds the configured size"));
        }
        Ok(())
    }
}

/// Whether any string or member name in `v` contains NUL.
pub fn has_nul(v: &Json) -> bool {
    match v {
        Json::String(s) => s.contains('\0'),
        Json::Array(items) => items.iter().any(has_nul),
        Json::Object(members) => members.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// [`has_nul`] for a whole request, except the row data of push mutations (`pk` and each
/// column's `value`).
fn request_has_nul(req: &Json) -> bool {
    let Json::Object(members) = req else {
        return has_nul(req);
    };
    members.iter().any(|(k, v)| {
        k.contains('\0')
            || match (k.as_str(), v) {
                ("mutations", Json::Array(items)) => items.iter().any(mutation_has_nul),
                _ => has_nul(v),
            }
    })
}

fn mutation_has_nul(m: &Json) -> bool {
    let Json::Object(members) = m else {
        return has_nul(m);
    };
    members.iter().any(|(k, v)| {
        k.contains('\0')
            || match (k.as_str(), v) {
                ("pk", _) => false,
                ("columns", Json::Array(columns)) => columns.iter().any(|c| match c {
                    Json::Object(cm) => cm
                        .iter()
                        .any(|(ck, cv)| ck.contains('\0') || (ck != "value" && has_nul(cv))),
                    other => has_nul(other),
                }),
                _ => has_nul(v),
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PullRequest;

    fn code(r: Result<Json, ErrorBody>) -> (u16, String) {
        let e = r.unwrap_err();
        (e.code.status(), e.to_json_string())
    }

    #[test]
    fn refuses_in_the_spec_order() {
        assert_eq!(code(read_request(b"\xff")).0, 400);
        assert_eq!(code(read_request(b"[3]")).0, 400);
        assert_eq!(
            code(read_request(br#"{"protocol_version":2,"x":"\u0000"}"#)),
            (
                426,
                r#"{"error":{"code":"upgrade_required","message":"protocol version 3 is required","received_protocol_version":2,"required_protocol_version":3,"retryable":false}}"#
                    .to_owned()
            )
        );
        assert_eq!(
            code(read_request(br#"{"protocol_version":3,"x":"\u0000"}"#)).0,
            400
        );
        // NUL in pushed row data is push's to judge, per mutation.
        let push = br#"{"protocol_version":3,"mutations":[{"pk":"\u0000","columns":[{"field_id":"f","value":"\u0000"}]}]}"#;
        assert!(read_request(push).is_ok());
        let req = read_request(br#"{"protocol_version":3,"unknown":1}"#).unwrap();
        assert_eq!(
            parse_request::<PullRequest>(&req).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
    }
}
