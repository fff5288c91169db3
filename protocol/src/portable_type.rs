//! The eleven portable logical types of protocol version 3 (spec 000 "Portable Type
//! System"): their manifest spelling and the tag octet of the typed binary grammar. This file
//! imports nothing of the crate, so the error type can name a type without a cycle; the
//! public path is [`crate::types::PortableType`].

/// A portable logical type (spec 000 "Portable Type System").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortableType {
    /// Unicode text.
    String,
    /// Signed 32-bit integer.
    Int,
    /// Signed 64-bit integer, a decimal string on the wire.
    Int64,
    /// Exact decimal, canonical text on the wire.
    Decimal,
    /// IEEE 754 binary64.
    Float,
    /// true or false.
    Boolean,
    /// UTC instant with microsecond precision.
    Datetime,
    /// Gregorian calendar date.
    Date,
    /// Time of day with microsecond precision.
    Time,
    /// One canonical I-JSON value.
    Json,
    /// Raw octets, base64url on the wire.
    Bytes,
}

impl PortableType {
    /// All types, in tag order.
    pub const ALL: [PortableType; 11] = [
        PortableType::String,
        PortableType::Int,
        PortableType::Int64,
        PortableType::Decimal,
        PortableType::Float,
        PortableType::Boolean,
        PortableType::Datetime,
        PortableType::Date,
        PortableType::Time,
        PortableType::Json,
        PortableType::Bytes,
    ];

    /// The manifest spelling of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            PortableType::String => "string",
            PortableType::Int => "int",
            PortableType::Int64 => "int64",
            PortableType::Decimal => "decimal",
            PortableType::Float => "float",
            PortableType::Boolean => "boolean",
            PortableType::Datetime => "datetime",
            PortableType::Date => "date",
            PortableType::Time => "time",
            PortableType::Json => "json",
            PortableType::Bytes => "bytes",
        }
    }

    /// Parses the exact manifest spelling; aliases, other cases and database names fail.
    pub fn parse(name: &str) -> Option<PortableType> {
        PortableType::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The type tag octet of the typed binary grammar (spec 001).
    pub fn tag(self) -> u8 {
        match self {
            PortableType::String => 0x01,
            PortableType::Int => 0x02,
            PortableType::Int64 => 0x03,
            PortableType::Decimal => 0x04,
            PortableType::Float => 0x05,
            PortableType::Boolean => 0x06,
            PortableType::Datetime => 0x07,
            PortableType::Date => 0x08,
            PortableType::Time => 0x09,
            PortableType::Json => 0x0a,
            PortableType::Bytes => 0x0b,
        }
    }

    /// The type with this tag octet.
    pub fn from_tag(tag: u8) -> Option<PortableType> {
        PortableType::ALL.into_iter().find(|t| t.tag() == tag)
    }

    /// Whether a primary key may have this type (string, int or int64).
    pub fn is_key_type(self) -> bool {
        matches!(
            self,
            PortableType::String | PortableType::Int | PortableType::Int64
        )
    }
}

impl core::fmt::Display for PortableType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
