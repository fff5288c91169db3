//! The version 3 wire checksum object (spec 001 "Wire checksum objects"):
//! `{"algorithm":"sha256","version":1,"encoding":"hex","digest":"<64 lowercase hex>"}`.
//! Parsing rejects any other algorithm, version, encoding, length, alphabet or shape.

use crate::error::{Error, Result};
use crate::json::Json;
use crate::manifest::parse_hex32;

/// A row or scope digest as carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Checksum(pub [u8; 32]);

impl Checksum {
    /// Parses a checksum object from JSON text.
    pub fn parse(text: &str) -> Result<Checksum> {
        Checksum::from_json(&Json::parse(text)?)
    }

    /// Validates a parsed checksum object: exactly the four members, exactly these values.
    pub fn from_json(value: &Json) -> Result<Checksum> {
        let bad = |reason| Error::InvalidChecksum { reason };
        let Json::Object(members) = value else {
            return Err(bad("not an object"));
        };
        if members.len() != 4 {
            return Err(bad(
                "must have exactly algorithm, version, encoding and digest",
            ));
        }
        let mut digest = None;
        for (name, v) in members {
            match (name.as_str(), v) {
                ("algorithm", Json::String(s)) if s == "sha256" => {}
                ("version", Json::Number(t)) if t == "1" => {}
                ("encoding", Json::String(s)) if s == "hex" => {}
                ("digest", Json::String(s)) => {
                    digest = Some(
                        parse_hex32(s)
                            .map_err(|_| bad("digest must be 64 lowercase hex characters"))?,
                    )
                }
                ("algorithm" | "version" | "encoding", _) => {
                    return Err(bad("unsupported algorithm, version or encoding"))
                }
                ("digest", _) => return Err(bad("digest must be a string")),
                _ => return Err(bad("unknown member")),
            }
        }
        // Four distinct known names (the parser rejects duplicates), so digest is present.
        digest.map(Checksum).ok_or(bad("missing digest"))
    }

    /// The canonical (RFC 8785) JSON text of this checksum object.
    pub fn to_json_string(&self) -> String {
        format!(
            "{{\"algorithm\":\"sha256\",\"digest\":\"{}\",\"encoding\":\"hex\",\"version\":1}}",
            hex::encode(self.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn exact_shape_only() {
        let good =
            format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{D}"}}"#);
        let c = Checksum::parse(&good).unwrap();
        assert_eq!(Checksum::parse(&c.to_json_string()).unwrap(), c);
        let upper = D.to_uppercase();
        let short = &D[..62];
        for bad in [
            format!(r#"{{"algorithm":"sha-256","version":1,"encoding":"hex","digest":"{D}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":2,"encoding":"hex","digest":"{D}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":1.0,"encoding":"hex","digest":"{D}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":"1","encoding":"hex","digest":"{D}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":1,"encoding":"base64","digest":"{D}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{upper}"}}"#),
            format!(r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{short}"}}"#),
            r#"{"algorithm":"sha256","version":1,"encoding":"hex"}"#.to_string(),
            format!(
                r#"{{"algorithm":"sha256","version":1,"encoding":"hex","digest":"{D}","x":1}}"#
            ),
            format!(r#"{{"algorithm":"sha256","version":1,"digest":"{D}","x":1}}"#),
            format!(r#"["sha256",1,"hex","{D}"]"#),
            format!(r#""{D}""#),
        ] {
            assert_eq!(
                Checksum::parse(&bad).unwrap_err().code(),
                "invalid_checksum",
                "{bad}"
            );
        }
    }
}
