//! Primitives of the canonical typed binary grammar (spec 001) and its domain prefixes.

/// `ASCII("synchro:v3:row-identity:v1") || 0x00`
pub const ROW_ID_DOMAIN: &[u8] = b"synchro:v3:row-identity:v1\0";
/// `ASCII("synchro:v3:row-digest:v1") || 0x00`
pub const ROW_DIGEST_DOMAIN: &[u8] = b"synchro:v3:row-digest:v1\0";
/// `ASCII("synchro:v3:scope-digest:v1") || 0x00`
pub const SCOPE_DOMAIN: &[u8] = b"synchro:v3:scope-digest:v1\0";
/// `ASCII("synchro:v3:schema-manifest:v1") || 0x00`
pub const SCHEMA_MANIFEST_DOMAIN: &[u8] = b"synchro:v3:schema-manifest:v1\0";

/// `u32be(x)`
pub fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_be_bytes());
}

/// `u64be(x)`
pub fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_be_bytes());
}

/// `blob(x) = u64be(octet_length(x)) || x`
pub fn put_blob(out: &mut Vec<u8>, x: &[u8]) {
    put_u64(out, x.len() as u64);
    out.extend_from_slice(x);
}

/// `text(x) = blob(UTF-8(x))`
pub fn put_text(out: &mut Vec<u8>, x: &str) {
    put_blob(out, x.as_bytes());
}

/// A cursor that reads the grammar back, for parsing untrusted octets.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_be_bytes(s.try_into().expect("8 octets")))
    }

    pub(crate) fn blob(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u64()?).ok()?;
        self.take(len)
    }

    pub(crate) fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.blob()?).ok()
    }
}
