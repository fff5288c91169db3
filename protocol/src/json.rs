//! A strict JSON (RFC 8259) parser for untrusted protocol input.
//!
//! It keeps what a general-purpose parser throws away and the protocol needs: every number
//! token exactly as written (an int64 or decimal must never pass through binary64), object
//! members in source order, and an error for duplicate member names and lone surrogate
//! escapes (I-JSON, RFC 7493). Nesting is bounded so hostile input cannot exhaust the stack.

use crate::error::{Error, Result};

/// Deepest array/object nesting accepted.
pub const MAX_DEPTH: usize = 128;

/// A parsed JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number token, exactly as written in the source (already checked against the grammar).
    Number(String),
    /// A string with its escapes decoded.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object's members in source order; names are unique.
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses one complete JSON text (surrounding whitespace allowed, nothing else).
    pub fn parse(text: &str) -> Result<Json> {
        let mut p = Parser {
            src: text.as_bytes(),
            pos: 0,
        };
        p.skip_ws();
        let value = p.value(0)?;
        p.skip_ws();
        if p.pos != p.src.len() {
            return Err(p.err("unexpected data after the JSON value"));
        }
        Ok(value)
    }

    /// The member `name` of an object, if this is an object that has it.
    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string content, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// A short name of the JSON kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, reason: &'static str) -> Error {
        Error::MalformedJson {
            offset: self.pos,
            reason,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &'static [u8], value: Json) -> Result<Json> {
        if self.src[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json> {
        match self.src.get(self.pos) {
            None => Err(self.err("unexpected end of input")),
            Some(b'n') => self.literal(b"null", Json::Null),
            Some(b't') => self.literal(b"true", Json::Bool(true)),
            Some(b'f') => self.literal(b"false", Json::Bool(false)),
            Some(b'"') => self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(Json::Number),
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json> {
        if depth > MAX_DEPTH {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.src.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.src.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json> {
        if depth > MAX_DEPTH {
            return Err(Error::NestingTooDeep { limit: MAX_DEPTH });
        }
        self.pos += 1;
        let mut members: Vec<(String, Json)> = Vec::new();
        let mut seen: Option<std::collections::HashSet<String>> = None;
        self.skip_ws();
        if self.src.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.src.get(self.pos) != Some(&b'"') {
                return Err(self.err("expected a member name"));
            }
            let name_at = self.pos;
            let name = self.string()?;
            // Small objects (rows, manifests) scan; large ones switch to a set.
            let duplicate = match &mut seen {
                Some(set) => !set.insert(name.clone()),
                None if members.len() < 16 => members.iter().any(|(k, _)| *k == name),
                None => {
                    let mut set: std::collections::HashSet<String> =
                        members.iter().map(|(k, _)| k.clone()).collect();
                    let dup = !set.insert(name.clone());
                    seen = Some(set);
                    dup
                }
            };
            if duplicate {
                return Err(Error::DuplicateMember { offset: name_at });
            }
            self.skip_ws();
            if self.src.get(self.pos) != Some(&b':') {
                return Err(self.err("expected ':'"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push((name, value));
            self.skip_ws();
            match self.src.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.src.get(self.pos) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<String> {
        let start = self.pos;
        if self.src[self.pos] == b'-' {
            self.pos += 1;
        }
        match self.src.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("expected a digit")),
        }
        if self.src.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.err("expected a digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.src.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.src.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("expected a digit in the exponent"));
            }
        }
        // The token is ASCII by construction.
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn hex4(&mut self) -> Result<u16> {
        let digits = self
            .src
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.err("truncated \\u escape"))?;
        let mut v: u16 = 0;
        for &d in digits {
            let n = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.err("invalid hex digit in \\u escape")),
            };
            v = (v << 4) | u16::from(n);
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the longest run of plain characters at once.
            let run_start = self.pos;
            while let Some(&b) = self.src.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            if self.pos > run_start {
                // The source is a &str, and the run ends before an ASCII byte or at the end,
                // so it is valid UTF-8.
                out.push_str(
                    std::str::from_utf8(&self.src[run_start..self.pos])
                        .map_err(|_| self.err("invalid UTF-8"))?,
                );
            }
            match self.src.get(self.pos) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let esc_at = self.pos;
                    self.pos += 1;
                    let Some(&e) = self.src.get(self.pos) else {
                        return Err(self.err("unterminated escape"));
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = match hi {
                                0xD800..=0xDBFF => {
                                    if self.src.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                        return Err(Error::LoneSurrogate { offset: esc_at });
                                    }
                                    self.pos += 2;
                                    let lo = self.hex4()?;
                                    if !(0xDC00..=0xDFFF).contains(&lo) {
                                        return Err(Error::LoneSurrogate { offset: esc_at });
                                    }
                                    let cp = 0x10000
                                        + ((u32::from(hi) - 0xD800) << 10)
                                        + (u32::from(lo) - 0xDC00);
                                    char::from_u32(cp)
                                }
                                0xDC00..=0xDFFF => {
                                    return Err(Error::LoneSurrogate { offset: esc_at })
                                }
                                _ => char::from_u32(u32::from(hi)),
                            };
                            out.push(c.ok_or_else(|| self.err("invalid \\u escape"))?);
                        }
                        _ => {
                            self.pos = esc_at;
                            return Err(self.err("invalid escape"));
                        }
                    }
                }
                Some(_) => return Err(self.err("unescaped control character in string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_number_tokens_verbatim() {
        let v = Json::parse("[1.0, -0, 12345678901234567890123, 1E+2]").unwrap();
        let Json::Array(items) = v else { panic!() };
        let toks: Vec<_> = items
            .iter()
            .map(|i| match i {
                Json::Number(t) => t.as_str(),
                _ => panic!(),
            })
            .collect();
        assert_eq!(toks, ["1.0", "-0", "12345678901234567890123", "1E+2"]);
    }

    #[test]
    fn rejects_bad_grammar() {
        for bad in [
            "",
            " ",
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "-",
            "[1,]",
            "{\"a\":1,}",
            "[",
            "{\"a\"}",
            "nul",
            "\"\\x\"",
            "\"a",
            "\"\u{1}\"",
            "1 2",
            "{1:2}",
            "[1]]",
            "NaN",
            "Infinity",
            "'a'",
        ] {
            assert!(Json::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn rejects_duplicates_small_and_large() {
        assert_eq!(
            Json::parse(r#"{"a":1,"a":2}"#).unwrap_err().code(),
            "duplicate_member"
        );
        let mut big: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        big.push("\"k7\":0".into());
        let text = format!("{{{}}}", big.join(","));
        assert_eq!(Json::parse(&text).unwrap_err().code(), "duplicate_member");
        // Escaped spelling of the same name is still a duplicate.
        assert!(Json::parse(r#"{"a":1,"\u0061":2}"#).is_err());
    }

    #[test]
    fn surrogates() {
        assert_eq!(
            Json::parse(r#""\ud83d\ude00""#).unwrap(),
            Json::String("😀".into())
        );
        for bad in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ud800x""#,
        ] {
            assert_eq!(
                Json::parse(bad).unwrap_err().code(),
                "lone_surrogate",
                "{bad}"
            );
        }
    }

    #[test]
    fn depth_is_bounded() {
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(Json::parse(&ok).is_ok());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(Json::parse(&deep).unwrap_err().code(), "nesting_too_deep");
        let hostile = "[".repeat(1_000_000);
        assert!(Json::parse(&hostile).is_err());
    }
}
