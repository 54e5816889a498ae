//! A row change's feed rows: the keys it added and removed, in the bytes
//! the feed's triggers record (`mysql/install.rs`): an integer as its
//! decimal text, a string as its UTF-8 bytes, a binary string as its
//! bytes, several key columns as `length:bytes` each, one after another.
//!
//! The binary log carries a row as the server stores it; the column types
//! the feed takes are the ones whose stored bytes are those bytes (integers,
//! and strings in `utf8mb4`, `utf8mb3` or `ascii`, or binary): the install
//! refuses any other (`install.rs`).

use mysql_async::binlog::events::TableMapEvent;
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;

/// One key column: where it is in the table's rows, and whether it is an
/// unsigned integer (the log carries those as the signed integer of the
/// same bits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyPart {
    pub(crate) name: String,
    pub(crate) index: usize,
    pub(crate) unsigned: bool,
}

/// A feed row: the kind (`i` added, `d` removed) and the key's bytes.
pub(crate) type FeedRow = (char, Vec<u8>);

/// Why a row's key could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// The image lacks the column (`binlog_row_image=MINIMAL`).
    Missing(String),
    /// A value of a type the feed does not take.
    Unsupported(String),
}

/// The feed rows of one row change, given its images before and after:
/// as the triggers, a key that did not change writes nothing.
pub(crate) fn feed_rows(
    parts: &[KeyPart],
    table: &TableMapEvent<'_>,
    before: Option<&BinlogRow>,
    after: Option<&BinlogRow>,
) -> Result<Vec<FeedRow>, KeyError> {
    let old = before.map(|row| key(parts, table, row)).transpose()?;
    let new = match (after, &old) {
        // An update's after image may leave an unchanged key column out
        // (MINIMAL): the key is the before image's.
        (Some(row), Some(old)) if parts.iter().any(|part| row.as_ref(part.index).is_none()) => {
            if parts.iter().all(|part| row.as_ref(part.index).is_none()) {
                Some(old.clone())
            } else {
                let missing = parts
                    .iter()
                    .find(|part| row.as_ref(part.index).is_none())
                    .map(|part| part.name.clone())
                    .unwrap_or_default();
                return Err(KeyError::Missing(missing));
            }
        }
        (Some(row), _) => Some(key(parts, table, row)?),
        (None, _) => None,
    };
    let (old, new) = (old.flatten(), new.flatten());
    if old == new {
        return Ok(Vec::new());
    }
    Ok(old
        .map(|old| ('d', old))
        .into_iter()
        .chain(new.map(|new| ('i', new)))
        .collect())
}

/// The key of `row`; `None` where a key column is null (the triggers
/// record nothing for it).
fn key(
    parts: &[KeyPart],
    table: &TableMapEvent<'_>,
    row: &BinlogRow,
) -> Result<Option<Vec<u8>>, KeyError> {
    let mut values = Vec::with_capacity(parts.len());
    for part in parts {
        let value = row
            .as_ref(part.index)
            .ok_or_else(|| KeyError::Missing(part.name.clone()))?;
        let width = table
            .get_column_type(part.index)
            .ok()
            .flatten()
            .and_then(integer_width);
        match bytes(value, part.unsigned, width) {
            Ok(Some(bytes)) => values.push(bytes),
            Ok(None) => return Ok(None),
            Err(()) => return Err(KeyError::Unsupported(part.name.clone())),
        }
    }
    Ok(Some(match values.as_slice() {
        [one] => one.clone(),
        _ => {
            let mut joined = Vec::new();
            for value in values {
                joined.extend_from_slice(value.len().to_string().as_bytes());
                joined.push(b':');
                joined.extend_from_slice(&value);
            }
            joined
        }
    }))
}

/// The bytes of one column's value, as `cast(convert(x using utf8mb4) as
/// binary)` gives them for the types the feed takes.
fn bytes(
    value: &BinlogValue<'_>,
    unsigned: bool,
    width: Option<u32>,
) -> Result<Option<Vec<u8>>, ()> {
    match value {
        BinlogValue::Value(Value::NULL) => Ok(None),
        BinlogValue::Value(Value::Bytes(bytes)) => Ok(Some(bytes.clone())),
        BinlogValue::Value(Value::UInt(number)) => Ok(Some(number.to_string().into_bytes())),
        BinlogValue::Value(Value::Int(number)) if unsigned => {
            let bits = width.unwrap_or(8) * 8;
            #[allow(clippy::cast_sign_loss)]
            let raw = *number as u64;
            let number = if bits >= 64 {
                raw
            } else {
                raw & ((1u64 << bits) - 1)
            };
            Ok(Some(number.to_string().into_bytes()))
        }
        BinlogValue::Value(Value::Int(number)) => Ok(Some(number.to_string().into_bytes())),
        _ => Err(()),
    }
}

/// The bytes an integer column of `kind` takes, for its unsigned value.
fn integer_width(kind: ColumnType) -> Option<u32> {
    match kind {
        ColumnType::MYSQL_TYPE_TINY => Some(1),
        ColumnType::MYSQL_TYPE_SHORT | ColumnType::MYSQL_TYPE_YEAR => Some(2),
        ColumnType::MYSQL_TYPE_INT24 => Some(3),
        ColumnType::MYSQL_TYPE_LONG => Some(4),
        ColumnType::MYSQL_TYPE_LONGLONG => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::bytes;
    use mysql_async::binlog::value::BinlogValue;
    use mysql_async::Value;

    #[test]
    fn unsigned_integers_read_back_from_their_signed_bits() {
        let value = |n: i64| BinlogValue::Value(Value::Int(n));
        assert_eq!(bytes(&value(-1), true, Some(1)), Ok(Some(b"255".to_vec())));
        assert_eq!(
            bytes(&value(-1), true, Some(3)),
            Ok(Some(b"16777215".to_vec()))
        );
        assert_eq!(
            bytes(&value(-1), true, Some(8)),
            Ok(Some(b"18446744073709551615".to_vec()))
        );
        assert_eq!(bytes(&value(-7), false, Some(4)), Ok(Some(b"-7".to_vec())));
        assert_eq!(
            bytes(&BinlogValue::Value(Value::NULL), false, None),
            Ok(None)
        );
        assert_eq!(
            bytes(&BinlogValue::Value(Value::Double(1.5)), false, None),
            Err(())
        );
    }
}
