//! A decoder for pgoutput protocol version 1 messages (PostgreSQL "Logical Replication
//! Message Formats"), as returned one per row by `pg_logical_slot_peek_binary_changes` or
//! carried in XLogData over a replication connection.
//!
//! Every read is bounds-checked: malformed input is a [`DecodeError`], never a panic. Tuple
//! values stay in PostgreSQL's text output form; interpreting them is the capture's job.

use thiserror::Error;

/// A decoding failure (truncated or unknown message); carries no row data.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The message ended early.
    #[error("pgoutput message truncated")]
    Truncated,
    /// An unknown message or tuple tag.
    #[error("unknown pgoutput tag {0:#04x}")]
    UnknownTag(u8),
    /// Bytes after the end of a message.
    #[error("trailing bytes after a pgoutput message")]
    Trailing,
    /// A name that is not NUL-terminated UTF-8.
    #[error("invalid string in a pgoutput message")]
    BadString,
}

/// One column of a relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity key.
    pub key: bool,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier.
    pub type_modifier: i32,
}

/// A column value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL null.
    Null,
    /// An unchanged TOASTed value (not sent).
    Unchanged,
    /// The value in text output form.
    Text(Vec<u8>),
}

/// One pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Transaction start.
    Begin {
        /// LSN of the commit record.
        final_lsn: u64,
        /// Commit time, microseconds since 2000-01-01.
        commit_time: i64,
        /// Transaction id.
        xid: u32,
    },
    /// Transaction end.
    Commit {
        /// Flags (unused, 0).
        flags: u8,
        /// LSN of the commit record.
        commit_lsn: u64,
        /// End LSN of the transaction.
        end_lsn: u64,
        /// Commit time.
        commit_time: i64,
    },
    /// Replication origin.
    Origin {
        /// Origin commit LSN.
        lsn: u64,
        /// Origin name.
        name: String,
    },
    /// Relation description, sent before the first change of a relation.
    Relation {
        /// Relation OID.
        oid: u32,
        /// Schema name.
        namespace: String,
        /// Relation name.
        name: String,
        /// Replica identity setting (`d`, `n`, `f`, `i`).
        replica_identity: u8,
        /// Columns.
        columns: Vec<RelationColumn>,
    },
    /// Type description.
    Type {
        /// Type OID.
        oid: u32,
        /// Schema name.
        namespace: String,
        /// Type name.
        name: String,
    },
    /// Row inserted.
    Insert {
        /// Relation OID.
        relation: u32,
        /// The new row.
        new: Vec<Value>,
    },
    /// Row updated.
    Update {
        /// Relation OID.
        relation: u32,
        /// The old key (replica identity DEFAULT when the key changed).
        key: Option<Vec<Value>>,
        /// The old row (replica identity FULL).
        old: Option<Vec<Value>>,
        /// The new row.
        new: Vec<Value>,
    },
    /// Row deleted.
    Delete {
        /// Relation OID.
        relation: u32,
        /// The old key.
        key: Option<Vec<Value>>,
        /// The old row (replica identity FULL).
        old: Option<Vec<Value>>,
    },
    /// Relations truncated.
    Truncate {
        /// Option bits (1 CASCADE, 2 RESTART IDENTITY).
        options: u8,
        /// Relation OIDs.
        relations: Vec<u32>,
    },
    /// A logical decoding message (`pg_logical_emit_message`).
    LogicalMessage {
        /// Emitted transactionally.
        transactional: bool,
        /// LSN.
        lsn: u64,
        /// Prefix.
        prefix: String,
        /// Content.
        content: Vec<u8>,
    },
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        let rest = self.buf.get(self.pos..).ok_or(DecodeError::Truncated)?;
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::BadString)?;
        let s = std::str::from_utf8(&rest[..len]).map_err(|_| DecodeError::BadString)?;
        self.pos += len + 1;
        Ok(s.to_owned())
    }
    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let n = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(n).min(1664));
        for _ in 0..n {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let len = self.u32()? as usize;
                    Value::Text(self.take(len)?.to_vec())
                }
                other => return Err(DecodeError::UnknownTag(other)),
            });
        }
        Ok(values)
    }
}

/// Decodes one complete pgoutput (protocol version 1) message.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let msg = match r.u8()? {
        b'B' => Message::Begin {
            final_lsn: r.u64()?,
            commit_time: r.u64()? as i64,
            xid: r.u32()?,
        },
        b'C' => Message::Commit {
            flags: r.u8()?,
            commit_lsn: r.u64()?,
            end_lsn: r.u64()?,
            commit_time: r.u64()? as i64,
        },
        b'O' => Message::Origin {
            lsn: r.u64()?,
            name: r.string()?,
        },
        b'R' => {
            let oid = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = r.u16()?;
            let mut columns = Vec::with_capacity(usize::from(n).min(1664));
            for _ in 0..n {
                columns.push(RelationColumn {
                    key: r.u8()? & 1 == 1,
                    name: r.string()?,
                    type_oid: r.u32()?,
                    type_modifier: r.u32()? as i32,
                });
            }
            Message::Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            }
        }
        b'Y' => Message::Type {
            oid: r.u32()?,
            namespace: r.string()?,
            name: r.string()?,
        },
        b'I' => {
            let relation = r.u32()?;
            match r.u8()? {
                b'N' => Message::Insert {
                    relation,
                    new: r.tuple()?,
                },
                other => return Err(DecodeError::UnknownTag(other)),
            }
        }
        b'U' => {
            let relation = r.u32()?;
            let (mut key, mut old) = (None, None);
            let new = loop {
                match r.u8()? {
                    b'K' if key.is_none() && old.is_none() => key = Some(r.tuple()?),
                    b'O' if key.is_none() && old.is_none() => old = Some(r.tuple()?),
                    b'N' => break r.tuple()?,
                    other => return Err(DecodeError::UnknownTag(other)),
                }
            };
            Message::Update {
                relation,
                key,
                old,
                new,
            }
        }
        b'D' => {
            let relation = r.u32()?;
            match r.u8()? {
                b'K' => Message::Delete {
                    relation,
                    key: Some(r.tuple()?),
                    old: None,
                },
                b'O' => Message::Delete {
                    relation,
                    key: None,
                    old: Some(r.tuple()?),
                },
                other => return Err(DecodeError::UnknownTag(other)),
            }
        }
        b'T' => {
            let n = r.u32()?;
            let options = r.u8()?;
            let mut relations = Vec::with_capacity((n as usize).min(1024));
            for _ in 0..n {
                relations.push(r.u32()?);
            }
            Message::Truncate { options, relations }
        }
        b'M' => {
            let transactional = r.u8()? & 1 == 1;
            let lsn = r.u64()?;
            let prefix = r.string()?;
            let len = r.u32()? as usize;
            Message::LogicalMessage {
                transactional,
                lsn,
                prefix,
                content: r.take(len)?.to_vec(),
            }
        }
        other => return Err(DecodeError::UnknownTag(other)),
    };
    if r.pos != bytes.len() {
        return Err(DecodeError::Trailing);
    }
    Ok(msg)
}
