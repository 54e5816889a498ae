//! Postgres's `pgoutput` messages, protocol version 1, as a log reader
//! receives them in each `XLogData` (Begin, Commit and Message come decoded
//! by the transport).
//!
//! Every read is bounds-checked: bytes that end early or carry an unknown
//! tag are an error, never a panic. The layouts are Postgres's "Logical
//! Replication Message Formats".

/// One decoded message; a tuple borrows its values from the message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    /// A table's columns, sent before its first change in a stream and
    /// again after its schema changes.
    Relation(Relation),
    Insert {
        relation: u32,
        new: Tuple<'a>,
    },
    /// `old` holds the replica identity's columns (`Old::Key`) or the whole
    /// row (`Old::Row`) when one of them changed or the identity is FULL;
    /// `None` when the identity's columns did not change.
    Update {
        relation: u32,
        old: Option<Old<'a>>,
        new: Tuple<'a>,
    },
    Delete {
        relation: u32,
        old: Old<'a>,
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// Begin, Commit, Origin, Type, Message: nothing a feed records.
    Other,
}

/// A table as the stream describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub(crate) id: u32,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `d` default (the primary key), `n` nothing, `f` full, `i` an index.
    pub(crate) identity: u8,
    pub(crate) columns: Vec<Column>,
}

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub(crate) name: String,
    /// Part of the replica identity: its old value comes with a delete.
    pub(crate) in_identity: bool,
    /// Its type's OID.
    pub(crate) type_id: u32,
}

/// The old row of an update or delete.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Old<'a> {
    /// The replica identity's columns; every other column is null.
    Key(Tuple<'a>),
    /// The whole row (REPLICA IDENTITY FULL).
    Row(Tuple<'a>),
}

impl<'a> Old<'a> {
    pub(crate) fn tuple(&self) -> &Tuple<'a> {
        match self {
            Old::Key(tuple) | Old::Row(tuple) => tuple,
        }
    }
}

/// A row's values, in the relation's column order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Tuple<'a>(pub(crate) Vec<Value<'a>>);

/// One column's value in a [`Tuple`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Null,
    /// A TOASTed value the change left as it was: not sent.
    Unchanged,
    /// The type's text output.
    Text(&'a [u8]),
    /// The type's binary form (only with the `binary` option).
    Binary(&'a [u8]),
}

/// Bytes that are not a `pgoutput` message of protocol version 1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DecodeError {
    #[error("the pgoutput message ends early")]
    Truncated,
    #[error("unknown pgoutput tag {0:?}")]
    Tag(char),
    #[error("a name in a pgoutput message is not UTF-8")]
    Utf8,
}

/// Decodes one message.
pub(crate) fn decode(bytes: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut input = Input(bytes);
    let message = match input.u8()? {
        b'R' => Message::Relation(relation(&mut input)?),
        b'I' => {
            let relation = input.u32()?;
            input.expect(b'N')?;
            Message::Insert {
                relation,
                new: tuple(&mut input)?,
            }
        }
        b'U' => {
            let relation = input.u32()?;
            let (old, tag) = match input.u8()? {
                b'K' => (Some(Old::Key(tuple(&mut input)?)), input.u8()?),
                b'O' => (Some(Old::Row(tuple(&mut input)?)), input.u8()?),
                tag => (None, tag),
            };
            if tag != b'N' {
                return Err(DecodeError::Tag(char::from(tag)));
            }
            Message::Update {
                relation,
                old,
                new: tuple(&mut input)?,
            }
        }
        b'D' => {
            let relation = input.u32()?;
            let old = match input.u8()? {
                b'K' => Old::Key(tuple(&mut input)?),
                b'O' => Old::Row(tuple(&mut input)?),
                tag => return Err(DecodeError::Tag(char::from(tag))),
            };
            Message::Delete { relation, old }
        }
        b'T' => {
            let count = input.u32()?;
            let _options = input.u8()?;
            // Grown as ids come: a count is not trusted for a capacity.
            let mut relations = Vec::new();
            for _ in 0..count {
                relations.push(input.u32()?);
            }
            Message::Truncate { relations }
        }
        b'B' | b'C' | b'O' | b'Y' | b'M' => Message::Other,
        tag => return Err(DecodeError::Tag(char::from(tag))),
    };
    Ok(message)
}

fn relation(input: &mut Input<'_>) -> Result<Relation, DecodeError> {
    let id = input.u32()?;
    let namespace = input.string()?;
    let name = input.string()?;
    let identity = input.u8()?;
    let count = input.u16()?;
    let mut columns = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let flags = input.u8()?;
        let name = input.string()?;
        let type_id = input.u32()?;
        let _modifier = input.u32()?;
        columns.push(Column {
            name,
            in_identity: flags & 1 == 1,
            type_id,
        });
    }
    Ok(Relation {
        id,
        namespace,
        name,
        identity,
        columns,
    })
}

fn tuple<'a>(input: &mut Input<'a>) -> Result<Tuple<'a>, DecodeError> {
    let count = input.u16()?;
    let mut values = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        values.push(match input.u8()? {
            b'n' => Value::Null,
            b'u' => Value::Unchanged,
            b't' => Value::Text(input.counted()?),
            b'b' => Value::Binary(input.counted()?),
            tag => return Err(DecodeError::Tag(char::from(tag))),
        });
    }
    Ok(Tuple(values))
}

/// The unread rest of a message.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn expect(&mut self, tag: u8) -> Result<(), DecodeError> {
        match self.u8()? {
            found if found == tag => Ok(()),
            found => Err(DecodeError::Tag(char::from(found))),
        }
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, DecodeError> {
        let end = memchr::memchr(0, self.0).ok_or(DecodeError::Truncated)?;
        let text = self.take(end)?;
        self.take(1)?;
        String::from_utf8(text.to_vec()).map_err(|_| DecodeError::Utf8)
    }

    /// Bytes after their Int32 length.
    fn counted(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.u32()?).map_err(|_| DecodeError::Truncated)?;
        self.take(len)
    }
}

#[cfg(test)]
mod tests;
