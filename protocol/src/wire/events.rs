//! `POST /sync/events`: the request, and the server-sent events of the stream (data-free
//! change notification; pull stays exactly as specified).

use super::{
    bad, id, object, positive, s, string, string_array, strings, version_3, Members, Message,
    WireError, MAX_ID_BYTES,
};
use crate::json::Json;

/// An events request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsRequest {
    /// The client ID.
    pub client_id: String,
    /// The current client generation.
    pub client_generation: u64,
}

impl Message for EventsRequest {
    fn from_json(body: &Json) -> Result<EventsRequest, WireError> {
        let mut m = Members::of(body, "the body is not a valid JSON object")?;
        version_3(&mut m)?;
        let r = EventsRequest {
            client_id: id(
                m.get("client_id"),
                MAX_ID_BYTES,
                "client_id must be a nonempty string of at most 256 bytes",
            )?,
            client_generation: positive(
                m.get("client_generation"),
                "client_generation must be a positive integer",
            )?,
        };
        m.finish("the request has an unknown member")?;
        Ok(r)
    }

    fn to_json(&self) -> Json {
        object(vec![
            ("protocol_version", super::num(3)),
            ("client_id", s(&self.client_id)),
            ("client_generation", super::num(self.client_generation)),
        ])
    }
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The stream is open.
    Ready,
    /// These assigned scopes have new effects: pull them.
    Changed {
        /// Scope IDs.
        scopes: Vec<String>,
    },
    /// The stream ends (`lifetime`, `client_generation_expired`, ...): reconnect.
    End {
        /// Why.
        reason: String,
    },
}

impl StreamEvent {
    /// The event name.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Ready => "ready",
            StreamEvent::Changed { .. } => "changed",
            StreamEvent::End { .. } => "end",
        }
    }

    /// The event's data object.
    pub fn data(&self) -> Json {
        match self {
            StreamEvent::Ready => Json::Object(Vec::new()),
            StreamEvent::Changed { scopes } => object(vec![("scopes", string_array(scopes))]),
            StreamEvent::End { reason } => object(vec![("reason", s(reason))]),
        }
    }

    /// The event in `text/event-stream` framing.
    pub fn to_sse(&self) -> String {
        format!(
            "event: {}\ndata: {}\n\n",
            self.name(),
            crate::jcs::to_output_string(&self.data())
        )
    }

    /// Reads an event from its name and data object.
    pub fn from_parts(name: &str, data: &Json) -> Result<StreamEvent, WireError> {
        let mut m = Members::of(data, "event data is an object")?;
        let e = match name {
            "ready" => StreamEvent::Ready,
            "changed" => StreamEvent::Changed {
                scopes: strings(m.get("scopes"), "changed carries scopes")?,
            },
            "end" => StreamEvent::End {
                reason: string(m.get("reason"), "end carries a reason")?,
            },
            _ => return Err(bad("unknown event")),
        };
        m.finish("event data has an unknown member")?;
        Ok(e)
    }
}
