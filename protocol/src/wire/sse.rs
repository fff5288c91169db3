//! Reading `text/event-stream` (the framing of `POST /sync/events`) back into
//! [`StreamEvent`]s: an incremental decoder that takes the body's bytes as they arrive, in
//! chunks of any size, and yields each complete event. No I/O: the caller feeds it.
//!
//! The subset of the WHATWG server-sent-events grammar the server writes is read exactly:
//! `event:` and `data:` fields (one optional space after the colon, several `data` lines
//! joined with `\n`), comment lines (`:` first, such as `: keepalive`), `\n`, `\r\n` or `\r`
//! line ends, and a blank line dispatching the event. Other fields (`id`, `retry`) are
//! ignored. An event whose name this protocol does not know is skipped (a newer server may
//! add one); a known event with malformed data is a [`WireError`]. A line or an event larger
//! than [`MAX_EVENT_BYTES`] is an error, so a misbehaving peer cannot grow the buffer
//! without bound.

use super::{bad, StreamEvent, WireError};
use crate::json::Json;

/// Largest line or event (name plus data) the decoder holds, in bytes.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;

/// An incremental `text/event-stream` decoder.
///
/// ```
/// use synchro_protocol::wire::{SseDecoder, StreamEvent};
/// let mut d = SseDecoder::new();
/// d.push(b"event: ready\ndata: {}\n\n: keepalive\n\nevent: chan");
/// assert_eq!(d.next_event(), Some(Ok(StreamEvent::Ready)));
/// assert_eq!(d.next_event(), None); // the rest is not complete yet
/// d.push(b"ged\ndata: {\"scopes\":[\"a\"]}\n\n");
/// assert_eq!(
///     d.next_event(),
///     Some(Ok(StreamEvent::Changed { scopes: vec!["a".into()] }))
/// );
/// ```
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes not yet split into lines.
    pending: Vec<u8>,
    /// The last byte consumed was a `\r` (a following `\n` belongs to the same line end).
    after_cr: bool,
    /// The event being assembled.
    name: String,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// An empty decoder.
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// Appends bytes of the body.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next complete event, `None` when more bytes are needed. An error leaves the
    /// decoder unusable (the stream should be dropped).
    pub fn next_event(&mut self) -> Option<Result<StreamEvent, WireError>> {
        loop {
            let line = match self.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            if line.is_empty() {
                let name = std::mem::take(&mut self.name);
                let data = std::mem::take(&mut self.data);
                if !std::mem::take(&mut self.has_data) {
                    continue; // no data: nothing to dispatch
                }
                if !matches!(name.as_str(), "ready" | "changed" | "end") {
                    continue; // an event this protocol does not know
                }
                let parsed = Json::parse(&data)
                    .map_err(|_| bad("event data is not JSON"))
                    .and_then(|d| StreamEvent::from_parts(&name, &d));
                return Some(parsed);
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.find(':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(' ').unwrap_or(v))
                }
                None => (line.as_str(), ""),
            };
            match field {
                "event" => self.name = value.to_owned(),
                "data" => {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                    self.has_data = true;
                }
                _ => {}
            }
            if self.name.len() + self.data.len() > MAX_EVENT_BYTES {
                return Some(Err(bad("an event is too large")));
            }
        }
    }

    /// The next complete line without its end, `None` when none is complete.
    fn next_line(&mut self) -> Result<Option<String>, WireError> {
        if self.after_cr && self.pending.first() == Some(&b'\n') {
            self.pending.remove(0);
        }
        self.after_cr = false;
        let Some(end) = self.pending.iter().position(|&b| b == b'\n' || b == b'\r') else {
            if self.pending.len() > MAX_EVENT_BYTES {
                return Err(bad("a line is too long"));
            }
            return Ok(None);
        };
        self.after_cr = self.pending[end] == b'\r';
        let line = String::from_utf8(self.pending[..end].to_vec())
            .map_err(|_| bad("the event stream is not UTF-8"))?;
        self.pending.drain(..=end);
        Ok(Some(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(d: &mut SseDecoder) -> Vec<Result<StreamEvent, WireError>> {
        std::iter::from_fn(|| d.next_event()).collect()
    }

    fn sample() -> Vec<StreamEvent> {
        vec![
            StreamEvent::Ready,
            StreamEvent::Changed {
                scopes: vec!["user:a".into(), "team:ü".into()],
            },
            StreamEvent::End {
                reason: "lifetime".into(),
            },
        ]
    }

    #[test]
    fn the_servers_framing_reads_back_at_every_split() {
        let mut text = String::new();
        for e in sample() {
            text.push_str(&e.to_sse());
            text.push_str(": keepalive\n\n");
        }
        let bytes = text.as_bytes();
        for split in 0..bytes.len() {
            let mut d = SseDecoder::new();
            d.push(&bytes[..split]);
            let mut got = all(&mut d);
            d.push(&bytes[split..]);
            got.extend(all(&mut d));
            assert_eq!(got, sample().into_iter().map(Ok).collect::<Vec<_>>());
        }
    }

    #[test]
    fn line_ends_multiline_data_unknown_events_and_fields() {
        let mut d = SseDecoder::new();
        d.push(b"id: 7\r\nevent: future\r\ndata: {}\r\n\r\nevent:changed\rdata: {\"scopes\":\rdata: [\"s\"]}\r\r");
        assert_eq!(
            all(&mut d),
            vec![Ok(StreamEvent::Changed {
                scopes: vec!["s".into()]
            })]
        );
    }

    #[test]
    fn malformed_known_events_and_oversized_input_are_errors() {
        let mut d = SseDecoder::new();
        d.push(b"event: changed\ndata: {\"scopes\": 1}\n\n");
        assert!(matches!(d.next_event(), Some(Err(_))));
        let mut d = SseDecoder::new();
        d.push(b"event: ready\ndata: not json\n\n");
        assert!(matches!(d.next_event(), Some(Err(_))));
        let mut d = SseDecoder::new();
        d.push(&vec![b'x'; MAX_EVENT_BYTES + 1]);
        assert!(matches!(d.next_event(), Some(Err(_))));
        let mut d = SseDecoder::new();
        for _ in 0..(MAX_EVENT_BYTES / 1000 + 2) {
            d.push(format!("data: {}\n", "y".repeat(1000)).as_bytes());
        }
        assert!(matches!(d.next_event(), Some(Err(_))));
    }
}
